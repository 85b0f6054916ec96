"""The launch's block tables come from persistent int32 rows (allocator/table_rows.py), kept
equal to the request tables through allocate, fork, copy-on-write, truncate and free."""

from __future__ import annotations

import random

import numpy as np
import pytest

from pagedkv.allocator import (
    BlockAllocator,
    CommitError,
    InvalidArgument,
    InvariantViolation,
    OutOfBlocks,
)
from pagedkv.allocator.allocator import _launch_slots
from pagedkv.allocator.table import slot_mapping
from pagedkv.allocator.table_rows import TableRows

B = 4


def _check_launch(alloc: BlockAllocator, launch) -> None:
    for k, rid in enumerate(launch.rids):
        table = alloc.block_table(rid)
        row = launch.block_tables[k]
        assert row[: len(table)].tolist() == table
        assert (row[len(table):] == -1).all()
        gens = alloc.block_generations()
        assert launch.table_generations[k, : len(table)].tolist() == gens[table].tolist()


def _workload(seed: int) -> BlockAllocator:
    rng = random.Random(seed)
    alloc = BlockAllocator(200, B, checked=True)
    live: list[str] = []
    for step in range(120):
        try:
            _one_op(alloc, rng, live, step)
        except (CommitError, InvalidArgument, OutOfBlocks):
            pass  # a refused call changes nothing; the rows must still match
        alloc.check_invariants()
    return alloc


def _one_op(alloc: BlockAllocator, rng: random.Random, live: list[str], step: int) -> None:
    op = rng.random()
    if op < 0.3 or not live:
        rid = f"r{step}"
        alloc.add_request(rid, [rng.randrange(50) for _ in range(rng.randrange(1, 30))])
        live.append(rid)
        alloc.allocate(rid, rng.randrange(1, 30))
    elif op < 0.45:
        child = f"c{step}"
        alloc.fork(rng.choice(live), child)
        live.append(child)  # after the fork: a refused one registers no child
    elif op < 0.55 and len(live) > 1:
        alloc.free(live.pop(rng.randrange(len(live))))
    elif op < 0.65:
        rid = rng.choice(live)
        n = alloc.num_reserved(rid)
        if n > max(1, alloc.num_computed(rid)):
            alloc.truncate(rid, rng.randrange(max(1, alloc.num_computed(rid)), n))
    else:
        batch = rng.sample(live, min(len(live), rng.randrange(1, 5)))
        for rid in batch:
            alloc.append_tokens(rid, [rng.randrange(50) for _ in range(3)])
            alloc.allocate(rid, alloc.num_reserved(rid) + rng.randrange(0, 6))
        launch = alloc.publish(batch)
        _check_launch(alloc, launch)
        launch.complete()


@pytest.mark.parametrize("seed", range(6))
def test_launch_rows_equal_the_tables(seed: int) -> None:
    _workload(seed)


def test_a_copy_on_write_left_out_of_the_rows_is_caught(monkeypatch) -> None:
    """Planted: publish replaces a shared partial block (copy-on-write) in the table but not
    in the rows; the launch then hands kernels the shared source block."""
    real = BlockAllocator._put_rows

    def skip_single(self, req, start, stop=None):
        if stop is None:
            real(self, req, start, stop)

    monkeypatch.setattr(BlockAllocator, "_put_rows", skip_single)
    alloc = BlockAllocator(16, B, checked=True)
    alloc.add_request("a", list(range(6)))
    alloc.allocate("a", 6)
    alloc.publish(["a"]).complete()
    alloc.commit("a", 6)
    alloc.fork("a", "b")
    alloc.append_tokens("b", [9])
    alloc.allocate("b", 7)
    launch = alloc.publish(["b"])
    assert launch.copies.shape == (1, 2)
    with pytest.raises(AssertionError):
        _check_launch(alloc, launch)
    with pytest.raises(InvariantViolation, match="launch rows"):
        alloc.check_invariants()


