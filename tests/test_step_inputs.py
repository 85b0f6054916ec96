"""step_inputs: a launch's host metadata checked once per step and moved to the device; the
per-layer calls then copy nothing back to the host."""

from __future__ import annotations

import numpy as np
import pytest

import pagedkv.kernels.cache_ops as cache_ops
from pagedkv.allocator import BlockAllocator
from pagedkv.kernels import (
    KernelInputError,
    KernelTypeError,
    StaleTableError,
    step_inputs,
    write_kv,
)


def _cache(num_blocks: int, block_size: int = 4) -> np.ndarray:
    return np.full((num_blocks, block_size, 1, 4), np.nan, np.float32)


def _launched(num_blocks: int = 8, block_size: int = 4):
    a = BlockAllocator(num_blocks, block_size)
    a.add_request("a", list(range(10)))
    a.add_request("b", list(range(20, 25)))
    a.allocate("a", 10)
    a.allocate("b", 5)
    return a, a.publish(["a", "b"])


def test_step_inputs_carry_the_launch_arrays():
    a, launch = _launched()
    inp = step_inputs(launch, _cache(8), block_generations=a.block_generations())
    assert np.array_equal(inp.block_tables, launch.block_tables)
    assert inp.block_tables.dtype == np.int32 and inp.slot_mapping.dtype == np.int64
    assert np.array_equal(inp.seq_lens, launch.seq_lens)
    assert np.array_equal(inp.slot_mapping, launch.slot_mapping)
    assert inp.query_lens.tolist() == [10, 5] and inp.max_seq_len == 10


def test_step_inputs_refuse_before_any_transfer():
    a, launch = _launched()
    with pytest.raises(KernelInputError, match="slot"):  # the cache is smaller than the pool
        step_inputs(launch, _cache(3))
    with pytest.raises(KernelInputError, match="block size"):
        step_inputs(launch, _cache(8, block_size=2))
    with pytest.raises(KernelTypeError):
        step_inputs(object(), _cache(8))
    launch.complete()
    a.free("a")  # a's blocks are reclaimed: the launch's tables are stale now
    a.add_request("c", list(range(40, 52)))
    a.allocate("c", 12)
    with pytest.raises(StaleTableError):
        step_inputs(launch, _cache(8), block_generations=a.block_generations())


def test_write_kv_default_copies_no_device_mapping_back(monkeypatch):
    """With a slot mapping that is not in host memory, the default check does not read it
    (no device-to-host copy); check=True does. (No GPU here: the mapping is declared to be on
    a device, and any host copy of it fails the test.)"""
    _, launch = _launched()
    k = np.random.default_rng(0).standard_normal((15, 1, 4)).astype(np.float32)
    kc, vc = _cache(8), _cache(8)

    def no_host_copy(x):
        raise AssertionError("the slot mapping was copied to the host")

    monkeypatch.setattr(cache_ops, "on_host", lambda x: False)
    monkeypatch.setattr(cache_ops, "host_copy", no_host_copy)
    write_kv(k, -k, kc, vc, launch.slot_mapping)
    b, o = divmod(int(launch.slot_mapping[3]), 4)
    assert np.array_equal(kc[b, o], k[3])
    with pytest.raises(AssertionError, match="copied to the host"):
        write_kv(k, -k, kc, vc, launch.slot_mapping, check=True)
    monkeypatch.undo()
    bad = launch.slot_mapping.copy()
    bad[1] = bad[0]
    with pytest.raises(KernelInputError, match="several tokens"):  # host mapping: checked
        write_kv(k, -k, kc, vc, bad)
