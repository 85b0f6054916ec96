"""Batched pool transitions (``BlockPool.run_many``, and ``take_many``'s batched allocate): one
compiled loop of the spec's own guard and effect per batch, equal to the single transitions one
after the other. Pool-level take_many workloads and errors: tests/test_kill_take_many.py."""

from __future__ import annotations

import dataclasses
import random

import pytest

from pagedkv.allocator import (
    AllocatorError,
    BlockAllocator,
    InvariantViolation,
    OutOfBlocks,
    PendingAccess,
    PublishError,
)
from pagedkv.allocator.compiled import batch_agrees, batch_code
from pagedkv.allocator.pool import BlockPool
from pagedkv.spec import ALLOCATED, TRANSITIONS


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


def _workload(seed: int, batched: bool, traced: bool = True) -> tuple:
    """Decode-like steps over many requests: every launch's writes and completions go
    through run_many or through the single transitions. ``traced``: the pool records its
    transitions (then batches recycle block by block, in the single transitions' order;
    untraced, the recycles after a batch run as one batch)."""
    rng = random.Random(seed)
    a = BlockAllocator(256, 4, checked=rng.random() < 0.5)
    a.pool.trace = [] if traced else None
    if not batched:  # the allocator's batches become single transitions

        def singles(name, items, _pool=a.pool):
            for args in items:
                getattr(_pool, name)(*args)

        def takes(r, n, _pool=a.pool):
            return [_pool.take(r) for _ in range(n)]
        a.pool.run_many = singles
        a.pool.take_many = takes
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


@pytest.mark.parametrize("seed", range(10))
def test_untraced_batches_recycle_as_the_single_transitions_do(seed):
    """Without a trace, the blocks a release or end_write batch (or the watermark) lets go
    are recycled as one batch: the same pool, queue order, retire queue and busy count."""
    batched, single = _workload(seed, True, traced=False), _workload(seed, False, traced=False)
    assert batched[0] == single[0]
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


@pytest.mark.parametrize("checked", [True, False])
def test_a_share_batch_revives_cached_blocks_as_single_shares_do(checked):
    """Prefix hits taken as one batch of the spec's share: zero-ref cached blocks (idle, and
    busy under a launch in flight) leave the eviction queue once, even when two holders of
    the batch share the same one; the pool, queue, retire queue and busy count end where the
    single shares end."""
    for in_flight in (False, True):
        ends = []
        for batched in (True, False):
            a = BlockAllocator(16, 4, checked=checked)
            a.add_request("p", list(range(13)))
            a.allocate("p", 13)
            a.publish(["p"]).complete()
            a.commit("p", 12)  # three full blocks cached
            held = a.block_table("p")[:3]
            if in_flight:
                a.publish(["p"])  # the freed blocks stay busy: a launch may read them
            a.free("p")
            pool = a.pool
            assert all(pool.state[b] == 4 for b in held)  # zero-ref CACHED, in the queue
            assert pool.cached_busy == (3 if in_flight else 0)
            for r in ("x", "y"):
                pool.open_holder(r)
            items = [(held[0], "x"), (held[1], "x"), (held[0], "y"), (held[2], "y")]
            if batched:
                pool.run_many("share", items)
            else:
                for b, r in items:
                    pool.share(b, r)
            ends.append((pool.abstract(), list(pool.queue), list(pool.retire_queue),
                         pool.cached_busy, pool.structure_errors()))
        assert ends[0] == ends[1]
        assert ends[0][3] == 0 and ends[0][4] == []
        assert not set(held) & set(ends[0][1])  # revived: out of the eviction queue


def test_prefix_hits_are_taken_as_one_share_batch():
    """An admission's prefix hits go through ``run_many("share", ...)`` in table order."""
    a = BlockAllocator(16, 4)
    a.add_request("p", list(range(9)))
    a.allocate("p", 9)
    a.publish(["p"]).complete()
    a.commit("p", 8)
    a.free("p")
    calls = []
    run_many = a.pool.run_many
    a.pool.run_many = lambda name, items: (calls.append((name, list(items))),
                                           run_many(name, items))[1]
    a.add_request("q", list(range(9)))
    table = a.allocate("q", 9)
    assert ("share", [(table[0], "q"), (table[1], "q")]) in calls


