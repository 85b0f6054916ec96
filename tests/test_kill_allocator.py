"""Kills mutants of the request layer (allocator/allocator.py): admission arithmetic with
prefix hits, commit and allocate boundaries, the hash memo, fork and copy-on-write."""

from __future__ import annotations

import pytest

import pagedkv.allocator.allocator as allocator_module
from pagedkv.allocator import (
    BlockAllocator,
    OutOfBlocks,
    TokensUnknown,
)
from pagedkv.allocator.hashing import chain_hashes, encode_tokens
from pagedkv.spec import CACHED, FREE, states_equal
from pagedkv.spec.requests import summary


def step(a, rid, n):
    """Cover n positions, launch, complete, commit."""
    a.allocate(rid, n)
    a.publish([rid]).complete()
    a.commit(rid, n)


def snap(a):
    ab = a.abstract()
    return ab.pool, summary(ab.requests)


def unchanged(a, before):
    pool, tables = snap(a)
    assert states_equal(before[0], pool) == [] and before[1] == tables


def test_same_size_allocate_and_commit_are_no_ops():
    a = BlockAllocator(4, 2)
    a.add_request("r", [1, 2, 3])
    assert a.allocate("r", 3) == a.allocate("r", 3)
    a.publish(["r"]).complete()
    a.commit("r", 3)  # exactly what was issued
    a.commit("r", 3)  # again: nothing new
    assert a.num_computed("r") == 3
    a.check_invariants()


def test_allocating_exactly_the_free_blocks():
    a = BlockAllocator(3, 2)
    a.add_request("r", [1] * 6)
    assert len(a.allocate("r", 6)) == 3
    a.add_request("s", [2])
    with pytest.raises(OutOfBlocks):
        a.allocate("s", 1)


def _cached_prefix(num_blocks):
    """'a' committed 2 full blocks (B = 2) and finished: they are CACHED."""
    a = BlockAllocator(num_blocks, 2)
    a.add_request("a", [1, 2, 3, 4, 5])
    step(a, "a", 5)
    a.free("a")
    return a


def test_prefix_hits_do_not_count_as_needed_blocks():
    a = _cached_prefix(3)  # 2 CACHED + 1 FREE
    a.add_request("b", [1, 2, 3, 4, 5])
    assert a.allocate("b", 5)[:2] == [b for b in range(3) if a.state(b) != FREE][:2]
    assert a.stats()["free"] == 0
    a.check_invariants()


def test_revived_hits_are_not_available_for_new_blocks():
    a = _cached_prefix(3)  # 2 CACHED + 1 FREE; b hits both and needs 2 more
    a.add_request("b", [1, 2, 3, 4, 5, 6, 7])
    before = snap(a)
    with pytest.raises(OutOfBlocks):
        a.allocate("b", 7)
    unchanged(a, before)


def test_busy_cached_hits_are_not_counted_as_revived():
    """A cached hit still read by a launch is not usable anyway: reviving it frees nothing."""
    a = BlockAllocator(4, 2)
    a.add_request("a", [1, 2, 3, 4, 5])
    step(a, "a", 5)
    a.append_tokens("a", [6])
    a.allocate("a", 6)
    launch = a.publish(["a"])  # reads blocks 0, 1
    a.free("a")  # 2 busy CACHED, 1 reclaimed pending, 1 FREE
    a.add_request("b", [1, 2, 3, 4, 5])
    assert len(a.allocate("b", 5)) == 3  # 2 hits + the FREE block
    launch.complete()
    a.check_invariants()


def test_distinct_prompts_never_hit_and_hashes_are_the_chain():
    a = _cached_prefix(6)
    cached = {b for b in range(6) if a.state(b) == CACHED}
    assert len(cached) == 2
    a.add_request("x", [8, 2, 9, 9, 9])
    assert cached.isdisjoint(a.allocate("x", 5))
    assert a._requests["x"].hashes == chain_hashes([8, 2, 9, 9, 9], 2)
    a.add_request("y", [1, 2, 3, 4, 5])
    t = a.allocate("y", 5)
    assert [a.ref_count(b) for b in t[:2]] == [1, 1]
    assert a._requests["y"].hashes == chain_hashes([1, 2, 3, 4, 5], 2)
    a.check_invariants()


