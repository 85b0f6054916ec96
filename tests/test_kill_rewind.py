"""The rewind guard, condition by condition (spec: rewind), through the pool's own method."""

from __future__ import annotations

import numpy as np
import pytest

from pagedkv.allocator import BlockAllocator, GuardViolation, InvalidArgument


def _written(num_slots: int = 3) -> tuple[BlockAllocator, int]:
    """A request whose single block holds ``num_slots`` written slots, launch completed."""
    a = BlockAllocator(4, 4)
    a.add_request("r", list(range(num_slots)))
    a.allocate("r", num_slots)
    a.publish(["r"]).complete()
    return a, a.block_table("r")[0]


def test_rewind_to_zero_and_to_the_written_count_are_allowed():
    a, b = _written(3)
    a.pool.rewind(b, "r", 3)  # keeps everything: allowed, a no-op
    assert a.pool.filled[b] == 3
    a.pool.rewind(b, "r", 0)  # drops every slot
    assert a.pool.filled[b] == 0


def test_rewind_needs_the_holder_and_cannot_grow():
    a, b = _written(3)
    a.add_request("other", [9])
    with pytest.raises(GuardViolation, match="holder 'other' must hold block"):
        a.pool.rewind(b, "other", 1)
    with pytest.raises(GuardViolation, match="must be <="):
        a.pool.rewind(b, "r", 4)  # more than was written
    assert a.pool.filled[b] == 3


def test_rewind_refuses_a_shared_block_and_one_being_written():
    a, b = _written(3)
    a.fork("r", "f")
    with pytest.raises(GuardViolation, match="reference count"):
        a.pool.rewind(b, "r", 1)
    a.free("f")
    a.append_tokens("r", [5])
    a.allocate("r", 4)
    launch = a.publish(["r"])
    with pytest.raises(GuardViolation, match="pending writing launches"):
        a.pool.rewind(b, "r", 1)
    launch.complete()
    a.pool.rewind(b, "r", 1)
    assert a.pool.filled[b] == 1


def test_truncate_returns_a_copy_of_the_table():
    a = BlockAllocator(8, 2)
    a.add_request("r", list(range(7)))
    a.allocate("r", 7)
    out = a.truncate("r", 3)
    assert out == a.block_table("r") and len(out) == 2
    out.append(99)  # the caller's list, not the allocator's table
    assert a.block_table("r") == out[:2]
    a.check_invariants()


@pytest.mark.parametrize("b", [-1, 4, 2**63, True, 1.0, "0"])
def test_rewind_refuses_a_block_id_outside_the_pool_and_changes_nothing(b):
    a, block = _written(3)
    with pytest.raises(InvalidArgument, match="block id"):
        a.pool.rewind(b, "r", 1)
    assert a.pool.filled[block] == 3


@pytest.mark.parametrize("k", [-1, 5, 2**63, True, 1.0])
def test_rewind_refuses_a_slot_count_outside_the_block_and_changes_nothing(k):
    a, block = _written(3)
    with pytest.raises(InvalidArgument, match="slots kept"):
        a.pool.rewind(block, "r", k)
    assert a.pool.filled[block] == 3


def test_rewind_takes_numpy_integers():
    a, block = _written(3)
    a.pool.rewind(np.int64(block), "r", np.int32(2))
    assert a.pool.filled[block] == 2 and type(a.pool.filled[block]) is int