# ---- batched allocation: take_many -----------------------------------------------------------
def _admissions(seed: int, batched: bool) -> tuple:
    """Admissions of multi-block prompts over a shared prefix into a small pool: prefix hits,
    cached blocks evicted to make room (launches in flight pin some of them), refusals when
    the pool is full, growth by allocate_many, forks and frees. The allocator takes its blocks
    by take_many, or by take n times."""
    rng = random.Random(seed)
    a = BlockAllocator(rng.randrange(12, 40), 4, checked=rng.random() < 0.5)
    pool = a.pool
    pool.trace = []
    if not batched:
        pool.take_many = lambda r, n, _pool=pool: [_pool.take(r) for _ in range(n)]
    prefix = [rng.randrange(50) for _ in range(8)]
    live: list[str] = []
    known: dict[str, int] = {}  # token ids each request has
    inflight = []
    refused = 0
    for i in range(60):
        op = rng.random()
        if op < 0.4 or not live:
            rid = f"r{i}"
            tokens = (prefix[:rng.randrange(9)]
                      + [rng.randrange(50) for _ in range(rng.randrange(1, 14))])
            a.add_request(rid, tokens)
            known[rid] = len(tokens)
            try:
                a.allocate(rid, len(tokens) + rng.randrange(3))
                live.append(rid)
            except OutOfBlocks:
                refused += 1
                a.free(rid)
        elif op < 0.6:
            grow = [(r, a.num_reserved(r) + rng.randrange(1, 9)) for r in live
                    if rng.random() < 0.5]
            try:
                a.allocate_many(grow)
            except OutOfBlocks:
                refused += 1
        elif op < 0.75:  # a step: publish, maybe complete, commit what was written
            launch = a.publish(live)
            if rng.random() < 0.6:
                launch.complete()
                for r in live:
                    more = max(0, a.num_reserved(r) - known[r])
                    a.append_tokens(r, [rng.randrange(50) for _ in range(more)])
                    known[r] += more
                    try:
                        a.commit(r, a.num_reserved(r))
                    except AllocatorError:
                        pass  # an earlier launch still in flight writes it
            else:
                inflight.append(launch)
        elif op < 0.8 and live:
            parent = rng.choice(live)
            if known[parent] >= a.num_reserved(parent):
                try:
                    a.fork(parent, f"f{i}")
                    live.append(f"f{i}")
                    known[f"f{i}"] = known[parent]
                except OutOfBlocks:
                    refused += 1
        elif op < 0.9 and inflight:
            inflight.pop(rng.randrange(len(inflight))).complete()
        else:
            a.free(live.pop(rng.randrange(len(live))))
    for launch in inflight:
        launch.complete()
    a.check_invariants()
    return (a.abstract().pool, pool.trace, list(pool.queue), list(pool.retire_queue),
            pool.cached_busy, {r: a.block_table(r) for r in live}, refused,
            pool.structure_errors())


@pytest.mark.parametrize("seed", range(10))
def test_take_many_admissions_end_where_single_takes_end(seed):
    batched, single = _admissions(seed, True), _admissions(seed, False)
    assert batched[5] == single[5], "the tables differ"
    assert batched[1] == single[1], "the transitions recorded differ"
    assert batched[0] == single[0]
    assert batched[2:] == single[2:], "eviction queue, retire queue, busy count differ"
    assert batched[7] == []


def test_the_admission_workloads_evict_and_refuse():
    names = [name for seed in range(10) for name, _ in _admissions(seed, True)[1]]
    assert names.count("evict") > 10 and names.count("share") > 10
    assert sum(_admissions(seed, True)[6] for seed in range(10)) > 5


def _allocate_effect(ops, s, b, r, **changes):
    """The spec's allocate effect written out, with the stores of ``changes`` replaced
    (``field=value``: b's entry of field stores value; ``field=None``: field is not written)."""
    old = s.state[b]
    count = ops.store(s.count, old, s.count[old] - 1)
    fields = {
        "state": ops.store(s.state, b, ALLOCATED),
        "count": ops.store(count, ALLOCATED, count[ALLOCATED] + 1),
        "holds": ops.store(s.holds, r, ops.store(s.holds[r], b, True)),
        "nheld": ops.store(s.nheld, r, s.nheld[r] + 1),
        "ref": ops.store(s.ref, b, 1),
        "init": ops.store(s.init, b, True),
        "filled": ops.store(s.filled, b, 0),
        "queued": ops.store(s.queued, b, False),
    }
    for f, v in changes.items():
        if v is None:
            del fields[f]
        else:
            fields[f] = ops.store(getattr(s, f), b, v)
    return s.replace(**fields)