def test_hash_memo_is_used_and_bounded(monkeypatch):
    monkeypatch.setattr(allocator_module, "_HASH_MEMO_MAX", 3)
    a = BlockAllocator(8, 1)
    a.add_request("r", [1, 2])
    assert len(a._hash_memo) == 2
    a.add_request("s", [1, 2])
    assert len(a._hash_memo) == 2 and a._requests["s"].hashes == a._requests["r"].hashes
    a.add_request("t", [5, 6, 7, 8])
    assert 1 <= len(a._hash_memo) <= 3
    assert a._requests["t"].hashes == chain_hashes([5, 6, 7, 8], 1)


def test_positions_with_unknown_tokens_are_written_but_never_cached_or_shared():
    a = BlockAllocator(4, 2)
    a.add_request("r", [1])
    a.allocate("r", 4)
    launch = a.publish(["r"])  # async scheduling: tokens 2..4 are sampled on the device
    launch.complete()
    before = snap(a)
    with pytest.raises(TokensUnknown):
        a.commit("r", 4)
    with pytest.raises(TokensUnknown):
        a.fork("r", "child")
    unchanged(a, before)
    a.commit("r", 1)  # the known prefix may be committed
    a.append_tokens("r", [2, 3, 4])
    a.commit("r", 4)
    a.add_request("s", [1, 2, 3, 4, 5])
    assert a.add_request("t", [1, 2, 3, 4, 5]) == 4  # both blocks are in the prefix cache


def test_commit_registers_published_blocks_once():
    a = BlockAllocator(6, 2)
    a.add_request("r", [1, 2, 3, 4, 5])
    step(a, "r", 5)
    assert a.add_request("s", [1, 2, 3, 4, 5]) == 4
    a.append_tokens("r", [6])
    step(a, "r", 6)
    a.check_invariants()


def test_fork_shares_published_blocks_and_refuses_bad_children():
    a = BlockAllocator(8, 2)
    a.add_request("p", [1, 2, 3])
    step(a, "p", 3)
    c = a.fork("p", "c")
    assert c == a.block_table("p")
    assert [a.ref_count(b) for b in c] == [2, 2]
    a.check_invariants()
    a.free("c")
    assert [a.ref_count(b) for b in a.block_table("p")] == [1, 1]
    a.check_invariants()


def test_fork_of_unpublished_blocks_takes_fresh_ones():
    a = BlockAllocator(8, 2)
    a.add_request("p", [1, 2, 3])
    a.allocate("p", 3)
    c = a.fork("p", "c")
    assert set(c).isdisjoint(a.block_table("p")) and len(c) == 2
    a.check_invariants()


def test_copy_on_write_only_for_shared_partial_blocks():
    a = BlockAllocator(8, 2)
    a.add_request("p", [1, 2, 3])
    step(a, "p", 3)
    launch = a.publish(["p"])  # nothing new to write: no copy
    assert len(launch.copies) == 0
    launch.complete()
    a.append_tokens("p", [4])
    a.allocate("p", 4)
    launch = a.publish(["p"])  # writes its own unshared partial block: no copy
    assert len(launch.copies) == 0
    launch.complete()
    a.commit("p", 4)
    a.append_tokens("p", [5])
    a.allocate("p", 5)
    a.publish(["p"]).complete()
    a.commit("p", 5)
    a.fork("p", "c")
    a.append_tokens("c", [6])
    a.allocate("c", 6)
    launch = a.publish(["c"])  # shared partial block: copied
    assert len(launch.copies) == 1
    launch.complete()
    a.check_invariants()


def test_copy_on_write_with_exactly_one_free_block():
    a = BlockAllocator(4, 2)
    a.add_request("p", [1, 2, 3])
    step(a, "p", 3)
    a.fork("p", "c")
    a.append_tokens("c", [6])
    a.allocate("c", 4)
    a.add_request("q", [7])
    a.allocate("q", 1)  # leaves exactly one FREE block for the copy
    assert a.stats()["free"] == 1
    launch = a.publish(["c"])
    assert len(launch.copies) == 1
    launch.complete()
    a.check_invariants()


