"""z3 encodings of the spec's ``PoolState``: a symbolic (unbounded) pool and a small explicit one.

Everything here is generic over ``spec.model.ARRAY_FIELDS`` and over the transitions and
invariants handed in: sorts come from ``initial_state``'s defaults, parameters from
``Transition.params``, invariant instances from ``Invariant.scope``.

Two encodings of a pre-state:

* ``symbolic``: every field is an unconstrained z3 array, ``num_blocks`` and ``block_size``
  are symbolic. Pool-wide sums in the spec range over ``s.block_ids``/``s.holder_ids``; here
  those tuples hold only the *anchors* (the transition's own block/holder), and every sum over
  them gets a fresh "rest of the pool" integer added (see ``RestOps``). That is a sound
  abstraction of an unbounded pool (argument in ``RestOps``' docstring), and it keeps every
  query quantifier-free, so z3 answers sat/unsat rather than ``unknown``.
* ``bounded``: ``N`` blocks with ids ``0..N-1``, ``R`` holders ``0..R-1``, hashes ``1..N+1``,
  launches ``0..K`` and clock values (``clock[ISSUED]``, ``clock[WATERMARK]``) in ``0..K``;
  every array is an explicit ``Store`` chain over a constant default (``z3.K``), one variable
  per entry. Any pool of exactly N blocks and R holders is such a state up to renaming of hash
  values (at most N hashes are in use, plus one fresh one a commit may register), so the
  bounded proof is complete for that size, and a counterexample reads like a concrete pool.

  Launches. Every launch a state can name is explicit: a launch in flight is numbered below
  ``clock[ISSUED] <= K`` (``launch_window``), and the only launch a transition adds is number
  ``clock[ISSUED] <= K`` (``launch``'s guard), so no entry of ``inflight`` outside ``0..K`` is
  read or written except at its default (not in flight). Soundness: the bounded proof is a
  proof about the states it describes, nothing more. Completeness, for states whose clock
  window ``clock[ISSUED] - clock[WATERMARK]`` is at most K: the spec reads clock values (the
  two clock entries, ``retire`` stamps, launch numbers) only by comparing them with one
  another and with 0 and by adding 1, so shifting every clock value and launch number down by
  the watermark and clamping the ``retire`` stamps below it to it (``proofs.epochs``) maps a
  counterexample to one with watermark 0 and issued <= K. That this normalization commutes
  with every transition and preserves every invariant is not taken on trust: it is checked
  with z3 for the spec at hand (``explore.normalization_lemma``), and the explorer relies on
  it too. The unbounded, symbolic proof has no window bound.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import z3

from pagedkv.spec.invariants import INVARIANTS, Invariant
from pagedkv.spec.model import (
    ARRAY_FIELDS,
    BLOCK_FIELDS,
    FIELD_DEFAULT,
    INDEX_KIND,
    PoolState,
    initial_state,
)
from pagedkv.spec.ops import Arr, Z3Ops
from pagedkv.spec.states import ALL_STATES, ISSUED, NO_BLOCK, NO_HASH, WATERMARK, state_name
from pagedkv.spec.transitions import PARAM_KINDS, TRANSITIONS, Transition

# --- sorts and defaults, read off the spec's initial state ------------------------------------
_TEMPLATE = initial_state(1, 1)


def _sort_of(value: Any) -> z3.SortRef:
    if isinstance(value, bool):
        return z3.BoolSort()
    if isinstance(value, int):
        return z3.IntSort()
    if isinstance(value, Arr):
        return z3.ArraySort(z3.IntSort(), _sort_of(value.default))
    raise TypeError(f"no z3 sort for {value!r}")


def _z3_value(value: Any) -> z3.ExprRef:
    if isinstance(value, bool):
        return z3.BoolVal(value)
    if isinstance(value, int):
        return z3.IntVal(value)
    if isinstance(value, Arr):
        return z3.K(z3.IntSort(), _z3_value(value.default))
    raise TypeError(f"no z3 value for {value!r}")


FIELD_SORT = {f: _sort_of(getattr(_TEMPLATE, f)) for f in ARRAY_FIELDS}
CLOCK_KEYS = (ISSUED, WATERMARK)
CLOCK_NAMES = {ISSUED: "issued", WATERMARK: "watermark"}

# Transition parameters: what they range over. Unknown names are unconstrained integers.
def param_kind(name: str) -> str:
    """The spec's declared kind (spec.transitions.PARAM_KINDS); a slot count is left an
    unconstrained integer here (the guards bound it), as is an undeclared parameter."""
    return PARAM_KINDS.get(name, "int")


# --- ops that abstract the rest of an unbounded pool ------------------------------------------
@dataclass
class SitePlan:
    """How one ``ops.Sum`` call site of an invariant ranges: over the pool or not."""

    over: str | None  # "blocks", "holders" or None (a sum over something else, e.g. states)
    lo: int | None = None  # bounds of one term, if provable (used to bound the rest)
    hi: int | None = None


class RecordingOps(Z3Ops):
    """Z3Ops that logs every Sum's terms and every And/Or's arity (for site classification)."""

    def __init__(self) -> None:
        super().__init__()
        self.sums: list[list[Any]] = []
        self.arity: list[int] = []
        z3_and, z3_or = z3.And, z3.Or

        def _and(*a: Any) -> Any:
            self.arity.append(len(a))
            return z3_and(*a)

        def _or(*a: Any) -> Any:
            self.arity.append(len(a))
            return z3_or(*a)

        self.And = _and
        self.Or = _or

    def Sum(self, terms: Iterable[Any]) -> Any:
        terms = list(terms)
        self.sums.append([z3.If(t, 1, 0) if z3.is_bool(t) else t for t in terms])
        return super().Sum(terms)


class RestOps(Z3Ops):
    """Z3Ops whose pool-wide sums add a symbolic "rest of the pool" term.

    In the symbolic encoding ``s.block_ids`` (``s.holder_ids``) holds only the anchors: the
    blocks (holders) the transition names. A pool-wide sum ``Σ_{b in B} t(b)`` over the real,
    unbounded pool B is ``Σ_{b in anchors} t(b) + rest`` with ``rest = Σ_{b in B - anchors} t(b)``.
    We make ``rest`` a fresh integer per (invariant, instance, call site), shared by the
    pre- and the post-state instance. Soundness: for any concrete pool and pre-state, choosing
    ``rest`` as that real value turns every assumed invariant into exactly the real one, and
    the goal's post instance too *provided* the transition leaves every non-anchor term
    unchanged; that frame condition is proved separately per goal and call site
    (``induction.frame_obligations``). ``rest`` is bounded by ``0 <= rest <= n - |anchors|``
    (resp. ``>= 0`` for holders) when one term is provably in [0, 1].
    """

    def __init__(self, plans: Mapping[str, list[SitePlan]], num_blocks: Any, n_anchor_blocks: int):
        super().__init__()
        self._plans = plans
        self._nb = num_blocks
        self._na = n_anchor_blocks
        self.rest: dict[tuple[str, str, int], z3.ArithRef] = {}
        self.side: list[z3.BoolRef] = []
        self._key: tuple[str, str] | None = None
        self._site = 0
        self.unsupported: set[str] = set()

    def begin(self, inv_name: str, point: str) -> None:
        self._key = (inv_name, point)
        self._site = 0

    def end(self) -> None:
        self._key = None

    def Sum(self, terms: Iterable[Any]) -> Any:
        base = super().Sum(terms)
        if self._key is None:
            return base
        name, point = self._key
        site = self._site
        self._site += 1
        plans = self._plans.get(name, [])
        plan = plans[site] if site < len(plans) else SitePlan(None)
        if plan.over is None:
            return base
        key = (name, point, site)
        if key not in self.rest:
            v = z3.Int(f"rest[{name}@{point}#{site}]")
            self.rest[key] = v
            if plan.lo is not None and plan.lo >= 0:
                self.side.append(v >= 0)
            if plan.over == "blocks" and plan.lo is not None and plan.hi is not None:
                if plan.lo >= 0 and plan.hi <= 1:
                    self.side.append(v <= self._nb - self._na)
        return base + self.rest[key]


# --- the state builders -----------------------------------------------------------------------
@dataclass
class Universe:
    """The points a state is built and printed over (ints in bounded mode, terms otherwise)."""

    blocks: list[Any]
    holders: list[Any]
    hashes: list[Any]
    states: list[Any] = field(default_factory=lambda: list(ALL_STATES))
    launches: list[Any] = field(default_factory=list)


@dataclass(frozen=True)
class BoundedConfig:
    blocks: int = 3
    holders: int = 3
    launches: int = 3  # K: clock values in 0..K, launches 0..K explicit

    @property
    def hashes(self) -> list[int]:
        # NO_HASH plus N + 1 real hashes: enough for every block's hash and one fresh one.
        return [NO_HASH] + list(range(1, self.blocks + 2))

    @property
    def launch_keys(self) -> list[int]:
        # every launch in flight is < clock[ISSUED] <= K; launch(L) adds L = clock[ISSUED]
        return list(range(self.launches + 1))


def _explicit(tag: str, f: str, cfg: BoundedConfig, vars_: list[z3.ExprRef]) -> z3.ExprRef:
    kind = INDEX_KIND.get(f)
    default = FIELD_DEFAULT[f]
    keys = {
        "block": range(cfg.blocks),
        "holder": range(cfg.holders),
        "hash": cfg.hashes,
        "state": ALL_STATES,
        "launch": cfg.launch_keys,
        "clock": CLOCK_KEYS,
    }.get(kind or "", None)
    if keys is None:
        return z3.Const(f"{tag}{f}", FIELD_SORT[f])
    arr = _z3_value(Arr(default))
    for k in keys:
        if isinstance(default, Arr):  # holds: a per-holder array over blocks
            inner = z3.K(z3.IntSort(), _z3_value(default.default))
            for blk in range(cfg.blocks):
                v = z3.Const(f"{tag}{f}[{k}][{blk}]", _sort_of(default.default))
                vars_.append(v)
                inner = z3.Store(inner, blk, v)
            arr = z3.Store(arr, k, inner)
        else:
            v = z3.Const(f"{tag}{f}[{k}]", _sort_of(default))  # noqa: B023
            vars_.append(v)
            arr = z3.Store(arr, k, v)
    return arr


def symbolic_state(tag: str = "") -> PoolState:
    fields = {f: z3.Const(f"{tag}{f}", FIELD_SORT[f]) for f in ARRAY_FIELDS}
    return PoolState(
        **fields,
        block_size=z3.Int(f"{tag}block_size"),
        num_blocks=z3.Int(f"{tag}num_blocks"),
    )


def bounded_state(cfg: BoundedConfig, tag: str = "") -> tuple[PoolState, list[z3.BoolRef]]:
    vars_: list[z3.ExprRef] = []
    fields = {f: _explicit(tag, f, cfg, vars_) for f in ARRAY_FIELDS}
    s = PoolState(
        **fields,
        block_size=z3.Int(f"{tag}block_size"),
        num_blocks=z3.IntVal(cfg.blocks),
        block_ids=tuple(z3.IntVal(b) for b in range(cfg.blocks)),
        holder_ids=tuple(z3.IntVal(r) for r in range(cfg.holders)),
    )
    dom = [s.block_size >= 1]
    # hash values stay in the finite universe (complete up to renaming, see module doc)
    for b in range(cfg.blocks):
        dom.append(z3.Or(*[s.hash[b] == h for h in cfg.hashes]))
    # clock values in 0..K: every launch the state can name is explicit (see module doc)
    for k in CLOCK_KEYS:
        dom += [s.clock[k] >= 0, s.clock[k] <= cfg.launches]
    return s, dom


def in_range(s: PoolState, b: Any) -> z3.BoolRef:
    return z3.And(b >= 0, b < s.num_blocks)


def param_vars(t: Transition, tag: str) -> dict[str, z3.ExprRef]:
    out: dict[str, z3.ExprRef] = {}
    for p in t.params:
        kind = param_kind(p)
        out[p] = z3.Bool(f"{tag}{p}") if kind == "bool" else z3.Int(f"{tag}{p}")
    return out


def param_domain(kind: str, v: z3.ExprRef, s: PoolState, cfg: BoundedConfig | None) -> Any:
    """Range constraint of a transition parameter (the environment's obligation)."""
    if kind == "block":
        if cfg is not None:
            return z3.Or(*[v == b for b in range(cfg.blocks)])
        return in_range(s, v)
    if kind == "holder" and cfg is not None:
        return z3.Or(*[v == r for r in range(cfg.holders)])
    if kind == "hash" and cfg is not None:
        return z3.Or(*[v == h for h in cfg.hashes])
    if kind == "launch" and cfg is not None:
        return z3.Or(*[v == L for L in cfg.launch_keys])
    return z3.BoolVal(True)


# --- invariant instances ----------------------------------------------------------------------
def instance(ops: Any, inv: Invariant, s: PoolState, point: Any) -> Any:
    """The invariant's formula at one point (None for pool scope)."""
    if isinstance(ops, RestOps):
        ops.begin(inv.name, "pool" if point is None else str(point))
    try:
        if inv.scope == "pool":
            return inv.pred(ops, s)
        return inv.pred(ops, s, point)
    finally:
        if isinstance(ops, RestOps):
            ops.end()


def proof_invariants(invariants: Mapping[str, Invariant]) -> dict[str, Invariant]:
    """The pool invariants z3 proves here (the tables': ``proofs.request_induction``)."""
    return dict(invariants)


# --- site classification for the rest-of-pool abstraction -------------------------------------
def classify_sites(inv: Invariant) -> tuple[list[SitePlan], str | None]:
    """Which of the invariant's Sum call sites range over the pool, and term bounds.

    Evaluates the predicate with one anchor block/holder, then with a second block, then a
    second holder: a site whose term list grows from 1 to 2 with blocks (holders) is a sum over
    the pool's blocks (holders). Anything else that changes shape (an And/Or over the pool, a
    sum over both) is reported as unsupported: the symbolic proof then answers ``unknown``.
    """
    s = symbolic_state("cls_")
    x, y = z3.Ints("cls_x cls_y")
    r, q = z3.Ints("cls_r cls_q")
    pt = {"block": x, "hash": z3.Int("cls_h"), "holder": r, "launch": z3.Int("cls_L"),
          "pool": None}[inv.scope]

    def run(blocks: tuple[Any, ...], holders: tuple[Any, ...]) -> RecordingOps:
        ops = RecordingOps()
        instance(ops, inv, s.replace(block_ids=blocks, holder_ids=holders), pt)
        return ops

    one = run((x,), (r,))
    two_b = run((x, y), (r,))
    two_r = run((x,), (r, q))
    if not (len(one.sums) == len(two_b.sums) == len(two_r.sums)):
        return [], "the number of sums depends on the pool"
    if one.arity != two_b.arity or one.arity != two_r.arity:
        return [], "an And/Or ranges over the pool (only ops.Sum is abstracted)"
    plans: list[SitePlan] = []
    for a, b_, c in zip(one.sums, two_b.sums, two_r.sums, strict=True):
        grow_b, grow_r = len(b_) - len(a), len(c) - len(a)
        if grow_b == 0 and grow_r == 0:
            plans.append(SitePlan(None))
            continue
        if len(a) != 1 or (grow_b, grow_r) not in ((1, 0), (0, 1)):
            return [], "a sum ranges over blocks x holders or over more than the pool"
        term = b_[1] if grow_b else c[1]
        lo = 0 if _valid(term >= 0) else None
        hi = 1 if _valid(term <= 1) else None
        plans.append(SitePlan("blocks" if grow_b else "holders", lo, hi))
    return plans, None


def _valid(f: z3.BoolRef) -> bool:
    sol = z3.Solver()
    sol.set("timeout", 2000)
    sol.add(z3.Not(f))
    return sol.check() == z3.unsat


# --- reading a model back in the spec's vocabulary --------------------------------------------
def _val(m: z3.ModelRef, term: Any) -> Any:
    if isinstance(term, bool | int):
        return term
    v = m.eval(term, model_completion=True)
    if z3.is_true(v):
        return True
    if z3.is_false(v):
        return False
    if z3.is_int_value(v):
        return v.as_long()
    return str(v)


def _order(v: Any) -> tuple[int, Any]:
    return (0, v) if isinstance(v, int) else (1, str(v))


def decode_state(m: z3.ModelRef, s: PoolState, uni: Universe) -> dict[str, Any]:
    """A JSON-able picture of a z3 state at the given points."""
    blocks = sorted({_val(m, b) for b in uni.blocks}, key=_order)
    holders = sorted({_val(m, r) for r in uni.holders}, key=_order)
    hashes = {_val(m, h) for h in uni.hashes} | {_val(m, s.hash[b]) for b in blocks}
    hashes = sorted(hashes, key=_order)
    out: dict[str, Any] = {
        "block_size": _val(m, s.block_size),
        "num_blocks": _val(m, s.num_blocks),
        "blocks": {},
        "holders": {},
        "hmap": {},
        "count": {state_name(st): _val(m, s.count[st]) for st in uni.states},
        "clock": {CLOCK_NAMES[k]: _val(m, s.clock[k]) for k in CLOCK_KEYS},
        "launches": {},
    }
    for L in sorted({_val(m, x) for x in uni.launches}, key=_order):
        out["launches"][L] = _val(m, s.inflight[L])
    for b in blocks:
        rec = {f: _val(m, getattr(s, f)[b]) for f in BLOCK_FIELDS}
        if "state" in rec and isinstance(rec["state"], int):
            rec["state"] = state_name(rec["state"])
        out["blocks"][b] = rec
    for r in holders:
        out["holders"][r] = {
            "alive": _val(m, s.alive[r]),
            "nheld": _val(m, s.nheld[r]),
            "holds": [b for b in blocks if _val(m, s.holds[r][b]) is True],
        }
    for h in hashes:
        out["hmap"][h] = _val(m, s.hmap[h])
    return out


def format_state(d: Mapping[str, Any], indent: str = "  ") -> str:
    lines = [f"{indent}num_blocks={d['num_blocks']} block_size={d['block_size']} "
             f"count={d['count']}"]
    if "clock" in d:
        shown = d.get("launches", {})
        inflight = [L for L, v in shown.items() if v is True]
        others = [L for L, v in shown.items() if v is not True]
        lines.append(f"{indent}clock: issued={d['clock'].get('issued')} "
                     f"watermark={d['clock'].get('watermark')}; launches in flight: {inflight}"
                     + (f"; not in flight: {others}" if others else ""))
    for b, rec in d["blocks"].items():
        lines.append(f"{indent}block {b}: " + " ".join(f"{k}={v}" for k, v in rec.items()))
    for r, rec in d["holders"].items():
        lines.append(f"{indent}holder {r}: " + " ".join(f"{k}={v}" for k, v in rec.items()))
    hm = {h: b for h, b in d["hmap"].items() if b != NO_BLOCK}
    lines.append(f"{indent}hmap (non-empty): {hm}")
    return "\n".join(lines)


def format_counterexample(cx: Mapping[str, Any]) -> str:
    lines = [f"counterexample: invariant {cx.get('invariant')!r} at {cx.get('where')!r} "
             f"after {cx['transition']}({', '.join(f'{k}={v}' for k, v in cx['params'].items())})"]
    if cx.get("note"):
        lines.append(f"  note: {cx['note']}")
    if cx.get("rest"):
        lines.append(f"  rest of the pool: {cx['rest']}")
    lines.append(" pre-state:")
    lines.append(format_state(cx["pre"], "   "))
    lines.append(" post-state:")
    lines.append(format_state(cx["post"], "   "))
    return "\n".join(lines)


def all_pairs(xs: list[Any]) -> Iterable[tuple[Any, Any]]:
    return itertools.combinations(xs, 2)


DEFAULT_TRANSITIONS = TRANSITIONS
DEFAULT_INVARIANTS = INVARIANTS
DEFAULT_BOUNDED = BoundedConfig()
