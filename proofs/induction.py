"""Inductiveness of every named invariant over every transition, with z3.

For each (invariant I, transition T) the obligation is

    Inv(s) ∧ domains(params) ∧ guard_T(s, params)  ⊢  I(effect_T(s, params))

where ``Inv`` is every pool invariant at every point the obligation can mention. It is
checked twice:

* ``symbolic``: one symbolic goal point (block / hash / holder / launch), an unbounded pool of
  symbolic size (see ``z3_model.RestOps`` for how pool-wide sums are abstracted and why that
  is sound; the frame side conditions it needs are proved here too), an unbounded clock.
  Invariants are assumed at the goal point, at the transition's own block/holder/hash/launch,
  at the hashes those blocks carry, at the blocks the hash map sends those hashes to, and at
  the launches numbered ``clock[WATERMARK]`` (``advance`` reads ``inflight`` there) and
  ``clock[ISSUED]`` (the next launch). Quantifier-free: sat/unsat, not ``unknown``.
  A transition with no parameter (``advance``) gets a fresh anchor block and holder.
* ``bounded``: an explicit pool of N blocks, R holders, launches and clock values ``0..K``
  (``BoundedConfig``), every invariant assumed everywhere; a failure comes back as a concrete
  pool, in the spec's own vocabulary.

``unknown`` (time-out, unsupported shape) is reported as such and is never a pass.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import z3

from pagedkv.spec.invariants import Invariant
from pagedkv.spec.ops import Z3Ops
from pagedkv.spec.states import ISSUED, WATERMARK
from pagedkv.spec.transitions import Transition

from .z3_model import (
    DEFAULT_BOUNDED,
    DEFAULT_INVARIANTS,
    DEFAULT_TRANSITIONS,
    BoundedConfig,
    RecordingOps,
    RestOps,
    SitePlan,
    Universe,
    bounded_state,
    classify_sites,
    decode_state,
    format_counterexample,
    in_range,
    instance,
    param_domain,
    param_kind,
    param_vars,
    proof_invariants,
    symbolic_state,
)

PROVED, COUNTEREXAMPLE, UNKNOWN = "proved", "counterexample", "unknown"


@dataclass
class Obligation:
    invariant: str
    transition: str
    mode: str  # "symbolic" | "bounded"
    result: str  # proved | counterexample | unknown
    time_s: float
    detail: str = ""
    counterexample: dict[str, Any] | None = None
    text: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_PLAN_CACHE: dict[tuple[str, int], tuple[list[SitePlan], str | None]] = {}


def site_plans(invariants: Mapping[str, Invariant]) -> dict[str, list[SitePlan]]:
    out = {}
    for name, inv in proof_invariants(invariants).items():
        key = (name, id(inv.pred))
        if key not in _PLAN_CACHE:
            _PLAN_CACHE[key] = classify_sites(inv)
        out[name] = _PLAN_CACHE[key][0]
    return out


def unsupported(invariants: Mapping[str, Invariant]) -> dict[str, str]:
    site_plans(invariants)
    return {
        n: _PLAN_CACHE[(n, id(i.pred))][1]  # type: ignore[misc]
        for n, i in proof_invariants(invariants).items()
        if _PLAN_CACHE[(n, id(i.pred))][1]
    }


# --- one pre-state with all hypotheses -------------------------------------------------------
@dataclass
class Frame:
    """A pre-state, a transition's parameters and everything assumed about them."""

    s: Any
    params: dict[str, Any]
    hyps: list[Any]
    ops: Any
    universe: Universe
    anchors_b: tuple[Any, ...]
    anchors_r: tuple[Any, ...]
    goal_point: Any = None
    extra_blocks: list[Any] = field(default_factory=list)
    extra_hashes: list[Any] = field(default_factory=list)
    extra_launches: list[Any] = field(default_factory=list)


def _goal_var(scope: str) -> Any:
    return {"block": z3.Int("goal_b"), "hash": z3.Int("goal_h"), "holder": z3.Int("goal_r"),
            "launch": z3.Int("goal_L")}.get(scope)