def test_hash_memo_never_exceeds_its_bound(monkeypatch):
    monkeypatch.setattr(allocator_module, "_HASH_MEMO_MAX", 3)
    a = BlockAllocator(8, 1)
    sizes = []
    for k in range(7):
        a.add_request(k, [100 + k])
        sizes.append(len(a._hash_memo))
    assert sizes == [1, 2, 3, 3, 3, 3, 3]  # full: the oldest entry makes room, one at a time
    assert [key[1] for key in a._hash_memo] == [encode_tokens([t]) for t in (104, 105, 106)]


def test_hash_memo_keeps_what_is_used_most_recently(monkeypatch):
    """A hot prefix hashed again survives newer entries: the least recently used goes first."""
    monkeypatch.setattr(allocator_module, "_HASH_MEMO_MAX", 3)
    a = BlockAllocator(16, 1)
    a.add_request("hot", [7])
    for k in range(6):
        a.add_request(("hot", k), [7])  # a hit: the hot entry becomes the newest
        a.add_request(k, [100 + k])
    assert [key[1] for key in a._hash_memo] == [encode_tokens([t]) for t in (104, 7, 105)]


def test_hashes_without_the_memo():
    a = BlockAllocator(8, 2)
    a._hash_memo = None
    a.add_request("r", [1, 2, 3, 4, 5], cache_salt="s")
    assert a._requests["r"].hashes == chain_hashes([1, 2, 3, 4, 5], 2, salt="s")


def test_a_one_token_prompt_never_hits():
    a = BlockAllocator(4, 1)
    a.add_request("a", [5, 6])
    step(a, "a", 2)
    a.free("a")
    assert a.add_request("b", [5]) == 0  # its only token must be computed
    assert a.allocate("b", 1) and a.num_computed("b") == 0
    assert a.add_request("c", []) == 0
    assert a.add_request("d", [5, 6]) == 1


def test_hits_held_by_a_live_request_are_not_revived():
    """b hits a's two REFERENCED blocks (still held by a) and needs the last FREE block."""
    a = BlockAllocator(4, 2)
    a.add_request("a", [1, 2, 3, 4, 5])
    step(a, "a", 5)
    assert a.stats()["free"] == 1
    a.add_request("b", [1, 2, 3, 4, 9])
    assert len(a.allocate("b", 5)) == 3
    a.check_invariants()


def test_fork_with_exactly_enough_blocks_for_the_unpublished_ones():
    a = BlockAllocator(4, 2)
    a.add_request("p", [1, 2, 3])
    a.allocate("p", 3)  # 2 ALLOCATED blocks, 2 FREE left
    assert len(a.fork("p", "c")) == 2
    a.check_invariants()


class _Done:
    def query(self) -> bool:
        return True


def test_copy_on_write_reclaims_a_finished_launch_and_commits():
    a = BlockAllocator(3, 2)
    a.add_request("p", [1, 2, 3])
    step(a, "p", 3)  # block 0 full, block 1 partial (1 slot)
    a.fork("p", "c")  # shares both
    a.add_request("q", [7])
    a.allocate("q", 1)  # the last FREE block
    launch = a.publish(["q"])
    launch.record(_Done())  # finished, not yet reclaimed
    a.free("q")  # its block waits for the launch
    assert a.pool.usable() == 0
    a.append_tokens("c", [4])
    a.allocate("c", 4)
    cow = a.publish(["c"])  # needs a block for the copy: reclaim() finds it
    assert launch.completed and len(cow.copies) == 1
    cow.complete()
    a.commit("c", 4)  # the copy holds the shared slot and the new one
    assert a.num_computed("c") == 4
    a.check_invariants()


def test_completed_launches_leave_the_inflight_set():
    a = BlockAllocator(4, 2)
    a.add_request("r", [1, 2, 3])
    a.allocate("r", 3)
    launch = a.publish(["r"])
    assert a.inflight == (launch,) and a.stats()["inflight_launches"] == 1
    launch.complete()
    assert a.inflight == () and a.stats()["inflight_launches"] == 0


