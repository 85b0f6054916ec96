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
