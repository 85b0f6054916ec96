"""write_kv (scatter new tokens into the pool) and copy_blocks (copy-on-write block copies)."""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import cuda

from ._backend import (
    KV_KINDS,
    SIMULATOR,
    host_copy,
    index_arg,
    is_torch,
    kv_kind,
    launch,
    on_host,
    same_device,
    stream_for,
    word_view,
)
from ._validate import (
    as_flag,
    check_caches,
    check_index_array,
    check_writable,
    shape_of,
    word_bytes,
)
from .errors import KernelInputError, KernelTypeError

_THREADS = 32 if SIMULATOR else 128


@cuda.jit
def _write_kv_kernel(key, value, k_cache, v_cache, slots, block_size):
    t = cuda.blockIdx.x
    slot = slots[t]
    if slot < 0:  # padding token
        return
    blk = slot // block_size
    off = slot - blk * block_size
    heads = k_cache.shape[2]
    words = k_cache.shape[3]
    for i in range(cuda.threadIdx.x, heads * words, cuda.blockDim.x):
        h = i // words
        w = i - h * words
        k_cache[blk, off, h, w] = key[t, h, w]
        v_cache[blk, off, h, w] = value[t, h, w]


@cuda.jit
def _copy_blocks_kernel(k_cache, v_cache, pairs):
    p = cuda.blockIdx.x
    src = pairs[p, 0]
    dst = pairs[p, 1]
    n = k_cache.shape[1]
    for i in range(cuda.threadIdx.x, n, cuda.blockDim.x):
        k_cache[dst, i] = k_cache[src, i]
        v_cache[dst, i] = v_cache[src, i]


def _contiguous(x: Any) -> Any:
    if is_torch(x):
        return x.contiguous()
    return np.ascontiguousarray(x)


def check_slots(slots: np.ndarray, num_slots: int) -> None:
    """A host slot mapping: every slot below ``num_slots`` and none given to two tokens
    (negative slots are padding)."""
    if not len(slots):
        return
    top = int(slots.max())
    if top >= num_slots:
        raise KernelInputError(f"slot {top} out of range: the pool has {num_slots} slots")
    real = slots[slots >= 0]
    if len(np.unique(real)) != len(real):  # which token would win is undefined
        u, c = np.unique(real, return_counts=True)
        raise KernelInputError(f"slot {int(u[c > 1][0])} is given to several tokens")


def write_kv(
    key: Any,
    value: Any,
    k_cache: Any,
    v_cache: Any,
    slot_mapping: Any,
    *,
    check: bool | None = None,
) -> None:
    """Scatter ``key``/``value`` ``[num_tokens, kv_heads, head_dim]`` into the caches.

    Token ``i`` goes to ``slot_mapping[i] = block * block_size + offset``; a negative slot is
    padding and is skipped. Checked, a slot ``>= num_blocks * block_size`` or a slot given to
    two tokens raises ``KernelInputError`` before anything is written. ``check=None`` (the
    default) checks a slot mapping in host memory and does not copy one on a GPU back to the
    host (no synchronisation): check the step's host metadata once instead, before it moves to
    the device (``step_inputs``). ``check=True`` always checks (a device-to-host copy when
    the mapping is on a GPU); ``check=False`` never does.
    """
    (nb, bs, hkv, d), kind = check_caches(k_cache, v_cache)
    check_writable("k_cache", k_cache)
    check_writable("v_cache", v_cache)
    check_index_array("slot_mapping", slot_mapping, 1)
    check = on_host(slot_mapping) if check is None else as_flag("check", check)
    for name, x in (("key", key), ("value", value)):
        if not (isinstance(x, np.ndarray) or is_torch(x)):
            raise KernelTypeError(f"{name} must be a numpy array or a torch tensor")
        if kv_kind(name, x) != kind:
            raise KernelTypeError(f"{name} dtype {x.dtype} differs from the cache's")
        if len(x.shape) != 3 or shape_of(x)[1:] != (hkv, d):
            raise KernelInputError(f"{name} must be [num_tokens, {hkv}, {d}], got {shape_of(x)}")
    n = shape_of(key)[0]
    if shape_of(value)[0] != n or shape_of(slot_mapping)[0] != n:
        raise KernelInputError(
            f"key, value and slot_mapping disagree on num_tokens: {shape_of(key)[0]}, "
            f"{shape_of(value)[0]}, {shape_of(slot_mapping)[0]}"
        )
    same_device([("key", key), ("value", value), ("k_cache", k_cache), ("v_cache", v_cache)])
    if check and n:
        check_slots(host_copy(slot_mapping), nb * bs)
    if n == 0:
        return
    wb = word_bytes(d, KV_KINDS[kind])
    slots = index_arg(slot_mapping, k_cache, "int64")
    launch(
        _write_kv_kernel, n, _THREADS, stream_for(k_cache),
        word_view(_contiguous(key), wb),
        word_view(_contiguous(value), wb),
        word_view(k_cache, wb),
        word_view(v_cache, wb),
        slots,
        bs,
    )


def copy_blocks(k_cache: Any, v_cache: Any, pairs: Any) -> None:
    """Copy whole blocks ``pairs[i] = (src, dst)`` (int ``[k, 2]``) in both caches.

    These are the allocator's copy-on-write copies, to run before the launch that needs them.
    Ids must lie in ``[0, num_blocks)``; destinations must be distinct and never a source
    (otherwise the result would depend on the order of the copies).
    """
    (nb, bs, hkv, d), kind = check_caches(k_cache, v_cache)
    check_writable("k_cache", k_cache)
    check_writable("v_cache", v_cache)
    check_index_array("pairs", pairs, 2)
    if shape_of(pairs)[1] != 2:
        raise KernelInputError(f"pairs must be [k, 2] (src, dst), got {shape_of(pairs)}")
    same_device([("k_cache", k_cache), ("v_cache", v_cache)])
    hp = host_copy(pairs).astype(np.int64)
    if hp.shape[0] == 0:
        return
    if hp.min() < 0 or hp.max() >= nb:
        raise KernelInputError(f"block ids in pairs must lie in [0, {nb}), got {hp.tolist()}")
    src, dst = hp[:, 0], hp[:, 1]
    if len(np.unique(dst)) != len(dst):
        raise KernelInputError(f"duplicate destination blocks in pairs {hp.tolist()}")
    if np.intersect1d(src, dst).size:
        raise KernelInputError(f"a destination block is also a source in pairs {hp.tolist()}")
    wb = word_bytes(d, KV_KINDS[kind])
    words = bs * hkv * d * KV_KINDS[kind] // wb
    kw = word_view(k_cache, wb).reshape(nb, words)
    vw = word_view(v_cache, wb).reshape(nb, words)
    dev_pairs = index_arg(hp, k_cache, "int32")
    launch(_copy_blocks_kernel, hp.shape[0], _THREADS, stream_for(k_cache), kw, vw, dev_pairs)