def test_launch_slots_expand_each_write_into_its_consecutive_slots() -> None:
    rng = np.random.default_rng(1)
    first = rng.integers(0, 10_000, size=7).tolist()
    counts = [3, 1, 4, 1, 1, 2, 4]
    want = [f + j for f, n in zip(first, counts, strict=True) for j in range(n)]
    got = _launch_slots(first, counts)
    assert got.dtype == np.int64 and got.tolist() == want
    ones = _launch_slots(first, [1] * 7)  # the decode step's shortcut
    assert ones.dtype == np.int64 and ones.tolist() == first
    assert _launch_slots([], []).dtype == np.int64 and len(_launch_slots([], [])) == 0


@pytest.mark.parametrize("seed", range(4))
def test_launch_slot_mappings_are_each_tables_slot_mapping(seed: int) -> None:
    """Prefills, chunks across block boundaries, decode steps and requests with nothing new,
    in one launch: the slot mapping is each table's ``table.slot_mapping`` of the positions
    it writes, concatenated in launch order."""
    rng = random.Random(seed)
    alloc = BlockAllocator(400, B)
    rids = [f"r{k}" for k in range(6)]
    for rid in rids:
        alloc.add_request(rid, [rng.randrange(1000) for _ in range(rng.randrange(1, 12))])
    for _ in range(8):
        batch = [rid for rid in rids if rng.random() < 0.8] or rids[:1]
        before = {}
        for rid in batch:
            done = alloc.num_reserved(rid)
            before[rid] = done
            grow = rng.choice([0, 1, 1, rng.randrange(1, 3 * B)])
            if done + grow == 0:
                grow = 1
            alloc.append_tokens(rid, [rng.randrange(1000) for _ in range(grow)])
            alloc.allocate(rid, done + grow)
        launch = alloc.publish(batch)
        want = [s for rid in batch for s in slot_mapping(
            alloc.block_table(rid), B, before[rid], alloc.num_reserved(rid))]
        assert launch.slot_mapping.dtype == np.int64 and launch.slot_mapping.tolist() == want
        launch.complete()


def test_rows_grow_without_moving_other_rows() -> None:
    rows = TableRows(rows=2, width=2)
    a, b = rows.open(), rows.open()
    rows.put(a, 0, [5, 6], [1, 1])
    c = rows.open()  # grows the row count
    rows.put(b, 0, [7, 8, 9, 10, 11], [2, 2, 2, 2, 2])  # grows the width
    rows.put(c, 0, [3], [0])
    assert not rows.mismatches(a, [5, 6], [1, 1])
    assert not rows.mismatches(b, [7, 8, 9, 10, 11], [2] * 5)
    assert rows.mismatches(c, [3, 4], [0, 0])
    rows.close(b, 5)
    assert rows.open() == b and not rows.mismatches(b, [], [])


# --- the launches' copies, maintained incrementally ---------------------------------------------
def _steady_workload(seed: int, keep_launches: bool) -> tuple[BlockAllocator, int, list]:
    """One batch decoding and prefilling, published again and again (so its copy is reused),
    reordered now and then, with copy-on-write (forks of a partial block that both then
    write), truncation, and requests freed and added (rows closed and reopened) now and then.
    Every launch's tables
    must equal the tables. Returns the allocator, how many launches reused a copy, and (with
    ``keep_launches``) each launch kept with a snapshot of its arrays."""
    rng = random.Random(seed)
    alloc = BlockAllocator(400, B, checked=True)
    alloc._rows.incremental_from = 0  # these tables are small: maintain every launch's copy

    def known(rid: str) -> int:
        return len(alloc._req(rid).tokens)

    batch = [f"r{k}" for k in range(4)]
    for rid in batch:
        alloc.add_request(rid, [rng.randrange(50) for _ in range(rng.randrange(1, 10))])
        alloc.allocate(rid, known(rid))
    kept, reused, fresh = [], 0, 0
    for step in range(60):
        op = rng.random()
        if op < 0.1:  # a request finishes; a new one takes its place (its row is reused)
            k = rng.randrange(len(batch))
            alloc.free(batch[k])
            fresh += 1
            batch[k] = f"n{fresh}"
            alloc.add_request(batch[k], [rng.randrange(50) for _ in range(rng.randrange(1, 9))])
            alloc.allocate(batch[k], known(batch[k]))
        elif op < 0.2:  # parallel sampling: the fork shares a partial block, both write it
            k = rng.randrange(len(batch))
            if alloc.num_reserved(batch[k]) % B:
                child = f"c{step}"
                alloc.fork(batch[k], child)
                alloc.free(batch[(k + 1) % len(batch)])
                batch[(k + 1) % len(batch)] = child
        elif op < 0.3:  # rejected draft tokens
            k = rng.randrange(len(batch))
            n, done = alloc.num_reserved(batch[k]), max(1, alloc.num_computed(batch[k]))
            if n > done:
                alloc.truncate(batch[k], rng.randrange(done, n))
        elif op < 0.35:  # the same requests in another order: the copy's rows move
            rng.shuffle(batch)
        for rid in batch:
            grow = rng.choice([1, 1, 1, rng.randrange(1, 3 * B)])
            have = known(rid)
            if have < alloc.num_reserved(rid) + grow:
                alloc.append_tokens(rid, [rng.randrange(50)
                                          for _ in range(alloc.num_reserved(rid) + grow - have)])
            alloc.allocate(rid, alloc.num_reserved(rid) + grow)
        last = alloc._rows._copies[-1] if alloc._rows._copies else None
        launch = alloc.publish(batch)
        reused += alloc._rows._copies[-1] is last
        _check_launch(alloc, launch)
        launch.complete()
        for rid in batch:
            alloc.commit(rid, alloc.num_reserved(rid))
        if keep_launches:
            kept.append((launch, launch.block_tables.copy(), launch.table_generations.copy()))
        del launch  # nothing refers to its arrays: the next launch of this batch reuses them
        alloc.check_invariants()
    return alloc, reused, kept