def build_frame(
    mode: str,
    t: Transition | None,
    invariants: Mapping[str, Invariant],
    cfg: BoundedConfig,
    goal_scope: str | None = None,
    extra_blocks: int = 0,
    tag: str = "pre_",
    extra_hashes: int = 0,
    extra_launches: int = 0,
) -> Frame:
    """Pre-state, parameters, and Inv at every relevant point (see module doc)."""
    invs = proof_invariants(invariants)
    params = param_vars(t, "p_") if t is not None else {}
    extra = [z3.Int(f"blk{i}") for i in range(extra_blocks)]
    xh = [z3.Int(f"hash{i}") for i in range(extra_hashes)]
    xl = [z3.Int(f"launch{i}") for i in range(extra_launches)]
    if mode == "bounded":
        s, dom = bounded_state(cfg, tag)
        ops: Any = Z3Ops()
        hyps = list(dom)
        for p, v in params.items():
            hyps.append(param_domain(param_kind(p), v, s, cfg))
        hyps += [param_domain("block", v, s, cfg) for v in extra]
        hyps += [param_domain("hash", v, s, cfg) for v in xh]
        hyps += [param_domain("launch", v, s, cfg) for v in xl]
        uni = Universe(list(range(cfg.blocks)), list(range(cfg.holders)), list(cfg.hashes),
                       launches=list(cfg.launch_keys))
        for inv in invs.values():
            hyps += [instance(ops, inv, s, p) for p in points(uni, inv.scope)]
        goal = None
        return Frame(s, params, hyps, ops, uni, tuple(s.block_ids), tuple(s.holder_ids), goal,
                     extra, xh, xl)

    # symbolic
    s = symbolic_state(tag)
    blocks = [v for p, v in params.items() if param_kind(p) == "block"] + extra
    holders = [v for p, v in params.items() if param_kind(p) == "holder"]
    hash_params = [v for p, v in params.items() if param_kind(p) == "hash"]
    launch_params = [v for p, v in params.items() if param_kind(p) == "launch"]
    anchors_b = tuple(blocks) or (z3.Int("anchor_b"),)
    anchors_r = tuple(holders) or (z3.Int("anchor_r"),)
    s = s.replace(block_ids=anchors_b, holder_ids=anchors_r)
    ops = RestOps(site_plans(invariants), s.num_blocks, len(anchors_b))
    hyps = [s.num_blocks >= 1, s.block_size >= 1]
    hyps += [in_range(s, b) for b in anchors_b]
    if len(anchors_b) > 1:
        hyps.append(z3.Distinct(*anchors_b))
    if len(anchors_r) > 1:
        hyps.append(z3.Distinct(*anchors_r))
    goal = _goal_var(goal_scope) if goal_scope else None
    pt_blocks = list(anchors_b)
    pt_hashes = list(hash_params) + xh
    pt_holders = list(anchors_r)
    pt_launches = launch_params + xl + [s.clock[WATERMARK], s.clock[ISSUED]]
    if goal_scope == "block":
        hyps.append(in_range(s, goal))
        pt_blocks.insert(0, goal)
    elif goal_scope == "hash":
        pt_hashes.insert(0, goal)
    elif goal_scope == "holder":
        pt_holders.insert(0, goal)
    elif goal_scope == "launch":
        pt_launches.insert(0, goal)
    pt_hashes += [s.hash[b] for b in pt_blocks]
    guarded_blocks = [s.hmap[h] for h in pt_hashes]
    for inv in invs.values():
        if inv.scope == "block":
            hyps += [instance(ops, inv, s, b) for b in pt_blocks]
            hyps += [z3.Implies(in_range(s, b), instance(ops, inv, s, b)) for b in guarded_blocks]
        elif inv.scope == "hash":
            hyps += [instance(ops, inv, s, h) for h in pt_hashes]
        elif inv.scope == "holder":
            hyps += [instance(ops, inv, s, r) for r in pt_holders]
        elif inv.scope == "launch":
            hyps += [instance(ops, inv, s, L) for L in pt_launches]
        elif inv.scope == "pool":
            hyps.append(instance(ops, inv, s, None))
        else:  # pragma: no cover - a scope this prover does not know is never a silent pass
            raise ValueError(f"induction: unknown invariant scope {inv.scope!r}")
    uni = Universe(pt_blocks, pt_holders, pt_hashes[: len(pt_hashes) - len(pt_blocks)],
                   launches=pt_launches)
    return Frame(s, params, hyps, ops, uni, anchors_b, anchors_r, goal, extra, xh, xl)


