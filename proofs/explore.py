"""Exhaustive explicit-state exploration of the spec (breadth-first, like TLC).

From ``spec.model.initial_state`` every transition is tried with every parameter value of a
small configuration, evaluated concretely (``guard``/``effect`` with ``CONCRETE`` ops, i.e.
exactly ``spec.check.step``), and every new state is checked against every invariant. The
search is complete for the configuration: it stops when no new state appears, not at a depth.

Bounds (the configuration's, reported as assumptions):

* ``blocks`` blocks, ``holders`` holders, ``block_size`` slots, writes of ``w in 0..block_size``;
* hash values ``hashes`` (plus ``NO_HASH``) - prefix hits between holders happen because
  every holder's chain uses the same values;
* at most ``max_inflight`` launches in flight (published, not completed; they complete in any
  order, at any later point), and at most ``max_window`` launches issued and not yet passed by
  the watermark (``clock[ISSUED] - clock[WATERMARK]``; completed launches the watermark has not
  passed yet count): successors with more are cut;
* fields no guard, no invariant and no other field's update ever reads (found with z3 on the
  symbolic encoding; today: ``gen``) are not part of the state: they only count history and
  would make the state space infinite. Dropping them is a bisimulation.

Epochs. The launch clock grows without bound too; every state is stored as seen from its
watermark (``proofs.epochs.normalize``: clock values and launch numbers shifted down by the
watermark, retire stamps below it clamped to it). Successors are computed from the normalized
state (launch parameters ``0..max_window``) and checked as computed, before they are
normalized. That this is a bisimulation - normalizing commutes with every transition, keeps
every guard and every invariant - is proved with z3 for the transitions and invariants handed
in (``normalization_lemma``; a failure is reported as a violation ``<normalization>`` and the
run is not ok). Together with the bounds the search is finite and complete for them.

The readers ghost. The spec pins blocks by launch number and does not say which launches read
a block; the explorer keeps, per block, the launches in flight that may read it: a launch,
when published (``inflight[L]`` becomes true, whatever the transition's name), may read every
block a table holds then (``ref > 0``) - and, in the request layer, the copy-on-write source it
copies. Completed launches are dropped from the sets. A FREE block with a launch in its set is
a violation ``<readers>`` ("a block was freed while a launch that may read it is in flight"):
the safety property the retire stamps serve, checked on the reachable states.

Two layers:

* ``pool`` (default): the whole spec, every parameter value; checks every pool / block /
  hash / holder / launch invariant and the readers ghost.
* ``request``: the spec's request layer (``spec.requests``): the same pool driven only
  through the request transitions (admission and prefix hits, growth, tokens becoming known,
  publication, writes and copy-on-write, commit, seal and cache, fork, truncation, release,
  eviction, launches completing out of order), with every pool invariant, the readers ghost
  and every table invariant (``spec.request_invariants``) checked in every state. Token ids
  known per request are bounded by ``max_tokens``. Its request fields carry no clock value,
  and its conditions read the clock only as ``inflight[clock[ISSUED] - 1]``, which the epoch
  normalization preserves.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from pagedkv.spec.check import hash_ids, launch_ids, request_violations
from pagedkv.spec.invariants import Invariant
from pagedkv.spec.model import (
    ARRAY_FIELDS,
    BLOCK_FIELDS,
    FIELD_DEFAULT,
    INDEX_KIND,
    PoolState,
    initial_state,
)
from pagedkv.spec.ops import CONCRETE, Arr, Overlay, flatten
from pagedkv.spec.requests import (
    HOLDER_FIELDS,
    POSITIONS,
    REQUEST_PARAM_KINDS,
    REQUEST_TRANSITIONS,
    RequestState,
    RequestTransition,
    initial_request_state,
    request_state,
)
from pagedkv.spec.states import ALL_STATES, FREE, ISSUED, NO_BLOCK, NO_HASH, WATERMARK, state_name
from pagedkv.spec.transitions import Transition

from . import epochs
from .z3_model import (
    CLOCK_KEYS,
    CLOCK_NAMES,
    DEFAULT_INVARIANTS,
    DEFAULT_TRANSITIONS,
    param_kind,
)

READERS = "<readers>"  # the readers ghost's violation (module doc)
NORMALIZATION = "<normalization>"
UNIVERSE = "<explorer universe>"
REBUILT = (epochs.CLOCK_FIELD, *epochs.LAUNCH_INDEXED, *epochs.CLOCK_VALUED)


@dataclass(frozen=True)
class ExploreConfig:
    blocks: int = 3
    holders: int = 2
    block_size: int = 2
    hashes: tuple[int, ...] = (1, 2)
    max_inflight: int = 2  # launches in flight
    max_window: int = 3  # launches issued, not yet passed by the watermark
    layer: str = "pool"  # "pool" | "request"
    label: str = ""  # names the configuration in the report beside its layer
    max_tokens: int = 4  # request layer: token ids known per request
    max_states: int = 3_000_000
    max_depth: int | None = None  # None: the search runs until no new state appears
    stop_at_first: bool = False
    drop_unobserved: bool = True


def layer_key(config: Mapping[str, Any]) -> str:
    """A search's name in the report: its layer, and its label if it has one."""
    return config["layer"] + (f":{config['label']}" if config.get("label") else "")


