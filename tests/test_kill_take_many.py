"""Kills mutants of the batched allocation path: ``BlockQueue.head_run`` / ``cut_head``
(allocator/lru.py) against a plain-list model, and ``BlockPool.take_many`` against ``take``
called n times on seeded pool workloads (evictions of idle and busy cached blocks, pools
taken to exhaustion), errors included. Fast: part of the mutation kill suite's first stage."""

from __future__ import annotations

import random

import pytest

from pagedkv.allocator import InvalidArgument, PendingAccess
from pagedkv.allocator.lru import BlockQueue
from pagedkv.allocator.pool import BlockPool
from pagedkv.spec import ALLOCATED, CACHED, FREE

B = 2  # block size


# ---- the queue's head run ------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(8))
def test_head_run_and_cut_head_match_a_list_model(seed):
    rnd = random.Random(seed)
    n = rnd.randrange(1, 9)
    q, model = BlockQueue(n), list(range(n))
    state = [rnd.choice((FREE, CACHED)) for _ in range(n)]
    for _ in range(40):
        want, limit = rnd.choice((FREE, CACHED)), rnd.randrange(0, n + 2)
        run = q.head_run(state, want, limit)
        expected = []
        for b in model[:limit]:
            if state[b] != want:
                break
            expected.append(b)
        assert run == expected
        assert q.order() == model  # head_run unlinks nothing
        k = rnd.randrange(len(run) + 1)
        taken = [(b, "r") for b in run[:k]]
        q.cut_head(taken)
        for b, _ in taken:  # the flags are the caller's (the spec's effect clears them)
            assert q.inq[b]
            q.inq[b] = False
        del model[:k]
        assert q.order() == model and list(q) == model
        assert q.head() == (model[0] if model else None)
        assert q.length == len(model)
        assert q.structure_errors() == []
        out = [b for b in range(n) if b not in model]
        if out and rnd.random() < 0.7:
            b = rnd.choice(out)
            (q.push_head if rnd.random() < 0.5 else q.push_tail)(b)
            (model.insert(0, b) if q.head() == b else model.append(b))
            state[b] = rnd.choice((FREE, CACHED))


# ---- take_many against n takes ---------------------------------------------------------------
def _end(p: BlockPool, taken: list) -> tuple:
    return (p.abstract(), list(p.queue), p.trace, list(p.count), list(p.retire_queue),
            p.cached_busy, p.queue.length, taken, p.structure_errors())


def _workload(seed: int, many: bool, checked: bool, stats: dict | None = None,
              traced: bool = True) -> tuple:
    """Holders take, fill, commit (cached blocks once let go), release, with launches in
    flight pinning what they let go (busy cached, reclaimed): takes of 0..usable() blocks,
    and a few past it (they fail once the queue is empty), by take_many(r, n) or by take(r)
    n times. ``traced``: the pool records its transitions (take_many then evicts by single
    transitions; untraced, a run of cached heads as one batch)."""
    rnd = random.Random(seed)
    p = BlockPool(rnd.randrange(4, 12), B, checked=checked)
    p.trace = [] if traced else None
    held: dict[str, list[int]] = {}
    taken: list = []
    inflight: list[int] = []
    stats = {"exhausted": 0, "failed": 0} if stats is None else stats
    serial = hashes = 0
    for _ in range(60):
        op = rnd.random()
        if op < 0.15 or not held:
            r = f"r{serial}"
            serial += 1
            p.open_holder(r)
            held[r] = []
        elif op < 0.55:
            r = rnd.choice(sorted(held))
            n = rnd.randrange(0, p.usable() + 1)
            n = p.usable() if rnd.random() < 0.2 else n  # down to the last usable block
            if rnd.random() < 0.1:  # past usable(): busy cached heads evicted, then it fails
                n = p.usable() + rnd.randrange(1, 3)
            before = set(p.held[r])
            try:
                got = p.take_many(r, n) if many else [p.take(r) for _ in range(n)]
            except AssertionError as e:  # the queue ran out (callers check usable() first)
                assert "exhausted" in str(e)
                got = sorted(p.held[r] - before)  # a pool of a few blocks: taken in id order
                stats["failed"] += 1
            stats["exhausted"] += n > 0 and p.usable() == 0
            taken.append(got)
            held[r] += got
        elif op < 0.75:  # fill and commit r's fresh blocks (full ones enter the cache)
            r = rnd.choice(sorted(held))
            fresh = [b for b in held[r] if p.state[b] == ALLOCATED]
            if fresh:
                L = p.clock[0]
                for b in fresh:
                    p.publish(b, r)
                p.launch(L)
                for b in fresh:
                    p.begin_write(b, r, B)
                    p.end_write(b)
                p.complete(L)
                p.advance_watermark()
                for b in fresh:
                    if rnd.random() < 0.7:
                        hashes += 1
                        p.commit(b, r, hashes)
        elif op < 0.85:  # a launch reading everything held now, completed later
            L = p.clock[0]
            p.launch(L)
            inflight.append(L)
        elif op < 0.92 and inflight:
            p.complete(inflight.pop(rnd.randrange(len(inflight))))
            p.advance_watermark()
        else:  # r lets go of its blocks (tail first) and goes away
            r = rnd.choice(sorted(held))
            for b in reversed(held.pop(r)):
                p.release(b, r)
            p.close_holder(r)
    return _end(p, taken)


