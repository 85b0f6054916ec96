"""Unit tests of pagedkv.engine: the vLLM-shaped KVCacheManager front door."""

from __future__ import annotations

import inspect
import random
from typing import Any

import numpy as np
import pytest

from pagedkv.allocator import LaunchAlreadyCompleted
from pagedkv.engine import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    CachedHashSet,
    EngineRequest,
    KVCacheBlocks,
    KVCacheManager,
    PrefixCacheStats,
    RequestStatus,
)
from pagedkv.engine import driver as pk_driver
from pagedkv.spec import ISSUED

B = 4


def mgr(num_blocks: int = 16, **kw: Any) -> KVCacheManager:
    return KVCacheManager(num_blocks, B, **kw)


def admit(m: KVCacheManager, req: EngineRequest, n: int | None = None, **kw: Any) -> Any:
    """The scheduler's admission: lookup, allocate_slots with the hit; RUNNING on success."""
    blocks, hits, boundary = m.get_computed_blocks(req)
    assert boundary == 0
    n = req.num_tokens - hits if n is None else n
    new = m.allocate_slots(req, n, hits, blocks, **kw)
    if new is not None:
        req.status = RequestStatus.RUNNING
        req.num_computed_tokens = hits
    return new, hits


def run_step(m: KVCacheManager, reqs: list[EngineRequest], complete: bool = True) -> Any:
    """Publish the requests' allocated positions as one launch; optionally complete it."""
    launch = m.publish(reqs)
    for r in reqs:
        r.num_computed_tokens = m.allocator.num_reserved(r.request_id)
    if complete:
        m.complete(launch)
    return launch


def snapshot(m: KVCacheManager, *reqs: EngineRequest) -> Any:
    pool = m.allocator.pool
    return (m.stats(), m.usage, m.get_num_free_blocks(), dict(pool.hmap), pool.queue.order(),
            list(pool.state), list(pool.ref), [m.get_block_ids(r.request_id) for r in reqs],
            m.allocator.requests)


# ---- the public interface, pinned --------------------------------------------------------
EXPECTED_SIGNATURES = {
    "KVCacheManager.__init__": (
        "(self, num_blocks: 'int', block_size: 'int', enable_caching: 'bool' = True, "
        "checked: 'bool' = True, *, log_stats: 'bool' = True, "
        "enable_kv_cache_events: 'bool' = False, watermark: 'float' = 0.0, "
        "null_block: 'bool' = True, spec: 'RequestSpec | None' = None) -> 'None'"),
    "KVCacheManager.get_computed_blocks": (
        "(self, request: 'EngineRequest', max_cache_hit_length: 'int | None' = None) "
        "-> 'tuple[KVCacheBlocks, int, int]'"),
    "KVCacheManager.allocate_slots": (
        "(self, request: 'EngineRequest', num_new_tokens: 'int', "
        "num_new_computed_tokens: 'int' = 0, new_computed_blocks: 'KVCacheBlocks | None' = "
        "None, num_lookahead_tokens: 'int' = 0, num_external_computed_tokens: 'int' = 0, "
        "delay_cache_blocks: 'bool' = False, num_encoder_tokens: 'int' = 0, "
        "full_sequence_must_fit: 'bool' = False, reserved_blocks: 'int' = 0, "
        "has_scheduled_reqs: 'bool' = True, skip_zeroing_group_ids: 'tuple[int, ...]' = ()) "
        "-> 'KVCacheBlocks | None'"),
    "KVCacheManager.free": "(self, request: 'EngineRequest') -> 'None'",
    "KVCacheManager.preempt": "(self, request: 'EngineRequest') -> 'None'",
    "KVCacheManager.append_token": (
        "(self, request: 'EngineRequest', token_id: 'int') -> 'None'"),
    "KVCacheManager.allocate_slots_many": (
        "(self, requests: 'Sequence[EngineRequest]', num_new_tokens: 'Sequence[int]', *, "
        "num_lookahead_tokens: 'int' = 0) -> 'list[KVCacheBlocks]'"),
    "KVCacheManager.append_token_many": (
        "(self, requests: 'Sequence[EngineRequest]', token_ids: 'Sequence[int]') -> 'None'"),
    "KVCacheManager.publish": "(self, requests: 'Sequence[EngineRequest]') -> 'Launch'",
    "KVCacheManager.complete": "(self, launch: 'Launch') -> 'None'",
    "KVCacheManager.poll": "(self) -> 'int'",
    "KVCacheManager.new_step_starts": "(self) -> 'None'",
    "KVCacheManager.cache_blocks": (
        "(self, request: 'EngineRequest', num_computed_tokens: 'int') -> 'None'"),
    "KVCacheManager.record_prefix_cache_stats": (
        "(self, request: 'EngineRequest', num_hits: 'int') -> 'None'"),
    "KVCacheManager.make_prefix_cache_stats": "(self) -> 'PrefixCacheStats | None'",
    "KVCacheManager.reset_prefix_cache": "(self) -> 'bool'",
    "KVCacheManager.take_events": "(self) -> 'list[KVCacheEvent]'",
    "KVCacheManager.get_blocks": "(self, request_id: 'Hashable') -> 'KVCacheBlocks'",
    "KVCacheManager.get_block_ids": (
        "(self, request_id: 'Hashable') -> 'tuple[list[int], ...]'"),
    "KVCacheManager.get_num_common_prefix_blocks": (
        "(self, running_request_id: 'Hashable') -> 'list[int]'"),
    "KVCacheManager.get_num_free_blocks": "(self) -> 'int'",
    "KVCacheManager.stats": "(self) -> 'dict[str, int]'",
    "KVCacheManager.begin_transfer": "(self, request: 'EngineRequest') -> 'None'",
    "KVCacheManager.end_transfer": "(self, request: 'EngineRequest') -> 'None'",
    "KVCacheManager.transfers_in_flight": "(self, request: 'EngineRequest') -> 'int'",
    "EngineRequest.__init__": (
        "(self, request_id: 'Hashable', prompt_token_ids: 'Sequence[int]', *, "
        "cache_salt: 'str | bytes | None' = None, extra_keys: 'Iterable[str | int | bytes]' "
        "= (), lora_name: 'str | None' = None, lora_id: 'int | None' = None, "
        "output_token_ids: 'Sequence[int]' = ()) -> 'None'"),
    "EngineRequest.append_output_token_ids": (
        "(self, token_ids: 'int | Sequence[int]') -> 'None'"),
    "KVCacheBlocks.get_block_ids": (
        "(self, allow_none: 'bool' = False) -> 'tuple[list[int], ...] | None'"),
    "PrefixCacheStats.record": (
        "(self, num_tokens: 'int', num_hits: 'int', preempted: 'bool') -> 'None'"),
    "KVCacheBlocks.__init__": "(self, block_ids: 'tuple[int, ...]' = ()) -> None",
    "PrefixCacheStats.__init__": (
        "(self, reset: 'bool' = False, requests: 'int' = 0, queries: 'int' = 0, "
        "hits: 'int' = 0, preempted_requests: 'int' = 0, preempted_queries: 'int' = 0, "
        "preempted_hits: 'int' = 0) -> None"),
    "CachedHashSet.__init__": "(self) -> 'None'",
    "CachedHashSet.apply": (
        "(self, events: 'Iterable[KVCacheEvent]') -> 'CachedHashSet'"),
}
EXPECTED_PROPERTIES = {
    "KVCacheManager": {"allocator", "num_usable_blocks", "usage"},
    "EngineRequest": {"all_token_ids", "prompt_token_ids", "output_token_ids", "num_tokens",
                      "num_prompt_tokens", "num_output_tokens", "hash_keys"},
}