@dataclass
class Violation:
    invariant: str
    where: Any
    depth: int
    trace: list[str]
    text: str


@dataclass
class ExploreResult:
    config: dict[str, Any]
    states: int
    edges: int
    depth: int
    complete: bool
    time_s: float
    fired: dict[str, int]
    violations: dict[str, Violation] = field(default_factory=dict)
    checked: dict[str, int] = field(default_factory=dict)  # invariant -> instances checked
    dropped_fields: list[str] = field(default_factory=list)
    normalization: dict[str, Any] = field(default_factory=dict)  # normalization_lemma's result
    readers_checked: int = 0  # FREE blocks checked against the readers ghost
    frontier: int = 0  # with a depth bound: new states at the bound, checked, not expanded
    scenarios: dict[str, int] = field(default_factory=dict)  # SCENARIOS: edges that were one

    @property
    def ok(self) -> bool:
        return self.complete and not self.violations

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ok"] = self.ok
        return d


# --- fields nothing reads ---------------------------------------------------------------------
def unobserved_fields(
    transitions: Mapping[str, Transition], invariants: Mapping[str, Invariant]
) -> list[str]:
    """Array fields that no guard, no invariant and no *other* field's update mentions."""
    import z3

    from .z3_model import param_vars, symbolic_state

    ops_mod = __import__("pagedkv.spec.ops", fromlist=["Z3Ops"])
    ops = ops_mod.Z3Ops()
    s = symbolic_state("uo_")
    names = {f"uo_{f}": f for f in ARRAY_FIELDS}
    s = s.replace(block_ids=(z3.Int("uo_b0"), z3.Int("uo_b1")),
                  holder_ids=(z3.Int("uo_r0"), z3.Int("uo_r1")))

    def mentioned(e: Any) -> set[str]:
        seen, out, todo = set(), set(), [e]
        while todo:
            x = todo.pop()
            if x.get_id() in seen:
                continue
            seen.add(x.get_id())
            if z3.is_const(x) and x.decl().name() in names:
                out.add(names[x.decl().name()])
            todo.extend(x.children())
        return out

    read: set[str] = set()
    for t in transitions.values():
        p = param_vars(t, "uo_p_")
        read |= mentioned(t.guard(ops, s, **p))
        post = t.effect(ops, s, **p)
        for f in ARRAY_FIELDS:
            read |= mentioned(getattr(post, f)) - {f}
    pt = {"block": z3.Int("uo_x"), "hash": z3.Int("uo_h"), "holder": z3.Int("uo_r"),
          "launch": z3.Int("uo_L")}
    for inv in invariants.values():
        if inv.scope == "pool":
            read |= mentioned(inv.pred(ops, s))
        else:
            read |= mentioned(inv.pred(ops, s, pt[inv.scope]))
    return [f for f in ARRAY_FIELDS if f not in read]


# --- canonical encoding -----------------------------------------------------------------------
class Escaped(Exception):
    """An effect wrote an array entry outside the configured universe (never in a good spec)."""


def _check_keys(arr: Any, keys: frozenset[Any], inner: frozenset[Any] | None = None) -> None:
    node = arr
    while isinstance(node, Overlay):
        if node.key not in keys:
            raise Escaped(f"store at {node.key!r}")
        if inner is not None:
            _check_keys(node.value, inner)
        node = node.base