def _wrong_allocate(**changes) -> object:
    """The spec's allocate with some of its stores replaced (a planted bug in the spec)."""
    return _wrong("allocate", lambda ops, s, b, r: _allocate_effect(ops, s, b, r, **changes))


def test_the_written_out_allocate_is_the_specs():
    t = _wrong_allocate()
    assert batch_agrees(TRANSITIONS["allocate"], batch_code(t, "written out"))


@pytest.mark.parametrize("changes, invariant", [
    ({"init": False}, "initialized_iff_live"),  # an allocated block without its record
    ({"queued": None}, "queue_is_free_and_cached"),  # allocate forgets to dequeue
])
def test_checked_mode_catches_a_wrong_allocate_in_the_batch(changes, invariant):
    """A spec whose allocate is wrong compiles to a batch that agrees with it, so take_many
    runs it; unchecked, the broken blocks go through; checked, the invariant re-check on the
    touched blocks names the broken invariant (without it the batch would pass)."""
    spec = {**TRANSITIONS, "allocate": _wrong_allocate(**changes)}
    for checked in (False, True):
        pool = BlockPool(8, 4, checked=checked, spec=spec)
        pool.open_holder("a")
        if checked:
            with pytest.raises(InvariantViolation) as info:
                pool.take_many("a", 3)
            assert info.value.invariant == invariant
        else:
            assert pool.take_many("a", 3) == [0, 1, 2]
        assert pool._batched["allocate", "run_many"][1] is not None, "it ran the compiled batch"


def _differs_when_compiled() -> object:
    """allocate whose symbolic evaluation (what batch_code compiles) writes filled = 1 and whose
    interpreted effect is the spec's: a compiled batch that disagrees with its spec."""

    def effect(ops, s, b, r):
        if isinstance(b, int):
            return _allocate_effect(ops, s, b, r)
        return _allocate_effect(ops, s, b, r, filled=1)

    return _wrong("allocate", effect)


@pytest.mark.parametrize("checked", [True, False])
def test_an_allocate_batch_that_disagrees_with_its_spec_is_not_run(checked, monkeypatch):
    """batch_agrees rejects the disagreeing batch: take_many runs the single transitions and
    ends where they end. With the agreement check removed the wrong batch would run."""
    t = _differs_when_compiled()
    assert batch_code(t, "disagrees") is not None and not batch_agrees(
        t, batch_code(t, "disagrees"))
    spec = {**TRANSITIONS, "allocate": t}
    ends = []
    for many in (True, False):
        pool = BlockPool(8, 4, checked=checked, spec=spec)
        pool.trace = []
        pool.open_holder("a")
        if many:
            got = pool.take_many("a", 5)
            assert pool._batched["allocate", "run_many"][1] is None, "the batch was rejected"
        else:
            got = [pool.take("a") for _ in range(5)]
        ends.append((got, pool.abstract(), pool.trace, list(pool.queue)))
    assert ends[0] == ends[1]
    assert ends[0][1].filled[0] == 0
    from pagedkv.allocator import pool as pool_module

    monkeypatch.setattr(pool_module, "batch_agrees", lambda t, code, fn="run_many": True)
    unchecked = BlockPool(8, 4, checked=False, spec=spec)
    unchecked.open_holder("a")
    unchecked.take_many("a", 5)
    assert unchecked.filled[:5] == [1] * 5  # what would have run


@pytest.mark.parametrize("checked", [True, False])
def test_run_many_allocate_anywhere_in_the_queue_is_the_single_allocates(checked):
    """run_many("allocate") of FREE blocks in any order (not the queue's head run): each
    leaves the eviction queue as the single transition's unlink does; a refused element (a
    block taken twice) raises after the ones before, as single calls do."""
    ends = []
    for batched in (True, False):
        pool = BlockPool(10, 4, checked=checked)
        pool.trace = []
        pool.open_holder("a")
        items = [(7, "a"), (2, "a"), (9, "a"), (0, "a"), (2, "a"), (5, "a")]
        with pytest.raises(PendingAccess, match="allocate refused"):
            if batched:
                pool.run_many("allocate", items)
            else:
                for b, r in items:
                    pool.allocate(b, r)
        ends.append((pool.abstract(), pool.trace, list(pool.queue), pool.queue.length,
                     pool.structure_errors()))
    assert ends[0] == ends[1]
    assert ends[0][2] == [1, 3, 4, 5, 6, 8] and ends[0][4] == []