def _public_methods(cls: type) -> set[str]:
    return {n for n, f in vars(cls).items()
            if (not n.startswith("_") or n == "__init__") and inspect.isfunction(f)}


@pytest.mark.parametrize("cls", [KVCacheManager, EngineRequest, KVCacheBlocks, PrefixCacheStats,
                                 CachedHashSet])
def test_public_interface_is_pinned(cls: type) -> None:
    name = cls.__name__
    pinned = {k.split(".")[1] for k in EXPECTED_SIGNATURES if k.startswith(name + ".")}
    methods = _public_methods(cls)
    assert methods == pinned, f"{name}: public methods changed: {sorted(methods ^ pinned)}"
    for m in pinned:
        got = str(inspect.signature(getattr(cls, m)))
        assert got == EXPECTED_SIGNATURES[f"{name}.{m}"], f"{name}.{m}{got}"
    props = {n for n, f in vars(cls).items() if isinstance(f, property)}
    assert props == EXPECTED_PROPERTIES.get(name, set())


def test_usage_counts_held_blocks_over_usable_and_block_0_is_null() -> None:
    m = mgr(9)  # 8 usable
    assert m.usage == 0.0 and m.get_num_free_blocks() == 8 and m.num_usable_blocks == 8
    a = EngineRequest("a", range(10))  # 3 blocks
    new, _ = admit(m, a)
    assert 0 not in new.block_ids and len(new.block_ids) == 3
    assert m.usage == pytest.approx(3 / 8) and m.get_num_free_blocks() == 5
    b = EngineRequest("b", range(100, 120))  # 5 blocks: the pool is full
    new_b, _ = admit(m, b)
    assert m.usage == 1.0 and 0 not in new_b.block_ids
    m.free(a)
    assert m.usage == pytest.approx(5 / 8)
    whole = KVCacheManager(8, B, null_block=False)
    new, _ = admit(whole, EngineRequest("c", range(32)))
    assert sorted(new.block_ids) == list(range(8)) and whole.usage == 1.0


def test_failed_allocation_returns_none_and_changes_nothing() -> None:
    m = mgr(6, enable_kv_cache_events=True)  # 5 usable
    a = EngineRequest("a", range(12))
    admit(m, a)
    run_step(m, [a])
    m.append_token(a, 7)
    m.take_events()
    big = EngineRequest("big", range(50, 70))  # 5 blocks, 2 free
    before = snapshot(m, a, big)
    assert admit(m, big)[0] is None
    assert m.allocate_slots(a, 20) is None  # running request, 5 more blocks
    assert snapshot(m, a, big) == before and m.take_events() == []
    # the whole sequence must fit with full_sequence_must_fit, not just the first chunk
    c = EngineRequest("c", range(80, 92))  # 3 blocks
    assert admit(m, c, n=4, full_sequence_must_fit=True)[0] is None
    assert snapshot(m, a, big) == before
    new, _ = admit(m, c, n=4)  # the first chunk alone fits
    assert len(new.block_ids) == 1