class Codec:
    """Fixed-layout tuples: each array field read at the points of its index universe.

    Every state the explorer meets is built over ``Arr``s holding exactly those points, and
    every store an effect makes is checked to stay inside them (``Escaped`` otherwise), so
    the encoding loses nothing. Dropped (unobserved) fields keep their initial value.
    """

    def __init__(self, template: PoolState, dropped: list[str], cfg: ExploreConfig) -> None:
        self.t = template
        self.dropped = dropped
        self.fields = [f for f in ARRAY_FIELDS if f not in dropped]
        blocks = tuple(range(cfg.blocks))
        holders = tuple(range(cfg.holders))
        uni = {"block": blocks, "holder": holders, "hash": (NO_HASH,) + tuple(cfg.hashes),
               "state": tuple(ALL_STATES), "launch": tuple(range(cfg.max_window + 1)),
               "clock": CLOCK_KEYS}
        self.blocks = blocks
        self.keys = {}
        for f in ARRAY_FIELDS:
            kind = INDEX_KIND.get(f)
            if kind is None:
                raise ValueError(f"explorer: no index universe for field {f!r}")
            self.keys[f] = uni[kind]
        self.keysets = {f: frozenset(k) for f, k in self.keys.items()}
        self.blockset = frozenset(blocks)

    def check_rebuilt(self, s: PoolState, fields: Iterable[str]) -> None:
        """The arrays the normalization rebuilt hold entries only inside the universe."""
        for f in fields:
            for k in flatten(getattr(s, f)).items():
                if k[0] not in self.keysets[f]:
                    raise Escaped(f"{f}[{k[0]!r}] after normalization")

    def key(self, s: PoolState, base: PoolState | None = None,
            base_key: tuple[Any, ...] | None = None) -> tuple[Any, ...]:
        """``base``/``base_key``: a state whose key is known; a field s shares with it (the
        same object: the effect left it alone) is not read again."""
        out = []
        for i, f in enumerate(self.fields):
            arr = getattr(s, f)
            if base is not None and arr is getattr(base, f):
                out.append(base_key[i])  # type: ignore[index]
                continue
            nested = isinstance(FIELD_DEFAULT[f], Arr)
            _check_keys(arr, self.keysets[f], self.blockset if nested else None)
            if nested:
                out.append(tuple(tuple(arr[k][b] for b in self.blocks) for k in self.keys[f]))
            else:
                out.append(tuple(arr[k] for k in self.keys[f]))
        return tuple(out)

    def state(self, key: tuple[Any, ...]) -> PoolState:
        vals = {}
        for f, v in zip(self.fields, key, strict=True):
            d = FIELD_DEFAULT[f]
            if isinstance(d, Arr):
                vals[f] = Arr(d, {k: Arr(d.default, dict(zip(self.blocks, row, strict=True)))
                                  for k, row in zip(self.keys[f], v, strict=True)})
            else:
                vals[f] = Arr(d, dict(zip(self.keys[f], v, strict=True)))
        vals.update({f: getattr(self.t, f) for f in self.dropped})
        return self.t.replace(**vals)


# --- parameter domains ------------------------------------------------------------------------
def param_values(t: Transition, cfg: ExploreConfig) -> list[dict[str, Any]]:
    doms = []
    for p in t.params:
        kind = param_kind(p)
        if kind == "block":
            doms.append(range(cfg.blocks))
        elif kind == "holder":
            doms.append(range(cfg.holders))
        elif kind == "hash":
            doms.append((NO_HASH,) + tuple(cfg.hashes))
        elif kind == "bool":
            doms.append((False, True))
        elif kind == "slots":
            doms.append(range(0, cfg.block_size + 1))
        elif kind == "launch":  # states are normalized: the watermark is 0
            doms.append(range(0, cfg.max_window + 1))
        else:
            raise ValueError(f"explorer: no domain for parameter {p!r} of {t.name}")
    return [dict(zip(t.params, vs, strict=True)) for vs in itertools.product(*doms)]


# --- the request layer ---------------------------------------------------------------------
RequestKey = tuple[Any, ...]
Readers = tuple[tuple[int, ...], ...]  # per block: the launches in flight that may read it


def _out_of_order(name: str, p: Mapping[str, Any], s: PoolState) -> bool:
    return name == "complete" and any(bool(s.inflight[L])
                                      for L in range(s.clock[WATERMARK], p["L"]))


# The patterns engines rely on, as edges of the search (transition, parameters, the state it
# fires in): the runner requires a complete request-layer search to pass through each, so a
# configuration too small to reach one cannot be reported as covering it.
SCENARIOS: dict[str, Callable[[str, Mapping[str, Any], PoolState], bool]] = {
    "a launch completes while an older one is in flight": _out_of_order,
    "copy-on-write of a shared block": lambda name, p, s: name == "copy_write",
    "fork sharing a block whose write is in flight":
        lambda name, p, s: name == "fork_share" and s.wpend[p["b"]] > 0,
    "truncation of rejected positions": lambda name, p, s: name == "truncate_tail",
    "a prefix hit on a cached block": lambda name, p, s: name == "hit",
}


