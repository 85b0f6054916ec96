"""Kills mutants of the request layer's batched step paths (allocator/allocator.py):
``commit_many``'s one-pass check of a batch (the spec's ``commit_bounds`` and
``slots_written`` compiled into loops), an admission's prefix hits taken as one batch of the
spec's ``share``, and the engine front door's per-token handoff (``_append_token``)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from pagedkv.allocator import (
    BlockAllocator,
    CommitError,
    InvalidArgument,
    TokensUnknown,
)
from pagedkv.spec.requests import summary


def _snapshot(a: BlockAllocator) -> tuple:
    ab = a.abstract()
    return (ab.pool, summary(ab.requests), a.stats(),
            {r: a.block_table(r) for r in a.requests})


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



def _cached_prefix(a: BlockAllocator) -> list[int]:
    """Request p wrote and committed 8 tokens (two blocks of 4), then finished: its two
    blocks are zero-ref cached. Returns them."""
    a.add_request("p", list(range(9)))
    a.allocate("p", 9)
    a.publish(["p"]).complete()
    a.commit("p", 8)
    table = a.block_table("p")[:2]
    a.free("p")
    return table


@pytest.mark.parametrize("checked", [True, False])
def test_an_admission_takes_its_prefix_hits_as_one_share_batch(checked):
    """The hits are shared (revived out of the eviction queue) in table order, counted
    computed, and the pool ends where single shares leave it."""
    ends = []
    for batched in (True, False):
        a = BlockAllocator(16, 4, checked=checked)
        hits = _cached_prefix(a)
        if not batched:  # the admission's batches become single transitions
            run_many = a.pool.run_many

            def singles(name, items, _pool=a.pool, _run=run_many):
                if name != "share":
                    return _run(name, items)
                for args in items:
                    _pool.share(*args)
            a.pool.run_many = singles
        a.add_request("q", list(range(9)))
        table = a.allocate("q", 10)
        assert table[:2] == hits and a.num_computed("q") == 8
        assert not set(hits) & set(a.pool.queue)
        ends.append((a.abstract().pool, list(a.pool.queue), a.pool.cached_busy,
                     a.pool.structure_errors()))
    assert ends[0] == ends[1] and ends[0][3] == []


def test_append_token_records_one_checked_id_and_hashes_a_block_it_fills():
    a = BlockAllocator(16, 4)
    a.add_request("r", [1, 2, 3])
    a.allocate("r", 4)
    record = a._req("r")
    before = _snapshot(a)
    for bad in (2**63, -(2**63) - 1, 1.0, True, "7"):
        with pytest.raises(InvalidArgument):
            a._append_token(record, bad)
        assert _snapshot(a) == before and record.tokens == [1, 2, 3]
    a._append_token(record, np.int64(4))  # a NumPy integer is an id, recorded as an int
    assert record.tokens == [1, 2, 3, 4] and type(record.tokens[-1]) is int
    twin = BlockAllocator(16, 4)
    twin.add_request("r", [1, 2, 3, 4])
    assert record.hashes == twin._req("r").hashes and len(record.hashes) == 1
    a._append_token(record, 5)
    assert len(record.hashes) == 1  # the next block is not full
