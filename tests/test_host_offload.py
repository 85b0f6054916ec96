"""Swap out / swap in end to end over KVCacheManager, torch on CPU: KV comes back exactly."""

from __future__ import annotations

import pytest
import torch

from pagedkv.allocator.errors import OutOfBlocks
from pagedkv.engine import KVCacheManager, TransferInFlight
from pagedkv.engine.offload import SwapError, Swapper
from pagedkv.engine.request import EngineRequest
from pagedkv.kernels import KVCachePool

B, NUM_BLOCKS, HEADS, DIM, LAYERS = 4, 9, 2, 8, 3  # block 0 is the manager's null block


def _setup(host_blocks: int = 6):
    m = KVCacheManager(NUM_BLOCKS, B)
    pool = KVCachePool(LAYERS, NUM_BLOCKS, B, HEADS, DIM, torch.float32).fill_(float("nan"))
    host = pool.like(host_blocks).fill_(float("nan"))  # poisoned: unwritten slots stay NaN
    return m, _caches(pool), Swapper(m, pool, host)


def _caches(pool: KVCachePool) -> list[torch.Tensor]:
    """Every layer's K and V cache (views of the pool)."""
    return [c for kv in pool.layers() for c in kv]


def _random(shape, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(shape, generator=g) + 0.5  # never zero


def _admit(m: KVCacheManager, dev, rid: str, n: int, seed: int) -> tuple[EngineRequest, list]:
    req = EngineRequest(rid, list(range(1000 * seed, 1000 * seed + n)))
    assert m.allocate_slots(req, n) is not None
    table = m.get_block_ids(rid)[0]
    for t, kv in enumerate(dev):  # write the request's n positions
        for p in range(n):
            kv[table[p // B], p % B] = _random((HEADS, DIM), seed * 10000 + t * 100 + p)
    req.num_computed_tokens = n
    return req, table


def _kv_of(dev, table, n: int) -> list[torch.Tensor]:
    return [torch.stack([kv[table[p // B], p % B] for p in range(n)]).clone() for kv in dev]


def test_swap_out_recycle_swap_in_exact() -> None:
    m, dev, sw = _setup()
    a, table = _admit(m, dev, "a", 10, 1)
    want = _kv_of(dev, table, 10)
    free_before = m.get_num_free_blocks()
    t = sw.swap_out(a)
    used = t.host_blocks
    # deferred free: the device blocks stay with a, pinned by the stores, until completion
    assert m.get_block_ids("a")[0] == table and m.get_num_free_blocks() == free_before
    assert all(sw.host.device_pinned(d) for d in t.device_blocks)
    with pytest.raises(SwapError):
        sw.swap_in(a)  # a swap in flight
    sw.complete(t)
    assert m.get_block_ids("a")[0] == [] and not any(
        sw.host.device_pinned(d) for d in t.device_blocks)
    # recycle every device block with other KV
    b, _ = _admit(m, dev, "b", (NUM_BLOCKS - 1) * B, 7)
    m.free(b)
    t = sw.swap_in(a)
    sw.complete(t)
    new_table = m.get_block_ids("a")[0]
    got = _kv_of(dev, new_table, 10)
    for w, g in zip(want, got, strict=True):
        assert torch.equal(w, g)
    assert a.num_computed_tokens == 10
    assert sw.host.num_free() == sw.host.num_blocks  # host copies dropped after swap-in
    assert sw.host.check_all() == []
    # the never-written slots (past position 10; host blocks never used) are still NaN
    for kv in dev:
        assert torch.isnan(kv[new_table[2], 10 % B:]).all()
    unused = [h for h in range(sw.host.num_blocks) if h not in used]
    for kv in _caches(sw.host_pool):
        assert torch.isnan(kv[unused]).all()


def test_swap_out_without_host_room_changes_nothing() -> None:
    m, dev, sw = _setup(host_blocks=2)
    a, table = _admit(m, dev, "a", 10, 1)
    before = sw.host.snapshot()
    with pytest.raises(OutOfBlocks):
        sw.swap_out(a)
    assert m.get_block_ids("a")[0] == table
    assert sw.host.snapshot().count == before.count
    assert not sw.is_swapped_out(a)


def test_swap_in_without_device_room_changes_nothing() -> None:
    m, dev, sw = _setup()
    a, _ = _admit(m, dev, "a", 10, 1)
    sw.complete(sw.swap_out(a))
    b, _ = _admit(m, dev, "b", (NUM_BLOCKS - 1) * B, 7)
    free, host_lru = m.get_num_free_blocks(), sw.host.lru_order()
    with pytest.raises(OutOfBlocks):
        sw.swap_in(a)
    assert m.get_num_free_blocks() == free and sw.host.lru_order() == host_lru
    assert m.get_block_ids("a")[0] == [] and sw.is_swapped_out(a)
    m.free(b)
    sw.complete(sw.swap_in(a))
    assert len(m.get_block_ids("a")[0]) == 3


def test_failed_swap_out_keeps_the_request_running() -> None:
    m, dev, sw = _setup()
    a, table = _admit(m, dev, "a", 10, 1)
    sw.complete(sw.swap_out(a), success=False)
    assert m.get_block_ids("a")[0] == table
    assert sw.host.num_free() == sw.host.num_blocks and not sw.is_swapped_out(a)
    with pytest.raises(SwapError):
        sw.swap_in(a)


def test_offloaded_prefix_is_a_host_hit_loaded_not_recomputed() -> None:
    m, dev, sw = _setup()
    a, table = _admit(m, dev, "a", 10, 1)  # blocks 0, 1 are full: two prefix hashes
    want = _kv_of(dev, table, 8)
    t = sw.offload(a)
    assert len(t.host_blocks) == 2 and all(sw.host.device_pinned(d) for d in table[:2])
    sw.complete(t)
    assert [sw.host.lookup(h) is not None for h in a.block_hashes[:2]] == [True, True]
    m.free(a)
    b, _ = _admit(m, dev, "b", (NUM_BLOCKS - 1) * B, 7)  # recycle every device block
    m.free(b)
    c = EngineRequest("c", a.all_token_ids + [5, 6, 7, 8])  # same 10-token prefix, 14 tokens
    t = sw.admit(c)
    assert len(t.host_blocks) == 2 and len(m.get_block_ids("c")[0]) == 2  # the prefix only
    assert t.launch.query_lens.tolist() == [8]  # one launch writes the loaded positions
    assert all(sw.host.state_of(h) == "LOADING" for h in t.host_blocks)
    sw.complete(t)
    assert c.num_computed_tokens == 8
    got = _kv_of(dev, m.get_block_ids("c")[0], 8)
    for w, g in zip(want, got, strict=True):
        assert torch.equal(w, g)
    assert all(sw.host.state_of(h) == "STORED" for h in t.host_blocks)
    assert sw.host.check_all() == []
    assert m.allocate_slots(c, 6) is not None  # the rest, as for a running request
    assert m.publish([c]).query_lens.tolist() == [6]
    with pytest.raises(SwapError):  # nothing cached on either tier for this one
        sw.admit(EngineRequest("d", [77, 78, 79, 80, 81]))


def test_offload_twice_stores_nothing_new() -> None:
    m, dev, sw = _setup()
    a, _ = _admit(m, dev, "a", 10, 1)
    sw.complete(sw.offload(a))
    t = sw.offload(a)
    assert t.host_blocks == []
    sw.complete(t)


def test_second_swap_out_while_one_is_in_flight_refused() -> None:
    m, dev, sw = _setup()
    a, _ = _admit(m, dev, "a", 10, 1)
    t = sw.swap_out(a)
    before = sw.host.snapshot().count
    with pytest.raises(SwapError):
        sw.swap_out(a)
    assert sw.host.snapshot().count == before
    sw.complete(t)
    with pytest.raises(SwapError):
        sw.complete(t)


def test_swap_in_of_evicted_host_kv_refused_and_changes_nothing() -> None:
    # swapped-out blocks are STORED, so host LRU eviction may reclaim them (see the module
    # doc); swap_in must then refuse cleanly rather than load garbage
    m, dev, sw = _setup(host_blocks=3)
    a, _ = _admit(m, dev, "a", 10, 1)
    sw.complete(sw.swap_out(a))
    d, _ = _admit(m, dev, "d", 9, 3)
    sw.complete(sw.offload(d))  # two stores: evicts two of a's swap blocks
    free, lru = m.get_num_free_blocks(), sw.host.lru_order()
    with pytest.raises(SwapError):
        sw.swap_in(a)
    assert m.get_num_free_blocks() == free and sw.host.lru_order() == lru
    assert m.get_block_ids("a")[0] == []


def test_free_while_an_offload_is_in_flight_waits_for_its_completion() -> None:
    m, dev, sw = _setup()
    a, table = _admit(m, dev, "a", 10, 1)
    want = _kv_of(dev, table, 8)
    free_before = m.get_num_free_blocks()
    t = sw.offload(a)
    sw.free(a)  # the request finished while its blocks are being copied to the host
    assert m.get_block_ids("a")[0] == table and m.get_num_free_blocks() == free_before
    b = EngineRequest("b", list(range(5000, 5000 + (NUM_BLOCKS - 1) * B)))
    assert m.allocate_slots(b, (NUM_BLOCKS - 1) * B) is None  # a's blocks are not handed out
    sw.complete(t)
    assert m.get_block_ids("a")[0] == [] and m.get_num_free_blocks() > free_before
    assert sw.host.check_all() == []
    got = [torch.stack([kv[h, p % B] for h in t.host_blocks for p in range(B)])
           for kv in _caches(sw.host_pool)]
    for w, g in zip(want, got, strict=True):  # the copy read a's KV, not another request's
        assert torch.equal(w, g)


def test_free_while_a_swap_out_is_in_flight_drops_the_host_copies_after_it() -> None:
    m, dev, sw = _setup()
    a, table = _admit(m, dev, "a", 10, 1)
    t = sw.swap_out(a)
    sw.free(a)
    assert m.get_block_ids("a")[0] == table
    assert all(sw.host.device_pinned(d) for d in t.device_blocks)
    sw.complete(t)
    assert m.get_block_ids("a")[0] == [] and not sw.is_swapped_out(a)
    assert sw.host.num_free() == sw.host.num_blocks and sw.host.check_all() == []
    sw.free(a)  # a second free is a no-op


def test_free_of_a_swapped_out_request_drops_its_host_copies() -> None:
    m, dev, sw = _setup()
    a, _ = _admit(m, dev, "a", 10, 1)
    sw.complete(sw.swap_out(a))
    assert sw.host.num_free() < sw.host.num_blocks
    sw.free(a)
    assert sw.host.num_free() == sw.host.num_blocks and not sw.is_swapped_out(a)
    with pytest.raises(SwapError):
        sw.swap_in(a)


def _step(m: KVCacheManager, dev, req: EngineRequest, seed: int) -> None:
    """One launch writing the request's positions past its computed ones, then completion."""
    launch = m.publish([req])
    table = m.get_block_ids(req.request_id)[0]
    for t, kv in enumerate(dev):
        for p in range(req.num_computed_tokens, req.num_tokens):
            kv[table[p // B], p % B] = _random((HEADS, DIM), seed * 10000 + t * 100 + p)
    m.complete(launch)
    req.num_computed_tokens = req.num_tokens


def test_swapped_in_blocks_become_prefix_hits_only_once_the_load_completed() -> None:
    """The load is a launch writing the loaded positions: its blocks are hits once it
    completed (not before), and the request's next launch writes only what follows."""
    m, dev, sw = _setup()
    a = EngineRequest("a", list(range(100, 112)))  # three full blocks
    assert m.allocate_slots(a, a.num_tokens) is not None
    _step(m, dev, a, 1)
    want = _kv_of(dev, m.get_block_ids("a")[0], 12)
    sw.complete(sw.swap_out(a))
    b, _ = _admit(m, dev, "b", (NUM_BLOCKS - 1) * B, 7)  # evicts a's cached device blocks
    m.free(b)
    probe = list(range(100, 112)) + [1, 2, 3, 4]
    assert m.get_computed_blocks(EngineRequest("p", probe))[1] == 0
    t = sw.swap_in(a)
    assert len(t.host_blocks) == 3 and t.launch is not None
    assert t.launch.query_lens.tolist() == [12] and not t.launch.completed
    assert m.get_computed_blocks(EngineRequest("q", probe))[1] == 0  # in flight: no hit
    sw.complete(t)
    assert t.launch.completed and a.num_computed_tokens == 12
    hits, n, _ = m.get_computed_blocks(EngineRequest("r", probe))
    assert n == 12 and list(hits.block_ids) == m.get_block_ids("a")[0][:3]
    for w, g in zip(want, _kv_of(dev, list(hits.block_ids), 12), strict=True):
        assert torch.equal(w, g)
    a.append_output_token_ids([9])
    assert m.allocate_slots(a, 1) is not None
    launch = m.publish([a])
    assert launch.query_lens.tolist() == [1]  # the loaded positions are not written again
    m.complete(launch)


def test_free_during_a_swap_in_waits_for_its_load() -> None:
    m, dev, sw = _setup()
    a, _ = _admit(m, dev, "a", 10, 1)
    sw.complete(sw.swap_out(a))
    t = sw.swap_in(a)
    loaded = list(t.device_blocks)
    sw.free(a)  # the load still writes its blocks: none is handed out before it completes
    b = EngineRequest("b", list(range(5000, 5000 + (NUM_BLOCKS - 1) * B)))
    assert m.allocate_slots(b, (NUM_BLOCKS - 1) * B) is None
    assert all(m.allocator.state(d) != 0 for d in loaded)  # not FREE
    sw.complete(t)
    assert m.get_block_ids("a")[0] == [] and sw.host.num_free() == sw.host.num_blocks
    assert m.allocate_slots(b, (NUM_BLOCKS - 1) * B) is not None


def test_manager_free_during_a_swap_out_is_deferred_and_a_launch_is_refused() -> None:
    m, dev, sw = _setup()
    a, table = _admit(m, dev, "a", 10, 1)
    t = sw.swap_out(a)
    assert m.transfers_in_flight(a) == 1
    with pytest.raises(TransferInFlight):  # it would write blocks the stores read
        m.publish([a])
    m.free(a)  # the engine calls the manager directly: still deferred
    assert m.get_block_ids("a")[0] == table
    b = EngineRequest("b", list(range(5000, 5000 + (NUM_BLOCKS - 1) * B)))
    assert m.allocate_slots(b, (NUM_BLOCKS - 1) * B) is None
    sw.complete(t)
    assert m.get_block_ids("a")[0] == [] and m.transfers_in_flight(a) == 0
    assert m.allocate_slots(b, (NUM_BLOCKS - 1) * B) is not None
    with pytest.raises(ValueError):
        m.end_transfer(a)  # none in flight


def test_no_rollback_while_a_copy_of_the_blocks_is_in_flight() -> None:
    m, dev, sw = _setup()
    a, _ = _admit(m, dev, "a", 10, 1)
    assert m.allocate_slots(a, 3) is not None  # positions 10..12: drafts, ids unknown
    launch = m.publish([a])
    a.num_computed_tokens = 13
    m.complete(launch)
    table = m.get_block_ids("a")[0]
    t = sw.offload(a)
    a.num_computed_tokens = 11  # two drafts rejected: a rollback releases and rewinds blocks,
    a.append_output_token_ids([1, 2])  # (the accepted draft and the bonus token)
    with pytest.raises(ValueError, match="still in flight"):  # not while a copy reads them
        m.allocate_slots(a, 1)
    assert m.get_block_ids("a")[0] == table
    sw.complete(t)
    assert m.allocate_slots(a, 1) is not None  # rolled back once the copy completed
    assert m.allocator.num_issued("a") == 11