def test_watermark_and_reserved_blocks_keep_blocks_back() -> None:
    m = KVCacheManager(11, B, watermark=0.2)  # 10 usable, watermark 2 blocks
    a = EngineRequest("a", range(4))
    admit(m, a)
    b = EngineRequest("b", range(100, 132))  # 8 blocks: 9 free, 8 + 2 > 9
    assert admit(m, b, has_scheduled_reqs=True)[0] is None
    assert admit(m, b, has_scheduled_reqs=False)[0] is not None
    m.free(b)
    b2 = EngineRequest("b2", range(100, 132))
    assert admit(m, b2, reserved_blocks=2, has_scheduled_reqs=False)[0] is None
    assert admit(m, b2, reserved_blocks=1, has_scheduled_reqs=False)[0] is not None


def test_hits_only_after_the_writing_launch_completed() -> None:
    m = mgr()
    a = EngineRequest("a", range(13))  # 3 full blocks
    admit(m, a)
    launch = run_step(m, [a], complete=False)
    twin = EngineRequest("twin", range(13))
    assert m.get_computed_blocks(twin)[1] == 0  # KV not written yet: no hit
    m.complete(launch)
    blocks, hits, _ = m.get_computed_blocks(twin)
    assert hits == 12 and blocks.block_ids == tuple(m.get_block_ids("a")[0][:3])
    with pytest.raises(LaunchAlreadyCompleted):
        m.complete(launch)


def test_recorded_event_completes_at_the_next_call() -> None:
    class Event:
        done = False

        def query(self) -> bool:
            return self.done

    m = mgr()
    a = EngineRequest("a", range(9))
    admit(m, a)
    launch = run_step(m, [a], complete=False)
    ev = Event()
    launch.record(ev)
    b = EngineRequest("b", range(9))
    assert m.get_computed_blocks(b)[1] == 0 and m.poll() == 1
    ev.done = True
    assert m.get_computed_blocks(b)[1] == 8 and m.poll() == 0 and launch.completed


def test_out_of_order_completion_commits_only_a_written_prefix() -> None:
    m = mgr()
    a = EngineRequest("a", range(6))
    admit(m, a, n=3)
    first = run_step(m, [a], complete=False)  # positions 0..2
    m.allocate_slots(a, 3)
    second = run_step(m, [a], complete=False)  # positions 3..5
    m.complete(second)
    assert m.allocator.num_computed("a") == 0  # position 0..2 are not written yet
    assert m.get_computed_blocks(EngineRequest("x", range(6)))[1] == 0
    m.complete(first)
    assert m.allocator.num_computed("a") == 6
    assert m.get_computed_blocks(EngineRequest("y", range(6)))[1] == 4


def test_in_order_completion_while_a_later_launch_writes_the_same_block() -> None:
    m = mgr()
    a = EngineRequest("a", range(10))
    admit(m, a, n=3)
    first = run_step(m, [a], complete=False)  # positions 0..2 of block 0
    m.allocate_slots(a, 6)
    second = run_step(m, [a], complete=False)  # positions 3..8: block 0 again, block 1, 2
    m.complete(first)  # block 0 still has a pending write: commit only whole blocks
    assert m.allocator.num_computed("a") == 0
    m.complete(second)
    assert m.allocator.num_computed("a") == 9
    assert m.get_computed_blocks(EngineRequest("y", range(10)))[1] == 8


def test_a_freed_request_launch_does_not_commit_its_next_incarnation() -> None:
    m = mgr()
    a = EngineRequest("a", range(9))
    admit(m, a)
    launch = run_step(m, [a], complete=False)
    m.preempt(a)
    assert a.status == RequestStatus.PREEMPTED and a.num_computed_tokens == 0
    assert a.num_preemptions == 1
    new, hits = admit(m, a)
    assert hits == 0 and new is not None
    m.complete(launch)  # wrote the old incarnation's blocks, which were reclaimed
    assert m.allocator.num_computed("a") == 0 and not m.allocator.pool.hmap
    assert m.stats()["reclaimed_waiting"] == 0


