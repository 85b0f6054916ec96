"""FlashInfer's paged-KV layout (CSR) from a launch's block tables, and back.

FlashInfer describes a batch of paged sequences by ``kv_indptr`` (int32 ``[n + 1]``),
``kv_indices`` (the pages of sequence i are ``kv_indices[kv_indptr[i]:kv_indptr[i + 1]]``),
``kv_last_page_len`` (int32 ``[n]``, slots used in each sequence's last page, in ``1..B``),
``qo_indptr`` (int32 ``[n + 1]``, where each sequence's query tokens start) and the query
tokens' ``positions``. A sequence of length L uses ceil(L / B) pages; one with L = 0 has none
and its last-page length is 0 (FlashInfer never receives such a sequence from a launch).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import InvalidArgument


@dataclass(frozen=True)
class FlashInferLayout:
    kv_indptr: np.ndarray
    kv_indices: np.ndarray
    kv_last_page_len: np.ndarray
    qo_indptr: np.ndarray
    positions: np.ndarray


def to_flashinfer(block_tables: np.ndarray, seq_lens: np.ndarray, query_lens: np.ndarray,
                  block_size: int) -> FlashInferLayout:
    """The CSR layout of block tables padded with -1 (vectorized, no Python loop per page)."""
    tables = np.asarray(block_tables)
    seq = np.asarray(seq_lens, dtype=np.int64)
    q = np.asarray(query_lens, dtype=np.int64)
    if tables.ndim != 2 or seq.shape != (tables.shape[0],) or q.shape != seq.shape:
        raise InvalidArgument("block_tables [n, w], seq_lens [n] and query_lens [n] expected")
    if (q < 0).any() or (q > seq).any():
        raise InvalidArgument("query_lens must lie in [0, seq_lens]")
    pages = -(-seq // block_size)
    if (pages > tables.shape[1]).any():
        raise InvalidArgument("a sequence is longer than its block table covers")
    used = np.arange(tables.shape[1])[None, :] < pages[:, None]
    if (tables[used] < 0).any():
        raise InvalidArgument("a used table entry is padding (-1)")
    kv_indptr = np.concatenate(([0], np.cumsum(pages))).astype(np.int32)
    last = np.where(pages > 0, seq - (pages - 1) * block_size, 0).astype(np.int32)
    qo_indptr = np.concatenate(([0], np.cumsum(q))).astype(np.int32)
    starts = np.repeat(seq - q, q)
    offsets = np.arange(int(q.sum())) - np.repeat(qo_indptr[:-1], q)
    return FlashInferLayout(kv_indptr, tables[used].astype(np.int32), last, qo_indptr,
                            (starts + offsets).astype(np.int64))


def from_flashinfer(layout: FlashInferLayout, block_size: int
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(block_tables padded with -1, seq_lens, query_lens): the inverse of ``to_flashinfer``."""
    indptr = np.asarray(layout.kv_indptr, dtype=np.int64)
    last = np.asarray(layout.kv_last_page_len, dtype=np.int64)
    pages = np.diff(indptr)
    if (pages < 0).any() or indptr[0] != 0 or indptr[-1] != len(layout.kv_indices):
        raise InvalidArgument("kv_indptr must rise from 0 to len(kv_indices)")
    if ((pages > 0) & ((last < 1) | (last > block_size))).any() or (last[pages == 0] != 0).any():
        raise InvalidArgument(f"kv_last_page_len must lie in 1..{block_size} for used pages")
    n, width = len(pages), int(pages.max(initial=0))
    tables = np.full((n, width), -1, dtype=np.int32)
    cols = np.arange(width)[None, :] < pages[:, None]
    tables[cols] = np.asarray(layout.kv_indices, dtype=np.int32)
    seq = np.where(pages > 0, (pages - 1) * block_size + last, 0).astype(np.int32)
    q = np.diff(np.asarray(layout.qo_indptr, dtype=np.int64)).astype(np.int32)
    return tables, seq, q