@pytest.mark.parametrize("let_go_again", [True, False])
def test_a_stale_retire_entry_is_not_counted_as_room_a_completion_would_make(let_go_again):
    """Block 0 is retired at clock 2 (launch 1 reads it), then revived by y's hit: held by y,
    or let go again and retired at 3 (launch 2 reads it). Either way its entry at 2 is stale:
    completing launch 1 (the watermark moves to 2) makes no room of block 0, and an allocation
    that needs it is refused with nothing changed (launch 1 not reclaimed either)."""
    a = BlockAllocator(4, 2)
    a.add_request("w", [1, 2, 3])
    step(a, "w", 3)  # launch 0: block 0 full and cached, block 1 partial
    first = a.publish(["w"])  # launch 1 reads blocks 0 and 1
    a.free("w")  # block 0 CACHED and busy, block 1 RECLAIMED: both retired at 2
    a.add_request("y", [1, 2, 3])
    a.allocate("y", 3)  # the hit revives block 0; block 2 is new
    if let_go_again:
        a.publish(["y"])  # launch 2, left in flight
        a.free("y")  # blocks 0 and 2 retired at 3
    first.record(_Done())  # launch 1 finished, not yet reclaimed
    assert a.pool.usable() == 1  # block 3; launch 1 would release block 1 only
    a.add_request("z", [7, 8, 9, 10, 11])
    before = snap(a)
    with pytest.raises(OutOfBlocks):
        a.allocate("z", 5)  # 3 blocks: 1 free + 1 released by launch 1 is not enough
    unchanged(a, before)
    assert not first.completed
    a.check_invariants()


@pytest.mark.parametrize("field", ["blocks", "gens"])
def test_check_invariants_catches_launch_rows_that_differ_from_the_table(field):
    """The int32 rows launches copy their block tables from must match each table (block ids
    and generations): a stale row would hand kernels another request's blocks."""
    from pagedkv.allocator import InvariantViolation

    a = BlockAllocator(6, 2)
    a.add_request("r", [1, 2, 3])
    a.allocate("r", 3)
    a.check_invariants()
    row = a._requests["r"].row
    getattr(a._rows, field)[row, 1] += 1
    with pytest.raises(InvariantViolation, match="launch rows of 'r' differ"):
        a.check_invariants()


def test_a_confirmed_refusal_keeps_one_message_with_the_spec_s_reason():
    from pagedkv.allocator import CommitError

    a = BlockAllocator(4, 2)
    a.add_request("r", [1, 2, 3])
    a.allocate("r", 3)
    a.publish(["r"])  # in flight: nothing written yet
    with pytest.raises(CommitError) as info:
        a.commit("r", 2)
    exc = info.value
    assert exc.args == (str(exc),)
    assert str(exc).count("(spec: ") == 1 and str(exc).endswith(f"(spec: {exc.spec_reason})")


def test_step_level_pairs_map_each_value_to_its_own_request():
    """Integer request ids that are also valid values: each value goes to the id beside it."""
    a = BlockAllocator(8, 2)
    for rid in (3, 5):
        a.add_request(rid, [1, 2, 3, 4, 5])
        a.allocate(rid, 1)
    a.allocate_many([(3, 5), (5, 3)])
    assert (a.num_reserved(3), a.num_reserved(5)) == (5, 3)


@pytest.mark.parametrize("pair", ["rn", ("r", 3, 9), ["r"], ("r",)])
@pytest.mark.parametrize("call", ["allocate_many", "commit_many"])
def test_step_level_calls_take_only_pairs(pair, call):
    """A 2-character string, a triple, a 1-list and a 1-tuple are not (request id, value)
    pairs, even where their first item names a request."""
    from pagedkv.allocator import InvalidArgument

    a = BlockAllocator(4, 2)
    a.add_request("r", [1, 2, 3])
    a.allocate("r", 1)
    before = snap(a)
    with pytest.raises(InvalidArgument, match=r"takes \(request id, value\) pairs"):
        getattr(a, call)([pair])
    unchanged(a, before)


def test_step_level_pairs_may_be_lists():
    a = BlockAllocator(8, 2)
    for rid in ("r", "s"):
        a.add_request(rid, [1, 2, 3, 4, 5])
        a.allocate(rid, 1)
    a.allocate_many([["r", 3], ("s", 5)])
    assert (a.num_reserved("r"), a.num_reserved("s")) == (3, 5)