def test_stale_lookup_is_refused_and_missing_lookup_is_an_error() -> None:
    m = mgr(6)  # 5 usable
    a = EngineRequest("a", range(9))
    admit(m, a)
    run_step(m, [a])
    m.free(a)  # its 2 full blocks stay cached
    b = EngineRequest("b", range(9))
    blocks, hits, _ = m.get_computed_blocks(b)
    assert hits == 8
    filler = EngineRequest("f", range(100, 120))  # takes all 5 blocks: evicts the cache
    admit(m, filler)
    before = snapshot(m, b, filler)
    assert m.allocate_slots(b, 1, hits, blocks) is None  # stale: nothing changed
    assert snapshot(m, b, filler) == before
    m.free(filler)
    c = EngineRequest("c", range(9))
    admit(m, c)
    run_step(m, [c])
    m.free(c)
    d = EngineRequest("d", range(9))
    with pytest.raises(ValueError, match="get_computed_blocks"):
        m.allocate_slots(d, 9)  # the first allocation takes the hits: pass the lookup
    e = EngineRequest("e", range(40))  # more than the pool holds: refused, but no lookup
    with pytest.raises(ValueError, match="get_computed_blocks"):  # passed: an error first
        m.allocate_slots(e, 40)


def test_lookups_that_went_stale_with_room_to_spare_are_refused() -> None:
    m = mgr(16)
    a = EngineRequest("a", range(9))
    admit(m, a)
    launch = run_step(m, [a], complete=False)
    b = EngineRequest("b", range(9))
    blocks, hits, _ = m.get_computed_blocks(b)
    assert hits == 0
    launch.complete()  # completed elsewhere (another thread): a's blocks become hits
    assert m.poll() == 0
    before = snapshot(m, a, b)
    assert m.allocate_slots(b, 9, hits, blocks) is None  # stale: the hit grew
    assert snapshot(m, a, b) == before
    blocks, hits, _ = m.get_computed_blocks(b)
    assert hits == 8
    m.free(a)
    filler = EngineRequest("f", range(100, 160))  # 15 blocks: evicts a's cached blocks
    admit(m, filler)
    m.free(filler)
    assert m.allocate_slots(b, 1, hits, blocks) is None  # stale: the hit is gone
    new, hits = admit(m, b)
    assert hits == 0 and len(new.block_ids) == 3


def test_idle_cached_hits_count_against_reserved_blocks() -> None:
    m = mgr(6)  # 5 usable
    a = EngineRequest("a", range(9))
    admit(m, a)
    run_step(m, [a])
    m.free(a)  # 2 idle cached blocks, 3 free
    b = EngineRequest("b", range(17))  # hits 2, needs 3 more
    blocks, hits, _ = m.get_computed_blocks(b)
    assert hits == 8
    # reviving the 2 idle hits takes them from the allocatable blocks: 2 + 3 > 5 - 1
    assert m.allocate_slots(b, 9, hits, blocks, reserved_blocks=1) is None
    assert m.allocate_slots(b, 9, hits, blocks) is not None


def test_deduplicated_blocks_are_cached_once() -> None:
    m = mgr(enable_kv_cache_events=True)
    a, b = EngineRequest("a", range(9)), EngineRequest("b", range(9))
    admit(m, a)
    admit(m, b)  # same step: b cannot hit a's unwritten blocks
    run_step(m, [a, b])
    stored = [e for e in m.take_events() if isinstance(e, BlockStored)]
    assert [len(e.block_hashes) for e in stored] == [2]  # b's identical blocks: not cached
    assert len(m.allocator.pool.hmap) == 2
    m.free(a)
    m.free(b)
    assert m.stats()["cached"] == 2 and m.stats()["free"] == 15 - 2


def test_prefix_cache_stats_count_admissions_and_reset_on_each_call() -> None:
    m = mgr()
    a = EngineRequest("a", range(9))
    _, hits = admit(m, a)
    m.record_prefix_cache_stats(a, hits)
    run_step(m, [a])
    b = EngineRequest("b", range(10))
    _, hits_b = admit(m, b)
    m.record_prefix_cache_stats(b, hits_b)
    s = m.make_prefix_cache_stats()
    assert (s.requests, s.queries, s.hits, s.reset) == (2, 19, 8, False)
    assert m.make_prefix_cache_stats() == PrefixCacheStats()  # reset by the call
    m.preempt(b)
    _, hits_b = admit(m, b)
    m.record_prefix_cache_stats(b, hits_b)
    s = m.make_prefix_cache_stats()
    assert (s.requests, s.preempted_requests, s.preempted_queries, s.preempted_hits) == (
        0, 1, 10, 8)
    m.free(a)
    m.free(b)
    assert m.reset_prefix_cache()
    assert m.make_prefix_cache_stats().reset is True
    assert KVCacheManager(8, B, log_stats=False).make_prefix_cache_stats() is None
    off = KVCacheManager(8, B, enable_caching=False)
    off.record_prefix_cache_stats(a, 0)
    assert off.make_prefix_cache_stats() == PrefixCacheStats()


def test_reset_prefix_cache() -> None:
    m = mgr(enable_kv_cache_events=True)
    a = EngineRequest("a", range(9))
    admit(m, a)
    run_step(m, [a])
    assert not m.reset_prefix_cache()  # a holds blocks
    assert len(m.allocator.pool.hmap) == 2
    reader = EngineRequest("r", range(9))
    admit(m, reader)  # hits a's 2 blocks
    launch = run_step(m, [reader], complete=False)  # pins them
    m.free(a)
    m.free(reader)
    m.take_events()
    assert m.reset_prefix_cache()
    assert m.take_events() == [AllBlocksCleared()]
    assert not m.allocator.pool.hmap
    assert m.get_computed_blocks(EngineRequest("z", range(9)))[1] == 0
    # the 2 formerly cached blocks, the reader's own last block and a's last block (let go
    # while the reader's launch, which pins every block held when it was published, was in
    # flight) wait for that launch
    assert m.stats()["reclaimed_waiting"] == 4
    m.complete(launch)
    assert m.stats()["free"] == 15 and m.stats()["cached"] == 0
    m.allocator.check_invariants()


