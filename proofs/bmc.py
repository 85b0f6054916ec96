"""z3 bounded model checking from the initial pool.

The initial state is written with constant arrays (``z3.K``), not as ∀-formulas (with
quantifiers BMC stalls). Each step picks one transition by a selector and fresh parameters
(blocks ``0..N-1``, holders ``0..R-1``, hashes ``1..H``, any ``w``, launches ``0..D`` for depth
D: a path of D steps issues at most D launches, so no launch it can name is missing); the next
state of every field is a fresh array constant equal to the selector's ``If`` over the
transitions' effects.
At each depth the solver is asked for a state violating some invariant (all points of the
explicit pool); depths are deepened until the time budget runs out. Cost grows exponentially
with depth, so the depth reached is reported, not fixed. Complementary to the explorer: no
launch bound, no epoch normalization (the clock is kept as it is), and ``gen`` kept.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import z3

from pagedkv.spec.invariants import Invariant
from pagedkv.spec.model import ARRAY_FIELDS, FIELD_DEFAULT, INDEX_KIND, PoolState, initial_state
from pagedkv.spec.ops import Z3Ops
from pagedkv.spec.states import ALL_STATES, FREE, NO_HASH
from pagedkv.spec.transitions import Transition

from .z3_model import (
    CLOCK_KEYS,
    DEFAULT_INVARIANTS,
    DEFAULT_TRANSITIONS,
    _z3_value,
    instance,
    proof_invariants,
)
from .z3_model import Arr as _Arr


@dataclass(frozen=True)
class BMCConfig:
    blocks: int = 3
    holders: int = 2
    block_size: int = 1
    hashes: tuple[int, ...] = (1, 2)
    max_depth: int = 12
    budget_s: float = 20.0
    step_timeout_s: float = 15.0


@dataclass
class BMCResult:
    config: dict[str, Any]
    depth: int  # every depth <= this was checked: no violation
    complete_to: int
    time_s: float
    per_depth_s: list[float] = field(default_factory=list)
    violation: dict[str, Any] | None = None
    stopped: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _universe(cfg: BMCConfig) -> dict[str, tuple[Any, ...]]:
    return {"block": tuple(range(cfg.blocks)), "holder": tuple(range(cfg.holders)),
            "hash": (NO_HASH,) + tuple(cfg.hashes), "state": tuple(ALL_STATES),
            "launch": tuple(range(cfg.max_depth + 1)), "clock": CLOCK_KEYS}


def _points(cfg: BMCConfig) -> list[tuple[str, Any, Any]]:
    """(field, outer key, inner key or None) for every scalar of the explicit state."""
    uni = _universe(cfg)
    out = []
    for f in ARRAY_FIELDS:
        for k in uni[INDEX_KIND[f]]:
            if isinstance(FIELD_DEFAULT[f], _Arr):
                out += [(f, k, b) for b in uni["block"]]
            else:
                out.append((f, k, None))
    return out


def _sort(f: str) -> Any:
    d = FIELD_DEFAULT[f]
    d = d.default if isinstance(d, _Arr) else d
    return z3.BoolSort() if isinstance(d, bool) else z3.IntSort()


class SArr:
    """A finite array as a dict of z3 terms (keys: the configured universe) plus a default.

    Reads and stores at symbolic indices become if-then-else terms over the universe, so BMC
    queries contain no array theory. A store at a symbolic index outside the universe is
    dropped; that can only happen from a state that already violates ``state_in_range`` or
    carries a hash outside the configured ones, and such a state is reported first (every
    state on a path at depth < d has been checked).
    """

    __slots__ = ("default", "data")

    def __init__(self, default: Any, data: dict[Any, Any]) -> None:
        self.default = default
        self.data = data

    def __getitem__(self, k: Any) -> Any:
        if isinstance(k, int) or z3.is_int_value(k):
            return self.data.get(k if isinstance(k, int) else k.as_long(), self.default)
        out = self.default
        for u, v in self.data.items():
            out = _ite(k == u, v, out)
        return out


def _ite(c: Any, a: Any, b: Any) -> Any:
    if isinstance(a, SArr) or isinstance(b, SArr):
        keys = set(a.data) | set(b.data)
        return SArr(a.default, {u: _ite(c, a[u], b[u]) for u in keys})
    return z3.If(c, a, b)


class ScalarOps(Z3Ops):
    def __init__(self) -> None:
        super().__init__()
        self.store = self._store

    @staticmethod
    def _store(arr: SArr, k: Any, v: Any) -> SArr:
        if isinstance(k, int) or z3.is_int_value(k):
            d = dict(arr.data)
            d[k if isinstance(k, int) else k.as_long()] = v
            return SArr(arr.default, d)
        return SArr(arr.default, {u: _ite(k == u, v, old) for u, old in arr.data.items()})


def _z3_default(d: Any) -> Any:
    if isinstance(d, _Arr):
        return SArr(_z3_default(d.default), {})
    return z3.BoolVal(d) if isinstance(d, bool) else z3.IntVal(d)


def _explicit(vals: Mapping[tuple[str, Any, Any], Any], cfg: BMCConfig) -> PoolState:
    arrays: dict[str, SArr] = {}
    for f in ARRAY_FIELDS:
        arrays[f] = SArr(_z3_default(FIELD_DEFAULT[f]), {})
    for (f, k, b), v in vals.items():
        if b is None:
            arrays[f].data[k] = v
        else:
            inner = arrays[f].data.setdefault(k, SArr(_z3_default(FIELD_DEFAULT[f].default), {}))
            inner.data[b] = v
    return PoolState(
        **arrays, block_size=z3.IntVal(cfg.block_size), num_blocks=z3.IntVal(cfg.blocks),
        block_ids=tuple(range(cfg.blocks)), holder_ids=tuple(range(cfg.holders)),
    )


def _read(s: PoolState, f: str, k: Any, b: Any) -> Any:
    v = getattr(s, f)[k]
    return v if b is None else v[b]


def _simp(e: Any) -> Any:
    if isinstance(e, bool):
        return z3.BoolVal(e)
    if isinstance(e, int):
        return z3.IntVal(e)
    return z3.simplify(e)


def _moves(transitions: Mapping[str, Transition], cfg: BMCConfig
           ) -> list[tuple[str, Transition, dict[str, Any]]]:
    from .explore import ExploreConfig, param_values

    ecfg = ExploreConfig(blocks=cfg.blocks, holders=cfg.holders, block_size=cfg.block_size,
                         hashes=cfg.hashes, max_window=cfg.max_depth)
    return [(n, t, p) for n, t in transitions.items() for p in param_values(t, ecfg)]


def bmc(
    cfg: BMCConfig = BMCConfig(),  # noqa: B008 - frozen dataclass
    transitions: Mapping[str, Transition] = DEFAULT_TRANSITIONS,
    invariants: Mapping[str, Invariant] = DEFAULT_INVARIANTS,
    progress: Callable[[str], None] | None = None,
) -> BMCResult:
    """Scalarized BMC: the state is one variable per array entry of the explicit pool, every
    step picks one concrete move (transition + parameter values), so every array read and
    store simplifies away and the queries are pure linear integer / boolean ones."""
    t0 = time.perf_counter()
    ops = ScalarOps()
    invs = proof_invariants(invariants)
    pts = _points(cfg)
    moves = _moves(transitions, cfg)
    init = initial_state(cfg.blocks, cfg.block_size, range(cfg.holders))
    vals = {pt: _simp(_z3_value(_read(init, *pt))) for pt in pts}
    s = _explicit(vals, cfg)
    sol = z3.Solver()
    steps: list[Any] = []
    per: list[float] = []
    res = BMCResult(asdict(cfg), 0, 0, 0.0)
    for d in range(0, cfg.max_depth + 1):
        if d > 0:
            sel = z3.Int(f"sel{d}")
            sol.add(sel >= 0, sel < len(moves))
            nv = {pt: z3.Const(f"d{d}_{pt[0]}[{pt[1]}]" + ("" if pt[2] is None else f"[{pt[2]}]"),
                               _sort(pt[0])) for pt in pts}
            for k, (_, t, p) in enumerate(moves):
                g = _simp(t.guard(ops, s, **p))
                if z3.is_false(g):
                    sol.add(sel != k)
                    continue
                post = t.effect(ops, s, **p)
                eqs = []
                for pt in pts:
                    e = _simp(_read(post, *pt))
                    eqs.append(nv[pt] == e)
                sol.add(z3.Implies(sel == k, z3.And(g, *eqs)))
            s = _explicit(nv, cfg)
            steps.append(sel)
        insts = _all_invariants(ops, invs, s, cfg)
        td = time.perf_counter()
        sol.push()
        sol.add(z3.Not(z3.And(*[f for _, _, f in insts])))
        sol.set("timeout", int(cfg.step_timeout_s * 1000))
        r = sol.check()
        dt = time.perf_counter() - td
        per.append(round(dt, 3))
        if r == z3.sat:
            m = sol.model()
            trace = []
            for sel in steps:
                n, _, p = moves[m.eval(sel, model_completion=True).as_long()]
                trace.append(f"{n}({', '.join(f'{a}={v}' for a, v in p.items())})")
            bad = [(n, p) for n, p, f in insts if z3.is_false(m.eval(f, model_completion=True))]
            res.violation = {"depth": d, "trace": trace,
                             "violated": [f"{n}@{p}" for n, p in bad]}
            sol.pop()
            break
        sol.pop()
        if r != z3.unsat:
            res.stopped = f"depth {d}: z3 {sol.reason_unknown()}"
            break
        res.depth = d
        # Sound strengthening: every state at depth d of every path satisfies the invariants
        # (that is what was just shown), so later depths may assume it.
        sol.add(*[f for _, _, f in insts])
        if progress:
            progress(f"bmc: depth {d} clean ({dt:.2f}s)")
        if d == cfg.max_depth:
            res.stopped = "max depth"
        elif time.perf_counter() - t0 + dt * 3 > cfg.budget_s:
            res.stopped = "time budget"
            break
    res.complete_to = res.depth
    res.per_depth_s = per
    res.time_s = round(time.perf_counter() - t0, 3)
    return res


def initial_z3(cfg: BMCConfig) -> PoolState:
    arrays = {f: _z3_value(_Arr(FIELD_DEFAULT[f])) for f in ARRAY_FIELDS}
    arrays["count"] = z3.Store(arrays["count"], FREE, cfg.blocks)
    return PoolState(
        **arrays, block_size=z3.IntVal(cfg.block_size), num_blocks=z3.IntVal(cfg.blocks),
        block_ids=tuple(z3.IntVal(b) for b in range(cfg.blocks)),
        holder_ids=tuple(z3.IntVal(r) for r in range(cfg.holders)),
    )


def _all_invariants(ops: Any, invs: Mapping[str, Invariant], s: PoolState, cfg: BMCConfig
                    ) -> list[tuple[str, Any, Any]]:
    out = []
    pts = {"block": list(range(cfg.blocks)), "hash": [NO_HASH, *cfg.hashes],
           "holder": list(range(cfg.holders)), "launch": list(range(cfg.max_depth + 1)),
           "pool": [None]}
    for inv in invs.values():
        for p in pts[inv.scope]:
            out.append((inv.name, p, _simp(instance(ops, inv, s, p))))
    return out


__all__ = ["BMCConfig", "BMCResult", "bmc", "ALL_STATES"]