@pytest.mark.parametrize("seed", range(8))
def test_a_reused_launch_copy_equals_the_tables(seed: int) -> None:
    _, reused, _ = _steady_workload(seed, keep_launches=False)
    assert reused >= 20  # most launches of the steady batch updated the last copy


@pytest.mark.parametrize("seed", range(3))
def test_a_launch_that_is_still_referenced_keeps_its_tables(seed: int) -> None:
    """Launches kept by the caller (here, all of them) are never updated in place: each keeps
    the tables it was published with, and no copy is reused."""
    _, reused, kept = _steady_workload(seed, keep_launches=True)
    assert reused == 0
    for launch, tables, gens in kept:
        assert np.array_equal(launch.block_tables, tables)
        assert np.array_equal(launch.table_generations, gens)


def test_a_view_of_a_launch_array_keeps_it_from_reuse() -> None:
    """Not only the launch: any view of its arrays (a row, a tensor over it) pins the copy."""
    alloc = BlockAllocator(64, B)
    alloc._rows.incremental_from = 0
    alloc.add_request("a", list(range(6)))
    alloc.allocate("a", 6)
    launch = alloc.publish(["a"])
    row = launch.block_tables[0]
    before = row.tolist()
    launch.complete()
    alloc.commit("a", 6)
    del launch
    alloc.append_tokens("a", [1, 2, 3])
    alloc.allocate("a", 9)
    second = alloc.publish(["a"])
    assert row.tolist() == before and second.block_tables[0].tolist() != before
    assert second.block_tables.base is not row.base


def test_launch_arrays_are_read_only() -> None:
    alloc = BlockAllocator(64, B)
    alloc.add_request("a", list(range(6)))
    alloc.allocate("a", 6)
    launch = alloc.publish(["a"])
    for arr in (launch.block_tables, launch.table_generations):
        with pytest.raises(ValueError, match="read-only"):
            arr[0, 0] = 1


def test_an_unreferenced_copy_is_updated_not_rebuilt() -> None:
    """TableRows alone: a copy nothing refers to is the one the next take of the same rows
    returns, updated with the appended entries; a replaced entry updates its whole row."""
    rows = TableRows(rows=4, width=4, incremental_from=0)
    a, b = rows.open(), rows.open()
    rows.put(a, 0, [1, 2], [0, 0])
    rows.put(b, 0, [3], [0])
    bt, tg = rows.take([a, b], 2)
    first = id(bt.base)  # not the array itself: a reference would pin it
    assert bt.tolist() == [[1, 2], [3, -1]]
    del bt, tg
    rows.put(b, 1, [4], [1])  # appended
    bt, tg = rows.take([a, b], 2)
    assert id(bt.base) == first and bt.tolist() == [[1, 2], [3, 4]] and tg.tolist() == [[0, 0],
                                                                                     [0, 1]]
    del bt, tg
    rows.put(a, 1, [7], [5])  # replaced (copy-on-write)
    rows.cut(b, 1, 2)  # dropped (truncate)
    bt, tg = rows.take([a, b], 2)
    assert id(bt.base) == first and bt.tolist() == [[1, 7], [3, -1]] and tg[0].tolist() == [0, 5]
    other, _ = rows.take([b, a], 2)  # other rows, other order: a copy of its own
    assert id(other.base) != first and other.tolist() == [[3, -1], [1, 7]]


