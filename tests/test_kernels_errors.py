"""Typed errors: bad input raises before anything is read or written."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pagedkv.allocator.errors import StaleTableError
from pagedkv.kernels import (
    KernelConfig,
    KernelInputError,
    KernelTypeError,
    paged_attention_decode,
    paged_attention_prefill,
)
from pagedkv.kernels.testing import make_paged_case

SENTINEL = 123.0


@pytest.fixture
def case():
    # block 4 (the last) is spare and poisoned; tables are padded with -1
    return make_paged_case([6, 3], num_kv_heads=1, head_dim=8, block_size=4, dtype=torch.float16,
                           spare_blocks=0, table_pad=1, seed=11)


def decode(case, q=None, tables=None, lens=None, **kw):
    q = torch.randn(2, 2, 8) if q is None else q
    tables = case.block_tables if tables is None else tables
    lens = case.seq_lens if lens is None else lens
    return paged_attention_decode(q, case.k_cache, case.v_cache, tables, lens, **kw)


def test_checked_mode_accepts_valid_tables_with_padding(case):
    gens = np.arange(case.num_blocks, dtype=np.int32) + 5
    tgens = np.where(case.block_tables >= 0, gens[case.block_tables], -1).astype(np.int32)
    out = decode(case, check=True, block_generations=gens, table_generations=tgens)
    assert not torch.isnan(out).any()


@pytest.mark.parametrize("bad", [-1, 5, 1000], ids=["padding-in-use", "num_blocks", "far"])
def test_checked_mode_rejects_out_of_range_entry(case, bad):
    tables = case.block_tables.copy()
    tables[0, 1] = bad  # sequence 0 (length 6, B=4) uses entries 0 and 1
    out = torch.full((2, 2, 8), SENTINEL)
    with pytest.raises(KernelInputError, match=r"block_tables\[0, 1\]"):
        decode(case, tables=tables, check=True, out=out)
    assert (out == SENTINEL).all()


def test_checked_mode_ignores_entries_past_the_length(case):
    tables = case.block_tables.copy()
    tables[1, 1] = 1000  # sequence 1 (length 3) uses entry 0 only
    out = decode(case, tables=tables, check=True)
    assert not torch.isnan(out).any()


def test_stale_generation_raises(case):
    gens = np.zeros(case.num_blocks, dtype=np.int32)
    tgens = np.where(case.block_tables >= 0, 0, -1).astype(np.int32)
    gens[case.block_tables[1, 0]] = 1  # the block was recycled after the table was published
    out = torch.full((2, 2, 8), SENTINEL)
    with pytest.raises(StaleTableError):
        decode(case, check=True, block_generations=gens, table_generations=tgens, out=out)
    assert (out == SENTINEL).all()


def test_generation_arrays_must_come_together_and_fit(case):
    gens = np.zeros(case.num_blocks, dtype=np.int32)
    with pytest.raises(KernelInputError):
        decode(case, check=True, block_generations=gens)
    with pytest.raises(KernelInputError):
        decode(case, check=True, block_generations=gens[:2],
               table_generations=np.zeros_like(case.block_tables))
    with pytest.raises(KernelInputError):
        decode(case, check=True, block_generations=gens,
               table_generations=np.zeros((2, 1), dtype=np.int32))


@pytest.mark.parametrize(
    "q, err",
    [
        (torch.randn(2, 8), KernelInputError),  # 2-D
        (torch.randn(2, 2, 16), KernelInputError),  # head_dim mismatch
        (torch.randn(3, 2, 8), KernelInputError),  # 3 queries for 2 sequences
        (torch.randint(0, 3, (2, 2, 8)), KernelTypeError),  # integer q
        ([[0.0] * 8] * 2, KernelTypeError),  # not an array
    ],
    ids=["2d", "head-dim", "count", "int", "list"],
)
def test_decode_rejects_bad_q(case, q, err):
    with pytest.raises(err):
        decode(case, q=q)


def test_heads_must_be_a_multiple_of_kv_heads():
    case = make_paged_case([3], num_kv_heads=2, head_dim=8, block_size=4, dtype=torch.float32)
    with pytest.raises(KernelInputError, match="multiple"):
        decode(case, q=torch.randn(1, 3, 8))


def test_decode_rejects_bad_lengths_and_tables(case):
    with pytest.raises(KernelInputError, match="seq_lens"):
        decode(case, lens=np.array([6, 0], dtype=np.int32))  # decode needs length >= 1
    with pytest.raises(KernelInputError, match="seq_lens"):
        decode(case, lens=np.array([13, 3], dtype=np.int32))  # beyond 3 table entries x B=4
    with pytest.raises(KernelTypeError):
        decode(case, lens=np.array([6.0, 3.0]))
    with pytest.raises(KernelInputError):
        decode(case, tables=case.block_tables[:1])
    with pytest.raises(KernelInputError):
        decode(case, tables=case.block_tables.reshape(-1))
    with pytest.raises(KernelInputError):
        decode(case, partition_size=0)
    with pytest.raises(KernelInputError):
        decode(case, config=KernelConfig(lanes=3))  # 8 fp16 elements are 2 words
    with pytest.raises(KernelInputError):
        decode(case, out=torch.empty(2, 2, 4))
    with pytest.raises(KernelTypeError):
        decode(case, scale="0.5")


def test_caches_must_agree(case):
    q = torch.randn(2, 2, 8)
    with pytest.raises(KernelTypeError):
        paged_attention_decode(q, case.k_cache, case.v_cache.float(), case.block_tables,
                               case.seq_lens)
    with pytest.raises(KernelTypeError):
        paged_attention_decode(q, case.k_cache.to(torch.int16), case.v_cache.to(torch.int16),
                               case.block_tables, case.seq_lens)
    with pytest.raises(KernelInputError):
        paged_attention_decode(q, case.k_cache, case.v_cache[:, :2], case.block_tables,
                               case.seq_lens)
    with pytest.raises(KernelInputError):
        paged_attention_decode(q, case.k_cache[..., :4], case.v_cache[..., :4],
                               case.block_tables, case.seq_lens)


def test_prefill_rejects_inconsistent_query_lens(case):
    q = torch.randn(4, 2, 8)

    def prefill(qlens, **kw):
        return paged_attention_prefill(q, case.k_cache, case.v_cache, case.block_tables,
                                       case.seq_lens, np.asarray(qlens), **kw)

    with pytest.raises(KernelInputError, match="sum"):
        prefill([1, 2])
    with pytest.raises(KernelInputError, match="exceed"):
        prefill([0, 4])  # 4 queries in a sequence of length 3
    with pytest.raises(KernelInputError, match="negative"):
        prefill([5, -1])
    with pytest.raises(KernelInputError):
        prefill([4])
    with pytest.raises(KernelTypeError):
        paged_attention_prefill(q, case.k_cache, case.v_cache, case.block_tables,
                                case.seq_lens, None)
    out = prefill([4, 0])
    assert out.shape == q.shape and not torch.isnan(out).any()
