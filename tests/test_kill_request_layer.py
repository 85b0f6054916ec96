"""Kills mutants of the request layer (allocator/allocator.py) through its public API: empty
token lists, returned tables that are copies, room planning with completed launches (a refused
call reclaims nothing; blocks still read by other launches or still held are not counted; a
held prefix hit is not counted twice), a fork that reclaims to get fresh blocks, copy-on-write
room when every holder writes, exact ``stats()`` accounting and ``check_invariants``' report;
and the token / key / parent checks of allocator/hashing.py that the request layer relies on."""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest

from pagedkv.allocator import (
    BlockAllocator,
    InvalidArgument,
    InvariantViolation,
    OutOfBlocks,
    block_hash,
    chain_hashes,
)
from pagedkv.spec import CACHED, FREE, PUBLISHED, RECLAIMED, REFERENCED, WATERMARK, violations
from pagedkv.spec.states import ALLOCATED


class Event:
    def __init__(self, done: bool = False) -> None:
        self.done = done

    def query(self) -> bool:
        return self.done


def step(a, rid, n):
    """Cover n positions, launch, complete, commit."""
    a.allocate(rid, n)
    a.publish([rid]).complete()
    a.commit(rid, n)


def snap(a):
    ab = a.abstract()
    return ab, a.stats(), [launch.completed for launch in a.inflight]


# ---- token lists ---------------------------------------------------------------------------
def test_empty_token_lists_are_accepted():
    a = BlockAllocator(4, 2)
    assert a.add_request("r", []) == 0
    a.append_tokens("r", [])
    a.append_tokens("r", ())
    a.append_tokens("r", [1, 2, 3])
    a.append_tokens("r", [])
    step(a, "r", 3)
    assert a.num_computed("r") == 3
    a.check_invariants()


def test_checked_flag_is_kept():
    assert BlockAllocator(2, 2).checked is True
    assert BlockAllocator(2, 2, checked=False).checked is False


# ---- returned tables are copies ------------------------------------------------------------
def _mess_up(table):
    table[0] = 999
    table.append(998)


def test_tables_returned_are_copies():
    a = BlockAllocator(8, 2)
    a.add_request("p", [1, 2, 3, 4, 5])
    t = a.allocate("p", 5)
    expect = list(t)
    _mess_up(t)
    assert a.block_table("p") == expect
    _mess_up(a.block_table("p"))
    assert a.block_table("p") == expect
    a.publish(["p"]).complete()
    a.commit("p", 5)
    child = a.fork("p", "c")
    assert child == expect
    _mess_up(child)
    assert a.block_table("c") == expect
    a.check_invariants()
    launch = a.publish(["p", "c"])
    assert launch.block_tables.tolist() == [expect + [-1], expect + [-1]]  # width 4
    launch.complete()
    a.free("c")
    a.free("p")
    a.check_invariants()


# ---- room planning with completed launches -------------------------------------------------
def test_refused_allocate_does_not_count_blocks_other_launches_still_read():
    """Two launches read the freed request's blocks; only the first one's event fired. The
    blocks stay RECLAIMED until both complete: nothing can be taken, and the refusal changes
    nothing (the completed launch is not reclaimed)."""
    a = BlockAllocator(2, 2)
    a.add_request("a", [1, 2, 3])
    a.allocate("a", 3)
    first = a.publish(["a"])
    second = a.publish(["a"])
    first.record(Event(done=True))
    a.free("a")
    assert [a.state(b) for b in range(2)] == [RECLAIMED, RECLAIMED]
    a.add_request("b", [7])
    before = snap(a)
    with pytest.raises(OutOfBlocks) as err:
        a.allocate("b", 1)
    assert (err.value.needed, err.value.available) == (1, 0)
    assert not first.completed and snap(a) == before
    second.complete()
    assert a.allocate("b", 1)  # first is reclaimed now: both blocks become FREE
    assert first.completed
    a.check_invariants()


