"""The step-level calls (``allocate_many``, ``extend``, ``commit_many``, ``append_tokens_many``,
``free_many``): each one is the repetition of its single call (``spec.calls``), so an allocator
driven through them ends exactly where one driven call by call ends, and a refusal anywhere in
a batch changes nothing."""

from __future__ import annotations

import random

import numpy as np
import pytest

from pagedkv.allocator import (
    BlockAllocator,
    CommitError,
    InvalidArgument,
    OutOfBlocks,
    TokensUnknown,
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


def _two_written(B: int = 4) -> BlockAllocator:
    """Requests a and b, each with 6 known tokens and 6 positions written by a completed
    launch, nothing committed yet."""
    a = BlockAllocator(16, B)
    for r in ("a", "b"):
        a.add_request(r, list(range(6)))
        a.allocate(r, 6)
    a.publish(["a", "b"]).complete()
    return a


def test_commit_many_checks_a_batch_in_one_compiled_pass_of_the_spec_s_rules(monkeypatch):
    a = _two_written()
    monkeypatch.setattr(a, "_commit_check", lambda *args: pytest.fail("checked one by one"))
    a.commit_many([("a", 5), ("b", 6)])
    assert (a.num_computed("a"), a.num_computed("b")) == (5, 6)


@pytest.mark.parametrize("pending", [False, True])
def test_commit_many_refuses_a_pair_whose_block_a_launch_still_writes(pending):
    """b's second block is being written by a launch in flight (or a's first pair reaches
    past what was issued): the batch check fails, the pair-by-pair check names the
    condition, and nothing is committed."""
    a = _two_written()
    a.allocate("b", 7)
    a.append_tokens("b", [99])
    launch = a.publish(["b"])  # writes position 6 of b's second block
    before = _snapshot(a)
    pairs = [("a", 6), ("b", 6)] if pending else [("a", 7), ("b", 6)]
    with pytest.raises(CommitError, match="pending" if pending else "issued"):
        a.commit_many(pairs)
    assert _snapshot(a) == before
    launch.complete()
    a.commit_many([("a", 6), ("b", 7)])
    assert (a.num_computed("a"), a.num_computed("b")) == (6, 7)


def test_commit_many_refuses_tokens_not_known_and_counts_out_of_range():
    a = _two_written()
    a.allocate("a", 7)
    a.publish(["a"]).complete()  # position 6 written, its token id not known yet
    before = _snapshot(a)
    with pytest.raises(TokensUnknown):
        a.commit_many([("b", 6), ("a", 7)])
    with pytest.raises(InvalidArgument):
        a.commit_many([("b", 6), ("a", 2**63)])
    assert _snapshot(a) == before
    a.commit_many([("b", np.int64(6)), ("a", 6)])  # a NumPy count: checked pair by pair
    assert type(a.num_computed("b")) is int  # and recorded as a plain int
    a.commit_many([("b", 6), ("a", 6)])  # nothing new: allowed, changes nothing
    assert (a.num_computed("a"), a.num_computed("b")) == (6, 6)
    before = _snapshot(a)
    with pytest.raises(CommitError, match="already committed"):
        a.commit_many([("b", 6), ("a", 5)])  # commits never go back
    assert _snapshot(a) == before


def test_the_batched_commit_rules_are_the_spec_s():
    from pagedkv.allocator.compiled import position_rule, position_rule_many
    from pagedkv.spec.requests import commit_bounds
    from pagedkv.spec.transitions import slots_written

    params = ("new", "issued", "known")
    many, single = position_rule_many(commit_bounds, params), position_rule(commit_bounds,
                                                                             params)
    assert many.__code__.co_filename == "<spec commit_bounds, batched>"
    rng = random.Random(0)
    for _ in range(200):
        B = rng.choice((1, 2, 16))
        rows = [tuple(rng.randrange(0, 40) for _ in params) for _ in range(rng.randrange(6))]
        want = next((i for i, row in enumerate(rows) if not all(single(B, *row))), -1)
        assert many(B, rows) == want

    a = _two_written()
    a.allocate("b", 7)
    a.publish(["b"])  # a write pending on b's second block
    pool = a.pool
    written, written_many = (pool.predicate(slots_written, ("b", "k")),
                             pool.predicate_many(slots_written, ("b", "k")))
    assert written_many.__code__.co_filename == "<spec slots_written, batched>"
    cells = [(b, k) for b in range(8) for k in range(5)]
    for _ in range(200):
        items = rng.sample(cells, rng.randrange(8))
        assert written_many(items) == next(
            (i for i, args in enumerate(items) if not written(*args)), -1)


def test_batched_rules_the_compiler_cannot_express_run_interpreted():
    from pagedkv.allocator.compiled import position_rule_many

    def odd_offset(ops, a):
        return [a[1] % 2 == 1]  # '%' on a term: not in the compiler's vocabulary

    many = position_rule_many(odd_offset, ("a",))
    assert not many.__code__.co_filename.startswith("<spec")
    assert many(4, [(1,), (3,), (4,), (5,)]) == 2

    def odd_fill(ops, s, b):
        return s.filled[b] % 2 == 1

    a = _two_written()
    f = a.pool.predicate_many(odd_fill, ("b",))
    assert not f.__code__.co_filename.startswith("<spec")
    table = a.block_table("a")  # filled 4, 2
    assert f([(table[0],)]) == 0 and f([]) == -1