def test_a_small_launch_gets_a_fresh_copy_a_large_one_the_kept_one() -> None:
    """Below ``incremental_from`` entries every launch gets new arrays (nothing is kept to
    update); from there on an unreferenced copy comes back, updated."""
    rows = TableRows(rows=4, width=4, incremental_from=8)
    a, b = rows.open(), rows.open()
    rows.put(a, 0, [1, 2, 3], [0, 0, 0])
    rows.put(b, 0, [4], [0])
    small = rows.take([a, b], 3)[0]  # 2 x 4 entries: kept
    kept = id(small.base)
    assert small.tolist() == [[1, 2, 3, -1], [4, -1, -1, -1]] and not small.flags.writeable
    del small
    rows.put(b, 1, [5], [0])
    again = rows.take([a, b], 3)[0]
    assert id(again.base) == kept and again.tolist() == [[1, 2, 3, -1], [4, 5, -1, -1]]
    one = rows.take([a], 3)[0]  # 1 x 4 entries: a fresh copy, nothing kept
    assert one.tolist() == [[1, 2, 3, -1]] and not one.flags.writeable
    assert len(rows._copies) == 1


# --- growth, memory bounds and which copy comes back (the mutation run's survivors) -------------
def test_rows_and_width_grow_only_when_full_and_then_double() -> None:
    rows = TableRows(rows=4, width=4)
    opened = [rows.open() for _ in range(4)]
    assert sorted(opened) == [0, 1, 2, 3] and rows.blocks.shape[0] == 4  # every row used first
    opened += [rows.open() for _ in range(4)]
    assert sorted(opened) == list(range(8)) and rows.blocks.shape[0] == 8  # doubled, all used
    rows.put(opened[0], 0, [1, 2, 3, 4], [0] * 4)  # exactly full: no growth
    assert rows.width == 4
    rows.put(opened[0], 4, [5], [0])  # one past: doubles
    assert rows.width == 8
    rows.put(opened[1], 0, list(range(20)), [1] * 20)  # past double: as wide as needed
    assert rows.width == 20
    assert not rows.mismatches(opened[0], [1, 2, 3, 4, 5], [0] * 5)
    assert not rows.mismatches(opened[1], list(range(20)), [1] * 20)


@pytest.mark.parametrize("incremental_from", [0, 1 << 30])
def test_a_launch_wider_than_the_rows_is_padded(incremental_from: int) -> None:
    """One put of more than twice the width leaves the rows 11 wide; the launch is 16 wide."""
    rows = TableRows(rows=2, width=4, incremental_from=incremental_from)
    a, b = rows.open(), rows.open()
    rows.put(a, 0, list(range(100, 111)), list(range(11)))
    rows.put(b, 0, [7], [3])
    assert rows.width == 11
    bt, tg = rows.take([b, a], 11)
    assert bt.shape == tg.shape == (2, 16)
    assert bt.tolist() == [[7] + [-1] * 15, list(range(100, 111)) + [-1] * 5]
    assert tg.tolist() == [[3] + [-1] * 15, list(range(11)) + [-1] * 5]


def test_at_most_four_copies_are_kept_least_recently_used_dropped() -> None:
    rows = TableRows(rows=8, width=4, incremental_from=0)
    opened = [rows.open() for _ in range(5)]
    for row in opened:
        rows.put(row, 0, [row + 1], [0])
    bases = {}
    for n in range(1, 6):  # launches of 1, 2, ... 5 rows: a copy of each shape
        bt, _ = rows.take(opened[:n], 1)
        bases[n] = id(bt.base)
        del bt, _
    assert len(rows._copies) == 4
    again, _ = rows.take(opened[:2], 1)  # the 2-row copy was kept: it comes back
    assert id(again.base) == bases[2]
    assert [len(c.rows) for c in rows._copies] == [3, 4, 5, 2]  # the 1-row one was dropped


