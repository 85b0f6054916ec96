"""Launch.to_flashinfer(): FlashInfer's CSR paged layout, checked against the table form, its
inverse, and attention computed through it against the kernels' reference on the tables."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pagedkv.allocator import BlockAllocator, InvalidArgument
from pagedkv.allocator.interop import FlashInferLayout, from_flashinfer, to_flashinfer
from pagedkv.kernels import paged_attention_prefill_reference


def _launch(seed: int):
    rng = np.random.default_rng(seed)
    B = int(rng.choice([1, 2, 4, 16]))
    a = BlockAllocator(64, B)
    rids = []
    for i in range(int(rng.integers(1, 5))):
        n = int(rng.integers(1, 40))
        a.add_request(i, rng.integers(0, 50, n).tolist())
        a.allocate(i, n)
        rids.append(i)
    first = a.publish(rids)
    for i in rids:  # a second step: a few more positions each (decode / chunked prefill)
        extra = int(rng.integers(1, 4))
        a.append_tokens(i, rng.integers(0, 50, extra).tolist())
        a.allocate(i, a.num_reserved(i) + extra)
    first.complete()
    return a, a.publish(rids), B


@pytest.mark.parametrize("seed", range(12))
def test_csr_layout_matches_the_tables(seed):
    a, launch, B = _launch(seed)
    fi = launch.to_flashinfer()
    for i, rid in enumerate(launch.rids):
        pages = fi.kv_indices[fi.kv_indptr[i]:fi.kv_indptr[i + 1]].tolist()
        assert pages == a.block_table(rid)
        L = int(launch.seq_lens[i])
        assert 1 <= fi.kv_last_page_len[i] <= B
        assert (len(pages) - 1) * B + fi.kv_last_page_len[i] == L
        q0, q1 = fi.qo_indptr[i], fi.qo_indptr[i + 1]
        assert fi.positions[q0:q1].tolist() == list(range(L - (q1 - q0), L))
    # every written slot is where the slot mapping says
    page_of = [fi.kv_indices[fi.kv_indptr[i] + p // B] for i in range(len(launch.rids))
               for p in fi.positions[fi.qo_indptr[i]:fi.qo_indptr[i + 1]]]
    assert (np.asarray(page_of) * B + fi.positions % B).tolist() == launch.slot_mapping.tolist()
    tables, seq, q = from_flashinfer(fi, B)
    width = tables.shape[1]  # the launch's tables are padded further, with -1
    assert np.array_equal(tables, launch.block_tables[:, :width])
    assert (launch.block_tables[:, width:] == -1).all()
    assert np.array_equal(seq, launch.seq_lens) and np.array_equal(q, launch.query_lens)
    launch.complete()


def _attention_through_csr(q, k_cache, v_cache, fi: FlashInferLayout, B: int) -> torch.Tensor:
    out = []
    for i in range(len(fi.kv_last_page_len)):
        pages = torch.as_tensor(fi.kv_indices[fi.kv_indptr[i]:fi.kv_indptr[i + 1]].astype(int))
        L = (len(pages) - 1) * B + int(fi.kv_last_page_len[i])
        k = k_cache[pages].reshape(-1, *k_cache.shape[2:])[:L].double()
        v = v_cache[pages].reshape(-1, *v_cache.shape[2:])[:L].double()
        qi = q[fi.qo_indptr[i]:fi.qo_indptr[i + 1]].double()
        pos = torch.as_tensor(fi.positions[fi.qo_indptr[i]:fi.qo_indptr[i + 1]])
        s = torch.einsum("nhd,lhd->hnl", qi, k) / qi.shape[-1] ** 0.5
        s = s.masked_fill(torch.arange(L)[None, None, :] > pos[None, :, None], float("-inf"))
        out.append(torch.einsum("hnl,lhd->nhd", torch.softmax(s, -1), v))
    return torch.cat(out)


@pytest.mark.parametrize("seed", range(4))
def test_attention_through_the_csr_layout_matches_the_table_reference(seed):
    a, launch, B = _launch(seed)
    g = torch.Generator().manual_seed(seed)
    k_cache = torch.randn(64, B, 2, 8, generator=g)
    v_cache = torch.randn(64, B, 2, 8, generator=g)
    used = set(np.unique(launch.block_tables[launch.block_tables >= 0]).tolist())
    unused = [b for b in range(64) if b not in used]
    k_cache[unused] = float("nan")  # poison: reading a wrong block shows
    v_cache[unused] = float("nan")
    q = torch.randn(int(launch.query_lens.sum()), 2, 8, generator=g)
    want = paged_attention_prefill_reference(q, k_cache, v_cache, launch.block_tables,
                                             launch.seq_lens, launch.query_lens)
    got = _attention_through_csr(q, k_cache, v_cache, launch.to_flashinfer(), B)
    assert torch.isfinite(got).all()
    assert (got - want).abs().max() / want.abs().max() < 1e-12
    launch.complete()


def test_bad_layouts_are_refused():
    tables = np.array([[3, -1]], dtype=np.int32)
    with pytest.raises(InvalidArgument):
        to_flashinfer(tables, np.array([5]), np.array([1]), 4)  # needs two pages
    with pytest.raises(InvalidArgument):
        to_flashinfer(tables, np.array([3]), np.array([4]), 4)  # more queries than tokens
    fi = to_flashinfer(tables, np.array([3]), np.array([1]), 4)
    bad = FlashInferLayout(fi.kv_indptr, fi.kv_indices, np.array([5], dtype=np.int32),
                           fi.qo_indptr, fi.positions)
    with pytest.raises(InvalidArgument):
        from_flashinfer(bad, 4)
