"""Refusals name, in words, the guard conditions that failed (read from the spec's guards)."""

from __future__ import annotations

import pytest

from pagedkv.allocator import BlockAllocator, DoubleFree, GuardViolation, PendingAccess
from pagedkv.spec import TRANSITIONS
from pagedkv.spec.explain import _conjuncts, failed_conditions


def _alloc() -> BlockAllocator:
    a = BlockAllocator(4, 2)
    a.add_request("x", [1, 2, 3])
    a.allocate("x", 3)  # blocks 0 and 1 ALLOCATED to x
    return a


@pytest.mark.parametrize("name", sorted(TRANSITIONS))
def test_every_guard_is_read_as_conjuncts(name):
    [(_, parts)] = _conjuncts(TRANSITIONS[name].guard)
    assert parts, name


@pytest.mark.parametrize(
    "call, error, words",
    [
        (lambda p: p.release(0, "y"), DoubleFree, ["holder 'y' must hold block 0"]),
        (lambda p: p.recycle(0), PendingAccess,
         ["the state of block 0 (it is ALLOCATED) must be RECLAIMED"]),
        (lambda p: p.allocate(0, "x"), PendingAccess,
         ["the state of block 0 (it is ALLOCATED) must be FREE",
          "holder 'x' must not hold block 0"]),
        (lambda p: p.close_holder("x"), GuardViolation,
         ["the number of blocks holder 'x' holds (it is 2) must be 0"]),
        (lambda p: p.open_holder("x"), GuardViolation, ["holder 'x' must not be open"]),
    ],
)
def test_refusal_names_the_failed_condition(call, error, words):
    a = _alloc()
    with pytest.raises(error) as err:
        call(a.pool)
    text = str(err.value)
    assert "does not hold" not in text
    for w in words:
        assert w in text, text


def _spec_state(*steps):
    from pagedkv.spec import check, initial_state

    s = initial_state(2, 1, range(1))
    for name, params in steps:
        s = check.step(s, name, **params)
        assert s is not None, name
    return s


RETIRED = (("open_holder", {"r": 0}), ("allocate", {"b": 0, "r": 0}), ("launch", {"L": 0}),
           ("release", {"b": 0, "r": 0}))


@pytest.mark.parametrize(
    "steps, name, params, words",
    [
        ((), "end_write", {"b": 0},
         ["the pending writing launches on block 0 (it is 0) must be > 0"]),
        (RETIRED[:2], "begin_write", {"b": 0, "r": 0, "w": 1},
         ["the state of block 0 (it is ALLOCATED) must be PUBLISHED"]),
        (RETIRED, "recycle", {"b": 0},
         ["the launch clock block 0 was retired at (it is 1) must be <= the watermark of "
          "completed launches (it is 0)"]),
        (RETIRED, "allocate", {"b": 1, "r": 0}, []),  # block 1 was never held: no wait
        (RETIRED, "advance", {}, ["launch 0 must not be in flight"]),
        (RETIRED, "complete", {"L": 1}, ["launch 1 must be in flight"]),
        ((), "launch", {"L": 5}, ["L (5) must be the number of launches issued (it is 0)"]),
        ((), "advance", {},
         ["the watermark of completed launches (it is 0) must be < the number of launches "
          "issued (it is 0)"]),
    ],
)
def test_epoch_refusals_name_the_clock(steps, name, params, words):
    """The epoch guards, read in words on spec states (launch numbers, the watermark)."""
    s = _spec_state(*steps)
    assert failed_conditions(TRANSITIONS[name].guard, s, **params) == words


def test_only_false_conditions_are_named():
    a = _alloc()
    t = TRANSITIONS["allocate"]
    failed = failed_conditions(t.guard, a.pool.view, b=2, r="x")
    assert failed == []  # block 2 is FREE: allocate is allowed
    failed = failed_conditions(t.guard, a.pool.view, b=0, r="y")
    assert failed == ["the state of block 0 (it is ALLOCATED) must be FREE",
                      "holder 'y' must be open"]
    assert failed_conditions(t.guard, a.pool.view, b=7, r="x")[0] == (
        "block id 7 must name a block of this pool")


def test_a_guard_without_source_still_refuses_with_a_message():
    a = _alloc()
    guard = eval("lambda ops, s, b: s.state[b] == 99")  # no source file to read
    assert failed_conditions(guard, a.pool.view, b=0) == []

