"""paged_attention_prefill (varlen, causal, chunked) against the float64 torch reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pagedkv.kernels import (
    KernelConfig,
    paged_attention_prefill,
    paged_attention_prefill_reference,
)
from pagedkv.kernels.testing import device_for_tests, make_paged_case, rel_error, tolerance

DEVICE = device_for_tests()
F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32


def lens_and_queries(bs: int) -> tuple[list[int], list[int]]:
    """Full prefills, chunked extends, a decode-like step and a sequence with no queries."""
    lens = [1, bs - 1, bs + 1, 2 * bs, bs, 2 * bs + 3]
    qlens = [1, bs - 1, 3, 0, 1, bs + 2]
    return lens, qlens


def run_prefill(dtype, group, bs, hd, hkv, lens, qlens, *, seed=0, **kw):
    case = make_paged_case(
        lens, num_kv_heads=hkv, head_dim=hd, block_size=bs, dtype=dtype, device=DEVICE, seed=seed
    )
    gen = torch.Generator().manual_seed(seed + 1)
    q = torch.randn(sum(qlens), hkv * group, hd, generator=gen).to(dtype).to(DEVICE)
    ql = np.asarray(qlens, dtype=np.int32)
    out = paged_attention_prefill(
        q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, ql, **kw
    )
    ref = paged_attention_prefill_reference(
        q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, ql
    )
    assert out.shape == q.shape and out.dtype == q.dtype
    assert not torch.isnan(ref).any()
    assert not torch.isnan(out).any(), "kernel read a poisoned slot"
    err = rel_error(out, ref)
    assert err < tolerance(dtype), f"relative error {err}"


PREFILL_CASES = [
    # dtype, group, block_size, head_dim, kv_heads
    pytest.param(F32, 1, 8, 8, 2, id="f32-g1-b8"),
    pytest.param(F16, 4, 8, 16, 1, id="f16-g4-b8"),
    pytest.param(BF16, 2, 16, 8, 1, id="bf16-g2-b16"),
] + [
    pytest.param(dt, g, bs, hd, 8, marks=pytest.mark.gpu, id=f"gpu-{str(dt)[6:]}-g{g}-b{bs}")
    for dt, g, bs, hd in [(F16, 1, 16, 128), (BF16, 8, 32, 128), (F32, 4, 16, 64)]
]


@pytest.mark.parametrize("dtype, group, bs, hd, hkv", PREFILL_CASES)
def test_prefill_matches_reference(dtype, group, bs, hd, hkv):
    lens, qlens = lens_and_queries(bs)
    if DEVICE == "cuda":
        lens, qlens = lens + [700, 2000], qlens + [700, 300]
    run_prefill(dtype, group, bs, hd, hkv, lens, qlens)


@pytest.mark.parametrize(
    "part", [pytest.param(8, id="p8"), pytest.param(256, marks=pytest.mark.gpu, id="gpu-p256")]
)
def test_prefill_split_k(part):
    lens = [part - 1, part + 1, 2 * part + 1, 3]
    qlens = [part - 1, 2, part + 1, 3]
    hd = 128 if DEVICE == "cuda" else 8
    run_prefill(F16, 2, 8, hd, 1, lens, qlens, partition_size=part, seed=4)


def test_prefill_query_tiles():
    # q_tile 3 leaves partial tiles; lanes 4 covers fp32 head_dim 8 (4 words of 8 bytes)
    lens, qlens = [9, 7, 4], [7, 1, 4]
    run_prefill(F32, 2, 4, 8, 1, lens, qlens, config=KernelConfig(4, 1, 2, 3), seed=6)


def test_prefill_equals_decode_for_single_queries():
    from pagedkv.kernels import paged_attention_decode

    case = make_paged_case([5, 11], num_kv_heads=1, head_dim=8, block_size=4, dtype=F32, seed=2)
    q = torch.randn(2, 2, 8, generator=torch.Generator().manual_seed(2))
    cfg = KernelConfig(lanes=2, slots=2, unroll=1, q_tile=1)
    a = paged_attention_decode(
        q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, config=cfg
    )
    b = paged_attention_prefill(
        q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, np.ones(2, np.int32),
        config=cfg,
    )
    assert torch.equal(a, b)


@pytest.mark.parametrize("group", [1, 8])
def test_gpu_default_layout_runs_in_the_simulator(monkeypatch, group):
    from pagedkv.kernels import attention, default_config

    monkeypatch.setattr(attention, "SIMULATOR", False)
    cfg = default_config(32, group, "bf16", prefill=True)
    monkeypatch.setattr(attention, "SIMULATOR", True)
    assert cfg.q_tile * group >= 8
    run_prefill(BF16, group, 8, 32, 1, [21, 5], [18, 5], config=cfg, seed=13)
