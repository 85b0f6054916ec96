"""Epoch-based reclamation in the runtime: launches are numbered, pin every held block by
their number, complete in any order; a block let go is retired at the launch clock and reused
only once the watermark (every launch below it completed) passes that clock."""

from __future__ import annotations

import dataclasses

import pytest

from pagedkv.allocator import BlockAllocator, InvariantViolation, PendingAccess
from pagedkv.allocator.pool import BlockPool
from pagedkv.spec import (
    CACHED,
    FREE,
    ISSUED,
    RECLAIMED,
    TRANSITIONS,
    WATERMARK,
    initial_state,
    step,
)


def _committed(a: BlockAllocator, rid, tokens: list[int]):
    a.add_request(rid, tokens)
    a.allocate(rid, len(tokens))
    a.publish([rid]).complete()
    a.commit(rid, len(tokens))


# ---- (a) a launch costs O(written + new) transitions, not O(table entries) ------------------
def _long_request(checked: bool = True) -> BlockAllocator:
    """30 blocks of 4: 29 full committed blocks and a partial one, all written."""
    a = BlockAllocator(40, 4, checked=checked)
    _committed(a, "x", list(range(118)))
    assert len(a.block_table("x")) == 30
    return a


@pytest.mark.parametrize("checked", [True, False])
def test_a_decode_step_of_a_30_block_table_costs_no_per_entry_transition(checked):
    a = _long_request(checked)
    a.append_tokens("x", [1])
    a.allocate("x", 119)  # one more position, in the partial last block
    a.pool.trace = []
    launch = a.publish(["x"])
    last = a.block_table("x")[-1]
    assert a.pool.trace == [("launch", {"L": launch.seq}),
                            ("begin_write", {"b": last, "r": "x", "w": 1})]
    assert launch.writes == (last,) and launch.block_tables.shape == (1, 32)
    a.pool.trace = []
    launch.complete()
    assert [name for name, _ in a.pool.trace] == ["end_write", "complete", "advance"]


def test_a_step_into_a_new_block_publishes_only_that_block():
    a = _long_request()
    a.append_tokens("x", [1, 2, 3])
    a.allocate("x", 121)  # fills the last block and starts a 31st
    a.pool.trace = []
    launch = a.publish(["x"])
    *_, old_last, new = a.block_table("x")
    names = [name for name, _ in a.pool.trace]
    assert names == ["publish", "launch", "begin_write", "begin_write"]
    assert {p["b"] for name, p in a.pool.trace if "b" in p} == {old_last, new}
    assert set(launch.writes) == {old_last, new}


def test_a_launch_that_only_reads_costs_one_transition():
    a = _long_request()
    a.pool.trace = []
    launch = a.publish(["x"])  # nothing new to write: it reads all 30 blocks
    assert a.pool.trace == [("launch", {"L": launch.seq})] and launch.writes == ()
    assert launch.query_lens.tolist() == [0]


def test_launches_are_numbered_from_zero_in_publish_order():
    a = BlockAllocator(8, 2)
    a.add_request("x", [1, 2, 3])
    a.allocate("x", 3)
    launches = [a.publish(["x"]) for _ in range(3)]
    assert [launch.seq for launch in launches] == [0, 1, 2]
    assert a.pool.clock == [3, 0] and a.pool.inflight == {0, 1, 2}


# ---- (b) out-of-order completion: the watermark waits for the oldest launch ----------------
def test_out_of_order_completion_keeps_a_block_until_the_oldest_launch_completes():
    a = BlockAllocator(8, 2)
    a.add_request("x", [1, 2, 3])
    a.allocate("x", 3)
    a.add_request("y", [7, 8])
    a.allocate("y", 2)
    l0 = a.publish(["x"])
    l1 = a.publish(["y"])
    l2 = a.publish(["x"])
    (yb,) = a.block_table("y")
    a.free("y")  # released while launches 0, 1 and 2 are in flight: retired at clock 3
    assert a.state(yb) == RECLAIMED and a.pool.retire[yb] == 3
    l2.complete()
    l1.complete()
    assert a.pool.clock[WATERMARK] == 0 and a.pool.inflight == {0}
    assert a.state(yb) == RECLAIMED  # launch 0 may still read it
    assert a.stats()["reclaimed_waiting"] == 1 and a.stats()["inflight_launches"] == 1
    a.add_request("z", list(range(100, 110)))
    assert yb not in a.allocate("z", 10)  # every other block: it is never handed out
    l0.complete()
    assert a.pool.clock == [3, 3] and a.pool.inflight == set()
    assert a.state(yb) == FREE
    a.check_invariants()


def test_a_block_released_after_later_launches_completed_waits_for_the_oldest():
    a = BlockAllocator(8, 2)
    a.add_request("x", [1, 2, 3])
    a.allocate("x", 3)
    a.add_request("y", [7, 8])
    a.allocate("y", 2)
    l0, l1, l2 = (a.publish(["x"]) for _ in range(3))
    l2.complete()
    l1.complete()
    (yb,) = a.block_table("y")
    a.free("y")  # y was held when launch 0 was published: it waits for it
    assert a.state(yb) == RECLAIMED
    l0.complete()
    assert a.state(yb) == FREE
    a.check_invariants()