def test_a_copy_of_other_rows_is_reused_only_for_as_many_rows_and_the_same_ones_first() -> None:
    rows = TableRows(rows=4, width=4, incremental_from=0)
    a, b, c = rows.open(), rows.open(), rows.open()
    for row in (a, b, c):
        rows.put(row, 0, [row + 10, row + 20], [0, 0])
    ab, _ = rows.take([a, b], 2)
    bc, _ = rows.take([b, c], 2)
    ids = id(ab.base), id(bc.base)
    del ab, bc, _
    one, _ = rows.take([c], 2)  # two rows' copies do not serve one row
    assert one.shape == (1, 2) and one.tolist() == [[c + 10, c + 20]]
    assert id(one.base) not in ids
    del one, _
    again, _ = rows.take([a, b], 2)  # both copies are free; the one of these rows comes back
    assert id(again.base) == ids[0] and again.tolist() == [[a + 10, a + 20], [b + 10, b + 20]]


def test_an_updated_copy_is_read_only_again() -> None:
    rows = TableRows(rows=2, width=4, incremental_from=0)
    a = rows.open()
    rows.put(a, 0, [1, 2], [0, 0])
    bt, _ = rows.take([a], 3)  # 4 wide, as the next one
    first = id(bt.base)
    del bt, _
    rows.put(a, 2, [3], [0])
    bt, tg = rows.take([a], 3)
    assert id(bt.base) == first and bt.tolist() == [[1, 2, 3, -1]]
    for arr in (bt, tg):
        with pytest.raises(ValueError, match="read-only"):
            arr[0, 0] = 9


def test_mismatches_takes_any_sequence_and_a_table_past_the_width() -> None:
    rows = TableRows(rows=2, width=4)
    a = rows.open()
    rows.put(a, 0, [5, 6, 7], [1, 2, 3])
    assert not rows.mismatches(a, (5, 6, 7), (1, 2, 3))
    assert rows.mismatches(a, (5, 6, 8), (1, 2, 3))
    assert rows.mismatches(a, (5, 6, 7), (1, 2, 4))
    assert rows.mismatches(a, [5, 6, 7, 8, 9], [1] * 5)  # longer than the rows are wide


def test_reserve_widens_by_doubling_and_keeps_the_rows():
    rows = TableRows(rows=3, width=4)
    r = rows.open()
    rows.put(r, 0, [5, 6, 7], [1, 1, 2])
    rows.reserve(3)  # wide enough already: nothing changes
    rows.reserve(4)
    assert rows.width == 4
    rows.reserve(6)  # at least doubled
    assert rows.width == 8
    rows.reserve(20)  # past double: the width asked for
    assert rows.width == 20 and rows.blocks.shape == rows.gens.shape == (3, 20)
    assert rows.blocks[r, :4].tolist() == [5, 6, 7, -1]
    assert rows.gens[r, :3].tolist() == [1, 1, 2] and int(rows.lengths[r]) == 3


def test_appending_in_place_through_lengths_is_what_put_does():
    """A caller that writes entries at the row's end and moves ``lengths`` (the native step
    path) leaves the rows, and the launches' incremental copies, as ``put`` would."""
    a, b = TableRows(rows=2, width=4, incremental_from=0), TableRows(rows=2, width=4,
                                                                     incremental_from=0)
    ra, rb = a.open(), b.open()
    a.put(ra, 0, [3, 4], [0, 0])
    b.put(rb, 0, [3, 4], [0, 0])
    first = b.take([rb], 2)
    del first
    a.put(ra, 2, [9], [5])
    b.blocks[rb, 2], b.gens[rb, 2] = 9, 5
    b.lengths[rb] = 3
    for rows, row in ((a, ra), (b, rb)):
        tables, gens = rows.take([row], 3)
        assert tables.tolist() == [[3, 4, 9, -1]] and gens.tolist() == [[0, 0, 5, -1]]
        assert not rows.mismatches(row, [3, 4, 9], [0, 0, 5])