def request_param_values(t: RequestTransition, cfg: ExploreConfig) -> list[dict[str, Any]]:
    doms = []
    for p in t.params:
        kind = REQUEST_PARAM_KINDS[p]
        doms.append({"block": range(cfg.blocks), "holder": range(cfg.holders),
                     "hash": tuple(cfg.hashes), "slots": range(0, cfg.block_size + 1),
                     "launch": range(0, cfg.max_window + 1)}[kind])
    return [dict(zip(t.params, vs, strict=True)) for vs in itertools.product(*doms)]


class RequestCodec:
    """The request fields as a tuple: per holder its table, positions and known chain values,
    per block its seal. Entries past a table's end, chain values past the known blocks and
    slots of blocks not held are not part of the state: no guard's outcome depends on them
    (each read of one is under a conjunct that bounds its index)."""

    def __init__(self, cfg: ExploreConfig) -> None:
        self.holders = tuple(range(cfg.holders))
        self.blocks = tuple(range(cfg.blocks))

    def key(self, s: RequestState) -> RequestKey:
        per = []
        for r in self.holders:
            n, kq = s.tlen[r], s.known_q[r]
            per.append((tuple(s.tab[r][i] for i in range(n)),
                        tuple(getattr(s, f)[r] for f in HOLDER_FIELDS[1:]),
                        tuple(s.chain[r][i] for i in range(kq))))
        return tuple(per), tuple(s.content[b] for b in self.blocks)

    def state(self, pool: PoolState, key: RequestKey) -> RequestState:
        per, content = key
        B = pool.block_size
        names = HOLDER_FIELDS[1:]
        reqs = []
        for r, (tab, pos, chain) in enumerate(per):
            got = dict(zip(names, pos, strict=True))
            counts = {n: got[f"{n}_q"] * B + got[f"{n}_o"] for n in POSITIONS}
            reqs.append((r, tab, counts, chain))
        return request_state(pool, B, reqs, {b: c for b, c in enumerate(content)
                                             if c != NO_HASH})

    def within(self, s: RequestState, cfg: ExploreConfig) -> bool:
        return all(s.known_q[r] * cfg.block_size + s.known_o[r] <= cfg.max_tokens
                   for r in self.holders)


# --- evaluation -------------------------------------------------------------------------------
def violations(s: PoolState, invariants: Mapping[str, Invariant],
               requests: RequestState | None = None,
               launches: Iterable[int] = ()) -> list[tuple[str, Any]]:
    """Like ``spec.check.violations``, over the invariants handed in (launch scope: the spec's
    ``launch_ids`` and the configured launch numbers)."""
    out: list[tuple[str, Any]] = []
    for inv in invariants.values():
        if inv.scope == "block":
            pts: Any = s.block_ids
        elif inv.scope == "hash":
            pts = hash_ids(s)
        elif inv.scope == "holder":
            pts = s.holder_ids
        elif inv.scope == "launch":
            pts = sorted(set(launch_ids(s)) | set(launches))
        elif inv.scope == "pool":
            if not inv.pred(CONCRETE, s):
                out.append((inv.name, "pool"))
            continue
        else:
            raise ValueError(f"unknown invariant scope {inv.scope!r}")
        out += [(inv.name, x) for x in pts if not inv.pred(CONCRETE, s, x)]
    if requests is not None:
        out += request_violations(requests, s.holder_ids)
    return out


def step(t: Transition, s: PoolState, params: Mapping[str, Any]) -> PoolState | None:
    """``spec.check.step`` over a given transition object (None when the guard fails), less
    the final ``flattened()``: the codec reads the overlays directly."""
    if not t.guard(CONCRETE, s, **params):
        return None
    return t.effect(CONCRETE, s, **params)


def readers_after(s: PoolState, s2: PoolState, readers: Readers,
                  reads: Mapping[int, Iterable[int]] = ()) -> Readers:  # type: ignore[assignment]
    """The readers ghost after a step from s to s2: launches published by it may read every
    block held in s (and the blocks ``reads`` names, per launch); completed ones drop out."""
    if s2.inflight is s.inflight and not reads:
        return readers
    now = set(epochs.in_flight(s2))
    new = now - set(epochs.in_flight(s))
    held = [b for b in s.block_ids if s.ref[b] > 0]
    out = [set(x) & now for x in readers]
    for L in new:
        for b in held:
            out[b].add(L)
    for L, blocks in dict(reads).items():
        for b in blocks:
            if L in now:
                out[b].add(L)
    return tuple(tuple(sorted(x)) for x in out)