def test_events_replay_to_the_cached_hash_set_under_random_workloads() -> None:
    kinds: set[type] = set()
    for seed in range(12):
        rng = random.Random(seed)
        m = KVCacheManager(rng.randint(4, 12), rng.choice([1, 2, 4]),
                           enable_kv_cache_events=True)
        consumer = CachedHashSet()
        prefixes = [[rng.randrange(3) for _ in range(rng.randint(1, 12))] for _ in range(3)]
        live: list[EngineRequest] = []
        flight: list[Any] = []
        for i in range(150):
            op = rng.random()
            if op < 0.3:
                r = EngineRequest(i, rng.choice(prefixes) + [rng.randrange(3)],
                                  cache_salt=rng.choice([None, "s"]))
                if admit(m, r, n=None)[0] is not None:
                    live.append(r)
            elif op < 0.55 and live:
                r = rng.choice(live)
                if m.allocator.num_reserved(r.request_id) > r.num_computed_tokens:
                    flight.append(run_step(m, [r], complete=False))
                else:
                    m.append_token(r, rng.randrange(3))
                    m.allocate_slots(r, 1)
            elif op < 0.8 and flight:
                m.complete(flight.pop(rng.randrange(len(flight))))
            elif op < 0.95 and live:
                m.free(live.pop(rng.randrange(len(live))))
            elif not live:
                m.reset_prefix_cache()
            events = m.take_events()
            kinds.update(type(e) for e in events)
            consumer.apply(events)
            assert consumer.hashes == set(m.allocator.pool.hmap), (seed, i)
        m.allocator.check_invariants()
    assert kinds == {BlockStored, BlockRemoved, AllBlocksCleared}


def test_events_carry_tokens_parent_hash_and_keys() -> None:
    m = mgr(6, enable_kv_cache_events=True)  # 5 usable
    a = EngineRequest("a", range(8), cache_salt="t", extra_keys=("img",), lora_name="L",
                      lora_id=3)
    admit(m, a)
    run_step(m, [a])
    (stored,) = m.take_events()
    assert stored.block_hashes == a.block_hashes[:2] and stored.parent_block_hash is None
    assert stored.token_ids == list(range(8)) and stored.block_size == B
    assert stored.lora_id == 3 and stored.lora_name == "L" and stored.medium == "GPU"
    assert stored.extra_keys == [("t", "L", "img"), ("L", "img")]
    assert stored.block_ids == m.get_block_ids("a")[0]
    m.append_token(a, 8)
    m.allocate_slots(a, 1)
    m.append_token(a, 9)  # not full yet
    run_step(m, [a])
    assert m.take_events() == []
    m.free(a)
    b = EngineRequest("b", range(100, 120))  # needs all 5 blocks: evicts a's 2
    admit(m, b)
    removed = m.take_events()
    assert removed == [BlockRemoved([a.block_hashes[1]]), BlockRemoved([a.block_hashes[0]])]
    assert KVCacheManager(4, B).take_events() == []


def test_salt_and_extra_keys_separate_the_cache() -> None:
    m = mgr()
    a = EngineRequest("a", range(9), cache_salt="x", extra_keys=(1,))
    admit(m, a)
    run_step(m, [a])
    for other, want in ((EngineRequest("b", range(9), cache_salt="x", extra_keys=(1,)), 8),
                        (EngineRequest("c", range(9), cache_salt="y", extra_keys=(1,)), 0),
                        (EngineRequest("d", range(9), extra_keys=(1,)), 0),
                        (EngineRequest("e", range(9), cache_salt="x"), 0),
                        (EngineRequest("f", range(9), cache_salt="x", extra_keys=(1,),
                                       lora_name="L"), 0)):
        assert m.get_computed_blocks(other)[1] == want, other.request_id
    assert m.allocator.pool.hmap.get(a.block_hashes[0]) == m.get_block_ids("a")[0][0]


def test_hits_stop_before_the_last_token_and_lookups_are_for_admission() -> None:
    m = mgr()
    a = EngineRequest("a", range(8))
    admit(m, a)
    run_step(m, [a])
    same = EngineRequest("s", range(8))
    assert m.get_computed_blocks(same)[1] == 4  # the last block is recomputed
    with pytest.raises(ValueError, match="admission"):
        m.get_computed_blocks(a)
    with pytest.raises(ValueError, match="max_cache_hit_length"):
        m.get_computed_blocks(same, max_cache_hit_length=3)
    assert m.get_computed_blocks(same, max_cache_hit_length=7)[1] == 4
    off = KVCacheManager(16, B, enable_caching=False)
    x = EngineRequest("x", range(8))
    admit(off, x)
    run_step(off, [x])
    assert off.get_computed_blocks(EngineRequest("y", range(8))) == (KVCacheBlocks(), 0, 0)


