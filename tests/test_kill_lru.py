"""Kills mutants of allocator/lru.py: the intrusive queue against a plain-list model, and its
structure check against hand-broken queues."""

from __future__ import annotations

import random

import pytest

from pagedkv.allocator.lru import BlockQueue


def _check(q: BlockQueue, model: list[int], n: int) -> None:
    assert q.order() == model
    assert list(q) == model
    assert q.head() == (model[0] if model else None)
    assert q.inq == [b in model for b in range(n)]
    assert q.length == len(model)
    assert q.structure_errors() == []


@pytest.mark.parametrize("n", [1, 2, 3, 7])
@pytest.mark.parametrize("seed", range(6))
def test_queue_matches_a_list_model(n, seed):
    rnd = random.Random(seed)
    q, model = BlockQueue(n), list(range(n))
    _check(q, model, n)
    for _ in range(60):
        out = [b for b in range(n) if b not in model]
        op = rnd.choice(["unlink", "tail", "head"])
        if op == "unlink" and model:
            b = rnd.choice(model)
            q.unlink(b)
            model.remove(b)
        elif op in ("tail", "head") and out:
            b = rnd.choice(out)
            if op == "tail":
                q.push_tail(b)
                model.append(b)
            else:
                q.push_head(b)
                model.insert(0, b)
        _check(q, model, n)


@pytest.mark.parametrize("n", [1, 2, 5, 8])
@pytest.mark.parametrize("seed", range(6))
def test_chains_pushed_at_once_match_single_pushes(n, seed):
    """push_tail_many / push_head_many link what push_tail / push_head of each block in turn
    would, from any queue (empty included), for chains of any length."""
    rnd = random.Random(seed)
    q, model = BlockQueue(n), list(range(n))
    for _ in range(40):
        out = [b for b in range(n) if b not in model]
        op = rnd.choice(["unlink", "tail_many", "head_many"])
        if op == "unlink" and model:
            for b in rnd.sample(model, rnd.randint(1, len(model))):
                q.unlink(b)
                model.remove(b)
        elif op != "unlink":
            chain = rnd.sample(out, rnd.randint(0, len(out)))
            if op == "tail_many":
                q.push_tail_many(chain)
                model += chain
            else:
                q.push_head_many(chain)
                model[:0] = reversed(chain)
        _check(q, model, n)


def test_empty_and_refill():
    q = BlockQueue(2)
    q.unlink(0)
    q.unlink(1)
    _check(q, [], 2)
    q.push_head(1)
    _check(q, [1], 2)
    q.push_head(0)
    _check(q, [0, 1], 2)
    q.unlink(1)
    q.push_tail(1)
    q.unlink(0)
    q.push_tail(0)
    _check(q, [1, 0], 2)


def test_size_must_be_positive():
    _check(BlockQueue(1), [0], 1)
    with pytest.raises(AssertionError):
        BlockQueue(0)


def test_structure_errors_detect_broken_queues():
    q = BlockQueue(4)
    q._prev[2] = 0  # backward link broken
    assert any("broken link" in e for e in q.structure_errors())

    q = BlockQueue(4)
    q.inq[3] = False  # flag disagrees with the links
    assert any("flags" in e for e in q.structure_errors())

    q = BlockQueue(4)
    q.length = 5
    assert any("length" in e for e in q.structure_errors())

    q = BlockQueue(3)  # a cycle that never returns to the sentinel: 0 -> 1 -> 0
    q._next[1] = 0
    assert q.structure_errors()

    q = BlockQueue(3)
    q.unlink(1)
    q.inq[1] = True  # flagged but not linked
    assert q.structure_errors()
    assert BlockQueue(3).structure_errors() == []


def test_flag_disagreement_names_up_to_eight_blocks():
    q = BlockQueue(10)
    q.inq[:] = [False] * 10
    errs = q.structure_errors()
    assert "queued flags disagree with links: [0, 1, 2, 3, 4, 5, 6, 7]" in errs