def freed_while_read(s: PoolState, readers: Readers) -> list[tuple[int, tuple[int, ...]]]:
    return [(b, readers[b]) for b in s.block_ids if s.state[b] == FREE and readers[b]]


def describe(s: PoolState, tables: RequestKey | None = None, offset: int = 0,
             readers: Readers | None = None) -> str:
    """A state in the spec's words; ``offset``: the watermark it was normalized by (clock
    values and launch numbers are shown as they really are)."""
    lines = []
    for b in s.block_ids:
        rec = {f: getattr(s, f)[b] for f in BLOCK_FIELDS}
        rec["state"] = state_name(rec["state"])
        for f in epochs.CLOCK_VALUED:
            if f in rec:
                rec[f] = rec[f] + offset
        rd = f" read_by={[L + offset for L in readers[b]]}" if readers and readers[b] else ""
        lines.append(f"    block {b}: " + " ".join(f"{k}={v}" for k, v in rec.items()) + rd)
    for r in s.holder_ids:
        held = [b for b in s.block_ids if s.holds[r][b]]
        tab = ""
        if tables is not None:
            entries, pos, chain = tables[0][r]
            named = dict(zip(HOLDER_FIELDS[1:], pos, strict=True))
            tab = (f" table={list(entries)} positions(blocks, offset)="
                   + ", ".join(f"{n}=({named[n + '_q']}, {named[n + '_o']})"
                               for n in ("reserved", "issued", "computed", "known"))
                   + f" chain={list(chain)}")
        lines.append(f"    holder {r}: alive={bool(s.alive[r])} nheld={s.nheld[r]} "
                     f"holds={held}{tab}")
    hm = {h: b for h, b in flatten(s.hmap).items() if b != NO_BLOCK}
    counts = {state_name(k): v for k, v in flatten(s.count).items()}
    lines.append(f"    hmap={hm} count={counts}")
    if tables is not None:
        lines.append(f"    sealed content={list(tables[1])}")
    clock = " ".join(f"{CLOCK_NAMES[k]}={s.clock[k] + offset}" for k in CLOCK_KEYS)
    lines.append(f"    clock: {clock}; launches in flight: "
                 f"{[L + offset for L in epochs.in_flight(s)]}")
    return "\n".join(lines)


def _label(name: str, p: Mapping[str, Any], offset: int) -> str:
    """A step as the spec would see it: launch numbers as they really are (``offset``: the
    watermark the state it was taken from had been normalized by)."""
    shown = epochs.shift_params(p, {k: param_kind(k) for k in p}, -offset)
    return f"{name}({', '.join(f'{a}={v}' for a, v in shown.items())})"


# --- the normalization lemma (z3) -------------------------------------------------------------
_LEMMA_CACHE: dict[Any, dict[str, Any]] = {}


def _alpha_z3(u: PoolState) -> PoolState:
    """``epochs.normalize`` on z3 terms."""
    import z3

    c = u.clock[epochs.WATERMARK]
    k, L, b = z3.Ints("nl_k nl_L nl_b")
    fields: dict[str, Any] = {epochs.CLOCK_FIELD: z3.Lambda([k], u.clock[k] - c)}
    for f in epochs.LAUNCH_INDEXED:
        fields[f] = z3.Lambda([L], getattr(u, f)[L + c])
    for f in epochs.CLOCK_VALUED:
        v = getattr(u, f)[b] - c
        fields[f] = z3.Lambda([b], z3.If(v < 0, 0, v))
    return u.replace(**fields)


