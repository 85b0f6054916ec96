"""The torch references themselves, against contiguous attention computed independently."""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from pagedkv.kernels import (
    gather_kv,
    paged_attention_decode_reference,
    paged_attention_prefill_reference,
)
from pagedkv.kernels.testing import make_paged_case


def sdpa(q, k, v, first_pos):
    """Contiguous causal GQA attention with torch SDPA in float64: q [n, H, D], k/v [L, Hkv, D];
    query i sits at key position first_pos + i."""
    group = q.shape[1] // k.shape[1]
    qh = q.double().transpose(0, 1)  # [H, n, D]
    kh = k.double().transpose(0, 1).repeat_interleave(group, dim=0)
    vh = v.double().transpose(0, 1).repeat_interleave(group, dim=0)
    n, length = q.shape[0], k.shape[0]
    allowed = torch.arange(length)[None, :] <= (first_pos + torch.arange(n))[:, None]
    out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=allowed,
                                         scale=1 / math.sqrt(q.shape[-1]))
    return out.transpose(0, 1)


def test_gather_returns_the_written_tokens():
    case = make_paged_case([5, 12, 1], num_kv_heads=2, head_dim=4, block_size=4,
                           dtype=torch.float32, seed=1)
    for i, n in enumerate(case.seq_lens):
        k, v = gather_kv(case.k_cache, case.v_cache, case.block_tables[i], int(n))
        assert torch.equal(k, case.keys[i]) and torch.equal(v, case.values[i])


def test_decode_reference_matches_contiguous_sdpa():
    lens = [1, 7, 8, 9, 16]
    case = make_paged_case(lens, num_kv_heads=2, head_dim=8, block_size=8,
                           dtype=torch.float16, seed=2)
    q = torch.randn(len(lens), 8, 8, generator=torch.Generator().manual_seed(2))
    ref = paged_attention_decode_reference(q, case.k_cache, case.v_cache, case.block_tables,
                                           case.seq_lens)
    for i, n in enumerate(lens):
        want = sdpa(q[i : i + 1], case.keys[i], case.values[i], n - 1)
        torch.testing.assert_close(ref[i : i + 1], want, rtol=1e-10, atol=1e-12)


def test_prefill_reference_matches_contiguous_sdpa():
    lens, qlens = [6, 10, 3], [6, 4, 0]
    case = make_paged_case(lens, num_kv_heads=1, head_dim=8, block_size=4,
                           dtype=torch.bfloat16, seed=3)
    q = torch.randn(sum(qlens), 4, 8, generator=torch.Generator().manual_seed(3))
    ref = paged_attention_prefill_reference(q, case.k_cache, case.v_cache, case.block_tables,
                                            case.seq_lens, np.asarray(qlens))
    start = 0
    for i, (n, ql) in enumerate(zip(lens, qlens, strict=True)):
        want = sdpa(q[start : start + ql], case.keys[i], case.values[i], n - ql)
        torch.testing.assert_close(ref[start : start + ql], want, rtol=1e-10, atol=1e-12)
        start += ql
    # a wrong causal offset would be caught: the last query of sequence 1 sees all 10 keys
    assert not torch.allclose(ref[9], sdpa(q[9:10], case.keys[1], case.values[1], 6)[0].double())
