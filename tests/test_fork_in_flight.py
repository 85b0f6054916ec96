"""Fork of a request whose launch is still in flight (parallel sampling right after a step is
published): the child shares the blocks being written, its launches run after the parent's
on the stream, and nothing the in-flight launches read is handed out again early."""

from __future__ import annotations

import pytest

from pagedkv.allocator import BlockAllocator, CommitError
from pagedkv.spec import CONCRETE, FREE, PUBLISHED, RECLAIMED, TRANSITIONS, step
from pagedkv.spec.model import initial_state


def _parent_in_flight() -> tuple[BlockAllocator, object]:
    a = BlockAllocator(6, 2)
    a.add_request("p", [1, 2, 3])
    a.allocate("p", 3)  # block 0 full, block 1 partial (1 slot)
    return a, a.publish(["p"])  # launch 0 writes both


def test_fork_shares_blocks_whose_write_is_in_flight():
    a, l0 = _parent_in_flight()
    table = a.block_table("p")
    assert [a.pool.wpend[b] for b in table] == [1, 1]
    assert a.fork("p", "c") == table  # shared, not refused
    assert [a.ref_count(b) for b in table] == [2, 2]
    assert [a.pool.wpend[b] for b in table] == [1, 1]  # the write goes on
    a.check_invariants()
    with pytest.raises(CommitError, match="pending"):  # the child's KV is not written yet
        a.commit("c", 2)
    l0.complete()
    a.commit("c", 2)
    a.commit("p", 3)
    a.check_invariants()


def test_child_copies_the_shared_block_in_a_later_launch_that_pins_the_source():
    a, l0 = _parent_in_flight()
    a.fork("p", "c")
    src = a.block_table("c")[1]
    a.append_tokens("c", [9])
    a.allocate("c", 4)
    l1 = a.publish(["c"])  # the child writes into the shared partial block: copy first
    assert l1.copies.tolist() == [[src, a.block_table("c")[1]]]
    assert a.block_table("p")[1] == src and a.ref_count(src) == 1
    a.free("p")  # the last holder lets the source go while both launches may read it
    assert a.state(src) == RECLAIMED
    l0.complete()
    assert a.state(src) == RECLAIMED  # launch 1 copies it: not reusable yet
    l1.complete()
    assert a.state(src) == FREE
    a.commit("c", 4)
    a.check_invariants()


def test_parent_and_child_both_write_the_shared_block_in_one_launch():
    a, l0 = _parent_in_flight()
    a.fork("p", "c")
    shared = a.block_table("p")[1]
    for rid, tok in (("p", 4), ("c", 5)):
        a.append_tokens(rid, [tok])
        a.allocate(rid, 4)
    l1 = a.publish(["p", "c"])  # one copies, the last writer writes in place
    assert len(l1.copies) == 1
    assert (shared in a.block_table("p")) != (shared in a.block_table("c"))
    assert a.pool.wpend[shared] == 2  # launch 0 and launch 1 write it, in stream order
    a.check_invariants()
    l1.complete()
    l0.complete()
    for rid in ("p", "c"):
        a.commit(rid, 4)
    assert a.abstract().pool.count[FREE] == 6 - 3  # the full block, the shared one, a copy
    a.check_invariants()


def test_the_spec_shares_a_block_being_written_and_still_refuses_to_write_it_shared():
    s = step(initial_state(2, 2, holder_ids=("p", "c")), "open_holder", r="p")
    s = step(s, "open_holder", r="c")
    for name, params in (("allocate", {"b": 0, "r": "p"}), ("publish", {"b": 0, "r": "p"}),
                         ("launch", {"L": 0}), ("begin_write", {"b": 0, "r": "p", "w": 1})):
        s = step(s, name, **params)
        assert s is not None, name
    shared = step(s, "share", b=0, r="c")
    assert shared is not None and shared.state[0] == PUBLISHED and shared.wpend[0] == 1
    # copy-on-write stays: no further write begins on the shared block, in place
    assert not TRANSITIONS["begin_write"].guard(CONCRETE,
                                                shared, b=0, r="p", w=1)
