"""paged_attention_decode against the float64 torch reference (simulator; GPU with -m gpu)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pagedkv.kernels import (
    KernelConfig,
    attention,
    choose_partition_size,
    default_config,
    paged_attention_decode,
    paged_attention_decode_reference,
)
from pagedkv.kernels.testing import device_for_tests, make_paged_case, rel_error, tolerance

DEVICE = device_for_tests()
F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32


def gpu_param(*values, name: str):
    return pytest.param(*values, marks=pytest.mark.gpu, id=f"gpu-{name}")


def edge_lens(bs: int) -> list[int]:
    """1, B-1, B, B+1 and a multiple of B."""
    return sorted({1, max(bs - 1, 1), bs, bs + 1, 2 * bs})


def run_decode(dtype, group, bs, hd, hkv, lens, *, seed=0, **kw):
    case = make_paged_case(
        lens, num_kv_heads=hkv, head_dim=hd, block_size=bs, dtype=dtype, device=DEVICE, seed=seed
    )
    gen = torch.Generator().manual_seed(seed + 1)
    q = torch.randn(len(lens), hkv * group, hd, generator=gen).to(dtype).to(DEVICE)
    out = paged_attention_decode(
        q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, **kw
    )
    ref = paged_attention_decode_reference(
        q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens
    )
    assert out.shape == q.shape and out.dtype == q.dtype
    assert not torch.isnan(ref).any()
    assert not torch.isnan(out).any(), "kernel read a poisoned slot"
    err = rel_error(out, ref)
    assert err < tolerance(dtype), f"relative error {err}"
    return out, ref


DECODE_CASES = [
    # dtype, group, block_size, head_dim, kv_heads
    pytest.param(F32, 1, 8, 16, 2, id="f32-g1-b8"),
    pytest.param(F16, 2, 16, 16, 2, id="f16-g2-b16"),
    pytest.param(BF16, 4, 8, 8, 2, id="bf16-g4-b8"),
    pytest.param(F16, 8, 8, 16, 1, id="f16-g8-b8"),
    pytest.param(F32, 4, 32, 8, 1, id="f32-g4-b32"),
] + [
    gpu_param(dt, g, bs, hd, 8, name=f"{str(dt)[6:]}-g{g}-b{bs}-d{hd}")
    for dt, g, bs, hd in [
        (F16, 1, 16, 128), (F16, 2, 32, 128), (F16, 4, 16, 64), (F16, 8, 32, 128),
        (BF16, 1, 8, 128), (BF16, 8, 16, 128), (F32, 2, 16, 64), (F32, 8, 32, 128),
    ]
]


@pytest.mark.parametrize("dtype, group, bs, hd, hkv", DECODE_CASES)
def test_decode_matches_reference(dtype, group, bs, hd, hkv):
    lens = edge_lens(bs)
    if DEVICE == "cuda":
        lens += [1000, 3000]
    run_decode(dtype, group, bs, hd, hkv, lens)


SPLIT_CASES = [
    # dtype, group, block_size, partition_size
    pytest.param(F16, 2, 8, 8, id="f16-p8"),
    pytest.param(F32, 1, 8, 12, id="f32-p12-not-multiple-of-B"),
    gpu_param(F16, 8, 16, 512, name="f16-g8-p512"),
    gpu_param(BF16, 4, 32, 256, name="bf16-g4-p256"),
]


@pytest.mark.parametrize("dtype, group, bs, part", SPLIT_CASES)
def test_decode_split_k_partition_boundaries(dtype, group, bs, part):
    # lengths around partition boundaries; the length-1 sequence has empty partitions
    lens = [1, part - 1, part, part + 1, 2 * part + 1]
    hd = 128 if DEVICE == "cuda" else 8
    run_decode(dtype, group, bs, hd, 2, lens, partition_size=part, seed=3)


@pytest.mark.parametrize(
    "cfg",
    [KernelConfig(lanes=1, slots=1, unroll=1), KernelConfig(lanes=4, slots=3, unroll=1),
     KernelConfig(lanes=2, slots=2, unroll=3)],
    ids=["l1-s1-u1", "l4-s3-u1", "l2-s2-u3"],
)
def test_decode_thread_layouts(cfg):
    # head_dim 16 in fp16 is 4 eight-byte words: lanes 1, 2 and 4 all divide it
    run_decode(F16, 2, 8, 16, 1, [3, 8, 13], config=cfg, seed=5)


def test_decode_numpy_inputs_and_out():
    case = make_paged_case([5, 9], num_kv_heads=1, head_dim=8, block_size=4, dtype=F32, seed=7)
    q = np.random.default_rng(7).standard_normal((2, 2, 8)).astype(np.float32)
    out = np.full(q.shape, 7.0, dtype=np.float32)
    got = paged_attention_decode(
        q, case.k_cache.numpy(), case.v_cache.numpy(), case.block_tables, case.seq_lens, out=out
    )
    assert got is out
    ref = paged_attention_decode_reference(
        torch.from_numpy(q), case.k_cache, case.v_cache, case.block_tables, case.seq_lens
    )
    assert rel_error(torch.from_numpy(out), ref) < tolerance(F32)


def test_decode_out_of_other_dtype_and_explicit_scale():
    case = make_paged_case([6, 2], num_kv_heads=2, head_dim=8, block_size=4, dtype=F16, seed=8)
    q = torch.randn(2, 4, 8, generator=torch.Generator().manual_seed(8))
    out = torch.empty(2, 4, 8, dtype=torch.float64)
    paged_attention_decode(
        q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, out=out, scale=0.3
    )
    ref = paged_attention_decode_reference(
        q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, scale=0.3
    )
    assert rel_error(out, ref) < tolerance(F32)


def test_decode_automatic_split(monkeypatch):
    # Shrink the minimum partition so the simulator's short sequences split automatically.
    monkeypatch.setattr(attention, "MIN_PARTITION", 4)
    assert choose_partition_size(2, 20, 132, 4) is not None
    compiled = []
    real = attention.attention_kernel

    def spy(*args):
        compiled.append(args[-1])  # the `split` flag
        return real(*args)

    monkeypatch.setattr(attention, "attention_kernel", spy)
    run_decode(F32, 2, 4, 8, 1, [20, 3], seed=9)
    assert compiled == [True]


def test_choose_partition_size():
    assert choose_partition_size(512, 100_000, 132, 16) is None  # grid already full
    assert choose_partition_size(8, 600, 132, 16) is None  # too short to split
    size = choose_partition_size(8, 32_768, 132, 16)
    assert size is not None and size % 16 == 0
    parts = -(-32_768 // size)
    assert 2 <= parts <= 32_768 // attention.MIN_PARTITION
    assert size >= attention.MIN_PARTITION


@pytest.mark.parametrize("group", [1, 8])
@pytest.mark.parametrize("prefill", [False, True], ids=["decode", "prefill"])
def test_gpu_default_layouts_are_valid(monkeypatch, group, prefill):
    from pagedkv.kernels._attention_kernels import check_config

    monkeypatch.setattr(attention, "SIMULATOR", False)
    for kind, eb in (("f16", 2), ("bf16", 2), ("f32", 4)):
        for hd in (64, 128):
            cfg = default_config(hd, group, kind, prefill=prefill)
            check_config(cfg, group, hd, hd * eb // 8)
            assert cfg.threads(group) >= 64
            assert prefill or cfg.q_tile == 1


@pytest.mark.parametrize("group", [1, 8])
def test_gpu_default_layout_runs_in_the_simulator(monkeypatch, group):
    # the layout a GPU would use for head_dim 32 (128 threads a block), on a short sequence
    monkeypatch.setattr(attention, "SIMULATOR", False)
    cfg = default_config(32, group, "f16", prefill=False)
    monkeypatch.setattr(attention, "SIMULATOR", True)
    assert cfg.threads(group) == 128
    run_decode(F16, group, 8, 32, 1, [19, 2], config=cfg, seed=12)