def test_block_ids_and_common_prefix_and_argument_errors() -> None:
    m = mgr()
    a = EngineRequest("a", range(9))
    new, _ = admit(m, a)
    assert m.get_block_ids("a") == (list(new.block_ids),)
    assert m.get_blocks("a").block_ids == new.block_ids
    assert m.get_block_ids("nobody") == ([],) and m.get_blocks("nobody") == KVCacheBlocks()
    assert m.get_num_common_prefix_blocks("a") == [0]
    assert new.get_block_ids() == (list(new.block_ids),)
    assert KVCacheBlocks().get_block_ids(allow_none=True) is None
    assert (KVCacheBlocks((1,)) + KVCacheBlocks((2,))).block_ids == (1, 2)
    for kw in ({"num_external_computed_tokens": 1}, {"num_encoder_tokens": 1}):
        with pytest.raises(ValueError, match="not supported"):
            m.allocate_slots(a, 1, **kw)
    with pytest.raises(ValueError, match="greater than 0"):
        m.allocate_slots(a, 0)
    with pytest.raises(ValueError, match="no new prefix hits"):
        m.allocate_slots(a, 1, 4, KVCacheBlocks((3,)))
    with pytest.raises(ValueError, match="blocks x"):
        m.allocate_slots(EngineRequest("q", range(5)), 1, 4)
    with pytest.raises(ValueError, match="another request"):
        m.free(EngineRequest("a", range(9)))
    with pytest.raises(ValueError, match="holds no blocks"):
        m.publish([EngineRequest("p", range(3))])
    with pytest.raises(TypeError):
        m.allocate_slots(a, 1.5)  # type: ignore[arg-type]
    m.free(EngineRequest("never", range(3)))  # a request without blocks: ignored
    with pytest.raises(ValueError, match="null block"):
        KVCacheManager(1, B)


def test_running_allocation_grows_the_table_and_appended_tokens_reach_the_allocator() -> None:
    m = mgr()
    a = EngineRequest("a", range(7))
    new, _ = admit(m, a)
    assert len(new.block_ids) == 2
    run_step(m, [a])
    m.append_token(a, 7)
    assert m.allocate_slots(a, 1) == KVCacheBlocks()  # position 7 fits in block 1
    run_step(m, [a])
    a.append_output_token_ids([8])  # appended directly: synced at the next call
    new = m.allocate_slots(a, 1)
    assert len(new.block_ids) == 1
    run_step(m, [a])
    assert m.allocator.num_computed("a") == 9 and len(a.block_hashes) == 2
    assert m.get_computed_blocks(EngineRequest("b", [*range(8), 99]))[1] == 8
    m.cache_blocks(a, 9)
    m.new_step_starts()
    assert a.output_token_ids == [7, 8] and a.num_tokens == 9 and a.num_prompt_tokens == 7


def test_growth_within_the_table_still_honours_every_refusal_rule() -> None:
    """A running request's growth that its table already covers takes no block, so it goes
    ahead at once; but ``reserved_blocks``, ``full_sequence_must_fit`` and the watermark still
    refuse it when the pool cannot give what they ask, as for any growth, and change
    nothing."""
    m = mgr(4)  # the null block and 3 usable
    a = EngineRequest("a", list(range(5)))
    assert admit(m, a) is not None  # 2 blocks, 5 of 8 positions
    run_step(m, [a])
    filler = EngineRequest("f", [9])
    assert admit(m, filler) is not None  # the last usable block
    assert m.get_num_free_blocks() == 0
    assert m._lock is m.allocator._lock  # one lock: the manager reads the allocator's records
    reserved = m.allocator.num_reserved("a")
    assert m.allocate_slots(a, 1, reserved_blocks=1) is None  # leave 1 block: none is free
    assert m.allocator.num_reserved("a") == reserved
    a.append_output_token_ids([1, 2, 3, 4])  # 9 tokens: the full sequence needs a 3rd block
    assert m.allocate_slots(a, 1, full_sequence_must_fit=True) is None
    assert m.allocator.num_reserved("a") == reserved
    new = m.allocate_slots(a, 1)  # within the table: goes ahead with no free block
    assert new is not None and new.block_ids == ()
    assert m.allocator.num_reserved("a") == reserved + 1
    # positions held: a's, the filler's and the null block's
    assert m.stats()["occupancy_tokens"] == reserved + 1 + 1 + 1

    # A request that holds blocks but is still WAITING (the scheduler flips it to RUNNING
    # after allocate_slots) is held to the watermark while others run.
    m = mgr(5, watermark=0.5)  # 2 blocks of watermark
    w = EngineRequest("w", list(range(5)))
    blocks, hits, _ = m.get_computed_blocks(w)
    assert m.allocate_slots(w, 5, hits, blocks, has_scheduled_reqs=False) is not None
    assert admit(m, EngineRequest("f", [9]), has_scheduled_reqs=False) is not None
    assert m.get_num_free_blocks() == 1 and w.status == RequestStatus.WAITING
    assert m.allocate_slots(w, 1) is None  # within w's table, but 1 free block < watermark
    assert m.allocate_slots(w, 1, has_scheduled_reqs=False).block_ids == ()