def normalization_lemma(
    transitions: Mapping[str, Transition], invariants: Mapping[str, Invariant],
    timeout_ms: int = 20000,
) -> dict[str, Any]:
    """z3: for every state s satisfying the invariants (at the points looked at, all symbolic:
    an unbounded pool, an unbounded clock), every transition and parameters p, with alpha the
    epoch normalization and p' the launch parameters shifted by s's watermark:

    (G) guard(s, p) == guard(alpha(s), p');
    (E) alpha(effect(s, p)) == alpha(effect(alpha(s), p')), every field at a fresh point;
    (V) every invariant holds in effect(s, p) at x iff in effect(alpha(s), p') at x' (x' = x
        shifted for launch-scoped ones).

    Together: the explorer, which steps from normalized states and checks the successors it
    computes, meets a violation iff the spec's own states have one (module doc)."""
    import z3

    from .induction import PROVED, build_frame, solve
    from .z3_model import DEFAULT_BOUNDED, in_range, instance, proof_invariants

    key = (tuple((n, id(t.guard), id(t.effect)) for n, t in transitions.items()),
           tuple((n, id(i.pred)) for n, i in invariants.items()))
    if key in _LEMMA_CACHE:
        return _LEMMA_CACHE[key]
    t0 = time.perf_counter()
    invs = proof_invariants(invariants)
    failed: list[dict[str, str]] = []
    queries = 0
    for name, t in transitions.items():
        fr = build_frame("symbolic", t, invariants, DEFAULT_BOUNDED, tag="nl_")
        s, ops = fr.s, fr.ops
        pts = {"block": z3.Int("nl_xb"), "hash": z3.Int("nl_xh"), "holder": z3.Int("nl_xr"),
               "launch": z3.Int("nl_xL"), "pool": None}
        hyps = list(fr.hyps) + [in_range(s, pts["block"])]
        hyps += [instance(ops, inv, s, pts[inv.scope]) for inv in invs.values()]
        c = s.clock[epochs.WATERMARK]
        kinds = {p: param_kind(p) for p in fr.params}
        p2 = epochs.shift_params(fr.params, kinds, c)  # type: ignore[arg-type]
        n = _alpha_z3(s)
        g_s, g_n = t.guard(ops, s, **fr.params), t.guard(ops, n, **p2)
        post_s, post_n = t.effect(ops, s, **fr.params), t.effect(ops, n, **p2)
        a_s, a_n = _alpha_z3(post_s), _alpha_z3(post_n)
        y, q = z3.Int("nl_y"), z3.Int("nl_q")
        diffs = []
        for f in ARRAY_FIELDS:
            x, z = getattr(a_s, f), getattr(a_n, f)
            if isinstance(FIELD_DEFAULT[f], Arr):
                diffs.append((f, x[q][y] != z[q][y]))
            else:
                diffs.append((f, x[y] != z[y]))
        inv_diffs = []
        for inv in invs.values():
            x = pts[inv.scope]
            x2 = x - c if inv.scope == "launch" else x
            inv_diffs.append((inv.name, instance(ops, inv, post_s, x)
                              != instance(ops, inv, post_n, x2)))
        side = list(getattr(ops, "side", []))
        for check, facts, named in (
            ("G: the guard is the same", [g_s != g_n], []),
            ("E: the successors normalize alike", [g_s, z3.Or(*[d for _, d in diffs])], diffs),
            ("V: the invariants agree on the successors",
             [g_s, z3.Or(*[d for _, d in inv_diffs])], inv_diffs),
        ):
            res, m, why = solve(hyps + side + facts, timeout_ms)
            queries += 1
            if res != PROVED:
                where = ""
                if m is not None:
                    bad = [nm for nm, d in named if z3.is_true(m.eval(d, model_completion=True))]
                    where = f" ({', '.join(bad)})" if bad else ""
                failed.append({"transition": name, "check": check + where,
                               "result": res, "detail": why})
    out = {"ok": not failed, "transitions": len(transitions), "queries": queries,
           "failed": failed, "time_s": round(time.perf_counter() - t0, 3)}
    _LEMMA_CACHE[key] = out
    return out