def test_publish_marks_the_table_published_so_a_step_looks_only_at_new_entries():
    """A launch's cost is O(entries added since the last one): the published mark follows the
    table, and the next publish starts from it."""
    a = BlockAllocator(16, 2)
    a.add_request("r", list(range(20)))
    a.allocate("r", 20)
    a.publish(["r"]).complete()
    assert a._requests["r"].published == 10
    a.commit("r", 20)
    a.append_tokens("r", [7])
    a.allocate("r", 21)
    a.publish(["r"]).complete()
    assert a._requests["r"].published == 11


def test_a_shared_partial_block_is_copied_only_by_the_request_that_writes_it():
    """Parent and child share a partial block; only the child writes it in this launch: the
    child copies, the parent (published beside it, writing nothing) keeps its table."""
    a = BlockAllocator(8, 2)
    a.add_request("p", [1, 2, 3])
    step(a, "p", 3)  # block 0 full, block 1 partial
    a.fork("p", "c")
    a.append_tokens("c", [4])
    a.allocate("c", 4)
    before = a.block_table("p")
    launch = a.publish(["p", "c"])
    assert a.block_table("p") == before
    assert len(launch.copies) == 1 and launch.copies[0][0] == before[1]
    assert a.block_table("c") == [before[0], launch.copies[0][1]]
    launch.complete()
    a.check_invariants()


def test_one_writer_of_a_block_three_requests_share_needs_one_block_for_its_copy():
    a = BlockAllocator(4, 2)
    a.add_request("p", [1, 2, 3])
    step(a, "p", 3)  # blocks 0 (full) and 1 (partial)
    a.fork("p", "c1")
    a.fork("p", "c2")  # block 1 held three times
    a.add_request("q", [9])
    a.allocate("q", 1)  # one FREE block left
    a.append_tokens("c1", [4])
    a.allocate("c1", 4)
    launch = a.publish(["c1"])  # its copy takes the last FREE block
    assert len(launch.copies) == 1 and a.stats()["free"] == 0
    launch.complete()
    a.check_invariants()


def test_entries_regrown_after_a_truncation_are_published_by_the_next_launch():
    from pagedkv.spec import PUBLISHED

    a = BlockAllocator(8, 2)
    a.add_request("r", [1, 2, 3, 4, 5, 6])
    a.allocate("r", 6)
    a.publish(["r"]).complete()  # 3 entries published, none committed
    a.truncate("r", 2)  # speculative positions rejected: one entry kept
    a.append_tokens("r", [7, 8, 9, 10])
    a.allocate("r", 6)  # two new entries
    launch = a.publish(["r"])
    assert [a.state(b) for b in a.block_table("r")] == [PUBLISHED] * 3
    launch.complete()
    a.check_invariants()


def test_a_freed_request_s_launch_row_is_reused():
    """Rows of the launch tables belong to live requests only: add and free many requests,
    the rows stay as many as were ever live at once."""
    a = BlockAllocator(8, 2)
    rows = a._rows.blocks.shape[0]
    for i in range(5 * rows):
        a.add_request(i, [1, 2, 3])
        a.allocate(i, 3)
        a.free(i)
    assert a._rows.blocks.shape[0] == rows
    a.check_invariants()


@pytest.mark.parametrize("pairs", [[("r", 3), ("r", 5)], [["r", 3], ["r", 5]]])
def test_a_request_appears_once_in_a_step_level_call(pairs):
    from pagedkv.allocator import InvalidArgument

    a = BlockAllocator(8, 2)
    a.add_request("r", [1, 2, 3, 4, 5])
    a.allocate("r", 1)
    before = snap(a)
    with pytest.raises(InvalidArgument, match="appears twice"):
        a.allocate_many(pairs)
    unchanged(a, before)


def _busy_cached_block_0(a, hold):
    """Block 0 cached, retired at 2 while launch 1 reads it (its event done, not reclaimed);
    block 1 RECLAIMED beside it; ``hold``: y revived block 0 by a hit and holds it."""
    a.add_request("w", [1, 2, 3])
    step(a, "w", 3)
    first = a.publish(["w"])
    a.free("w")
    if hold:
        a.add_request("y", [1, 2, 3])
        a.allocate("y", 3)  # block 0 revived, block 2 new
    first.record(_Done())
    return first


