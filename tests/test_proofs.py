"""The z3 proofs and the reachability search, on the spec and on weakened copies of it.

Each headline guard is weakened in a copy of ``TRANSITIONS`` (``dataclasses.replace``); the
provers must answer with a counterexample naming an invariant that serves the right safety
property, and the explorer must find a trace from the initial pool.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from pagedkv.proofs.bmc import BMCConfig, bmc
from pagedkv.proofs.explore import ExploreConfig, explore, step, unobserved_fields
from pagedkv.proofs.induction import COUNTEREXAMPLE, PROVED, induction_matrix, prove_obligation
from pagedkv.proofs.nonvacuity import ENABLED, nonvacuity
from pagedkv.proofs.runner import run_all
from pagedkv.proofs.safety import prove_safety
from pagedkv.spec import (
    ALLOCATED,
    FREE,
    INVARIANTS,
    PUBLISHED,
    RECLAIMED,
    REFERENCED,
    TRANSITIONS,
    initial_state,
)
from pagedkv.spec import check as spec_check
from pagedkv.spec.invariants import NO_DOUBLE_FREE, NO_EARLY_PUBLICATION, NO_RECYCLE_WHILE_PENDING

SMALL = ExploreConfig(blocks=2, holders=2, block_size=1, max_pending=1, stop_at_first=True)


def _weaken(name: str, guard) -> dict:
    t = dict(TRANSITIONS)
    t[name] = dataclasses.replace(t[name], guard=guard)
    return t


def _release_no_holds_check(ops, s, b, r):
    # release's guard without "r holds b" and without "ref > 0": a double free
    st = s.state[b]
    return ops.Or(st == ALLOCATED, st == PUBLISHED, st == REFERENCED)


def _recycle_while_pending(ops, s, b):
    return s.state[b] == RECLAIMED  # pending == 0 dropped


def _publish_no_init(ops, s, b, r):
    # only the init conjunct dropped: masked by state == ALLOCATED (ALLOCATED => init)
    return ops.And(s.state[b] == ALLOCATED, s.alive[r], s.holds[r][b])


def _publish_uninitialized(ops, s, b, r):
    # init, holds and the ALLOCATED-only state check dropped: publish a FREE block
    return ops.And(ops.Or(s.state[b] == ALLOCATED, s.state[b] == FREE), s.alive[r])


MUTANTS = {
    "double_free": (("release", _release_no_holds_check), NO_DOUBLE_FREE),
    "recycle_while_pending": (("recycle", _recycle_while_pending), NO_RECYCLE_WHILE_PENDING),
    "publish_uninitialized": (("publish", _publish_uninitialized), NO_EARLY_PUBLICATION),
}


# --- the real spec ----------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["symbolic", "bounded"])
def test_every_invariant_is_inductive(mode):
    obs = induction_matrix(mode)
    bad = [(o.invariant, o.transition, o.result, o.detail) for o in obs if o.result != PROVED]
    assert not bad
    n_inv = sum(i.scope != "table" for i in INVARIANTS.values())
    assert len(obs) == n_inv * len(TRANSITIONS)


def test_safety_properties_follow_from_the_invariants():
    res = prove_safety()
    assert {r.result for r in res.values()} == {PROVED}, {
        p: [(c.claim, c.transition, c.mode, c.result) for c in r.claims if c.result != PROVED]
        for p, r in res.items()
    }


def test_every_transition_is_enabled_under_the_invariants():
    res = nonvacuity()
    assert all(e.result == ENABLED for es in res.values() for e in es)
    assert set(res) == set(TRANSITIONS)


def test_exploration_small_config_is_clean_and_fires_everything():
    r = explore(ExploreConfig(blocks=2, holders=2, block_size=2, max_pending=2))
    assert r.complete and not r.violations, {k: v.text for k, v in r.violations.items()}
    assert all(n > 0 for n in r.fired.values()), r.fired
    assert r.states > 1000
    req = explore(ExploreConfig(blocks=2, holders=2, block_size=1, max_pending=1,
                                layer="request"))
    assert req.ok and req.checked["table_isolation"] == req.states


def test_explorer_step_matches_spec_step():
    s = initial_state(2, 1, range(2))
    for name, params in [("open_holder", {"r": 0}), ("allocate", {"b": 1, "r": 0}),
                         ("publish", {"b": 1, "r": 0}), ("begin_access", {"b": 1, "r": 0,
                                                                          "w": 1})]:
        mine = step(TRANSITIONS[name], s, params)
        theirs = spec_check.step(s, name, **params)
        assert mine is not None and theirs is not None
        assert mine.flattened() == theirs
        s = theirs
    # a guard that fails applies nothing: failed allocation changes nothing
    assert spec_check.step(s, "allocate", b=1, r=0) is None
    assert step(TRANSITIONS["allocate"], s, {"b": 1, "r": 0}) is None


def test_only_history_fields_are_dropped_from_the_explored_state():
    assert unobserved_fields(TRANSITIONS, INVARIANTS) == ["gen"]


def test_bmc_is_clean_on_the_spec():
    r = bmc(BMCConfig(blocks=2, holders=2, max_depth=3, budget_s=10))
    assert r.violation is None and r.depth == 3


# --- weakened specs ---------------------------------------------------------------------------
@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_weakened_guard_gives_counterexample_and_trace(mutant, capsys):
    (tname, guard), prop = MUTANTS[mutant]
    trans = _weaken(tname, guard)
    right = {n for n, i in INVARIANTS.items() if i.property == prop}
    for mode in ("bounded", "symbolic"):
        obs = induction_matrix(mode, trans, only={"transitions": [tname]})
        cx = [o for o in obs if o.result == COUNTEREXAMPLE]
        assert {o.invariant for o in cx} & right, (mode, [o.invariant for o in cx])
        assert all(o.counterexample and o.text for o in cx)
        print(f"[{mutant}/{mode}]\n{next(o for o in cx if o.invariant in right).text}")
    saf = prove_safety(trans)
    assert saf[prop].result == COUNTEREXAMPLE
    r = explore(SMALL, trans)
    assert set(r.violations) & right, list(r.violations)
    v = next(v for n, v in r.violations.items() if n in right)
    assert v.trace and v.trace[-1].startswith(tname)
    print(f"[{mutant}/explorer] {v.text}")
    out = capsys.readouterr().out
    assert "pre-state" in out and "post-state" in out


def test_dropping_only_publish_init_check_is_masked():
    """publish's init conjunct alone is implied by state == ALLOCATED and the invariants."""
    trans = _weaken("publish", _publish_no_init)
    obs = induction_matrix("bounded", trans, only={"transitions": ["publish"]})
    assert all(o.result == PROVED for o in obs)
    assert prove_safety(trans, modes=("bounded",))[NO_EARLY_PUBLICATION].result == PROVED