def test_refused_allocate_does_not_count_blocks_a_live_request_holds():
    """A completed launch of a live request releases pins, not blocks: its blocks are still
    held, so they are no room, and the refusal does not reclaim the launch."""
    a = BlockAllocator(2, 2)
    a.add_request("a", [1, 2, 3])
    a.allocate("a", 3)
    launch = a.publish(["a"])
    launch.record(Event(done=True))
    a.add_request("b", [7])
    before = snap(a)
    with pytest.raises(OutOfBlocks) as err:
        a.allocate("b", 1)
    assert (err.value.needed, err.value.available) == (1, 0)
    assert not launch.completed and snap(a) == before
    a.check_invariants()


def test_held_prefix_hit_read_by_a_completed_launch_is_not_subtracted():
    """b's prefix hit is a's REFERENCED block, read by a completed launch that also pins the
    one block b needs (x's, RECLAIMED): b fits exactly once that launch is reclaimed."""
    a = BlockAllocator(4, 2)
    a.add_request("a", [1, 2, 3])
    step(a, "a", 3)  # a0 REFERENCED, a1 PUBLISHED (partial)
    a.add_request("x", [9])
    a.allocate("x", 1)
    a.add_request("y", [8])
    a.allocate("y", 1)
    launch = a.publish(["a", "x"])
    launch.record(Event(done=True))
    a.free("x")
    a0, _ = a.block_table("a")
    [xb] = launch.block_tables[1][:1].tolist()
    assert a.state(a0) == REFERENCED and a.state(xb) == RECLAIMED
    assert a.stats()["allocatable_now"] == 0
    a.add_request("b", [1, 2, 3])
    assert a.allocate("b", 3) == [a0, xb]
    assert launch.completed and a.ref_count(a0) == 2
    a.check_invariants()


def test_fork_reclaims_a_completed_launch_for_its_fresh_blocks():
    a = BlockAllocator(4, 2)
    a.add_request("p", [1, 2, 3])
    step(a, "p", 3)
    a.append_tokens("p", [4, 5])
    a.allocate("p", 5)  # a third, never published (ALLOCATED) block: the child gets its own
    a.add_request("x", [9])
    a.allocate("x", 1)
    launch = a.publish(["x"])
    launch.record(Event(done=True))
    a.free("x")
    [xb] = launch.block_tables[0].tolist()
    assert a.state(xb) == RECLAIMED and a.stats()["free"] == 0
    child = a.fork("p", "c")
    assert launch.completed
    assert child[:2] == a.block_table("p")[:2] and child[2] == xb
    assert a.state(a.block_table("p")[2]) == ALLOCATED and a.state(xb) == ALLOCATED
    a.check_invariants()


def test_every_holder_of_a_shared_partial_block_writes_in_one_launch():
    """p and its fork c share a partial block and both write it in one launch: one copies,
    the last writes in place, so one free block is enough."""
    a = BlockAllocator(3, 2)
    a.add_request("p", [1, 2, 3])
    step(a, "p", 3)  # 2 blocks, the second partial
    a.fork("p", "c")
    for r in ("p", "c"):
        a.append_tokens(r, [4])
        a.allocate(r, 4)
    assert a.stats()["free"] == 1
    launch = a.publish(["p", "c"])
    assert len(launch.copies) == 1
    launch.complete()
    a.commit("p", 4)
    a.commit("c", 4)
    assert a.block_table("p")[1] != a.block_table("c")[1]
    a.check_invariants()


