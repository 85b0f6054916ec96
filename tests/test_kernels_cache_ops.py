"""KVCachePool, write_kv and copy_blocks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pagedkv.kernels import (
    KernelInputError,
    KernelTypeError,
    KVCachePool,
    copy_blocks,
    copy_blocks_reference,
    write_kv,
    write_kv_reference,
)
from pagedkv.kernels.testing import device_for_tests

DEVICE = device_for_tests()
DTYPES = [
    pytest.param(torch.float16, id="f16"),
    pytest.param(torch.float32, id="f32"),
    pytest.param(torch.bfloat16, id="bf16"),
    pytest.param(torch.float16, marks=pytest.mark.gpu, id="gpu-f16"),
    pytest.param(torch.bfloat16, marks=pytest.mark.gpu, id="gpu-bf16"),
]


def nan_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num()))


def test_pool_geometry_and_layers():
    pool = KVCachePool(3, 10, 16, 2, 8, torch.float16, device=DEVICE)
    assert (pool.num_blocks, pool.block_size) == (10, 16)
    assert pool.bytes_per_block == 3 * 2 * 16 * 2 * 8 * 2
    assert pool.reserved_bytes == 10 * pool.bytes_per_block
    k0, v0 = pool.layer(0)
    k2, v2 = pool.layer(2)
    assert k0.shape == (10, 16, 2, 8) and k0.is_contiguous() and v2.is_contiguous()
    pool.fill_(float("nan"))
    assert torch.isnan(k0).all() and torch.isnan(v2).all()
    pool.fill_(0.0).fill_blocks_([4], 1.0)
    for k, v in pool.layers():
        assert (k[4] == 1).all() and (v[4] == 1).all() and (k[3] == 0).all()
    assert k2.data_ptr() != k0.data_ptr()


@pytest.mark.parametrize(
    "args, err",
    [
        ((0, 4, 8, 1, 8), KernelInputError),
        ((1, 4, -8, 1, 8), KernelInputError),
        ((1, 4.0, 8, 1, 8), KernelTypeError),
    ],
)
def test_pool_rejects_bad_geometry(args, err):
    with pytest.raises(err):
        KVCachePool(*args, torch.float16)


def test_pool_rejects_bad_dtype_and_layer():
    with pytest.raises(KernelTypeError):
        KVCachePool(1, 4, 8, 1, 8, torch.int8)
    pool = KVCachePool(2, 4, 8, 1, 8, "bf16")
    assert pool.dtype == torch.bfloat16
    with pytest.raises(KernelInputError):
        pool.layer(2)
    with pytest.raises(KernelInputError):
        pool.fill_blocks_([4], 0.0)


def _caches(dtype, nb=6, bs=4, h=2, d=8):
    k = torch.full((nb, bs, h, d), float("nan"), dtype=dtype, device=DEVICE)
    return k, k.clone()


@pytest.mark.parametrize("dtype", DTYPES)
def test_write_kv_matches_reference_and_skips_padding(dtype):
    k, v = _caches(dtype)
    gen = torch.Generator().manual_seed(0)
    key = torch.randn(7, 2, 8, generator=gen).to(dtype).to(DEVICE)
    val = torch.randn(7, 2, 8, generator=gen).to(dtype).to(DEVICE)
    slots = np.array([5, -1, 0, 23, 9, -1, 12], dtype=np.int64)
    write_kv(key, val, k, v, slots)
    rk, rv = _caches(dtype)
    write_kv_reference(key, val, rk, rv, slots)
    assert nan_equal(k, rk) and nan_equal(v, rv)
    # padding tokens wrote nothing: exactly 5 slots are filled
    filled = (~k.isnan()).all(dim=(-1, -2)).sum().item()
    assert filled == 5


def test_write_kv_out_of_range_slot_changes_nothing():
    k, v = _caches(torch.float16)
    key = torch.randn(2, 2, 8).half().to(DEVICE)
    with pytest.raises(KernelInputError, match="out of range"):
        write_kv(key, key, k, v, np.array([0, 24]))
    assert k.isnan().all() and v.isnan().all()


def test_write_kv_rejects_mismatched_inputs():
    k, v = _caches(torch.float16)
    key = torch.randn(2, 2, 8).half()
    with pytest.raises(KernelTypeError):
        write_kv(key.float(), key, k, v, np.array([0, 1]))
    with pytest.raises(KernelInputError):
        write_kv(key[:, :1], key[:, :1], k, v, np.array([0, 1]))
    with pytest.raises(KernelInputError):
        write_kv(key, key, k, v, np.array([0, 1, 2]))
    with pytest.raises(KernelTypeError):
        write_kv(key, key, k, v, np.array([0.0, 1.0]))
    with pytest.raises(KernelTypeError):
        write_kv(key.tolist(), key, k, v, np.array([0, 1]))
    assert k.isnan().all()


def test_write_kv_numpy_caches():
    k = np.full((3, 4, 1, 4), np.nan, dtype=np.float32)
    v = k.copy()
    key = np.arange(8, dtype=np.float32).reshape(2, 1, 4) + 1
    write_kv(key, -key, k, v, np.array([6, 1]))
    assert (k[1, 2, 0] == key[0, 0]).all() and (v[0, 1, 0] == -key[1, 0]).all()
    assert np.isnan(k).sum() == k.size - 8


@pytest.mark.parametrize("dtype", DTYPES)
def test_copy_blocks_matches_reference(dtype):
    gen = torch.Generator().manual_seed(1)
    k = torch.randn(6, 4, 2, 8, generator=gen).to(dtype).to(DEVICE)
    v = torch.randn(6, 4, 2, 8, generator=gen).to(dtype).to(DEVICE)
    rk, rv = k.clone(), v.clone()
    pairs = np.array([[1, 4], [1, 5], [0, 2]], dtype=np.int32)
    copy_blocks(k, v, pairs)
    copy_blocks_reference(rk, rv, pairs)
    assert torch.equal(k, rk) and torch.equal(v, rv)
    assert torch.equal(k[4], k[1]) and not torch.equal(k[3], k[1])


@pytest.mark.parametrize(
    "pairs", [[[0, 6]], [[-1, 2]], [[0, 2], [1, 2]], [[0, 2], [2, 3]]],
    ids=["dst-out-of-range", "negative-src", "duplicate-dst", "dst-is-a-src"],
)
def test_copy_blocks_rejects_bad_pairs(pairs):
    k = torch.randn(6, 4, 2, 8).half()
    v = k.clone()
    before = k.clone()
    with pytest.raises(KernelInputError):
        copy_blocks(k, v, np.array(pairs, dtype=np.int32))
    assert torch.equal(k, before)


def test_copy_blocks_rejects_bad_shape_and_empty_is_noop():
    k = torch.randn(6, 4, 2, 8).half()
    v = k.clone()
    with pytest.raises(KernelInputError):
        copy_blocks(k, v, np.array([0, 1, 2], dtype=np.int32).reshape(1, 3))
    before = k.clone()
    copy_blocks(k, v, np.zeros((0, 2), dtype=np.int32))
    assert torch.equal(k, before)


def test_pool_copy_blocks_all_layers():
    pool = KVCachePool(2, 4, 2, 1, 4, torch.float32)
    for i, (k, v) in enumerate(pool.layers()):
        k.copy_(torch.arange(k.numel()).reshape(k.shape) + 100 * i)
        v.copy_(-k)
    pool.copy_blocks(np.array([[3, 0]], dtype=np.int32))
    for k, v in pool.layers():
        assert torch.equal(k[0], k[3]) and torch.equal(v[0], v[3])
        assert not torch.equal(k[1], k[3])


@pytest.mark.parametrize("dtype", DTYPES)
def test_transfer_blocks_to_a_host_pool_and_back(dtype):
    g = torch.Generator().manual_seed(11)
    dev = KVCachePool(2, 8, 4, 2, 8, dtype, device=DEVICE).fill_(float("nan"))
    for k, v in dev.layers():
        for c in (k, v):
            c[:] = (torch.rand(c.shape, generator=g) + 0.5).to(dtype)
    want = dev._storage.clone()
    host = dev.like(5, pin_memory=False).fill_(float("nan"))
    assert host.device.type == "cpu" and host.block_shape == dev.block_shape
    dev.transfer_blocks(host, [6, 1, 3], [4, 0, 2])
    for i, (hk, hv) in enumerate(host.layers()):
        dk, dv = dev.layer(i)
        for src, dst in ((6, 4), (1, 0), (3, 2)):
            assert torch.equal(hk[dst], dk[src].cpu()) and torch.equal(hv[dst], dv[src].cpu())
        assert torch.isnan(hk[[1, 3]]).all() and torch.isnan(hv[[1, 3]]).all()  # untouched
    dev.fill_blocks_([6, 1, 3], float("nan"))
    host.transfer_blocks(dev, [4, 0, 2], [6, 1, 3])  # back into the same slots
    assert nan_equal(dev._storage, want)


def test_transfer_blocks_refuses_bad_input_and_changes_nothing():
    dev = KVCachePool(2, 8, 4, 2, 8, torch.float32).fill_(1.5)
    host = dev.like(4).fill_(float("nan"))
    before = host._storage.clone()
    bad = [
        ((object(), [0], [0]), KernelTypeError),
        ((host, [0, 1], [0]), KernelInputError),  # one destination per source
        ((host, [0, 1], [2, 2]), KernelInputError),  # a destination twice
        ((host, [8], [0]), KernelInputError),  # source out of range
        ((host, [0], [4]), KernelInputError),  # destination out of range
        ((host, [0.5], [0]), KernelTypeError),
        ((KVCachePool(1, 4, 4, 2, 8, torch.float32), [0], [0]), KernelInputError),  # layers
        ((KVCachePool(2, 4, 4, 2, 8, torch.float16), [0], [0]), KernelInputError),  # dtype
        ((KVCachePool(2, 4, 2, 2, 8, torch.float32), [0], [0]), KernelInputError),  # shape
    ]
    for (dst, src_ids, dst_ids), err in bad:
        with pytest.raises(err):
            dev.transfer_blocks(dst, src_ids, dst_ids)
    assert nan_equal(host._storage, before)
    with pytest.raises(KernelTypeError):
        dev.transfer_blocks(host, [0], [0], non_blocking=1)
    dev.transfer_blocks(host, [], [])
    assert nan_equal(host._storage, before)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_pinned_host_pool_needs_cuda():
    from pagedkv.kernels import KernelDeviceError

    with pytest.raises(KernelDeviceError):
        KVCachePool(1, 4, 4, 1, 8, torch.float32, pin_memory=True)
    assert KVCachePool(1, 4, 4, 1, 8, torch.float32).like(2).pin_memory is False
