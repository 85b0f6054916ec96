"""The table invariants are inductive over the request layer, with z3, unbounded.

For each table invariant I (``spec.request_invariants``) and request transition T
(``spec.requests``) the obligation is

    Pool(s) ∧ Lemmas(s) ∧ Tables(s) ∧ guard_T(s, params)  ⊢  I(effect_T(s, params)) at a
    symbolic goal point (a request, a request and an index, a request and a block, a block).

The pre-state is fully symbolic: any number of blocks, requests, launches, any block size; the
request fields are unconstrained z3 arrays. Hypotheses are instances of universally true
facts, so assuming more of them is sound:

* ``Pool``: every pool invariant without a pool-wide sum, at every block, hash, holder and
  launch term the obligation mentions. They hold in the request layer because every request
  transition is a sequence of pool transitions, each with its guard (the pool proof);
* ``Lemmas``: two consequences of ``ref_matches_holders`` (whose sum is not instantiated
  here), proved below from it: a block held by a holder has ``ref >= 1``; one held by two
  different holders has ``ref >= 2``;
* ``Tables``: every table invariant at every (request, index) and (request, block) pair of the
  terms mentioned: the transition's requests and the goal's, indices at the goal, each
  table's ends, its issued and computed block, and the entries of the blocks named.

Quantifier-free and linear (positions are kept as (blocks, offset) pairs): z3 answers sat or
unsat. ``unknown`` is reported, never a pass.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

import z3

from pagedkv.spec.invariants import INVARIANTS, Invariant
from pagedkv.spec.model import PoolState
from pagedkv.spec.ops import Z3Ops
from pagedkv.spec.request_invariants import REQUEST_INVARIANTS
from pagedkv.spec.requests import (
    REQUEST_INDEX_KIND,
    REQUEST_PARAM_KINDS,
    REQUEST_TRANSITIONS,
    RequestState,
    RequestTransition,
)
from pagedkv.spec.states import ISSUED, WATERMARK

from .induction import COUNTEREXAMPLE, PROVED, UNKNOWN, Obligation
from .z3_model import symbolic_state

SYMBOLIC = "symbolic"
_II = z3.ArraySort(z3.IntSort(), z3.IntSort())
_IAI = z3.ArraySort(z3.IntSort(), _II)


class _NoSums(Z3Ops):
    """Z3Ops that refuses pool-wide sums: the invariants using them are not instantiated."""

    def Sum(self, terms: Iterable[Any]) -> Any:  # noqa: ARG002
        raise _HasSum


class _HasSum(Exception):
    pass


def symbolic_request_state(tag: str) -> RequestState:
    pool = symbolic_state(tag)
    sorts = {1: _II, 2: _IAI}  # int arrays, indexed once or twice (REQUEST_INDEX_KIND)
    fields = {f: z3.Const(f"{tag}{f}", sorts[len(kinds)])
              for f, kinds in REQUEST_INDEX_KIND.items()}
    return RequestState(pool=pool, **fields)


def sum_free_invariants(invariants: Mapping[str, Invariant]) -> dict[str, Invariant]:
    """The pool invariants whose predicate has no pool-wide sum (tried on a symbolic state)."""
    s = symbolic_state("probe_")
    out = {}
    for name, inv in invariants.items():
        if inv.scope == "table":
            continue
        args = () if inv.scope == "pool" else (z3.Int("probe_x"),)
        try:
            inv.pred(_NoSums(), s, *args)
        except _HasSum:
            continue
        out[name] = inv
    return out


def lemmas(s: PoolState, holders: list[Any], blocks: list[Any]) -> list[Any]:
    out = []
    for b in blocks:
        for i, x in enumerate(holders):
            out.append(z3.Implies(s.holds[x][b], s.ref[b] >= 1))
            for y in holders[i + 1:]:
                out.append(z3.Implies(z3.And(x != y, s.holds[x][b], s.holds[y][b]),
                                      s.ref[b] >= 2))
    return out


def prove_lemmas(timeout_ms: int = 10_000) -> str:
    """The lemmas follow from ref_matches_holders: ref[b] is the number of holders holding b;
    split it as x's term + y's term + the rest (a sum of 0/1 terms, so >= 0)."""
    s = symbolic_state("lem_")
    x, y, b, rest = z3.Ints("lem_x lem_y lem_b lem_rest")
    tx, ty = z3.If(s.holds[x][b], 1, 0), z3.If(s.holds[y][b], 1, 0)
    sol = z3.Solver()
    sol.set("timeout", timeout_ms)
    sol.add(x != y, rest >= 0, s.ref[b] == tx + ty + rest)
    sol.add(z3.Not(z3.And(*lemmas(s, [x, y], [b]))))
    r = sol.check()
    return PROVED if r == z3.unsat else COUNTEREXAMPLE if r == z3.sat else UNKNOWN


def _goal(scope: str) -> tuple[Any, ...]:
    return {"holder": (z3.Int("goal_r"),),
            "entry": (z3.Int("goal_r"), z3.Int("goal_i")),
            "holding": (z3.Int("goal_r"), z3.Int("goal_b")),
            "block": (z3.Int("goal_b"),)}[scope]


def _hypotheses(s: RequestState, params: Mapping[str, Any], goal: tuple[Any, ...],
                scope: str, pool_invs: Mapping[str, Invariant]) -> list[Any]:
    ops = Z3Ops()
    P = s.pool
    holders = [v for k, v in params.items() if REQUEST_PARAM_KINDS.get(k) == "holder"]
    blocks = [v for k, v in params.items() if REQUEST_PARAM_KINDS.get(k) == "block"]
    hashes = [v for k, v in params.items() if REQUEST_PARAM_KINDS.get(k) == "hash"]
    launches = [v for k, v in params.items() if REQUEST_PARAM_KINDS.get(k) == "launch"]
    indices: list[Any] = []
    if scope in ("holder", "entry", "holding"):
        holders.append(goal[0])
    if scope == "entry":
        indices.append(goal[1])
    if scope in ("holding", "block"):
        blocks.append(goal[-1])
    for h in holders:
        indices += [s.tlen[h] - 1, s.tlen[h], s.issued_q[h], s.computed_q[h]]
        indices += [s.slot[h][b] for b in blocks]
    entries = [s.tab[h][i] for h in holders for i in indices]
    hashes += [s.chain[h][i] for h in holders for i in indices]
    all_blocks = blocks + entries
    hashes += [P.hash[b] for b in all_blocks] + [s.content[b] for b in all_blocks]
    hit_blocks = [P.hmap[h] for h in hashes]
    all_blocks += hit_blocks
    launches += [P.clock[ISSUED] - 1, P.clock[ISSUED], P.clock[WATERMARK]]
    hyps: list[Any] = [P.num_blocks >= 1, P.block_size >= 1]
    hyps += [z3.And(b >= 0, b < P.num_blocks)
             for k, b in params.items() if REQUEST_PARAM_KINDS.get(k) == "block"]
    points = {"block": all_blocks, "hash": hashes, "holder": holders, "launch": launches}
    for inv in pool_invs.values():
        if inv.scope == "pool":
            hyps.append(inv.pred(ops, P))
            continue
        hyps += [inv.pred(ops, P, x) for x in points[inv.scope]]
    hyps += lemmas(P, holders, all_blocks)
    for inv in REQUEST_INVARIANTS.values():
        if inv.scope == "holder":
            hyps += [inv.pred(ops, s, h) for h in holders]
        elif inv.scope == "entry":
            hyps += [inv.pred(ops, s, h, i) for h in holders for i in indices]
        elif inv.scope == "holding":
            hyps += [inv.pred(ops, s, h, b) for h in holders for b in all_blocks]
        elif inv.scope == "block":
            hyps += [inv.pred(ops, s, b) for b in all_blocks]
        else:  # pragma: no cover - a spec authoring error
            raise ValueError(f"unknown request invariant scope {inv.scope!r}")
    return hyps


def prove_one(inv: Invariant, t: RequestTransition, pool_invs: Mapping[str, Invariant],
              timeout_ms: int = 60_000) -> Obligation:
    start = time.perf_counter()
    s = symbolic_request_state("pre_")
    params = {p: z3.Int(f"p_{p}") for p in t.params}
    goal = _goal(inv.scope)
    ops = Z3Ops()
    hyps = _hypotheses(s, params, goal, inv.scope, pool_invs)
    post = t.effect(ops, s, **params)
    sol = z3.Solver()
    sol.set("timeout", timeout_ms)
    sol.add(*hyps, t.guard(ops, s, **params), z3.Not(inv.pred(ops, post, *goal)))
    r = sol.check()
    elapsed = time.perf_counter() - start
    if r == z3.unsat:
        return Obligation(inv.name, t.name, SYMBOLIC, PROVED, elapsed)
    if r == z3.sat:
        m = sol.model()
        shown = {p: m.eval(v, model_completion=True) for p, v in params.items()}
        shown.update({f"goal{k}": m.eval(g, model_completion=True) for k, g in enumerate(goal)})
        where = ", ".join(f"{k}={v}" for k, v in shown.items())
        return Obligation(inv.name, t.name, SYMBOLIC, COUNTEREXAMPLE, elapsed, f"at {where}",
                                 {k: str(v) for k, v in shown.items()},
                                 f"counterexample: {inv.name} after {t.name}({where})")
    return Obligation(inv.name, t.name, SYMBOLIC, UNKNOWN, elapsed,
                      str(sol.reason_unknown()))


def prove_all(
    transitions: Mapping[str, RequestTransition] = REQUEST_TRANSITIONS,
    invariants: Mapping[str, Invariant] = REQUEST_INVARIANTS,
    pool_invariants: Mapping[str, Invariant] = INVARIANTS,
    timeout_ms: int = 60_000,
) -> list[Obligation]:
    pool_invs = sum_free_invariants(pool_invariants)
    out = [Obligation("<lemmas from ref_matches_holders>", "-", SYMBOLIC, prove_lemmas(), 0.0)]
    for inv in invariants.values():
        for t in transitions.values():
            out.append(prove_one(inv, t, pool_invs, timeout_ms))
    return out
