"""Batched pool transitions (``BlockPool.run_many``): one compiled loop of the spec's own guard
and effect per batch, equal to the single transitions one after the other."""

from __future__ import annotations

import dataclasses
import random

import pytest

from pagedkv.allocator import (
    AllocatorError,
    BlockAllocator,
    InvariantViolation,
    PublishError,
)
from pagedkv.allocator.compiled import batch_agrees, batch_code
from pagedkv.allocator.pool import BlockPool
from pagedkv.spec import TRANSITIONS


@pytest.mark.parametrize("name", BlockPool.BATCHED)
def test_the_batched_transitions_compile_and_agree_with_the_spec(name):
    t = TRANSITIONS[name]
    code = batch_code(t, name)
    assert code is not None, f"{name} would run as single transitions"
    assert batch_agrees(t, code)


def _wrong(name: str, effect) -> object:
    return dataclasses.replace(TRANSITIONS[name], effect=effect)


def test_a_batch_compiled_from_another_effect_or_guard_disagrees():
    t = TRANSITIONS["begin_write"]

    def effect(ops, s, b, r, w):  # one slot too many
        return s.replace(wpend=ops.store(s.wpend, b, s.wpend[b] + 1),
                         filled=ops.store(s.filled, b, s.filled[b] + w + 1))

    assert not batch_agrees(t, batch_code(_wrong("begin_write", effect), "wrong effect"))
    lax = dataclasses.replace(t, guard=lambda ops, s, b, r, w: ops.And(b >= 0, w > 0))
    assert not batch_agrees(t, batch_code(lax, "wrong guard"))


def _workload(seed: int, batched: bool) -> tuple:
    """Decode-like steps over many requests: every launch's writes and completions go
    through run_many or through the single transitions."""
    rng = random.Random(seed)
    a = BlockAllocator(256, 4, checked=rng.random() < 0.5)
    a.pool.trace = []
    if not batched:  # the allocator's batches become single transitions

        def singles(name, items, _pool=a.pool):
            for args in items:
                getattr(_pool, name)(*args)
        a.pool.run_many = singles
    live = []
    for i in range(8):
        tokens = [rng.randrange(4) for _ in range(rng.randrange(1, 9))]
        a.add_request(f"r{i}", tokens)
        a.allocate(f"r{i}", len(tokens))
        live.append(f"r{i}")
    inflight = []
    serial = 8
    for _ in range(40):
        for r in live:
            k = rng.randrange(0, 6)
            a.append_tokens(r, [rng.randrange(4) for _ in range(k)])  # known: commits cache
            a.extend(r, a.num_reserved(r) + k)
        inflight.append(a.publish(live))
        while inflight and rng.random() < 0.8:
            inflight.pop(rng.randrange(len(inflight))).complete()
        for r in live:
            if a.num_computed(r) < a.num_reserved(r):
                try:
                    a.commit(r, a.num_reserved(r) // 4 * 4)  # full blocks enter the cache
                except AllocatorError:
                    pass  # a launch still writes it
        if rng.random() < 0.3:  # a request finishes (some of its blocks still in flight)
            a.free(live.pop(rng.randrange(len(live))))
            live.append(f"r{serial}")
            a.add_request(live[-1], [rng.randrange(4) for _ in range(rng.randrange(1, 9))])
            a.allocate(live[-1], 1)
            serial += 1
    for launch in inflight:
        launch.complete()
    a.check_invariants()
    pool = a.pool
    return (a.abstract().pool, pool.trace, list(pool.queue), list(pool.retire_queue),
            pool.cached_busy)


@pytest.mark.parametrize("seed", range(10))
def test_run_many_ends_where_the_single_transitions_end(seed):
    batched, single = _workload(seed, True), _workload(seed, False)
    assert batched[0] == single[0]
    assert batched[1] == single[1], "the transitions recorded differ"
    assert batched[2:] == single[2:], "eviction queue, retire queue or busy count differ"


@pytest.mark.parametrize("checked", [True, False])
def test_a_refused_element_raises_its_guard_error_after_the_ones_before(checked):
    a = BlockAllocator(8, 4, checked=checked)
    a.add_request("a", [1, 2, 3])
    a.allocate("a", 6)  # two ALLOCATED blocks: 0 and 1
    pool = a.pool
    with pytest.raises(PublishError, match="publish"):
        pool.run_many("publish", [(0, "a"), (5, "a"), (1, "a")])  # 5 is FREE
    assert [pool.state[b] for b in (0, 1)] == [2, 1]  # 0 PUBLISHED, 1 still ALLOCATED


def test_checked_mode_rechecks_the_touched_blocks_invariants():
    """A spec whose begin_write overfills a block (and a batch compiled from it, which agrees
    with it) runs unchecked; checked mode's invariant check on the touched block catches it.
    Without that check the batch would pass."""

    def effect(ops, s, b, r, w):
        return s.replace(wpend=ops.store(s.wpend, b, s.wpend[b] + 1),
                         filled=ops.store(s.filled, b, s.filled[b] + w + s.block_size))

    spec = {**TRANSITIONS, "begin_write": _wrong("begin_write", effect)}
    for checked in (False, True):
        a = BlockAllocator(8, 4, checked=checked, spec=spec)
        a.add_request("a", [1, 2, 3])
        a.allocate("a", 3)
        a.pool.run_many("publish", [(0, "a")])
        a.pool.launch(0)
        if checked:
            with pytest.raises(InvariantViolation):
                a.pool.run_many("begin_write", [(0, "a", 3)])
        else:
            a.pool.run_many("begin_write", [(0, "a", 3)])
            assert a.pool.filled[0] == 7


def test_a_block_released_by_several_holders_in_one_batch_is_let_go_once():
    """Forked tables share blocks: releasing every holder's reference in one batch ends where
    the single releases end (eviction queue, retire queue and busy count included), with a
    launch in flight and without."""
    for in_flight in (False, True):
        ends = []
        for batched in (True, False):
            a = BlockAllocator(16, 4)
            a.add_request("p", list(range(12)))
            a.allocate("p", 12)
            a.publish(["p"]).complete()
            a.commit("p", 12)
            a.fork("p", "c")
            if in_flight:
                a.publish(["p"])  # a launch that may read the shared blocks
            items = [(b, r) for b in a.block_table("p") for r in ("p", "c")]
            if batched:
                a.pool.run_many("release", items)
            else:
                for b, r in items:
                    a.pool.release(b, r)
            pool = a.pool
            ends.append((pool.abstract(), list(pool.queue), list(pool.retire_queue),
                         pool.cached_busy, pool.structure_errors()))
        assert ends[0] == ends[1]
        assert ends[0][4] == []
