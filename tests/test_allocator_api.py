"""The allocator's public API: worked examples, typed errors, launches, prefix caching."""

from __future__ import annotations

import pytest

from pagedkv.allocator import (
    AllocatorError,
    BlockAllocator,
    CommitError,
    DoubleFree,
    DuplicateRequest,
    InvalidArgument,
    InvariantViolation,
    LaunchAlreadyCompleted,
    OutOfBlocks,
    PendingAccess,
    PositionOutOfRange,
    StaleTableError,
    UnknownRequest,
    blocks_needed,
    resolve,
)
from pagedkv.spec import CACHED, FREE, PUBLISHED, RECLAIMED, REFERENCED
from pagedkv.spec.requests import summary


def snapshot(a: BlockAllocator):
    ab = a.abstract()
    return ab.pool.flattened(), summary(ab.requests), a.pool.queue.order(), a.stats()


def assert_unchanged(a: BlockAllocator, before) -> None:
    from pagedkv.spec import states_equal

    pool, tables, order, stats = snapshot(a)
    assert states_equal(before[0], pool) == []
    assert (tables, order, stats) == before[1:]


def run_step(a: BlockAllocator, rid, n: int) -> None:
    """allocate n positions, launch, complete, commit them."""
    a.allocate(rid, n)
    a.publish([rid]).complete()
    a.commit(rid, n)


# ---- worked examples from the design documents ---------------------------------------------
def test_resolve_worked_example_block_size_4():
    table = [7, 2, 9]
    assert resolve(table, 4, 0) == (7, 0)
    assert resolve(table, 4, 5) == (2, 1)
    assert resolve(table, 4, 10) == (9, 2)
    assert resolve(table, 4, 11) == (9, 3)
    with pytest.raises(PositionOutOfRange, match="entry 3"):
        resolve(table, 4, 12)  # token 12 needs a fourth block first


def test_block_size_16_growth_example():
    a = BlockAllocator(16, 16)
    a.add_request("r", list(range(40)))
    assert len(a.allocate("r", 40)) == 3 == blocks_needed(40, 16)
    assert a.stats()["tail_waste_slots"] == 3 * 16 - 40
    for n in range(41, 49):  # tokens 41..48 fill the third block
        assert len(a.allocate("r", n)) == 3
    assert a.stats()["tail_waste_slots"] == 0
    table = a.allocate("r", 49)  # token 49 takes a fourth
    assert len(table) == 4
    assert a.stats()["tail_waste_slots"] == 15  # the worst tail waste: B - 1 slots


def test_blocks_needed_edges():
    assert [blocks_needed(n, 4) for n in (0, 1, 3, 4, 5, 8, 9)] == [0, 1, 1, 1, 2, 2, 3]
    for bad in (-1, 1.0, True, "3"):
        with pytest.raises(InvalidArgument):
            blocks_needed(bad, 4)
    with pytest.raises(InvalidArgument):
        blocks_needed(4, 0)


# ---- typed errors leave everything unchanged ------------------------------------------------
@pytest.fixture
def busy():
    """Two requests sharing a cached prefix, one launch in flight."""
    a = BlockAllocator(8, 4)
    a.add_request("a", list(range(9)))
    run_step(a, "a", 9)
    a.add_request("b", list(range(9)) + [5])
    a.allocate("b", 10)
    launch = a.publish(["b"])
    return a, launch


