"""Kills mutants of the views that show the runtime's storage as the spec's state
(allocator/request_view.py, allocator/storage.py) and of the pool's retire accounting: the
spec's defaults where no record says more, a seal read only off a table that holds the block,
the live view's enumeration of launches in flight, and one retire-queue entry per stamp."""

from __future__ import annotations

import pytest
from test_kill_pool import _block_0_in_flight

from pagedkv.allocator import BlockAllocator, InvariantViolation
from pagedkv.allocator.pool import BlockPool
from pagedkv.spec import FREE, NO_HASH, WATERMARK
from pagedkv.spec.check import launch_ids
from pagedkv.spec.requests import NO_SLOT, POSITIONS, initial_request_state

B = 4


def _sealed() -> tuple[BlockAllocator, int]:
    """A request whose first block is full, written, and PUBLISHED (sealed, not cached)."""
    a = BlockAllocator(6, B, prefix_caching=False)
    a.add_request("r", list(range(B + 2)))
    a.allocate("r", B + 2)
    a.publish(["r"]).complete()
    return a, a.block_table("r")[0]


def test_the_spec_view_reads_the_spec_s_defaults_where_no_record_says_more() -> None:
    a, _ = _sealed()
    view, spec = a.spec_view, initial_request_state(a.abstract().pool)
    for name in POSITIONS:
        for part in ("q", "o"):
            field = f"{name}_{part}"
            assert getattr(view, field)["nobody"] == getattr(spec, field)["nobody"] == 0
    assert view.tlen["nobody"] == spec.tlen["nobody"] == 0
    assert view.tab["nobody"][0] == spec.tab["nobody"][0] == -1
    assert view.tab["r"][2] == -1  # past the end of a table
    assert view.chain["nobody"][0] == view.chain["r"][1] == NO_HASH
    assert view.slot["nobody"][0] == view.slot["r"][5] == NO_SLOT


def test_a_seal_is_read_off_the_table_that_holds_the_block() -> None:
    a, b = _sealed()
    assert a.spec_view.content[b] == a._requests["r"].hashes[0]
    a._requests["r"].table.remove(b)  # corrupt: the pool says r holds b, its table does not
    assert a.spec_view.content[b] == NO_HASH
    with pytest.raises(InvariantViolation):
        a.check_invariants()


def test_a_seal_is_read_only_where_the_pool_says_the_table_holds_the_block() -> None:
    a, b = _sealed()
    a.pool.held["r"].discard(b)  # corrupt: r's table lists b, the pool says r holds it not
    assert a.spec_view.content[b] == NO_HASH


def test_a_pool_holder_with_no_request_record_is_reported_not_a_crash() -> None:
    a = BlockAllocator(6, B, prefix_caching=False)
    a.pool.open_holder("ghost")  # corrupt: a holder the allocator has no record of, first
    a.add_request("r", list(range(B + 2)))
    a.allocate("r", B + 2)
    a.publish(["r"]).complete()
    b = a.block_table("r")[0]
    a.pool.share(b, "ghost")
    assert a.spec_view.content[b] == a._requests["r"].hashes[0]
    with pytest.raises(InvariantViolation):
        a.check_invariants()


def test_the_live_view_enumerates_the_launches_in_flight() -> None:
    p = BlockPool(2, 1)
    for L in range(3):
        p.launch(L)
    p.complete(1)
    assert launch_ids(p.view) == [0, 2, 3]


def test_the_live_view_s_members_are_a_snapshot_for_holder_ids_of_mixed_types() -> None:
    p = BlockPool(2, 1)
    p.open_holder(1)
    p.open_holder("a")
    items = p.view.alive.items()  # ids of mixed types cannot be sorted: any order
    p.open_holder("b")
    assert dict(items) == {1: True, "a": True}


def test_a_block_revived_and_let_go_again_at_one_stamp_is_queued_once() -> None:
    p = BlockPool(2, 1)
    _block_0_in_flight(p)
    p.begin_write(0, "r", 1)
    p.end_write(0)
    p.commit(0, "r", 7)
    p.release(0, "r")  # CACHED, busy: launch 0 may read it
    p.open_holder("s")
    p.share(0, "s")  # a prefix hit revives it ...
    p.release(0, "s")  # ... and lets it go again, at the same launch clock
    assert p.retire_queue.count((1, 0)) == 1
    p.complete(0)
    p.advance()
    assert p.cached_busy == 0 and p.usable() == 2 and p.structure_errors() == []


def test_busy_means_retired_past_the_watermark() -> None:
    p = BlockPool(2, 1)
    _block_0_in_flight(p)
    p.release(0, "r")  # retired at clock 1 while launch 0 is in flight
    assert p.busy(0) and not p.busy(1)
    p.complete(0)
    p.advance()
    assert p.retire[0] == p.clock[WATERMARK] == 1
    assert not p.busy(0) and p.state[0] == FREE


def test_block_hash_takes_a_salt_of_str_or_bytes_and_refuses_others() -> None:
    from pagedkv.allocator import InvalidArgument, block_hash

    a = BlockAllocator(2, B)
    for salt in ("tenant", b"tenant", None):
        assert a.block_hash(0, [1, 2, 3, 4], salt=salt) == block_hash(0, [1, 2, 3, 4], (), salt)
    with pytest.raises(InvalidArgument, match="cache_salt"):
        a.block_hash(0, [1, 2, 3, 4], salt=7)
