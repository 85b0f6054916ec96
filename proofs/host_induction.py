"""The host tier's invariants are inductive over its transitions, with z3, unbounded.

For each host invariant I (``spec.host_invariants``) and host transition T (``spec.host``):

    Inv(s) at the relevant points ∧ guard_T(s, params)  ⊢  I(effect_T(s, params)) at a goal

The pre-state is fully symbolic: z3 arrays over the integers for every field, a tier of any
size ``num_blocks >= 1``, symbolic parameters. The goal point is a fresh symbolic host block,
hash or device block (for ``pool`` scope there is none). The invariants, all universally true
in a reachable state, are assumed at every point the obligation mentions: the goal, the
parameters, the hashes and sources those blocks carry, the blocks the hash map and the device
readers send those to (block invariants only where in range). Assuming more true facts is sound.

The pool-wide sums of ``host_conservation`` run over the transition's block ``b`` plus a
symbolic rest: each sum is ``term(b) + rest_k``, with the same ``rest_k`` before and after. That
is sound because a separate frame obligation proves every other in-range block's fields are
unchanged by T (so the rest of each sum is too).

Quantifier-free: sat (a counterexample) or unsat (proved); ``unknown`` is reported, never a pass.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

import z3

from pagedkv.spec.host import (
    HOST_ARRAY_FIELDS,
    HOST_BLOCK_FIELDS,
    HOST_PARAM_KINDS,
    HOST_TRANSITIONS,
    HostState,
    HostTransition,
)
from pagedkv.spec.host_invariants import HOST_INVARIANTS
from pagedkv.spec.invariants import Invariant
from pagedkv.spec.ops import Z3Ops

from .induction import COUNTEREXAMPLE, PROVED, UNKNOWN, Obligation, solve
from .nonvacuity import DEAD, ENABLED

SYMBOLIC = "symbolic"


class _RestSumOps(Z3Ops):
    """Z3Ops whose k-th ``Sum`` of an instance is the listed terms plus the symbolic rest_k."""

    def __init__(self) -> None:
        super().__init__()
        self.k = 0
        self.rests: list[Any] = []

    def begin(self) -> None:
        self.k = 0

    def Sum(self, terms: Iterable[Any]) -> Any:
        if self.k == len(self.rests):
            self.rests.append(z3.Int(f"rest{self.k}"))
        rest = self.rests[self.k]
        self.k += 1
        return super().Sum(terms) + rest


def symbolic_host_state(tag: str = "pre_") -> HostState:
    arr = {f: z3.Array(f"{tag}{f}", z3.IntSort(), z3.IntSort()) for f in HOST_ARRAY_FIELDS}
    return HostState(num_blocks=z3.Int(f"{tag}num_blocks"), **arr)


def _in_range(s: HostState, b: Any) -> Any:
    return z3.And(b >= 0, b < s.num_blocks)


def _instance(ops: Any, inv: Invariant, s: HostState, p: Any) -> Any:
    if isinstance(ops, _RestSumOps):
        ops.begin()
    return inv.pred(ops, s) if inv.scope == "pool" else inv.pred(ops, s, p)


def _points(s: HostState, params: Mapping[str, Any], goal_scope: str | None, goal: Any
            ) -> dict[str, list[Any]]:
    """The host blocks, hashes and device blocks the obligation mentions (two rounds)."""
    pts: dict[str, list[Any]] = {"block": [], "hash": [], "device": []}
    for p, v in params.items():
        pts[HOST_PARAM_KINDS[p]].append(v)
    if goal_scope in pts:
        pts[goal_scope].insert(0, goal)
    for _ in range(2):
        blocks = list(pts["block"])
        pts["hash"] += [s.hash[b] for b in blocks]
        pts["device"] += [s.src[b] for b in blocks]
        pts["block"] += [s.hmap[h] for h in pts["hash"]] + [s.dreader[d] for d in pts["device"]]
    return pts


def _py(m: z3.ModelRef, v: Any) -> Any:
    v = m.eval(v, model_completion=True)
    if z3.is_true(v) or z3.is_false(v):
        return z3.is_true(v)
    return v.as_long() if z3.is_int_value(v) else str(v)


def _cx(m: z3.ModelRef, s: HostState, post: HostState, params: Mapping[str, Any],
        pts: Mapping[str, list[Any]], goal: Any, note: str = "") -> dict[str, Any]:
    def dump(st: HostState) -> dict[str, Any]:
        blocks = sorted({_py(m, b) for b in pts["block"]})
        hashes = sorted({_py(m, h) for h in pts["hash"]})
        devs = sorted({_py(m, d) for d in pts["device"]})
        return {
            "num_blocks": _py(m, st.num_blocks),
            "blocks": {b: {f: _py(m, getattr(st, f)[b]) for f in HOST_BLOCK_FIELDS}
                       for b in blocks},
            "hmap": {h: _py(m, st.hmap[h]) for h in hashes},
            "dreader": {d: _py(m, st.dreader[d]) for d in devs},
        }

    return {"params": {p: _py(m, v) for p, v in params.items()},
            "goal": None if goal is None else _py(m, goal), "note": note,
            "pre": dump(s), "post": dump(post)}


_SCOPES = ("block", "hash", "device", "pool")


def _pre(ops: _RestSumOps, t: HostTransition, invariants: Mapping[str, Invariant],
         goal_scope: str | None, goal: Any
         ) -> tuple[HostState, dict[str, Any], dict[str, list[Any]], list[Any]]:
    """The symbolic pre-state, the transition's parameters, the points the obligation
    mentions, and every invariant assumed at those points."""
    s = symbolic_host_state()
    params = {p: z3.Int(f"p_{p}") for p in t.params}
    if "b" not in params:
        raise ValueError(f"host transition {t.name!r} names no host block")
    s = s.replace(block_ids=(params["b"],))
    pts = _points(s, params, goal_scope, goal)
    hyps: list[Any] = [s.num_blocks >= 1]
    if goal_scope == "block":
        hyps.append(_in_range(s, goal))
    for other in invariants.values():
        if other.scope == "block":
            hyps += [z3.Implies(_in_range(s, x), _instance(ops, other, s, x))
                     for x in pts["block"]]
        elif other.scope in ("hash", "device"):
            hyps += [_instance(ops, other, s, x) for x in pts[other.scope]]
        elif other.scope == "pool":
            hyps.append(_instance(ops, other, s, None))
        else:
            raise ValueError(f"unknown invariant scope {other.scope!r}")
    return s, params, pts, hyps


def prove_host_obligation(
    inv_name: str,
    t_name: str,
    transitions: Mapping[str, HostTransition] = HOST_TRANSITIONS,
    invariants: Mapping[str, Invariant] = HOST_INVARIANTS,
    timeout_ms: int = 20000,
) -> Obligation:
    t0 = time.perf_counter()
    inv, t = invariants[inv_name], transitions[t_name]

    def done(result: str, detail: str = "", cx: dict[str, Any] | None = None) -> Obligation:
        return Obligation(inv_name, t_name, SYMBOLIC, result,
                          round(time.perf_counter() - t0, 4), detail, cx,
                          repr(cx) if cx else None)

    if inv.scope not in _SCOPES:
        return done(UNKNOWN, f"unknown invariant scope {inv.scope!r}")
    ops = _RestSumOps()
    goal = {"block": z3.Int("goal_b"), "hash": z3.Int("goal_h"),
            "device": z3.Int("goal_d")}.get(inv.scope)
    s, params, pts, hyps = _pre(ops, t, invariants, inv.scope, goal)
    guard = t.guard(ops, s, **params)
    post = t.effect(ops, s, **params)
    res, m, why = solve(hyps + [guard, z3.Not(_instance(ops, inv, post, goal))], timeout_ms)
    if res == COUNTEREXAMPLE:
        return done(res, "", _cx(m, s, post, params, pts, goal))
    if res == UNKNOWN:
        return done(res, f"z3: {why}")
    if inv.scope != "pool":
        return done(PROVED)
    b = params["b"]
    # frame: every other in-range block is untouched, so each sum's rest is unchanged
    y = z3.Int("frame_y")
    changed = z3.Or(*[getattr(post, f)[y] != getattr(s, f)[y] for f in HOST_BLOCK_FIELDS])
    res, m, why = solve(hyps + [guard, _in_range(s, y), y != b, changed], timeout_ms)
    if res == COUNTEREXAMPLE:
        pts["block"].append(y)
        return done(res, "frame condition fails",
                    _cx(m, s, post, params, pts, y, "a block the transition does not name "
                        "changed"))
    if res == UNKNOWN:
        return done(res, f"frame condition: z3 {why}")
    return done(PROVED, "+1 frame condition")


def prove_host(
    transitions: Mapping[str, HostTransition] = HOST_TRANSITIONS,
    invariants: Mapping[str, Invariant] = HOST_INVARIANTS,
    timeout_ms: int = 20000,
) -> list[Obligation]:
    """Every (host invariant, host transition) obligation; ``result`` is proved /
    counterexample / unknown (unknown is never a pass)."""
    return [prove_host_obligation(i, t, transitions, invariants, timeout_ms)
            for i in invariants for t in transitions]


def host_nonvacuity(
    transitions: Mapping[str, HostTransition] = HOST_TRANSITIONS,
    invariants: Mapping[str, Invariant] = HOST_INVARIANTS,
    timeout_ms: int = 20000,
) -> dict[str, str]:
    """Per host transition: ``enabled`` when its guard holds in some state satisfying the
    invariants (a witness exists), else ``never enabled`` (or ``unknown``): an induction
    proof over a guard that never holds proves nothing."""
    out = {}
    for name, t in transitions.items():
        ops = _RestSumOps()
        s, params, _pts, hyps = _pre(ops, t, invariants, None, None)
        res, _m, _why = solve(hyps + [t.guard(ops, s, **params)], timeout_ms)
        out[name] = {COUNTEREXAMPLE: ENABLED, PROVED: DEAD}.get(res, UNKNOWN)
    return out
