"""Kills guard weakenings that no invariant notices: a holder acts only on blocks it holds."""

from __future__ import annotations

import pytest

from pagedkv.allocator import AllocatorError
from pagedkv.allocator.pool import BlockPool


def _written_block():
    p = BlockPool(2, 1)
    p.open_holder("r")
    p.open_holder("other")
    p.allocate(0, "r")
    p.publish(0, "r")
    p.begin_write(0, "r", 1)
    p.end_write(0)
    return p


@pytest.mark.parametrize("call", [
    lambda p: p.commit(0, "other", 7),
    lambda p: p.commit(0, "ghost", 7),
    lambda p: p.release(0, "other"),
])
def test_only_the_holder_acts_on_its_block(call):
    p = _written_block()
    p.trace = []
    with pytest.raises(AllocatorError):
        call(p)
    assert p.trace == [] and p.lookup(7) is None and p.ref[0] == 1
    p.commit(0, "r", 7)
    assert p.lookup(7) == 0


@pytest.mark.parametrize("holder", ["other", "ghost"])
def test_only_the_holder_writes_its_block(holder):
    p = BlockPool(2, 2)
    p.open_holder("r")
    p.open_holder("other")
    p.allocate(0, "r")
    p.publish(0, "r")
    p.trace = []
    with pytest.raises(AllocatorError):
        p.begin_write(0, holder, 1)  # room for the slot: only the holder is wrong
    assert p.trace == [] and p.wpend[0] == 0 and p.filled[0] == 0
    p.begin_write(0, "r", 1)
    assert p.wpend[0] == 1 and p.filled[0] == 1


def test_closing_an_unknown_holder_is_refused():
    p = BlockPool(2, 1)
    p.trace = []
    with pytest.raises(AllocatorError):
        p.close_holder("ghost")
    assert p.trace == []
    p.open_holder("r")
    p.close_holder("r")
    with pytest.raises(AllocatorError):
        p.close_holder("r")