# --- the search -------------------------------------------------------------------------------
def explore(
    cfg: ExploreConfig = ExploreConfig(),  # noqa: B008 - frozen dataclass
    transitions: Mapping[str, Transition] = DEFAULT_TRANSITIONS,
    invariants: Mapping[str, Invariant] = DEFAULT_INVARIANTS,
    progress: Callable[[str], None] | None = None,
    lemma: bool = True,
) -> ExploreResult:
    t0 = time.perf_counter()
    request = cfg.layer == "request"
    invs = dict(invariants)
    dropped = unobserved_fields(transitions, invariants) if cfg.drop_unobserved else []
    norm = normalization_lemma(transitions, invariants) if lemma else {"ok": None}
    init0 = initial_state(cfg.blocks, cfg.block_size, range(cfg.holders))
    codec = Codec(init0, dropped, cfg)
    init = codec.state(codec.key(init0))
    launch_pts = tuple(range(cfg.max_window + 1))
    moves = [(name, t, p) for name, t in transitions.items() for p in param_values(t, cfg)]
    rcodec = RequestCodec(cfg)
    req_moves = [(name, t, p) for name, t in REQUEST_TRANSITIONS.items()
                 for p in request_param_values(t, cfg)] if request else []
    fired = dict.fromkeys(REQUEST_TRANSITIONS if request else transitions, 0)
    checked = dict.fromkeys(invs, 0)
    scenarios = dict.fromkeys(SCENARIOS, 0)
    tables0 = rcodec.key(initial_request_state(init))
    readers0: Readers = tuple(() for _ in range(cfg.blocks))
    k0 = (codec.key(init), readers0, tables0 if request else None)
    # key -> (parent key, transition name, normalized params, watermark it was normalized by)
    parent: dict[Any, tuple[Any, str, dict[str, Any], int] | None] = {k0: None}
    depth_of = {k0: 0}
    queue = deque([k0])
    edges = 0
    max_depth = 0
    frontier = 0  # states at the depth bound, not expanded
    readers_checked = 0
    found: dict[str, Violation] = {}
    if norm.get("ok") is False:
        text = "; ".join(f"{f['transition']}: {f['check']} [{f['result']}]"
                         for f in norm["failed"])
        found[NORMALIZATION] = Violation(
            NORMALIZATION, "lemma", 0, [],
            f"the epoch normalization is not a bisimulation for this spec: {text}")

    def path(k: Any) -> tuple[list[str], int]:
        """The trace to k with real launch numbers, and k's offset (its real watermark)."""
        hops = []
        while parent[k] is not None:
            k, name, p, shift = parent[k]  # type: ignore[misc]
            hops.append((name, p, shift))
        labels, offset = [], 0
        for name, p, shift in reversed(hops):
            labels.append(_label(name, p, offset))
            offset += shift
        return labels, offset

    def check(pk: Any, move: tuple[str, dict[str, Any]] | None, s: PoolState,
              tabs: RequestKey | None, rd: Readers) -> bool:
        """Check s, reached from pk's state by ``move`` (not normalized yet)."""
        nonlocal readers_checked
        rs = rcodec.state(s, tabs) if tabs is not None else None
        bad = violations(s, invs, rs, launch_pts)
        for n in invs:
            checked[n] += 1
        readers_checked += sum(s.state[b] == FREE for b in s.block_ids)
        freed = freed_while_read(s, rd)
        bad += [(READERS, f"block {b} (launches {list(ls)})") for b, ls in freed]
        for name, where in bad:
            if name not in found:
                tr, off = path(pk) if pk is not None else ([], 0)
                if move is not None:
                    tr.append(_label(*move, off))
                what = (f"invariant {name!r} violated" if name != READERS else
                        "a block was freed while a launch that may read it is in flight "
                        f"({READERS})")
                text = (f"{what} at {where!r} after {len(tr)} steps:\n  "
                        + "\n  ".join(tr) + "\n  reached state:\n"
                        + describe(s, tabs, off, rd))
                found[name] = Violation(name, where, len(tr), tr, text)
        return not bad

    ok0 = check(None, None, init, tables0 if request else None, readers0)
    complete = True
    if not ok0 and cfg.stop_at_first:
        queue.clear()

    def successors(s: PoolState, tabs: RequestKey | None, rd: Readers
                   ) -> Iterable[tuple[str, dict[str, Any], PoolState, RequestKey | None,
                                       Readers]]:
        if not request:
            for name, t, p in moves:
                s2 = step(t, s, p)
                if s2 is not None:
                    yield name, p, s2, None, readers_after(s, s2, rd)
            return
        rs = rcodec.state(s, tabs)  # type: ignore[arg-type]
        for name, rt, p in req_moves:
            rs2 = rt.fire(rs, **p)
            if rs2 is None or not rcodec.within(rs2, cfg):
                continue  # the token bound
            yield name, p, rs2.pool, rcodec.key(rs2), readers_after(s, rs2.pool, rd)

    while queue:
        k = queue.popleft()
        s = codec.state(k[0])
        rd, tabs = k[1], k[2]
        d = depth_of[k]
        for name, p, s2, tabs2, rd2 in successors(s, tabs, rd):
            if s2.inflight is not s.inflight and len(epochs.in_flight(s2)) > cfg.max_inflight:
                continue  # the launch bounds
            if epochs.window(s2) > cfg.max_window:
                continue
            fired[name] += 1
            edges += 1
            for what, seen in SCENARIOS.items():
                if seen(name, p, s):
                    scenarios[what] += 1
            c2 = epochs.watermark(s2)
            try:
                n2 = epochs.normalize(s2)
                if n2 is not s2:
                    codec.check_rebuilt(n2, REBUILT)
                key2 = codec.key(n2, s, k[0])
            except (Escaped, epochs.NotNormal) as e:
                if not check(k, (name, p), s2, tabs2, rd2):  # reported: nothing to normalize
                    if cfg.stop_at_first:
                        queue.clear()
                        break
                    continue
                tr, off = path(k)
                label = _label(name, p, off)
                found.setdefault(UNIVERSE, Violation(
                    UNIVERSE, str(e), d + 1, tr + [label],
                    f"{label} wrote outside the configured universe: {e}"))
                continue
            rdn = tuple(tuple(L - c2 for L in x) for x in rd2) if c2 else rd2
            k2 = (key2, rdn, tabs2)
            if k2 in parent:
                continue
            parent[k2] = (k, name, p, c2)
            depth_of[k2] = d + 1
            max_depth = max(max_depth, d + 1)
            if check(k, (name, p), s2, tabs2, rd2):
                if cfg.max_depth is None or d + 1 < cfg.max_depth:
                    queue.append(k2)  # violating states are reported, not expanded
                else:
                    frontier += 1
            elif cfg.stop_at_first:
                queue.clear()
                break
            if len(parent) >= cfg.max_states:
                complete = False
                queue.clear()
                break
        if progress and len(parent) % 20000 < 1:
            progress(f"explore[{cfg.layer}]: {len(parent)} states, {edges} edges")
    if found:
        complete = complete and not cfg.stop_at_first
    return ExploreResult(
        config=asdict(cfg), states=len(parent), edges=edges, depth=max_depth,
        complete=complete, time_s=round(time.perf_counter() - t0, 3), fired=fired,
        violations=found, checked=checked, dropped_fields=dropped, normalization=norm,
        readers_checked=readers_checked, frontier=frontier, scenarios=scenarios,
    )