def test_a_cached_block_stays_busy_until_the_watermark_passes_it():
    a = BlockAllocator(8, 2)
    _committed(a, "x", [1, 2, 3])
    l1 = a.publish(["x"])
    l2 = a.publish(["x"])
    a.free("x")  # the full block is CACHED, retired at 3 > watermark 1
    cached = [b for b in range(8) if a.state(b) == CACHED]
    assert len(cached) == 1 and a.stats()["evictable_after_launches"] == 1
    l2.complete()
    assert a.stats()["evictable_after_launches"] == 1  # launch 1 is still in flight
    l1.complete()
    assert a.stats()["evictable_after_launches"] == 0 and a.stats()["evictable_now"] == 1
    assert a.pool.retire_queue == type(a.pool.retire_queue)()  # drained
    a.check_invariants()


def test_plan_room_counts_only_what_the_watermark_would_pass():
    """Completing done launches releases exactly what the new watermark passes: with an older
    launch still in flight, a newer done launch releases nothing."""

    class Done:
        def query(self):
            return True

    a = BlockAllocator(6, 2)
    a.add_request("old", [1, 2])
    a.allocate("old", 2)
    old = a.publish(["old"])  # launch 0, in flight, no event
    a.add_request("y", [5, 6, 7, 8])
    a.allocate("y", 4)
    new = a.publish(["y"])  # launch 1, its event says done
    new.record(Done())
    a.free("y")  # 2 blocks retired at clock 2: they need launch 0 too
    a.add_request("z", list(range(100, 108)))
    with pytest.raises(Exception) as err:
        a.allocate("z", 8)  # 4 blocks: 3 FREE, and the done launch would release none
    assert type(err.value).__name__ == "OutOfBlocks"
    assert (err.value.needed, err.value.available, err.value.waiting) == (4, 3, 2)
    assert not new.completed  # refused: nothing reclaimed
    old.complete()  # now completing `new` would move the watermark past both
    assert a.allocate("z", 8) and new.completed
    a.check_invariants()


# ---- (c) with nothing in flight, a released block is reusable at once ----------------------
def test_a_block_released_with_no_launch_in_flight_is_reusable_at_once():
    a = BlockAllocator(4, 2)
    _committed(a, "x", [1, 2, 3])  # a full committed block, a partial one
    assert a.pool.inflight == set()
    full, partial = a.block_table("x")
    a.free("x")
    assert a.state(partial) == FREE and a.state(full) == CACHED
    s = a.stats()
    assert s["free"] == 3 and s["evictable_now"] == 1 and s["waiting_on_launches"] == 0
    a.add_request("y", list(range(50, 58)))
    assert sorted(a.allocate("y", 8)) == [0, 1, 2, 3]  # the cached block is evicted, reused
    assert a.pool.retire_queue == type(a.pool.retire_queue)()
    a.check_invariants()


def test_pool_level_release_and_evict_recycle_at_once_when_nothing_is_in_flight():
    p = BlockPool(2, 1)
    p.open_holder("r")
    p.allocate(0, "r")
    p.publish(0, "r")
    p.release(0, "r")
    assert p.state[0] == FREE and not p.retire_queue
    p.allocate(1, "r")
    p.publish(1, "r")
    p.begin_write(1, "r", 1)
    p.release(1, "r")  # a write is still pending: RECLAIMED until it ends
    assert p.state[1] == RECLAIMED and p.structure_errors() == []
    p.end_write(1)
    assert p.state[1] == FREE and p.structure_errors() == []


# ---- (d) the retire stamp is load-bearing ---------------------------------------------------
def _without_retire_stamp():
    """release's effect, less its retire stamp (the retire clock is left as it was)."""
    t = TRANSITIONS["release"]

    def effect(ops, s, b, r):
        return t.effect(ops, s, b=b, r=r).replace(retire=s.retire)

    return dataclasses.replace(t, effect=effect)


def test_release_without_the_stamp_lets_the_spec_reuse_a_block_under_its_reader():
    """On the spec itself: block 0, held when launch 0 was published, is let go while launch 0
    is in flight. With the stamp, recycle is refused until launch 0 completes; without it,
    the block goes FREE and is allocated again while launch 0 may still read it."""

    def reused_while_launch_0_reads(spec):
        s = initial_state(1, 1, ("r", "q"))
        for name, kw in [("open_holder", {"r": "r"}), ("open_holder", {"r": "q"}),
                         ("allocate", {"b": 0, "r": "r"}), ("publish", {"b": 0, "r": "r"}),
                         ("launch", {"L": 0}), ("release", {"b": 0, "r": "r"})]:
            s = step(s, name, spec, **kw)
            assert s is not None, name
        assert s.inflight[0] and s.state[0] == RECLAIMED
        s = step(s, "recycle", spec, b=0)
        return s is not None and step(s, "allocate", spec, b=0, r="q") is not None

    assert not reused_while_launch_0_reads(TRANSITIONS)
    # the defect: nothing in the spec stops it now
    assert reused_while_launch_0_reads(dict(TRANSITIONS, release=_without_retire_stamp()))