def test_driver_runs_the_scheduler_calls() -> None:
    d = pk_driver.make(10, B)
    assert d.add("a", list(range(9))) == 0
    assert len(d.allocate("a", 9)) == 3 and d.status("a") == "RUNNING"
    d.commit("a", 9)
    d.append("a", 5)
    assert d.num_tokens("a") == 10 and d.num_computed("a") == 9
    assert d.add("b", list(range(9)), "salt") == 0 and d.add("c", list(range(9))) == 8
    assert d.allocate("c", 1) == [d.block_ids("c")[2]]
    d.preempt("a")
    assert d.status("a") == "PREEMPTED" and d.add("a") == 8
    d.free("a")
    d.free("c")
    assert d.num_free() == 9 and d.num_evictable() == 2 and d.usage() == 0.0
    assert d.prefix_stats()["hits"] == 8


@pytest.mark.parametrize("bad", [True, 1.0, "7", None])
def test_driver_append_refuses_what_is_not_a_token_id_and_changes_nothing(bad: Any) -> None:
    d = pk_driver.make(10, B)
    d.add("a", list(range(7)))
    d.allocate("a", 7)
    d.commit("a", 7)
    with pytest.raises(TypeError):
        d.append("a", bad)
    assert d.num_tokens("a") == 7
    d.append("a", np.int64(9))  # a NumPy integer is a token id, kept as a plain int
    assert d.requests["a"].all_token_ids[-1] == 9
    assert type(d.requests["a"].all_token_ids[-1]) is int


def test_tokens_the_driver_appends_reach_the_prefix_cache() -> None:
    """``append`` records the token on the request only; the manager learns it at its next
    call, and the block it filled is cached once written and committed."""
    d = pk_driver.make(10, B)
    d.step()
    d.add("a", list(range(7)))
    d.allocate("a", 7)
    d.commit("a", 7)
    d.append("a", 70)  # fills block 1: tokens 4..6 and 70
    d.step()
    d.allocate("a", 1)
    d.commit("a", 8)
    d.append("a", 71)
    d.step()
    assert d.manager.allocator.num_computed("a") == 8
    assert d.add("b", [*range(7), 70, 5]) == 8  # both full blocks of a are hits


def test_driver_runs_one_launch_per_step() -> None:
    """Every request allocated in a step is written by the step's one launch, published at
    the step's first commit; a request allocated again after it gets a launch of its own."""
    d = pk_driver.make(20, B)
    alloc = d.manager.allocator
    d.step()
    for rid in ("a", "b", "c"):
        d.add(rid, [ord(rid)] * 9)
        d.allocate(rid, 9)
    launches = alloc.pool.clock[ISSUED]
    for rid in ("a", "b", "c"):
        d.commit(rid, 9)
    assert alloc.pool.clock[ISSUED] == launches + 1
    assert all(alloc.num_computed(r) == 9 for r in "abc")  # one launch wrote all three
    for rid in "abc":
        d.append(rid, 1)
    d.step()
    d.allocate("a", 1)
    d.commit("a", 10)
    d.append("a", 2)
    d.allocate("a", 1)  # allocated again after this step's launch
    d.commit("a", 11)
    assert alloc.pool.clock[ISSUED] == launches + 3 and alloc.num_computed("a") == 11


def test_a_request_keeps_its_tokens_once_and_hands_out_copies() -> None:
    prompt = [3, 1, 4, 1, 5]
    r = EngineRequest("r", prompt, output_token_ids=[9])
    prompt.append(2)  # the caller's list is not the request's
    r.append_output_token_ids([2, 6])
    assert r.prompt_token_ids == [3, 1, 4, 1, 5] and r.num_prompt_tokens == 5
    assert r.output_token_ids == [9, 2, 6] and r.num_output_tokens == 3
    assert r.all_token_ids == [3, 1, 4, 1, 5, 9, 2, 6] and r.num_tokens == 8
    r.prompt_token_ids.append(7)  # copies: the request is unchanged
    r.output_token_ids.clear()
    assert r.all_token_ids == [3, 1, 4, 1, 5, 9, 2, 6]
    with pytest.raises(AttributeError):
        r.prompt_token_ids = [1]  # type: ignore[misc]


@pytest.mark.parametrize("tokens", [[1, True, 3], (1, 2.0), [1, "2"], [1, None]])
def test_engine_request_refuses_token_ids_that_are_not_ints(tokens):
    with pytest.raises(TypeError, match="token ids must be ints"):
        EngineRequest("r", tokens)
    with pytest.raises(TypeError, match="token ids must be ints"):
        EngineRequest("r", [1, 2], output_token_ids=tokens)


def test_engine_request_keeps_its_own_copy_of_plain_and_numpy_token_ids():

    prompt = [5, 6, 7]
    r = EngineRequest("r", prompt, output_token_ids=np.array([8, 9], dtype=np.int64))
    prompt.append(99)  # the caller's list is not the request's
    assert r.all_token_ids == [5, 6, 7, 8, 9] and r.num_prompt_tokens == 3
    assert all(type(t) is int for t in r.all_token_ids)