@dataclass
class WalkResult:
    walks: int
    steps: int
    fired: dict[str, int]
    violations: dict[str, str]
    time_s: float


def walk_requests(cfg: ExploreConfig, walks: int = 200, steps: int = 150, seed: int = 0,
                  invariants: Mapping[str, Invariant] = DEFAULT_INVARIANTS) -> WalkResult:
    """Seeded random walks through the request layer, deeper than the breadth-first search
    reaches (a prefix hit needs about 18 steps): each step picks a request transition
    uniformly among those enabled, then one of its enabled moves; every state is checked like
    the explorer's (pool and table invariants, the readers ghost). No launch bound is needed:
    walks are finite."""
    import random

    t0 = time.perf_counter()
    rng = random.Random(seed)
    rcodec = RequestCodec(cfg)
    by_name = {name: request_param_values(t, cfg) for name, t in REQUEST_TRANSITIONS.items()}
    names = list(by_name)
    fired = dict.fromkeys(REQUEST_TRANSITIONS, 0)
    found: dict[str, str] = {}
    launch_pts = tuple(range(cfg.max_window + 1))
    for _ in range(walks):
        rs = initial_request_state(initial_state(cfg.blocks, cfg.block_size,
                                                 range(cfg.holders)))
        rs = rcodec.state(rs.pool, rcodec.key(rs))
        readers: Readers = tuple(() for _ in range(cfg.blocks))
        trace: list[str] = []
        for _ in range(steps):
            mark = rs.pool.clock[WATERMARK]
            pts = tuple(range(mark, rs.pool.clock[ISSUED] + 1))
            # a transition name uniformly among those with an enabled move, then a move of
            # it: rarely enabled transitions (copy-on-write, hits) are not drowned out
            picked = None
            for name in rng.sample(names, len(names)):
                for p in rng.sample(by_name[name], len(by_name[name])):
                    t = REQUEST_TRANSITIONS[name]
                    p = _shift_launch(p, mark)
                    nxt = t.fire(rs, **p)
                    if nxt is not None and rcodec.within(nxt, cfg):  # the token bound
                        picked = name, p, nxt
                        break
                if picked is not None:
                    break
            if picked is None:
                break
            name, p, nxt = picked
            nxt = rcodec.state(nxt.pool.flattened(), rcodec.key(nxt))
            readers = readers_after(rs.pool, nxt.pool, readers)
            rs = nxt
            fired[name] += 1
            trace.append(f"{name}({', '.join(f'{k}={v}' for k, v in p.items())})")
            bad = violations(rs.pool, invariants, rs, set(launch_pts) | set(pts))
            bad += [(READERS, f"block {b}") for b, _ in freed_while_read(rs.pool, readers)]
            for vname, where in bad:
                found.setdefault(vname, f"{vname} at {where!r} after: " + ", ".join(trace))
            if bad:
                break
    return WalkResult(walks, steps, fired, found, round(time.perf_counter() - t0, 3))


def _shift_launch(p: dict[str, Any], mark: int) -> dict[str, Any]:
    return {k: v + mark if REQUEST_PARAM_KINDS[k] == "launch" else v for k, v in p.items()}