def points(uni: Universe, scope: str) -> list[Any]:
    """The points of a universe an invariant of ``scope`` is instantiated at."""
    return {"block": uni.blocks, "hash": uni.hashes, "holder": uni.holders,
            "launch": uni.launches, "pool": [None]}[scope]


def solve(
    facts: list[Any], timeout_ms: int
) -> tuple[str, z3.ModelRef | None, str]:
    sol = z3.Solver()
    sol.set("timeout", timeout_ms)
    sol.add(*facts)
    r = sol.check()
    if r == z3.unsat:
        return PROVED, None, ""
    if r == z3.sat:
        return COUNTEREXAMPLE, sol.model(), ""
    return UNKNOWN, None, str(sol.reason_unknown())


def _py(v: Any) -> Any:
    if z3.is_true(v):
        return True
    if z3.is_false(v):
        return False
    if z3.is_int_value(v):
        return v.as_long()
    return str(v)


def _violated_points(m: z3.ModelRef, ops: Any, inv: Invariant, post: Any, uni: Universe,
                     goal: Any) -> str:
    if goal is not None:
        return f"{inv.scope} {_py(m.eval(goal, model_completion=True))}"
    if inv.scope == "pool":
        return "pool"
    pts = points(uni, inv.scope)
    bad = [p for p in pts
           if z3.is_false(m.eval(instance(ops, inv, post, p), model_completion=True))]
    return f"{inv.scope} {', '.join(map(str, bad))}"


def _counterexample(
    m: z3.ModelRef, fr: Frame, t: Transition, post: Any, inv: Invariant, mode: str, note: str = ""
) -> dict[str, Any]:
    uni = fr.universe
    if fr.goal_point is not None and inv.scope == "hash":
        uni = Universe(uni.blocks, uni.holders, [fr.goal_point] + uni.hashes,
                       launches=uni.launches)
    params = {p: _py(m.eval(v, model_completion=True)) for p, v in fr.params.items()}
    rest = {}
    if isinstance(fr.ops, RestOps):
        rest = {f"{n}@{pt}#{k}": _py(m.eval(v, model_completion=True))
                for (n, pt, k), v in fr.ops.rest.items()}
    return {
        "rest": rest,
        "invariant": inv.name,
        "where": _violated_points(m, fr.ops, inv, post, uni, fr.goal_point),
        "transition": t.name,
        "params": params,
        "mode": mode,
        "note": note,
        "pre": decode_state(m, fr.s, uni),
        "post": decode_state(m, post, uni),
    }