def test_counterexample_uses_spec_vocabulary():
    trans = _weaken("recycle", _recycle_while_pending)
    ob = prove_obligation("no_pending_when_free", "recycle", "bounded", trans)
    assert ob.result == COUNTEREXAMPLE
    pre_states = {b["state"] for b in ob.counterexample["pre"]["blocks"].values()}
    assert "RECLAIMED" in pre_states
    assert "FREE" in ob.text and "pending=" in ob.text
    json.dumps(ob.to_dict())


def test_bmc_finds_double_free():
    trans = _weaken("release", _release_no_holds_check)
    r = bmc(BMCConfig(blocks=2, holders=2, max_depth=4, budget_s=20), trans)
    assert r.violation is not None
    assert r.violation["trace"][-1].startswith("release")


def test_run_all_reports_failures_and_is_json():
    trans = _weaken("release", _release_no_holds_check)
    rep = run_all(
        transitions=trans, parallel=False,
        explore_cfgs=[SMALL], bmc_cfg=BMCConfig(blocks=2, holders=2, max_depth=2, budget_s=5),
    )
    assert not rep.ok
    assert rep.invariants["ref_matches_holders"]["status"] == "counterexample"
    assert rep.invariants["state_in_range"]["status"] == "proved"
    assert rep.safety[NO_DOUBLE_FREE]["result"] == COUNTEREXAMPLE
    d = json.loads(rep.to_json())
    assert d["ok"] is False and d["assumptions"]
    assert "NOT OK" in rep.table()