@pytest.mark.parametrize("checked", [True, False])
@pytest.mark.parametrize("seed", range(12))
def test_take_many_ends_where_n_takes_end(seed, checked):
    batched, single = _workload(seed, True, checked), _workload(seed, False, checked)
    assert batched[7] == single[7], "different blocks taken"
    assert batched[2] == single[2], "the transitions recorded differ"
    assert batched[0] == single[0]
    assert batched[1:] == single[1:]
    assert batched[8] == []


@pytest.mark.parametrize("checked", [True, False])
@pytest.mark.parametrize("seed", range(12))
def test_untraced_take_many_evicting_runs_of_cached_heads_ends_where_n_takes_end(seed, checked):
    """Untraced, take_many evicts a run of cached heads as one batch (last first): the same
    blocks taken, in the same order, and the same pool, queue, retire queue and busy count
    as single takes."""
    batched = _workload(seed, True, checked, traced=False)
    single = _workload(seed, False, checked, traced=False)
    assert batched[7] == single[7], "different blocks taken"
    assert batched[0] == single[0]
    assert batched[1:] == single[1:]
    assert batched[8] == []


def test_untraced_workloads_evict_runs_of_cached_heads_as_batches(monkeypatch):
    """The untraced workloads above reach the batched eviction, with runs longer than one."""
    runs: list[int] = []
    real = BlockPool._run_batch

    def spy(self, name, run, items, *rest):
        if name == "evict":
            runs.append(len(items))
        return real(self, name, run, items, *rest)

    monkeypatch.setattr(BlockPool, "_run_batch", spy)
    for seed in range(12):
        for checked in (True, False):
            _workload(seed, True, checked, traced=False)
    assert runs and max(runs) > 1, runs


def test_the_workloads_evict_idle_and_busy_cached_blocks():
    """The seeded workloads above do reach what take_many must get right: idle cached heads
    evicted and recycled, busy ones evicted and left waiting (a busy block is released after
    the idle ones, so only a take past usable() reaches it), pools taken to their last usable
    block and past it."""
    idle = busy = 0
    stats = {"exhausted": 0, "failed": 0}
    for seed in range(12):
        trace = _workload(seed, True, False, stats)[2]
        for i, (name, params) in enumerate(trace):
            if name == "evict":
                recycled = i + 1 < len(trace) and trace[i + 1] == ("recycle", params)
                idle, busy = idle + recycled, busy + (not recycled)
    assert idle and busy and stats["exhausted"] and stats["failed"], (idle, busy, stats)


def _cached_head_pool(checked: bool, busy: bool = False) -> BlockPool:
    """Two CACHED blocks (0, 1) at the queue's head, then FREE ones; busy: a launch that read
    them is in flight."""
    p = BlockPool(6, B, checked=checked)
    p.open_holder("w")
    for b in (0, 1):
        p.take("w")
        p.publish(b, "w")
    p.launch(0)
    for b in (0, 1):
        p.begin_write(b, "w", B)
        p.end_write(b)
    p.complete(0)
    p.advance_watermark()
    for b in (0, 1):
        p.commit(b, "w", 100 + b)
    if busy:
        p.launch(1)
    for b in (0, 1):
        p.release(b, "w")
    p.close_holder("w")
    p.queue.unlink(0), p.queue.unlink(1)  # the cached ones to the head, LRU order
    p.queue.push_head(1), p.queue.push_head(0)
    p.trace = []
    assert list(p.queue)[:2] == [0, 1] and p.state[0] == p.state[1] == CACHED
    return p