def test_a_hit_held_by_another_request_is_not_taken_off_the_room_completions_make():
    a = BlockAllocator(4, 2)
    _busy_cached_block_0(a, hold=True)
    assert a.pool.usable() == 1  # block 3; launch 1 would release block 1
    a.add_request("z", [1, 2, 3, 4, 5])
    assert len(a.allocate("z", 5)) == 3  # the hit (block 0, y's) and 2 new blocks
    a.check_invariants()


@pytest.mark.parametrize("extra", [0, 1])
def test_a_busy_hit_a_completion_makes_idle_is_revived_not_counted_as_room(extra):
    """Block 0 is a hit launch 1 still reads: completing launch 1 would make it idle, but z
    revives it, so the room is block 1 and the FREE blocks only."""
    a = BlockAllocator(5, 2)
    _busy_cached_block_0(a, hold=False)
    assert a.pool.usable() == 3  # blocks 2, 3, 4
    a.add_request("z", [1, 2] + list(range(10, 10 + 2 * (3 + extra))))
    before = snap(a)
    if extra:
        with pytest.raises(OutOfBlocks):
            a.allocate("z", 2 + 2 * 5)  # 5 new blocks: 3 FREE + block 1 is 4
        unchanged(a, before)
    else:
        assert len(a.allocate("z", 2 + 2 * 4)) == 5  # the hit and 4 new blocks
    a.check_invariants()


def test_an_idle_hit_is_taken_off_the_room_once():
    a = BlockAllocator(5, 2)
    a.add_request("w", [1, 2, 3])
    step(a, "w", 3)
    a.free("w")  # block 0 idle CACHED, block 1 FREE
    a.add_request("q", [9])
    a.allocate("q", 1)
    done = a.publish(["q"])
    a.free("q")  # its block waits for the launch
    done.record(_Done())
    assert a.pool.usable() == 4  # blocks 0 (idle, the hit), 1, 3, 4
    a.add_request("z", [1, 2] + list(range(10, 18)))
    assert len(a.allocate("z", 10)) == 5  # the hit and 4 new: 3 FREE and q's block
    a.check_invariants()


def test_a_refusal_for_unknown_tokens_is_confirmed_by_the_spec():
    a = BlockAllocator(4, 2)
    a.add_request("r", [1, 2, 3])
    a.allocate("r", 4)
    a.publish(["r"]).complete()
    with pytest.raises(TokensUnknown) as info:
        a.commit("r", 4)
    assert "(spec: " in str(info.value) and info.value.spec_reason


def test_growth_within_the_table_keeps_exact_counts_and_plain_ints():
    """A running request's growth that its table already covers (``_extend``'s fast path) sets
    the positions reserved, keeps ``stats()`` exact, and stores a plain int even when given a
    NumPy one."""
    np = pytest.importorskip("numpy")
    a = BlockAllocator(8, 4, checked=False)
    a.add_request("r", [1, 2, 3, 4, 5])
    a.allocate("r", 5)  # two blocks: 8 positions covered
    for n in (6, 6, np.int64(7), 8):
        assert a.extend("r", n) == []
        assert a.num_reserved("r") == n and type(a.num_reserved("r")) is int
        assert a.stats()["occupancy_tokens"] == n
        a.check_invariants()
    assert a.extend("r", 9) != []  # past the table: a new block
    assert a.stats()["occupancy_tokens"] == 9 and len(a.block_table("r")) == 3
    with pytest.raises(allocator_module.InvalidArgument):
        a.extend("r", 8)  # tables only grow
    with pytest.raises(allocator_module.InvalidArgument):
        a.extend("r", -1)


def test_a_first_allocation_of_no_positions_still_takes_the_prefix_hits():
    """An empty table covers nothing, so a zero-position first allocation is not a growth
    within it: it takes every cached hit, as the first allocation always does."""
    a = BlockAllocator(8, 2)
    step_tokens = [1, 2, 3, 4, 5]
    a.add_request("p", step_tokens)
    step(a, "p", 5)
    a.free("p")
    a.add_request("q", step_tokens)
    hits = a.allocate("q", 0)
    assert len(hits) == 2 and a.num_computed("q") == 4