@pytest.mark.parametrize("bad", [True, 2.0, "3", None])
def test_append_token_refuses_what_is_not_a_token_id_and_changes_nothing(bad):

    m = mgr()
    a = EngineRequest("a", range(3))
    admit(m, a)
    run_step(m, [a])
    with pytest.raises(TypeError, match="token ids must be ints"):
        m.append_token(a, bad)
    assert a.num_tokens == 3
    m.append_token(a, np.int64(9))  # a NumPy integer is a token id, stored as a plain int
    assert a.output_token_ids == [9] and type(a.all_token_ids[-1]) is int


@pytest.mark.parametrize("name", ["num_new_computed_tokens", "num_lookahead_tokens",
                                  "reserved_blocks", "num_external_computed_tokens",
                                  "num_encoder_tokens"])
@pytest.mark.parametrize("bad", [False, 0.0])
def test_a_zero_like_count_is_refused_on_the_decode_fast_path(name, bad):
    """A running request's growth within its table takes a fast path; a count given as a
    bool or a float is still a ``TypeError`` there, and nothing changes."""
    m = KVCacheManager(16, 8)
    req = EngineRequest("a", [1, 2, 3])
    assert m.allocate_slots(req, 3) is not None
    req.status, req.num_computed_tokens = RequestStatus.RUNNING, 3
    before = (m.get_block_ids("a"), m.allocator.num_reserved("a"), m.stats())
    with pytest.raises(TypeError):
        m.allocate_slots(req, 1, **{name: bad})
    assert (m.get_block_ids("a"), m.allocator.num_reserved("a"), m.stats()) == before
    assert m.allocate_slots(req, 1) is not None  # the plain call takes the fast path
    assert m.allocator.num_reserved("a") == 4


def test_a_token_id_past_int64_is_refused_by_append_token_and_changes_nothing():
    """A running request's sampled id goes to the allocator at once (its int64 check there):
    one out of range is refused before the request or the allocator records it."""
    from pagedkv.allocator import InvalidArgument

    m = KVCacheManager(16, 4)
    req = EngineRequest("a", [1, 2, 3])
    assert m.allocate_slots(req, 3) is not None
    req.status, req.num_computed_tokens = RequestStatus.RUNNING, 3
    with pytest.raises(InvalidArgument, match="64-bit"):
        m.append_token(req, 2**63)
    assert req.all_token_ids == [1, 2, 3]
    assert m.allocator._req("a").tokens == [1, 2, 3]
    m.append_token(req, 2**63 - 1)  # the largest id is one
    assert m.allocator._req("a").tokens == req.all_token_ids == [1, 2, 3, 2**63 - 1]


@pytest.mark.parametrize("seed", range(6))
def test_admissions_refused_before_the_lookup_decide_as_after_it(seed: int) -> None:
    """``allocate_slots`` refuses a waiting request whose need beyond the blocks it was given
    exceeds the usable ones before looking the hits up again (``_refused_before_lookup``). Two
    managers in lockstep, one without that shortcut, on admissions with the lookup's hits,
    stale hits and fewer hits, whole-sequence or not, with reserved blocks: the same answers
    and the same state."""
    rng = random.Random(seed)
    fast, slow = mgr(24), mgr(24)
    slow._refused_before_lookup = lambda *args: False  # type: ignore[method-assign]
    prompts = [list(range(base, base + rng.randrange(2, 30))) for base in (0, 0, 0, 50, 50)]
    live: list[str] = []
    for k in range(60):
        if live and rng.random() < 0.3:
            rid = live.pop(rng.randrange(len(live)))
            for m in (fast, slow):
                m.free(m._live[rid].req)
            continue
        rid = f"r{k}"
        tokens = rng.choice(prompts) + [1000 + k] * rng.randrange(0, 6)
        reqs = [EngineRequest(rid, tokens), EngineRequest(rid, tokens)]
        given = [m.get_computed_blocks(r) for m, r in zip((fast, slow), reqs, strict=True)]
        blocks, hits, _ = given[0]
        if hits and rng.random() < 0.3:  # fewer hits than the cache has: stale
            blocks = KVCacheBlocks(blocks.block_ids[:-1])
            hits -= B
        kw = dict(full_sequence_must_fit=rng.random() < 0.5, reserved_blocks=rng.randrange(3))
        n = rng.randrange(1, len(tokens) - hits + 1)
        out = [m.allocate_slots(r, n, hits, blocks, **kw)
               for m, r in zip((fast, slow), reqs, strict=True)]
        assert (out[0] is None) == (out[1] is None)
        assert out[0] is None or out[0].block_ids == out[1].block_ids
        if out[0] is not None:
            live.append(rid)
            for r in reqs:
                r.status = RequestStatus.RUNNING
                r.num_computed_tokens = hits
            run_step(fast, [reqs[0]])
            run_step(slow, [reqs[1]])
        assert snapshot(fast)[:8] == snapshot(slow)[:8]  # (8: each its own null holder)
        assert fast.allocator.requests[1:] == slow.allocator.requests[1:]