@pytest.mark.parametrize(
    "call, error",
    [
        (lambda a: a.add_request("a", [1]), DuplicateRequest),
        (lambda a: a.add_request("z", [1.5]), InvalidArgument),
        (lambda a: a.add_request("z", [1], extra_keys=[object()]), InvalidArgument),
        (lambda a: a.add_request([1], [1]), InvalidArgument),
        (lambda a: a.allocate("nobody", 4), UnknownRequest),
        (lambda a: a.allocate("a", -1), InvalidArgument),
        (lambda a: a.allocate("a", 2.0), InvalidArgument),
        (lambda a: a.allocate("a", 4), InvalidArgument),  # shrinking a table
        (lambda a: a.allocate("a", 1000), OutOfBlocks),
        (lambda a: a.commit("a", 12), CommitError),  # past what was launched
        (lambda a: a.commit("a", 3), CommitError),  # below what is committed
        (lambda a: a.commit("b", 10), CommitError),  # its launch is still pending
        (lambda a: a.publish([]), InvalidArgument),
        (lambda a: a.publish(["a", "a"]), InvalidArgument),
        (lambda a: a.publish(["a", "gone"]), UnknownRequest),
        (lambda a: a.free("gone"), UnknownRequest),
        (lambda a: a.fork("gone", "c"), UnknownRequest),
        (lambda a: a.fork("a", "b"), DuplicateRequest),
        (lambda a: a.fork("a", ["unhashable"]), InvalidArgument),
        (lambda a: a.state(8), InvalidArgument),
        (lambda a: a.ref_count(-1), InvalidArgument),
        (lambda a: a.pool.release(7, "a"), DoubleFree),
        (lambda a: a.pool.recycle(0), PendingAccess),
        (lambda a: a.append_tokens("a", ["x"]), InvalidArgument),
        (lambda a: a.append_tokens("a", [2**70]), InvalidArgument),
    ],
)
def test_refused_calls_change_nothing(busy, call, error):
    a, _ = busy
    before = snapshot(a)
    with pytest.raises(error):
        call(a)
    assert issubclass(error, AllocatorError)
    assert_unchanged(a, before)
    a.check_invariants()


def test_out_of_blocks_keeps_queue_order_and_refs():
    a = BlockAllocator(6, 2)
    a.add_request("a", [1, 2, 3, 4, 5])
    run_step(a, "a", 5)
    a.free("a")  # two full blocks cached, tail reclaimed
    a.add_request("b", [1, 2, 3, 4, 9])
    before = snapshot(a)
    with pytest.raises(OutOfBlocks) as info:
        a.allocate("b", 100)
    assert info.value.needed == 50 - 2 and info.value.available == 6 - 2
    assert_unchanged(a, before)


# ---- prefix caching -------------------------------------------------------------------------
def test_prefix_hits_full_blocks_never_last_token():
    a = BlockAllocator(10, 4)
    a.add_request("a", list(range(12)))
    run_step(a, "a", 12)
    assert [a.state(b) for b in a.block_table("a")] == [REFERENCED] * 3
    # identical prompt: the last token must be recomputed, so only 2 of 3 blocks hit
    assert a.add_request("same", list(range(12))) == 8
    assert a.add_request("longer", list(range(13))) == 12
    assert a.add_request("diverges", list(range(6)) + [99] * 6) == 4
    table = a.allocate("longer", 13)
    assert table[:3] == a.block_table("a") and a.num_computed("longer") == 12
    assert a.ref_count(table[0]) == 2
    assert a.stats()["prefix_hit_tokens"] == 12


def test_salt_and_extra_keys_isolate():
    a = BlockAllocator(12, 4)
    a.add_request("a", list(range(9)), cache_salt="tenant-1", extra_keys=["lora:7"])
    run_step(a, "a", 9)
    assert a.add_request("same", list(range(9)), cache_salt="tenant-1",
                         extra_keys=["lora:7"]) == 8
    assert a.add_request("other-salt", list(range(9)), cache_salt="tenant-2",
                         extra_keys=["lora:7"]) == 0
    assert a.add_request("no-salt", list(range(9)), extra_keys=["lora:7"]) == 0
    assert a.add_request("other-key", list(range(9)), cache_salt="tenant-1",
                         extra_keys=["lora:8"]) == 0
    # a str and an int key with the same text are different kinds
    a.add_request("int-key", list(range(9)), extra_keys=[7])
    a.add_request("str-key", list(range(9)), extra_keys=["7"])
    run_step(a, "int-key", 9)
    assert a.add_request("str-key-2", list(range(9)), extra_keys=["7"]) == 0