def prove_obligation(
    inv_name: str,
    t_name: str,
    mode: str = "symbolic",
    transitions: Mapping[str, Transition] = DEFAULT_TRANSITIONS,
    invariants: Mapping[str, Invariant] = DEFAULT_INVARIANTS,
    cfg: BoundedConfig = DEFAULT_BOUNDED,
    timeout_ms: int = 20000,
) -> Obligation:
    t0 = time.perf_counter()
    inv = invariants[inv_name]
    t = transitions[t_name]

    def done(result: str, detail: str = "", cx: dict[str, Any] | None = None) -> Obligation:
        return Obligation(inv_name, t_name, mode, result, round(time.perf_counter() - t0, 4),
                          detail, cx, format_counterexample(cx) if cx else None)

    if mode == "symbolic":
        why = unsupported(invariants).get(inv_name)
        if why:
            return done(UNKNOWN, f"symbolic pool abstraction does not apply: {why}")
    fr = build_frame(mode, t, invariants, cfg, goal_scope=inv.scope if mode == "symbolic"
                     else None)
    ops, s = fr.ops, fr.s
    guard = t.guard(ops, s, **fr.params)
    post = t.effect(ops, s, **fr.params)
    if mode == "bounded":
        goal = z3.And(*[instance(ops, inv, post, p) for p in points(fr.universe, inv.scope)])
        side: list[Any] = []
    else:
        instance(ops, inv, s, fr.goal_point)  # the pre instance (already assumed) - same rest
        goal = instance(ops, inv, post, fr.goal_point)
        side = list(ops.side)
    res, m, why = solve(fr.hyps + side + [guard, z3.Not(goal)], timeout_ms)
    if res == COUNTEREXAMPLE:
        note = "" if mode == "bounded" else (
            "symbolic pool: 'rest[...]' terms stand for the blocks/holders not shown"
        )
        return done(res, "", _counterexample(m, fr, t, post, inv, mode, note))
    if res == UNKNOWN:
        return done(res, f"z3: {why}")
    if mode == "symbolic":
        fres, fdetail, fcx = frame_obligations(fr, t, post, inv, invariants, timeout_ms)
        if fres != PROVED:
            return done(fres, fdetail, fcx)
        return done(PROVED, fdetail)
    return done(PROVED)


def frame_obligations(
    fr: Frame, t: Transition, post: Any, inv: Invariant, invariants: Mapping[str, Invariant],
    timeout_ms: int,
) -> tuple[str, str, dict[str, Any] | None]:
    """Each non-anchor term of each pool-wide sum of the goal is unchanged by the transition."""
    plans = site_plans(invariants).get(inv.name, [])
    sites = [(k, p) for k, p in enumerate(plans) if p.over]
    if not sites:
        return PROVED, "", None
    y, q = z3.Int("frame_y"), z3.Int("frame_q")
    checks = 0
    for k, plan in sites:
        if plan.over == "blocks":
            ids = {"block_ids": fr.anchors_b + (y,)}
            extra = [in_range(fr.s, y)] + [y != a for a in fr.anchors_b]
        else:
            ids = {"holder_ids": fr.anchors_r + (q,)}
            extra = [q != a for a in fr.anchors_r]
        rec_pre, rec_post = RecordingOps(), RecordingOps()
        instance(rec_pre, inv, fr.s.replace(**ids), fr.goal_point)
        instance(rec_post, inv, post.replace(**ids), fr.goal_point)
        before, after = rec_pre.sums[k][-1], rec_post.sums[k][-1]
        guard = t.guard(fr.ops, fr.s, **fr.params)
        res, m, why = solve(fr.hyps + list(fr.ops.side) + extra + [guard, before != after],
                            timeout_ms)
        checks += 1
        if res == COUNTEREXAMPLE:
            cx = _counterexample(m, fr, t, post, inv, "symbolic",
                                 f"frame: sum site {k} changes at a block/holder the "
                                 "transition does not name")
            return COUNTEREXAMPLE, "frame condition fails", cx
        if res == UNKNOWN:
            return UNKNOWN, f"frame condition: z3 {why}", None
    return PROVED, f"+{checks} frame condition(s)", None


def induction_matrix(
    mode: str = "symbolic",
    transitions: Mapping[str, Transition] = DEFAULT_TRANSITIONS,
    invariants: Mapping[str, Invariant] = DEFAULT_INVARIANTS,
    cfg: BoundedConfig = DEFAULT_BOUNDED,
    timeout_ms: int = 20000,
    progress: Callable[[str], None] | None = None,
    only: Mapping[str, Any] | None = None,
) -> list[Obligation]:
    """Every (invariant, transition) obligation in the given mode."""
    out = []
    for iname in proof_invariants(invariants):
        if only and "invariants" in only and iname not in only["invariants"]:
            continue
        for tname in transitions:
            if only and "transitions" in only and tname not in only["transitions"]:
                continue
            ob = prove_obligation(iname, tname, mode, transitions, invariants, cfg, timeout_ms)
            if progress:
                progress(f"induction[{mode}] {iname} / {tname}: {ob.result} ({ob.time_s:.2f}s)")
            out.append(ob)
    return out