def test_each_full_block_is_offered_to_the_prefix_cache_once():
    """A and B compute the same prefix side by side: at B's commit its first block is a
    duplicate of A's (already cached under that hash) and stays unregistered. Blocks are
    offered once, at the commit that completes them (commit costs O(new blocks)): after A's
    copy is evicted, B's next commit registers only its new block, and a fourth request with
    the same prompt finds no hit."""
    a = BlockAllocator(5, 2)
    a.add_request("A", [1, 2, 3])
    a.add_request("B", [1, 2, 3])
    a.allocate("A", 3)
    a.allocate("B", 3)
    a.publish(["A", "B"]).complete()
    a.commit("A", 3)
    a.commit("B", 3)
    a0, b0 = a.block_table("A")[0], a.block_table("B")[0]
    assert (a.state(a0), a.state(b0)) == (REFERENCED, PUBLISHED)
    a.free("A")
    a.add_request("C", [9, 9, 9, 9, 9, 9])
    a.allocate("C", 6)  # the FREE blocks, then A's cached block is evicted
    assert a.state(a0) == ALLOCATED
    a.free("C")
    assert a.stats()["cached"] == 0 and a.stats()["free"] == 3
    a.append_tokens("B", [4, 5])
    step(a, "B", 5)
    assert a.state(a.block_table("B")[1]) == REFERENCED  # completed by this commit
    assert a.state(b0) == PUBLISHED  # offered once, at its own commit
    assert a.add_request("D", [1, 2, 3, 4, 5]) == 0
    a.check_invariants()


# ---- exact accounting ----------------------------------------------------------------------
class FakeKVPool:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks, self.block_size = num_blocks, block_size
        self.bytes_per_block = 1000
        self.reserved_bytes = 1000 * num_blocks + 7


def _stats_by_scan(a) -> dict[str, int]:
    p = a.pool
    states = [a.state(b) for b in range(a.num_blocks)]
    busy = sum(1 for b, s in enumerate(states)
               if s == CACHED and p.retire[b] > p.clock[WATERMARK])
    count = {s: states.count(s) for s in (FREE, ALLOCATED, PUBLISHED, REFERENCED, CACHED,
                                          RECLAIMED)}
    held = sum(1 for b in range(a.num_blocks) if a.ref_count(b) > 0)
    entries = sum(len(a.block_table(r)) for r in a.requests)
    tokens = sum(a.num_reserved(r) for r in a.requests)
    per = 1000
    return {
        "free": count[FREE],
        "evictable_now": count[CACHED] - busy,
        "evictable_after_launches": busy,
        "cached": count[CACHED],
        "reclaimed_waiting": count[RECLAIMED],
        "waiting_on_launches": count[RECLAIMED] + busy,
        "held": held,
        "allocatable_now": count[FREE] + count[CACHED] - busy,
        "admission_headroom": a.num_blocks - held,
        "occupancy_blocks": entries,
        "occupancy_tokens": tokens,
        "tail_waste_slots": entries * a.block_size - tokens,
        "prefix_hit_tokens": a.stats()["prefix_hit_tokens"],
        "inflight_launches": len(a.inflight),
        "bytes_per_block": per,
        "reserved_bytes": 1000 * a.num_blocks + 7,
        "in_use_bytes": held * per,
        "cached_bytes": count[CACHED] * per,
    }


def test_stats_are_exact_in_every_block_state():
    N, B = 14, 2
    a = BlockAllocator(N, B)
    a.attach_pool(FakeKVPool(N, B))
    a.add_request("a", [1, 2, 3, 4, 5])
    step(a, "a", 5)  # 2 REFERENCED, 1 PUBLISHED
    a.add_request("e", [5, 5, 6, 6, 1])
    step(a, "e", 5)
    a.free("e")  # no launch in flight: 2 CACHED idle, the partial one FREE
    a.add_request("d", [7, 7, 8, 8, 9])
    step(a, "d", 5)
    reading = a.publish(["d"])  # may read every held block until it completes
    a.free("d")  # 2 CACHED but busy, 1 RECLAIMED
    a.add_request("g", [3, 3, 3, 3])
    a.allocate("g", 4)  # 2 ALLOCATED
    a.add_request("h", [1, 2, 3, 4, 0])
    assert a.add_request("i", [1, 2, 3, 4, 5, 6]) == 4
    a.allocate("h", 5)  # 2 prefix hits on a's blocks + 1 ALLOCATED
    s = a.stats()
    assert s == _stats_by_scan(a)
    assert s["prefix_hit_tokens"] == 4
    assert (s["evictable_after_launches"], s["reclaimed_waiting"], s["evictable_now"]) == (2, 1, 2)
    assert s["held"] == 3 + 2 + 1 and s["cached_bytes"] == 4000 and s["in_use_bytes"] == 6000
    reading.complete()
    assert a.stats() == _stats_by_scan(a)
    a.check_invariants()


