"""Kills mutants of allocator/launch.py and of the launch side of the request layer: polling a
recorded event, completing once, ``event_done``, the stale-table check (block 0 and padding
included) and the launch's repr."""

from __future__ import annotations

import re

import pytest

from pagedkv.allocator import (
    BlockAllocator,
    InvalidArgument,
    LaunchAlreadyCompleted,
    OutOfBlocks,
    StaleTableError,
)
from pagedkv.spec import FREE, RECLAIMED


class Event:
    """A completion event the test fires by hand."""

    def __init__(self) -> None:
        self.done = False

    def query(self) -> bool:
        return self.done


def _launched(num_blocks=4, block_size=2, n=3, rid="a"):
    a = BlockAllocator(num_blocks, block_size)
    a.add_request(rid, list(range(n)))
    a.allocate(rid, n)
    return a, a.publish([rid])


def test_poll_without_an_event_leaves_the_launch_in_flight():
    a, launch = _launched()
    assert launch.poll() is False
    assert not launch.completed and a.inflight == (launch,)
    assert a.pool.inflight == {launch.seq} and a.pool.clock == [1, 0]
    assert launch.writes == tuple(launch.block_tables[0].tolist())  # it writes both blocks
    assert [a.pool.wpend[b] for b in launch.writes] == [1, 1]


def test_poll_completes_once_the_event_fires_and_again_is_a_no_op():
    a, launch = _launched()
    ev = Event()
    launch.record(ev)
    assert launch.poll() is False and not launch.completed
    ev.done = True
    assert launch.poll() is True
    assert launch.completed and a.inflight == ()
    assert a.pool.inflight == set() and a.pool.clock == [1, 1]  # the watermark passed it
    assert [a.pool.wpend[b] for b in launch.writes] == [0, 0]
    assert launch.poll() is True  # already completed: no LaunchAlreadyCompleted from poll
    a.commit("a", 3)
    a.check_invariants()


def test_complete_twice_is_refused_and_unpins_once():
    a, launch = _launched()
    a.free("a")  # the launch still reads both blocks: RECLAIMED, waiting for it
    assert [a.state(b) for b in launch.block_tables[0]] == [RECLAIMED, RECLAIMED]
    launch.complete()
    assert a.stats()["free"] == 4
    with pytest.raises(LaunchAlreadyCompleted):
        launch.complete()
    assert a.stats()["free"] == 4
    a.check_invariants()


def test_event_done_is_true_once_completed_even_without_an_event():
    a, launch = _launched()
    assert launch.event_done() is False
    launch.complete()
    assert launch.event_done() is True
    ev = Event()  # an event recorded late, that never fires, changes nothing
    launch.record(ev)
    assert launch.event_done() is True and launch.poll() is True


def test_stale_block_zero_is_detected():
    a, launch = _launched(num_blocks=4, block_size=2, n=1)
    [b] = launch.block_tables[0].tolist()
    assert b == 0
    launch.complete()
    a.validate(launch)
    a.free("a")  # block 0 RECLAIMED, then FREE: a new generation
    assert a.state(0) == FREE
    with pytest.raises(StaleTableError, match=r"\[0\]"):
        a.validate(launch)


def test_padding_is_not_checked_and_only_stale_entries_are_named():
    a = BlockAllocator(8, 2)
    a.add_request("long", list(range(6)))
    a.add_request("short", [1])
    a.allocate("long", 6)
    a.allocate("short", 1)
    launch = a.publish(["long", "short"])
    assert launch.block_tables.shape == (2, 4)  # 3 entries, rounded to a power of two
    assert launch.block_tables[1].tolist()[1:] == [-1, -1, -1]  # padding
    launch.complete()
    a.validate(launch)  # padding (-1) is never compared
    short_block = launch.block_tables[1, 0]
    a.free("short")
    with pytest.raises(StaleTableError) as err:
        a.validate(launch)
    assert re.search(rf"entries \[{short_block}\] were reclaimed", str(err.value))


def test_stale_message_names_the_first_eight_blocks():
    a = BlockAllocator(12, 1)
    a.add_request("a", list(range(10)))
    a.allocate("a", 10)
    launch = a.publish(["a"])
    launch.complete()
    a.free("a")
    with pytest.raises(StaleTableError) as err:
        a.validate(launch)
    named = [int(x) for x in re.search(r"entries \[([^\]]*)\]", str(err.value))[1].split(",")]
    assert named == sorted(b for b in launch.block_tables[0].tolist() if b >= 0)[:8]


def test_repr_names_the_requests_as_a_list_and_the_status():
    a, launch = _launched(rid="a")
    # seq is the spec's launch number: launches are numbered from 0
    assert repr(launch) == "<Launch #0 of ['a'], in flight>"
    launch.complete()
    assert repr(launch) == "<Launch #0 of ['a'], completed>"
    a.add_request("b", [5, 6])
    a.allocate("b", 2)
    assert repr(a.publish(["a", "b"])) == "<Launch #1 of ['a', 'b'], in flight>"


# ---- table arithmetic behind the launch arrays ------------------------------------------------
def test_slot_of_block_and_offset():
    from pagedkv.allocator.table import slot

    assert [slot(3, 4, k) for k in range(4)] == [12, 13, 14, 15]
    assert slot(0, 1, 0) == 0


def test_the_largest_count_is_a_count():
    a = BlockAllocator(4, 2)
    a.add_request("r", [1, 2, 3])
    with pytest.raises(OutOfBlocks):  # a valid count, just too many positions
        a.allocate("r", 2**63 - 1)
    with pytest.raises(InvalidArgument):  # not an int64 count
        a.allocate("r", 2**63)
    assert a.block_table("r") == []
