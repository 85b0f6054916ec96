"""Torch reference implementations: gather K/V through the block table, then attend in
float64 (or float32). Slow and simple, meant for checking kernels and user setups."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

__all__ = [
    "attention_reference",
    "copy_blocks_reference",
    "gather_kv",
    "paged_attention_decode_reference",
    "paged_attention_prefill_reference",
    "write_kv_reference",
]


def _t(x: Any) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x
    a = np.asarray(x)
    return torch.from_numpy(a if a.flags.writeable else a.copy())  # a launch's are read-only


def gather_kv(
    k_cache: Any, v_cache: Any, table_row: Any, seq_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Contiguous ``[seq_len, kv_heads, head_dim]`` K and V of one sequence.

    Only the first ``ceil(seq_len / block_size)`` table entries are used.
    """
    k_cache, v_cache = _t(k_cache), _t(v_cache)
    bs = k_cache.shape[1]
    n_blocks = -(-int(seq_len) // bs)
    ids = _t(table_row)[:n_blocks].to(device=k_cache.device, dtype=torch.long)
    k = k_cache[ids].reshape(-1, *k_cache.shape[2:])[: int(seq_len)]
    v = v_cache[ids].reshape(-1, *v_cache.shape[2:])[: int(seq_len)]
    return k, v


def attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    scale: float,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """Causal GQA attention over contiguous K/V: query ``i`` (at key position
    ``positions[i]``) sees keys ``0..positions[i]``. q ``[n, H, D]``, k/v ``[L, Hkv, D]``."""
    group = q.shape[1] // k.shape[1]
    qf = q.to(dtype)
    kf = k.to(dtype).repeat_interleave(group, dim=1)
    vf = v.to(dtype).repeat_interleave(group, dim=1)
    scores = torch.einsum("nhd,lhd->hnl", qf, kf) * scale
    keys = torch.arange(k.shape[0], device=q.device)
    mask = keys[None, :] > positions.to(q.device)[:, None]
    scores = scores.masked_fill(mask[None], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.einsum("hnl,lhd->nhd", probs, vf)


def paged_attention_prefill_reference(
    q: Any,
    k_cache: Any,
    v_cache: Any,
    block_tables: Any,
    seq_lens: Any,
    query_lens: Any,
    *,
    scale: float | None = None,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """Reference for ``paged_attention_prefill``; returns ``dtype`` ``[sum(query_lens), H, D]``."""
    q = _t(q)
    lens = _t(seq_lens).tolist()
    qlens = _t(query_lens).tolist()
    tables = _t(block_tables)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    out = torch.empty(q.shape, dtype=dtype, device=q.device)
    start = 0
    for i, (length, ql) in enumerate(zip(lens, qlens, strict=True)):
        if ql == 0:
            continue
        k, v = gather_kv(k_cache, v_cache, tables[i], length)
        positions = torch.arange(length - ql, length)
        out[start : start + ql] = attention_reference(
            q[start : start + ql], k, v, positions, scale, dtype
        )
        start += ql
    return out


def paged_attention_decode_reference(
    q: Any,
    k_cache: Any,
    v_cache: Any,
    block_tables: Any,
    seq_lens: Any,
    *,
    scale: float | None = None,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """Reference for ``paged_attention_decode``; returns ``dtype`` ``[num_seqs, H, D]``."""
    n = _t(q).shape[0]
    return paged_attention_prefill_reference(
        q, k_cache, v_cache, block_tables, seq_lens, torch.ones(n, dtype=torch.long),
        scale=scale, dtype=dtype,
    )


def write_kv_reference(
    key: Any, value: Any, k_cache: Any, v_cache: Any, slot_mapping: Any
) -> None:
    """Reference for ``write_kv`` (in place; negative slots skipped)."""
    k_cache, v_cache = _t(k_cache), _t(v_cache)
    bs = k_cache.shape[1]
    slots = _t(slot_mapping).to(torch.long)
    keep = slots >= 0
    kflat = k_cache.view(-1, *k_cache.shape[2:])
    vflat = v_cache.view(-1, *v_cache.shape[2:])
    assert kflat.shape[0] == k_cache.shape[0] * bs
    kflat[slots[keep]] = _t(key)[keep]
    vflat[slots[keep]] = _t(value)[keep]


def copy_blocks_reference(k_cache: Any, v_cache: Any, pairs: Any) -> None:
    """Reference for ``copy_blocks`` (in place)."""
    k_cache, v_cache = _t(k_cache), _t(v_cache)
    for src, dst in _t(pairs).tolist():
        k_cache[dst] = k_cache[src]
        v_cache[dst] = v_cache[src]