@pytest.mark.parametrize("checked", [True, False])
@pytest.mark.parametrize("busy", [False, True])
@pytest.mark.parametrize("short", [0, 2])  # all usable blocks, or 2 fewer
def test_cached_heads_are_evicted_in_lru_order_then_the_free_run_taken(checked, busy, short):
    ends = []
    for many in (True, False):
        p = _cached_head_pool(checked, busy)
        p.open_holder("r")
        n = p.usable() - short
        got = p.take_many("r", n) if many else [p.take("r") for _ in range(n)]
        ends.append(_end(p, got))
    assert ends[0] == ends[1]
    names = [name for name, _ in ends[0][2]]
    assert names[1] == "evict" and ends[0][2][1][1] == {"b": 0}
    assert ("recycle" in names) is not busy


@pytest.mark.parametrize("checked", [True, False])
def test_an_unknown_holder_is_refused_where_take_refuses_it(checked):
    """take("nobody") evicts the CACHED heads on its way, then allocate refuses (spec: the
    holder must be alive); take_many leaves the same."""
    ends = []
    for many in (True, False):
        p = _cached_head_pool(checked)
        with pytest.raises(PendingAccess, match="allocate refused"):
            if many:
                p.take_many("nobody", 3)
            else:
                for _ in range(3):
                    p.take("nobody")
        ends.append(_end(p, None))
    assert ends[0] == ends[1]
    with pytest.raises(PendingAccess):
        BlockPool(3, B).take_many("nobody", 1)  # a FREE head: refused by the batch's guard


@pytest.mark.parametrize("checked", [True, False])
def test_a_queued_head_neither_free_nor_cached_is_refused_as_take_refuses_it(checked):
    """A corrupt queue (its head ALLOCATED): allocate's guard refuses it, in both paths."""
    ends = []
    for many in (True, False):
        p = BlockPool(4, B, checked=False)
        p.open_holder("r")
        p.state[0] = ALLOCATED  # behind the pool's back
        p.checked = checked
        with pytest.raises(PendingAccess, match="allocate refused"):
            p.take_many("r", 2) if many else p.take("r")
        ends.append(_end(p, None)[:-1])
    assert ends[0] == ends[1]


@pytest.mark.parametrize("checked", [True, False])
def test_an_unhashable_holder_is_refused_typed(checked):
    for p in (BlockPool(3, B, checked=checked), _cached_head_pool(checked)):
        q = _cached_head_pool(checked) if p.num_blocks == 6 else BlockPool(3, B, checked=checked)
        with pytest.raises(InvalidArgument, match="hashable"):
            p.take_many(["x"], 2)
        with pytest.raises(InvalidArgument, match="hashable"):
            q.take(["x"])
        assert _end(p, None) == _end(q, None)


@pytest.mark.parametrize("checked", [True, False])
def test_an_exhausted_pool_fails_where_take_fails(checked):
    """Past usable() (the caller's check), n takes evict the busy cached blocks and fail on the
    empty queue; take_many takes and evicts the same before failing."""
    ends = []
    for many in (True, False):
        p = _cached_head_pool(checked, busy=True)
        p.open_holder("r")
        n = p.usable() + 1
        with pytest.raises(AssertionError, match="exhausted"):
            if many:
                p.take_many("r", n)
            else:
                for _ in range(n):
                    p.take("r")
        ends.append(_end(p, None))
    assert ends[0] == ends[1]
    assert ends[0][0].count[ALLOCATED] == 4 and list(ends[0][1]) == []


def test_take_many_checks_its_count():
    p = BlockPool(4, B)
    p.open_holder("r")
    for bad in (-1, True, 1.0, "2"):
        with pytest.raises(InvalidArgument):
            p.take_many("r", bad)
    assert p.take_many("r", 0) == [] and p.count[FREE] == 4
    import numpy as np

    assert p.take_many("r", np.int64(2)) == [0, 1]


def test_the_free_run_is_one_batch_not_single_transitions(monkeypatch):
    calls = []
    real = BlockPool.allocate

    def counting(self, b, r):
        calls.append(b)
        return real(self, b, r)

    monkeypatch.setattr(BlockPool, "allocate", counting)
    p = BlockPool(8, B)
    p.open_holder("r")
    assert p.take_many("r", 5) == [0, 1, 2, 3, 4] and calls == []
    p.compile_spec = False  # interpreted: the single transitions
    p._batched.clear()
    assert p.take_many("r", 2) == [5, 6] and calls == [5, 6]