@pytest.mark.parametrize("compiled", [True, False])
def test_release_without_the_stamp_is_caught_by_checked_mode(compiled):
    """On the runtime: the pool stamps the block, the weakened spec says the stamp is left
    alone, so checked mode reports the release as not refining the spec."""
    spec = dict(TRANSITIONS)
    a = BlockAllocator(4, 2, spec=spec)
    a.pool.compile_spec = compiled
    a.add_request("x", [1, 2, 3])
    a.allocate("x", 3)
    a.publish(["x"])  # launch 0 in flight
    spec["release"] = _without_retire_stamp()
    with pytest.raises(InvariantViolation, match=r"refines:release.*retire\[\d\]"):
        a.free("x")


def test_the_stamp_is_what_refuses_reuse_under_a_reader():
    """The guards read the stamp: a RECLAIMED block retired above the watermark can be neither
    recycled nor (once FREE) allocated early."""
    p = BlockPool(1, 1)
    p.open_holder("r")
    p.allocate(0, "r")
    p.publish(0, "r")
    p.launch(0)
    p.release(0, "r")
    assert (p.state[0], p.retire[0], p.clock) == (RECLAIMED, 1, [1, 0])
    with pytest.raises(PendingAccess, match="watermark"):
        p.recycle(0)
    p.complete(0)
    assert p.state[0] == RECLAIMED  # complete alone does not move the watermark
    p.advance()
    assert p.state[0] == FREE and p.clock[ISSUED] == p.clock[WATERMARK] == 1


# ---- the retire queue's bookkeeping ---------------------------------------------------------
def test_a_block_retired_twice_at_one_clock_is_queued_once():
    a = BlockAllocator(6, 2)
    _committed(a, "x", [1, 2, 3])
    (full, _) = a.block_table("x")
    reader = a.publish(["x"])
    a.free("x")  # full: CACHED, busy, queued at clock 2
    a.add_request("y", [1, 2, 9])
    a.allocate("y", 3)  # revives it (hit): no longer busy
    a.free("y")  # retired again at the same clock: the queued entry covers it
    assert [e for e in a.pool.retire_queue if e[1] == full] == [(2, full)]
    assert a.pool.cached_busy == 1 and a.pool.structure_errors() == []
    reader.complete()
    assert a.pool.cached_busy == 0 and a.stats()["evictable_now"] == 1
    a.check_invariants()


def test_structure_errors_report_a_lost_retire_queue_entry():
    a = BlockAllocator(4, 2)
    a.add_request("x", [1, 2])
    a.allocate("x", 2)
    a.publish(["x"])
    a.free("x")
    assert a.pool.structure_errors() == []
    a.pool.retire_queue.clear()  # the block would never be recycled
    with pytest.raises(InvariantViolation, match="reused_after_its_readers"):
        a.check_invariants()


@pytest.mark.parametrize("compiled", [True, False])
def test_checked_mode_catches_a_stray_change_of_the_clock(monkeypatch, compiled):
    """A runtime transition that moves the clock (or a launch's flag) where the spec's effect
    leaves it is a refinement failure, named as such."""
    p = BlockPool(2, 1)
    p.compile_spec = compiled
    p.open_holder("r")
    p.allocate(0, "r")
    move = p._move

    def move_and_tick(b, new_state):
        move(b, new_state)
        p.clock[ISSUED] += 1

    monkeypatch.setattr(p, "_move", move_and_tick)
    with pytest.raises(InvariantViolation, match="refines:publish.*clock changed"):
        p.publish(0, "r")

    def move_and_flag(b, new_state):
        move(b, new_state)
        p.inflight.add(8)

    monkeypatch.setattr(p, "_move", move_and_flag)
    with pytest.raises(InvariantViolation, match="refines:allocate.*launches in flight"):
        p.allocate(1, "r")


@pytest.mark.parametrize("compiled", [True, False])
def test_checked_mode_checks_the_clock_invariants_after_a_clock_transition(compiled):
    p = BlockPool(2, 1)
    p.compile_spec = compiled
    p.launch(0)
    p.clock[WATERMARK] = 3  # corrupt: the watermark passed launch 0, still in flight
    with pytest.raises(InvariantViolation, match="watermark_bounds"):
        p.launch(1)
    q = BlockPool(2, 1)
    q.compile_spec = compiled
    q.launch(0)
    q.complete(0)
    q.clock[WATERMARK] = 2  # corrupt: past the next launch, which then lands below it
    with pytest.raises(InvariantViolation, match="launch_window"):
        q.launch(1)  # (the clock is [2, 2] after it: only the launch's window is wrong)
    r = BlockPool(2, 1)
    r.compile_spec = compiled
    r.launch(0)
    r.complete(0)
    r.advance()
    assert r.clock == [1, 1]  # the unmodified run passes every check