def test_freed_prefix_stays_cached_and_revives():
    a = BlockAllocator(6, 4)
    a.add_request("a", list(range(9)))
    run_step(a, "a", 9)
    table = a.block_table("a")
    a.free("a")
    assert [a.state(b) for b in table] == [CACHED, CACHED, FREE]
    assert a.stats()["cached"] == 2
    # preemption = free + re-add: the cached prefix is hit again
    assert a.add_request("a", list(range(9))) == 8
    assert a.allocate("a", 9)[:2] == table[:2]
    assert [a.state(b) for b in table[:2]] == [REFERENCED, REFERENCED]


def test_free_releases_in_reverse_so_tail_is_evicted_first():
    a = BlockAllocator(4, 2)
    a.add_request("a", [1, 2, 3, 4, 5, 6, 7])
    run_step(a, "a", 6)
    table = a.block_table("a")
    a.free("a")
    cached_order = [b for b in a.pool.queue.order() if a.state(b) == CACHED]
    assert cached_order == list(reversed(table))


def test_lru_eviction_when_pool_is_full():
    a = BlockAllocator(4, 2)
    a.add_request("old", [1, 2, 3, 4, 5])
    run_step(a, "old", 4)
    a.free("old")
    assert a.stats() | {} and a.stats()["cached"] == 2
    a.add_request("new", [9, 9, 9, 9, 9, 9, 9])
    a.allocate("new", 7)  # needs all 4 blocks: both cached ones are evicted
    assert a.stats()["cached"] == 0
    assert a.add_request("old", [1, 2, 3, 4, 5]) == 0


