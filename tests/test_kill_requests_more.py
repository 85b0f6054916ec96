"""More request-layer kills: a launch with nothing new to write copies nothing, even through a
shared partial block; two launches reading a cached block keep it busy until both complete."""

from __future__ import annotations

from pagedkv.allocator import BlockAllocator
from pagedkv.spec import CACHED, WATERMARK


def _usable_by_scan(a):
    p = a.pool
    return sum(1 for b in range(a.num_blocks)
               if p.state[b] == 0 or (p.state[b] == CACHED
                                      and p.retire[b] <= p.clock[WATERMARK]))


def test_no_copy_without_a_write_through_a_shared_partial_block():
    a = BlockAllocator(8, 2)
    a.add_request("p", [1, 2, 3])
    a.allocate("p", 3)
    a.publish(["p"]).complete()
    a.commit("p", 3)
    a.fork("p", "c")
    launch = a.publish(["p"])  # issued == reserved: reads only
    assert len(launch.copies) == 0
    assert launch.query_lens.tolist() == [0]
    launch.complete()
    a.check_invariants()


def test_two_readers_of_a_cached_block():
    a = BlockAllocator(6, 2)
    a.add_request("a", [1, 2, 3, 4, 5])
    a.allocate("a", 5)
    a.publish(["a"]).complete()
    a.commit("a", 5)
    first = a.publish(["a"])
    second = a.publish(["a"])
    a.free("a")
    p = a.pool
    assert p.usable() == _usable_by_scan(a)
    first.complete()
    assert p.usable() == _usable_by_scan(a) and p.structure_errors() == []
    second.complete()
    assert p.usable() == _usable_by_scan(a) == 6 and p.structure_errors() == []


def test_a_read_only_launch_of_a_shared_partial_block_plans_no_copy_on_a_full_pool():
    """A request that writes nothing (issued == reserved) through a shared partial block
    needs no copy, so its launch needs no free block: on a full pool it goes ahead."""
    a = BlockAllocator(4, 2)
    a.add_request("p", [1, 2, 3])
    a.allocate("p", 3)
    a.publish(["p"]).complete()
    a.commit("p", 3)
    a.fork("p", "c")  # the partial block (slot 2) is shared now
    a.add_request("q", [7, 8, 9, 10])
    a.allocate("q", 4)  # takes the last two blocks
    assert a.pool.usable() == 0
    launch = a.publish(["p"])  # reads only
    assert len(launch.copies) == 0 and launch.query_lens.tolist() == [0]
    launch.complete()
    a.check_invariants()


def test_a_launch_writing_from_inside_a_block_across_blocks_maps_each_position_to_its_slot():
    B = 4
    a = BlockAllocator(8, B)
    a.add_request("r", list(range(1, 11)))
    a.allocate("r", 3)
    a.publish(["r"]).complete()
    a.allocate("r", 10)  # positions 3..9: the rest of block 0, all of block 1, half of block 2
    launch = a.publish(["r"])
    table = a.block_table("r")
    assert launch.slot_mapping.tolist() == [table[p // B] * B + p % B for p in range(3, 10)]
    launch.complete()
    a.check_invariants()