# ---- check_invariants' report ----------------------------------------------------------------
def _one_request():
    a = BlockAllocator(4, 2)
    a.add_request("r", [1, 2, 3])
    a.allocate("r", 3)
    return a


def test_stats_totals_out_of_step_with_the_tables_are_reported():
    a = _one_request()
    a._entries_total += 1  # a bookkeeping bug: stats() would misreport occupancy
    with pytest.raises(InvariantViolation) as err:
        a.check_invariants()
    assert err.value.invariant == "table_covers_reserved"
    assert "stats totals differ" in str(err.value) and "(and" not in str(err.value)


def test_the_report_counts_the_other_violations():
    a = _one_request()
    a._reserved_total += 1
    b = a.block_table("r")[0]
    a.pool.ref[b] += 1  # a ref-count bug as well
    ab = a.abstract()
    n = len(violations(ab.pool, ab.requests)) + len(a.pool.structure_errors()) + 1
    assert n >= 2
    with pytest.raises(InvariantViolation) as err:
        a.check_invariants()
    assert str(err.value).endswith(f" (and {n - 1} more)")


# ---- the hashing the request layer relies on (allocator/hashing.py) ---------------------------
class bool_(int):  # noqa: N801 - named like numpy's bool on purpose
    """An int subclass from another module that happens to share numpy's bool's name."""


def test_only_numpys_bool_is_refused_as_a_bool():
    assert block_hash(bool_(5), [1, 2]) == block_hash(5, [1, 2])
    assert block_hash(0, [bool_(1), 2], (bool_(3),)) == block_hash(0, [1, 2], (3,))
    assert chain_hashes([1, 2, 3, 4], bool_(2)) == chain_hashes([1, 2, 3, 4], 2)
    a = BlockAllocator(8, 2)
    a.add_request("x", [1, 2, 3], extra_keys=(3,))
    step(a, "x", 3)
    assert a.add_request("y", [1, 2, 3], extra_keys=[bool_(3)]) == 2  # same key: a hit
    for bad in (np.bool_(True), True):
        with pytest.raises(InvalidArgument):
            block_hash(0, [1, 2], (bad,))
        with pytest.raises(InvalidArgument):
            chain_hashes([1, 2], bad)


def test_empty_non_list_token_sequences_hash_like_an_empty_list():
    for empty in (np.zeros(0, dtype=np.int64), range(0), deque()):
        assert chain_hashes(empty, 2) == []
        assert block_hash(7, empty) == block_hash(7, [])


def test_int64_edges_are_accepted_from_any_sequence():
    edges = [-(2**63), 2**63 - 1]
    want = block_hash(0, edges)
    assert block_hash(0, np.array(edges, dtype=np.int64)) == want
    assert block_hash(0, deque(edges)) == want
    assert chain_hashes(deque(edges), 2) == [want]


@pytest.mark.parametrize("tokens", [[-(2**63), 2**63], [2**63 - 1, 2**63],
                                    [-(2**63), -(2**63) - 1]], ids=str)
def test_the_refusal_names_the_token_out_of_range(tokens):
    with pytest.raises(InvalidArgument) as err:
        block_hash(0, deque(tokens))
    assert str(err.value).endswith(f": {tokens[1]}")