# ---- launches -------------------------------------------------------------------------------
def test_launch_arrays():
    a = BlockAllocator(8, 4)
    a.add_request("a", list(range(6)))
    a.add_request("b", list(range(50, 53)))
    ta, tb = a.allocate("a", 6), a.allocate("b", 3)
    launch = a.publish(["a", "b"])
    assert launch.block_tables.dtype.name == "int32"
    assert launch.block_tables.tolist() == [ta, tb + [-1]]
    assert launch.seq_lens.tolist() == [6, 3] and launch.query_lens.tolist() == [6, 3]
    expected = [ta[p // 4] * 4 + p % 4 for p in range(6)] + [tb[0] * 4 + p for p in range(3)]
    assert launch.slot_mapping.tolist() == expected
    assert launch.table_generations.tolist() == [[0, 0], [0, -1]]
    assert [a.state(b) for b in ta + tb] == [PUBLISHED] * 3
    # decode step: only the new position is written
    launch.complete()
    a.commit("a", 6)
    a.append_tokens("a", [7])
    a.allocate("a", 7)
    step = a.publish(["a"])
    assert step.query_lens.tolist() == [1] and step.slot_mapping.tolist() == [ta[1] * 4 + 2]


def test_late_completion_delays_recycling():
    a = BlockAllocator(4, 4)
    a.add_request("a", list(range(6)))
    table = a.allocate("a", 6)
    launch = a.publish(["a"])
    a.free("a")  # while the kernel still runs
    assert [a.state(b) for b in table] == [RECLAIMED, RECLAIMED]
    assert a.stats()["reclaimed_waiting"] == 2 and a.stats()["allocatable_now"] == 2
    a.add_request("b", list(range(20)))
    with pytest.raises(OutOfBlocks):
        a.allocate("b", 16)

    class Event:
        done = False

        def query(self):
            return self.done

    ev = Event()
    launch.record(ev)
    assert a.reclaim() == 0 and not launch.completed
    ev.done = True
    assert len(a.allocate("b", 16)) == 4  # allocate reclaims what became safe
    assert launch.completed
    with pytest.raises(LaunchAlreadyCompleted):
        launch.complete()


def test_stale_table_is_an_error():
    a = BlockAllocator(4, 4)
    a.add_request("a", list(range(6)))
    a.allocate("a", 6)
    launch = a.publish(["a"])
    launch.complete()
    a.validate(launch)  # still current
    a.free("a")
    with pytest.raises(StaleTableError):
        a.validate(launch)
    gens = a.block_generations()
    assert (gens[launch.block_tables[0]] == 1).all()


def test_fork_copy_on_write():
    a = BlockAllocator(8, 4)
    a.add_request("p", list(range(6)))
    run_step(a, "p", 6)
    a.append_tokens("p", [6])
    child_table = a.fork("p", "c")
    assert child_table == a.block_table("p")
    partial = child_table[1]
    assert a.ref_count(partial) == 2
    a.append_tokens("c", [6])
    a.allocate("c", 7)
    launch = a.publish(["c"])
    (src, dst), = launch.copies.tolist()
    assert src == partial and dst != partial
    assert a.block_table("c")[1] == dst and a.block_table("p")[1] == partial
    assert a.ref_count(partial) == 1 and a.ref_count(dst) == 1
    assert launch.slot_mapping.tolist() == [dst * 4 + 2]
    a.check_invariants()


def test_check_invariants_names_the_broken_invariant():
    a = BlockAllocator(4, 4)
    a.add_request("a", list(range(6)))
    a.allocate("a", 6)
    a.pool.ref[a.block_table("a")[0]] = 2  # corrupt the runtime state behind its back
    with pytest.raises(InvariantViolation) as info:
        a.check_invariants()
    assert info.value.invariant == "ref_matches_holders"


@pytest.mark.parametrize("compiled", [True, False])
def test_checked_mode_catches_a_wrong_effect(monkeypatch, compiled):
    """A runtime transition that diverges from the spec's effect is caught on the spot."""
    from pagedkv.allocator import pool as pool_module

    a = BlockAllocator(4, 4, checked=True)
    a.pool.compile_spec = compiled
    a.add_request("a", list(range(6)))
    real = pool_module.BlockPool._move

    def off_by_one(self, b, new_state):
        real(self, b, new_state)
        self.gen[b] += 1  # a stray side effect

    monkeypatch.setattr(pool_module.BlockPool, "_move", off_by_one)
    # The single transition: the allocator's allocations of FREE blocks run the spec's own
    # effect, compiled (take_many), with no runtime effect to diverge from it.
    with pytest.raises(InvariantViolation, match="refines:allocate.*gen"):
        a.pool.take("a")



def test_stats_with_attached_pool():
    class FakePool:
        num_blocks, block_size, bytes_per_block, reserved_bytes = 8, 4, 1024, 8 * 1024

    a = BlockAllocator(8, 4)
    a.attach_pool(FakePool())
    a.add_request("a", list(range(6)))
    a.allocate("a", 6)
    s = a.stats()
    assert (s["bytes_per_block"], s["reserved_bytes"], s["in_use_bytes"]) == (1024, 8192, 2048)

    class Wrong(FakePool):
        block_size = 8

    with pytest.raises(InvalidArgument, match="block_size"):
        a.attach_pool(Wrong())


def test_prefix_caching_off_never_shares():
    a = BlockAllocator(8, 4, prefix_caching=False)
    a.add_request("a", list(range(9)))
    run_step(a, "a", 9)
    assert {a.state(b) for b in a.block_table("a")} == {PUBLISHED}
    assert a.add_request("b", list(range(9))) == 0
    a.free("a")
    assert a.stats()["free"] == 8


@pytest.mark.parametrize("compiled", [True, False])
def test_checked_mode_names_a_broken_invariant_on_the_touched_block(compiled):
    a = BlockAllocator(4, 4, checked=True)
    a.pool.compile_spec = compiled
    a.add_request("a", list(range(6)))
    head = a.pool.queue.head()
    a.pool.wpend[head] = 5  # corrupt: writers pending on a FREE block
    with pytest.raises(InvariantViolation) as info:
        a.allocate("a", 6)
    assert info.value.invariant == "no_write_when_free"


def test_checked_mode_is_o1_in_the_number_of_holders():
    """Checked mode re-evaluates only invariants that read the touched block itself."""
    from pagedkv.allocator.pool import local_invariants

    names = {inv.name for inv in local_invariants()}
    assert "ref_matches_holders" not in names  # a sum over every holder
    assert {"ref_nonnegative", "no_write_when_free", "reused_after_its_readers",
            "initialized_iff_live"} <= names
