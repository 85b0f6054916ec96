"""Each headline safety guard is load-bearing: weaken it and the stateful test finds the
violation. (The weakened spec is passed in, ``AllocatorMachine.for_spec``: the allocator
enforces it and the test's model runs it alike, so the failure must come from the invariants
and the typed-error expectations.)"""

from __future__ import annotations

import dataclasses
import traceback

import pytest
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from pagedkv.proofs.refinement import AllocatorMachine
from pagedkv.spec import RECLAIMED, TRANSITIONS

FAST = settings(
    max_examples=400,
    stateful_step_count=40,
    derandomize=True,
    database=None,
    deadline=None,
    phases=[Phase.generate],  # no shrinking: we only need to know it fails
)


def failure_text(machine=AllocatorMachine) -> str:
    try:
        run_state_machine_as_test(machine, settings=FAST)
    except BaseException as exc:  # noqa: BLE001 - any failure is what we are looking for
        return "".join(traceback.format_exception(exc))
    return ""


def test_unmodified_guards_pass():
    assert failure_text() == ""


WEAKENED = {
    # no double free: release no longer checks that the holder holds the block
    "release": (lambda ops, s, b, r: ops.And(s.ref[b] >= 0),
                ("DoubleFree", "ref_nonnegative", "ref_matches_holders")),
    # no recycling while pending: recycle forgets the watermark and the pending writes
    "recycle": (lambda ops, s, b: s.state[b] == RECLAIMED,
                ("reused_after_its_readers", "no_write_when_free", "PendingAccess")),
    # no publication before initialization: publish takes any block
    "publish": (lambda ops, s, b, r: ops.And(s.ref[b] >= 0),
                ("initialized_iff_live", "PublishError", "ref_positive_iff_held")),
}


@pytest.mark.parametrize("name", sorted(WEAKENED))
def test_weakened_guard_is_caught(name):
    guard, evidence = WEAKENED[name]
    weakened = dict(TRANSITIONS, **{name: dataclasses.replace(TRANSITIONS[name], guard=guard)})
    text = failure_text(AllocatorMachine.for_spec(weakened))
    assert text, f"weakening {name}'s guard went unnoticed"
    assert any(word in text for word in evidence), text[-3000:]
