"""The z3 proofs and the reachability search, on the spec and on weakened copies of it.

Each headline guard is weakened in a copy of ``TRANSITIONS`` (``dataclasses.replace``); the
provers must answer with a counterexample naming an invariant that serves the right safety
property, and the explorer must find a trace from the initial pool.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from pagedkv.proofs import epochs
from pagedkv.proofs.bmc import BMCConfig, bmc
from pagedkv.proofs.explore import (
    READERS,
    ExploreConfig,
    explore,
    normalization_lemma,
    step,
    unobserved_fields,
)
from pagedkv.proofs.induction import COUNTEREXAMPLE, PROVED, induction_matrix, prove_obligation
from pagedkv.proofs.nonvacuity import ENABLED, nonvacuity
from pagedkv.proofs.runner import run_all
from pagedkv.proofs.safety import prove_safety
from pagedkv.spec import (
    ALLOCATED,
    FREE,
    INVARIANTS,
    ISSUED,
    PUBLISHED,
    RECLAIMED,
    REFERENCED,
    TRANSITIONS,
    WATERMARK,
    initial_state,
)
from pagedkv.spec import check as spec_check
from pagedkv.spec.host import HOST_TRANSITIONS
from pagedkv.spec.host_invariants import HOST_INVARIANTS
from pagedkv.spec.invariants import NO_DOUBLE_FREE, NO_EARLY_PUBLICATION, NO_RECYCLE_WHILE_PENDING

SMALL = ExploreConfig(blocks=2, holders=2, block_size=1, max_inflight=1, max_window=2,
                      stop_at_first=True)


def _weaken(name: str, guard) -> dict:
    t = dict(TRANSITIONS)
    t[name] = dataclasses.replace(t[name], guard=guard)
    return t


def _release_no_holds_check(ops, s, b, r):
    # release's guard without "r holds b" and without "ref > 0": a double free
    st = s.state[b]
    return ops.Or(st == ALLOCATED, st == PUBLISHED, st == REFERENCED)


def _recycle_while_pending(ops, s, b):
    return s.state[b] == RECLAIMED  # retire <= watermark and wpend == 0 dropped


def _recycle_ignores_watermark(ops, s, b):
    # only the epoch check dropped: a launch in flight may still read the block
    return ops.And(b >= 0, b < s.num_blocks, s.state[b] == RECLAIMED, s.wpend[b] == 0)


def _release_without_stamp(ops, s, b, r):
    return TRANSITIONS["release"].effect(ops, s, b, r).replace(retire=s.retire)


def _publish_no_init(ops, s, b, r):
    # only the init conjunct dropped: masked by state == ALLOCATED (ALLOCATED => init)
    return ops.And(s.state[b] == ALLOCATED, s.alive[r], s.holds[r][b])


def _publish_uninitialized(ops, s, b, r):
    # init, holds and the ALLOCATED-only state check dropped: publish a FREE block
    return ops.And(ops.Or(s.state[b] == ALLOCATED, s.state[b] == FREE), s.alive[r])


MUTANTS = {
    "double_free": (("release", _release_no_holds_check), NO_DOUBLE_FREE),
    "recycle_while_pending": (("recycle", _recycle_while_pending), NO_RECYCLE_WHILE_PENDING),
    "recycle_ignores_watermark": (("recycle", _recycle_ignores_watermark),
                                  NO_RECYCLE_WHILE_PENDING),
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
    # two launches in flight: completions out of order
    r = explore(ExploreConfig(blocks=2, holders=2, block_size=1, max_inflight=2, max_window=2))
    assert r.complete and not r.violations, {k: v.text for k, v in r.violations.items()}
    assert all(n > 0 for n in r.fired.values()), r.fired
    assert r.states > 1000 and r.readers_checked > 0
    assert r.normalization["ok"] and not r.normalization["failed"]
    assert r.checked["launch_window"] == r.states
    req = explore(ExploreConfig(blocks=2, holders=2, block_size=2, max_inflight=1,
                                max_window=2, layer="request", max_tokens=3, hashes=(1,),
                                max_depth=6))
    assert req.ok and req.frontier > 0 and req.checked["launch_window"] == req.states
    assert req.fired["write_block"] > 0 and req.fired["truncate_tail"] > 0
    assert req.fired["fork_share"] > 0 and req.fired["complete"] > 0


def test_explorer_step_matches_spec_step():
    s = initial_state(2, 1, range(2))
    for name, params in [("open_holder", {"r": 0}), ("allocate", {"b": 1, "r": 0}),
                         ("publish", {"b": 1, "r": 0}), ("launch", {"L": 0}),
                         ("begin_write", {"b": 1, "r": 0, "w": 1}), ("complete", {"L": 0}),
                         ("advance", {}), ("end_write", {"b": 1})]:
        mine = step(TRANSITIONS[name], s, params)
        theirs = spec_check.step(s, name, **params)
        assert mine is not None and theirs is not None
        assert mine.flattened() == theirs
        s = theirs
    # a guard that fails applies nothing: failed allocation changes nothing
    assert spec_check.step(s, "advance") is None  # nothing left for the watermark to pass
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
    ob = prove_obligation("no_write_when_free", "recycle", "bounded", trans)
    assert ob.result == COUNTEREXAMPLE
    pre_states = {b["state"] for b in ob.counterexample["pre"]["blocks"].values()}
    assert "RECLAIMED" in pre_states
    assert "FREE" in ob.text and "wpend=" in ob.text
    json.dumps(ob.to_dict())


# --- epochs -----------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["symbolic", "bounded"])
@pytest.mark.parametrize("inv", ["launch_window", "reused_after_its_readers", "watermark_bounds",
                                 "no_write_when_free"])
def test_epoch_invariants_are_inductive(mode, inv):
    obs = induction_matrix(mode, only={"invariants": [inv]})
    assert len(obs) == len(TRANSITIONS)
    assert all(o.result == PROVED for o in obs), [(o.transition, o.result) for o in obs]
    assert INVARIANTS["launch_window"].scope == "launch"


@pytest.mark.parametrize("mode", ["symbolic", "bounded"])
def test_recycle_without_watermark_check_names_retire_and_watermark(mode):
    trans = _weaken("recycle", _recycle_ignores_watermark)
    ob = prove_obligation("reused_after_its_readers", "recycle", mode, trans)
    assert ob.result == COUNTEREXAMPLE
    post = ob.counterexample["post"]
    bad = [b for b in post["blocks"].values() if b["state"] == "FREE"
           and b["retire"] > post["clock"]["watermark"]]
    assert bad, ob.text
    assert "retire=" in ob.text and "watermark=" in ob.text and "issued=" in ob.text
    print(ob.text)


def test_release_without_retire_stamp_breaks_the_readers_ghost():
    """No invariant mentions which launch read which block: the stamp is checked by the
    readers ghost, in z3 (safety) and in the explorer."""
    trans = dict(TRANSITIONS)
    trans["release"] = dataclasses.replace(trans["release"], effect=_release_without_stamp)
    assert all(o.result == PROVED for o in induction_matrix("bounded", trans))
    saf = prove_safety(trans, only={"release"})
    bad = [c for c in saf[NO_RECYCLE_WHILE_PENDING].claims if c.result == COUNTEREXAMPLE]
    assert bad and all("readers ghost" in c.claim for c in bad)
    assert "retire=" in bad[0].text and "may read" in bad[0].text
    r = explore(SMALL, trans)
    assert READERS in r.violations, list(r.violations)
    v = r.violations[READERS]
    assert v.trace[-1].startswith("recycle") and any(t.startswith("launch") for t in v.trace)
    assert "launches in flight" in v.text and "retire=" in v.text
    print(v.text)


def test_advance_past_a_launch_in_flight_breaks_the_window():
    trans = _weaken("advance", lambda ops, s: s.clock[WATERMARK] < s.clock[ISSUED])
    for mode in ("bounded", "symbolic"):
        ob = prove_obligation("launch_window", "advance", mode, trans)
        assert ob.result == COUNTEREXAMPLE, mode
        assert "launches in flight" in ob.text
    r = explore(SMALL, trans)
    assert "launch_window" in r.violations


def test_normalization_lemma_holds_and_catches_a_stamp_compared_with_a_constant():
    res = normalization_lemma(TRANSITIONS, INVARIANTS)
    assert res["ok"] and res["queries"] == 3 * len(TRANSITIONS)

    def absolute(ops, s, b):  # compares a retire stamp with a fixed launch number
        return ops.And(b >= 0, b < s.num_blocks, s.state[b] == RECLAIMED, s.retire[b] <= 1,
                       s.wpend[b] == 0)

    bad = normalization_lemma(_weaken("recycle", absolute), INVARIANTS)
    assert not bad["ok"]
    assert [f["transition"] for f in bad["failed"]] == ["recycle"]
    r = explore(SMALL, _weaken("recycle", absolute))
    assert "<normalization>" in r.violations and not r.ok


def test_concrete_normalization_matches_the_z3_one():
    import z3

    from pagedkv.proofs.explore import _alpha_z3
    from pagedkv.proofs.z3_model import symbolic_state
    from pagedkv.spec import check

    s = initial_state(2, 1, range(1))
    for name, params in [("open_holder", {"r": 0}), ("allocate", {"b": 0, "r": 0}),
                         ("launch", {"L": 0}), ("launch", {"L": 1}), ("release", {"b": 0, "r": 0}),
                         ("complete", {"L": 0}), ("advance", {}), ("launch", {"L": 2})]:
        s = check.step(s, name, **params)
        assert s is not None, name
    n = epochs.normalize(s)
    assert n.clock[WATERMARK] == 0 and n.clock[ISSUED] == 2
    assert epochs.in_flight(n) == [0, 1] and n.retire[0] == 1 and n.retire[1] == 0
    z = symbolic_state("cmp_")
    facts = []
    for f in ("clock", "inflight", "retire"):
        keys = {"clock": (ISSUED, WATERMARK), "inflight": range(-1, 5), "retire": (0, 1)}[f]
        facts += [getattr(z, f)[k] == getattr(s, f)[k] for k in keys]
    a = _alpha_z3(z)
    sol = z3.Solver()
    sol.add(*facts)
    assert sol.check() == z3.sat
    m = sol.model()
    for f, keys in (("clock", (ISSUED, WATERMARK)), ("inflight", range(0, 3)),
                    ("retire", (0, 1))):
        for k in keys:
            got = m.eval(getattr(a, f)[k], model_completion=True)
            want = getattr(n, f)[k]
            assert (z3.is_true(got) if isinstance(want, bool) else got.as_long()) == want, (f, k)


def test_transitions_without_parameters_are_proved_and_enabled():
    assert TRANSITIONS["advance"].params == ()
    obs = induction_matrix("symbolic", only={"transitions": ["advance"]})
    assert obs and all(o.result == PROVED for o in obs)
    res = nonvacuity({"advance": TRANSITIONS["advance"], "launch": TRANSITIONS["launch"],
                      "complete": TRANSITIONS["complete"]})
    assert all(e.result == ENABLED for es in res.values() for e in es)


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
        request_layer=False,
    )
    assert not rep.ok
    assert rep.invariants["ref_matches_holders"]["status"] == "counterexample"
    assert rep.invariants["state_in_range"]["status"] == "proved"
    assert rep.safety[NO_DOUBLE_FREE]["result"] == COUNTEREXAMPLE
    d = json.loads(rep.to_json())
    assert d["ok"] is False and d["assumptions"]
    assert "NOT OK" in rep.table()
    # the host tier's proofs are in the report, and pass though the pool layer's fail
    host = {n: r for n, r in rep.invariants.items() if r.get("layer") == "host"}
    assert set(host) == set(HOST_INVARIANTS)
    assert all(r["status"] == "proved" and len(r["induction"]) == len(HOST_TRANSITIONS)
               for r in host.values())
    n = len(HOST_INVARIANTS) * len(HOST_TRANSITIONS)
    assert rep.totals["host_proved"] == rep.totals["host_obligations"] == n
    assert (f"host tier {n}/{n} proved, {len(HOST_TRANSITIONS)}/{len(HOST_TRANSITIONS)} "
            "transitions enabled") in rep.table()
    assert not any("host" in f for f in rep.failures)


def test_a_complete_search_must_pass_through_the_scenarios_it_covers():
    """One launch in flight at a time and one holder: no completion out of order, no fork,
    no copy; the runner reports each scenario the search was required to pass through and
    never did (and requires nothing of a depth-bounded search)."""
    from pagedkv.proofs.explore import SCENARIOS
    from pagedkv.proofs.runner import REQUIRED_SCENARIOS, scenario_failures

    small = explore(ExploreConfig(blocks=1, holders=1, block_size=1, max_inflight=1,
                                  max_window=1, layer="request", max_tokens=1, hashes=(1,)))
    assert small.complete and small.ok
    assert small.scenarios["truncation of rejected positions"] > 0
    missing = scenario_failures([small])
    assert missing == [f"explorer[request]: never passed through {w!r}" for w in (
        "a launch completes while an older one is in flight", "copy-on-write of a shared block",
        "fork sharing a block whose write is in flight")]
    assert set(REQUIRED_SCENARIOS["request"]) | set(REQUIRED_SCENARIOS["request:hits"]) == set(
        SCENARIOS)
    bounded = explore(ExploreConfig(blocks=1, holders=1, block_size=1, max_inflight=1,
                                    max_window=1, layer="request", max_tokens=1, hashes=(1,),
                                    max_depth=3))
    assert scenario_failures([bounded]) == []


def _end_write_without_pending_check(ops, s, b):
    # end_write's "wpend > 0" dropped, on a published block: a write ends that never began
    return ops.And(b >= 0, b < s.num_blocks, s.state[b] == PUBLISHED)


def test_ending_a_write_that_never_began_breaks_no_write_when_free():
    """Only ``no_write_when_free``'s ``wpend >= 0`` says pending writes never go negative
    (its other conjunct covers FREE and ALLOCATED blocks, not a published one)."""
    trans = _weaken("end_write", _end_write_without_pending_check)
    for mode in ("bounded", "symbolic"):
        obs = induction_matrix(mode, trans, only={"transitions": ["end_write"]})
        cx = {o.invariant for o in obs if o.result == COUNTEREXAMPLE}
        assert "no_write_when_free" in cx, (mode, cx)
