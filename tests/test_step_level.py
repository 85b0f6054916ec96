"""The step-level calls (``allocate_many``, ``extend``, ``commit_many``, ``append_tokens_many``,
``free_many``): each one is the repetition of its single call (``spec.calls``), so an allocator
driven through them ends exactly where one driven call by call ends, and a refusal anywhere in
a batch changes nothing."""

from __future__ import annotations

import random

import pytest

from pagedkv.allocator import (
    BlockAllocator,
    CommitError,
    InvalidArgument,
    OutOfBlocks,
    UnknownRequest,
)
from pagedkv.proofs.call_refinement import CallModel
from pagedkv.spec.requests import summary


def _snapshot(a: BlockAllocator) -> tuple:
    ab = a.abstract()
    return (ab.pool, summary(ab.requests), a.stats(),
            {r: a.block_table(r) for r in a.requests})


def _serve(seed: int, batched: bool, steps: int = 60) -> tuple:
    """A seeded decode workload with admissions, forks and finishes; the per-request work of
    each step goes through the step-level calls or one call per request."""
    rng = random.Random(seed)
    a = BlockAllocator(48, 4, checked=True)
    prefix = [rng.randrange(5) for _ in range(8)]
    live: list[str] = []
    known: dict[str, int] = {}
    serial = 0
    for _ in range(steps):
        if len(live) < 6 and rng.random() < 0.5:
            rid = f"r{serial}"
            serial += 1
            tail = [rng.randrange(5) for _ in range(rng.randrange(1, 6))]
            tokens = prefix[: rng.randrange(9)] + tail
            a.add_request(rid, tokens)
            known[rid] = len(tokens)
            try:
                a.allocate(rid, len(tokens))
                live.append(rid)
            except OutOfBlocks:
                a.free(rid)
        if not live:
            continue
        grow = [(r, known[r]) for r in live]  # cover the tokens known: decode
        try:
            if batched:
                a.allocate_many(grow)
            else:
                for r, n in grow:
                    a.extend(r, n)
        except OutOfBlocks:
            assert batched, "the per-request path was given room by the batched one"
            victim = live.pop()
            a.free(victim)
            continue
        launch = a.publish(live)
        launch.complete()
        done = [(r, a.num_reserved(r)) for r in live]
        sampled = [(r, [rng.randrange(5)]) for r in live]
        for r in live:
            known[r] += 1
        if batched:
            a.commit_many(done)
            a.append_tokens_many(sampled)
        else:
            for r, n in done:
                a.commit(r, n)
            for r, t in sampled:
                a.append_tokens(r, t)
        finished = [r for r in live if rng.random() < 0.08]
        if finished:
            live = [r for r in live if r not in finished]
            if batched:
                a.free_many(finished)
            else:
                for r in finished:
                    a.free(r)
    a.check_invariants()
    return _snapshot(a)


@pytest.mark.parametrize("seed", range(12))
def test_step_level_calls_end_where_the_single_calls_end(seed):
    batched, single = _serve(seed, True), _serve(seed, False)
    assert batched[0] == single[0], "pool state differs"
    assert batched[1:] == single[1:]


def _running(num_blocks: int = 8, block_size: int = 2) -> BlockAllocator:
    a = BlockAllocator(num_blocks, block_size)
    for r, n in (("a", 3), ("b", 2), ("c", 1)):
        a.add_request(r, list(range(10 + n, 10 + 2 * n)))
        a.allocate(r, n)
    return a


def test_allocate_many_is_all_or_nothing():
    a = _running()  # 8 blocks: a holds 2, b 1, c 1
    before = _snapshot(a)
    with pytest.raises(OutOfBlocks):
        a.allocate_many([("a", 5), ("b", 6), ("c", 6)])  # 1 + 2 + 2 > 4 free
    assert _snapshot(a) == before
    assert a.allocate_many([("a", 5), ("b", 6)]) == [[4], [5, 6]]
    assert a.block_table("b") == [2, 5, 6]


@pytest.mark.parametrize("call, args, error", [
    ("allocate_many", [("a", 4), ("a", 5)], InvalidArgument),
    ("allocate_many", [("a", 4), ("b", 1)], InvalidArgument),  # tables only grow
    ("allocate_many", [("a", 4), ("zz", 1)], UnknownRequest),
    ("allocate_many", [("a", 4), ("b",)], InvalidArgument),
    ("allocate_many", {"a": 4}, InvalidArgument),
    ("commit_many", [("a", 0), ("a", 0)], InvalidArgument),
    ("commit_many", [("c", 0), ("a", 3)], CommitError),  # nothing issued
    ("append_tokens_many", [("a", [1]), ("b", [1.5])], InvalidArgument),
    ("append_tokens_many", [("a", [1]), ("b", "12")], InvalidArgument),
    ("free_many", ["a", "a"], InvalidArgument),
    ("free_many", ["a", "zz"], UnknownRequest),
    ("free_many", "ab", InvalidArgument),
])
def test_a_refused_batch_changes_nothing(call, args, error):
    a = _running()
    before = _snapshot(a)
    with pytest.raises(error):
        getattr(a, call)(args)
    assert _snapshot(a) == before


def test_allocate_many_refuses_an_admission():
    a = _running()
    a.add_request("new", [1, 2, 3])
    with pytest.raises(InvalidArgument, match="empty table"):
        a.allocate_many([("a", 4), ("new", 3)])
    assert a.block_table("a") == [0, 1] and a.block_table("new") == []


def test_extend_returns_what_it_appended():
    a = _running()
    assert a.extend("a", 3) == []
    assert a.extend("a", 8) == [4, 5]
    assert a.block_table("a") == [0, 1, 4, 5]
    a.add_request("hit", [11, 12, 13, 14, 15])  # no cached blocks yet: nothing to take
    assert a.extend("hit", 1) == [6]


def test_a_batch_is_checked_against_its_spec_program():
    """The call-level refinement check of the step-level calls, both directions, and a
    planted defect: a commit_many that commits each pair as it checks it (not all or
    nothing) is caught when a later pair is refused."""
    a = _running()
    a.pool.trace = []  # the refinement check follows the allocator's block choices
    m = CallModel(a)
    launch = m.check("publish", (["a", "b", "c"],), lambda: a.publish(["a", "b", "c"]))
    m.check("complete", (launch.seq, list(launch.writes)), launch.complete)
    out = m.check("commit_many", ([("a", 2), ("b", 2)],),
                  lambda: a.commit_many([("a", 2), ("b", 2)]))
    assert out is None and a.num_computed("a") == 2
    refused = m.check("commit_many", ([("c", 1), ("a", 9)],),
                      lambda: a.commit_many([("c", 1), ("a", 9)]))
    assert isinstance(refused, CommitError) and a.num_computed("c") == 0

    class Eager(BlockAllocator):
        def commit_many(self, updates):
            for rid, n in updates:
                self.commit(rid, n)

    b = Eager(8, 2)
    for r, n in (("a", 3), ("c", 1)):
        b.add_request(r, list(range(10 + n, 10 + 2 * n)))
        b.allocate(r, n)
    b.publish(["a", "c"]).complete()
    b.pool.trace = []
    mb = CallModel(b)
    with pytest.raises(AssertionError):  # refused, but the first commit happened
        before = _snapshot(b)
        got = mb.check("commit_many", ([("c", 1), ("a", 9)],),
                       lambda: b.commit_many([("c", 1), ("a", 9)]))
        assert isinstance(got, CommitError)
        assert _snapshot(b) == before, "a refused commit_many changed the allocator"

