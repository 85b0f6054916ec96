"""Exhaustive explicit-state exploration of the spec (breadth-first, like TLC).

From ``spec.model.initial_state`` every transition is tried with every parameter value of a
small configuration, evaluated concretely (``guard``/``effect`` with ``CONCRETE`` ops, i.e.
exactly ``spec.check.step``), and every new state is checked against every invariant. The
search is complete for the configuration: it stops when no new state appears, not at a depth.

Bounds (the configuration's, reported as assumptions):

* ``blocks`` blocks, ``holders`` holders, ``block_size`` slots, writes of ``w in 0..block_size``;
* hash values ``hashes`` (plus ``NO_HASH``) - prefix hits between holders happen because
  every holder's chain uses the same values;
* at most ``max_pending`` accesses in flight in total (launches that began and have not
  completed; each may complete at any later point - "late"): successors with more are cut;
* fields no guard, no invariant and no other field's update ever reads (found with z3 on the
  symbolic encoding; today: ``gen``) are not part of the state: they only count history and
  would make the state space infinite. Dropping them is a bisimulation.

Two layers:

* ``pool`` (default): the whole spec, every parameter value; checks every pool / block /
  hash / holder invariant.
* ``request``: the same pool plus a request layer keeping each holder's table as a tuple of
  block ids - allocate and share append, release pops the tail, commit registers the hash of
  the table position (the holder's chain value there), share is a prefix hit
  (``hmap[chain[i]]``) or a fork of another table's same position. This restricts which
  spec transitions a request makes; it adds the table-scoped invariants (``TableView``) to the
  checks. ``reserved`` is ``len(entries) * block_size`` and ``computed`` the written slots.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from pagedkv.spec.check import hash_ids
from pagedkv.spec.invariants import Invariant, TableView
from pagedkv.spec.model import ARRAY_FIELDS, BLOCK_FIELDS, PoolState, initial_state
from pagedkv.spec.ops import CONCRETE, Arr, Overlay, flatten
from pagedkv.spec.states import ALL_STATES, NO_BLOCK, NO_HASH, state_name
from pagedkv.spec.transitions import Transition

from .z3_model import (
    DEFAULT_INVARIANTS,
    DEFAULT_TRANSITIONS,
    FIELD_DEFAULT,
    INDEX_KIND,
    param_kind,
)


@dataclass(frozen=True)
class ExploreConfig:
    blocks: int = 3
    holders: int = 2
    block_size: int = 2
    hashes: tuple[int, ...] = (1, 2)
    max_pending: int = 2
    layer: str = "pool"  # "pool" | "request"
    max_states: int = 3_000_000
    stop_at_first: bool = False
    drop_unobserved: bool = True


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
    pt = {"block": z3.Int("uo_x"), "hash": z3.Int("uo_h"), "holder": z3.Int("uo_r")}
    for inv in invariants.values():
        if inv.scope == "pool":
            read |= mentioned(inv.pred(ops, s))
        elif inv.scope == "table":
            tv = TableView(z3.Int("uo_t"), [z3.Int("uo_e0"), z3.Int("uo_e1")], z3.Int("uo_rs"),
                           z3.Int("uo_cp"), [z3.Int("uo_c0"), z3.Int("uo_c1")])
            read |= mentioned(inv.pred(ops, s, tv))
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
               "state": tuple(ALL_STATES)}
        self.blocks = blocks
        self.keys = {}
        for f in ARRAY_FIELDS:
            kind = INDEX_KIND.get(f)
            if kind is None:
                raise ValueError(f"explorer: no index universe for field {f!r}")
            self.keys[f] = uni[kind]
        self.keysets = {f: frozenset(k) for f, k in self.keys.items()}
        self.blockset = frozenset(blocks)

    def key(self, s: PoolState) -> tuple[Any, ...]:
        out = []
        for f in self.fields:
            arr = getattr(s, f)
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
        else:
            raise ValueError(f"explorer: no domain for parameter {p!r} of {t.name}")
    return [dict(zip(t.params, vs, strict=True)) for vs in itertools.product(*doms)]


# --- the request layer ------------------------------------------------------------------------
Tables = tuple[tuple[int, ...], ...]


def _chain(cfg: ExploreConfig, r: int) -> tuple[int, ...]:
    return tuple(cfg.hashes)  # every holder's tokens hash to the same chain: prefix hits


def request_allows(name: str, p: Mapping[str, Any], s: PoolState, tables: Tables,
                   cfg: ExploreConfig) -> bool:
    r = p.get("r")
    if name == "allocate":
        return len(tables[r]) < len(_chain(cfg, r))
    if name == "share":
        i = len(tables[r])
        ch = _chain(cfg, r)
        if i >= len(ch):
            return False
        if s.hmap[ch[i]] == p["b"]:
            return True  # prefix hit on the requester's own chain value
        return any(  # fork: same prefix, same tokens, take the other table's block i
            q != r and len(tables[q]) > i and tables[q][:i] == tables[r]
            and tables[q][i] == p["b"] and _chain(cfg, q)[: i + 1] == ch[: i + 1]
            for q in range(cfg.holders)
        )
    if name == "release":
        return bool(tables[r]) and tables[r][-1] == p["b"]
    if name == "commit":
        t = tables[r]
        return p["b"] in t and p["h"] == _chain(cfg, r)[t.index(p["b"])]
    return True


def request_effect(name: str, p: Mapping[str, Any], tables: Tables) -> Tables:
    r = p.get("r")
    if name in ("allocate", "share"):
        return tables[:r] + (tables[r] + (p["b"],),) + tables[r + 1:]
    if name == "release":
        return tables[:r] + (tables[r][:-1],) + tables[r + 1:]
    if name in ("open_holder", "close_holder"):
        return tables[:r] + ((),) + tables[r + 1:]
    return tables


def table_views(s: PoolState, tables: Tables, cfg: ExploreConfig) -> list[TableView]:
    out = []
    for r, entries in enumerate(tables):
        if not s.alive[r]:
            continue
        ch = _chain(cfg, r)
        chain = [ch[i] if i < len(ch) else NO_HASH for i in range(len(entries))]
        computed = sum(min(s.filled[e], cfg.block_size) for e in entries)
        out.append(TableView(r, list(entries), len(entries) * cfg.block_size, computed, chain))
    return out


# --- evaluation -------------------------------------------------------------------------------
def violations(s: PoolState, invariants: Mapping[str, Invariant],
               tables: list[TableView] | None = None) -> list[tuple[str, Any]]:
    """Like ``spec.check.violations``, over the invariants handed in."""
    out: list[tuple[str, Any]] = []
    for inv in invariants.values():
        if inv.scope == "block":
            pts: Any = s.block_ids
        elif inv.scope == "hash":
            pts = hash_ids(s)
        elif inv.scope == "holder":
            pts = s.holder_ids
        elif inv.scope == "pool":
            if not inv.pred(CONCRETE, s):
                out.append((inv.name, "pool"))
            continue
        elif inv.scope == "table":
            if tables is not None:
                out += [(inv.name, t.holder) for t in tables if not inv.pred(CONCRETE, s, t)]
            continue
        else:
            raise ValueError(f"unknown invariant scope {inv.scope!r}")
        out += [(inv.name, x) for x in pts if not inv.pred(CONCRETE, s, x)]
    return out


def step(t: Transition, s: PoolState, params: Mapping[str, Any]) -> PoolState | None:
    """``spec.check.step`` over a given transition object (None when the guard fails), less
    the final ``flattened()``: the codec reads the overlays directly."""
    if not t.guard(CONCRETE, s, **params):
        return None
    return t.effect(CONCRETE, s, **params)


def describe(s: PoolState, tables: Tables | None = None) -> str:
    lines = []
    for b in s.block_ids:
        rec = {f: getattr(s, f)[b] for f in BLOCK_FIELDS}
        rec["state"] = state_name(rec["state"])
        lines.append(f"    block {b}: " + " ".join(f"{k}={v}" for k, v in rec.items()))
    for r in s.holder_ids:
        held = [b for b in s.block_ids if s.holds[r][b]]
        tab = f" table={list(tables[r])}" if tables is not None else ""
        lines.append(f"    holder {r}: alive={bool(s.alive[r])} nheld={s.nheld[r]} "
                     f"holds={held}{tab}")
    hm = {h: b for h, b in flatten(s.hmap).items() if b != NO_BLOCK}
    counts = {state_name(k): v for k, v in flatten(s.count).items()}
    lines.append(f"    hmap={hm} count={counts}")
    return "\n".join(lines)


def explore(
    cfg: ExploreConfig = ExploreConfig(),  # noqa: B008 - frozen dataclass
    transitions: Mapping[str, Transition] = DEFAULT_TRANSITIONS,
    invariants: Mapping[str, Invariant] = DEFAULT_INVARIANTS,
    progress: Callable[[str], None] | None = None,
) -> ExploreResult:
    t0 = time.perf_counter()
    request = cfg.layer == "request"
    invs = {n: i for n, i in invariants.items() if request or i.scope != "table"}
    dropped = unobserved_fields(transitions, invariants) if cfg.drop_unobserved else []
    init0 = initial_state(cfg.blocks, cfg.block_size, range(cfg.holders))
    codec = Codec(init0, dropped, cfg)
    init = codec.state(codec.key(init0))
    moves = [(name, t, p) for name, t in transitions.items() for p in param_values(t, cfg)]
    fired = dict.fromkeys(transitions, 0)
    checked = dict.fromkeys(invs, 0)
    tables0: Tables = tuple(() for _ in range(cfg.holders))
    k0 = (codec.key(init), tables0) if request else codec.key(init)
    parent: dict[Any, tuple[Any, str] | None] = {k0: None}
    depth_of = {k0: 0}
    queue = deque([k0])
    edges = 0
    max_depth = 0
    found: dict[str, Violation] = {}

    def trace_to(k: Any) -> list[str]:
        labels = []
        while parent[k] is not None:
            k, lab = parent[k]  # type: ignore[misc]
            labels.append(lab)
        return labels[::-1]

    def check(k: Any, s: PoolState, tabs: Tables | None) -> bool:
        views = table_views(s, tabs, cfg) if tabs is not None else None
        bad = violations(s, invs, views)
        for n in invs:
            checked[n] += 1
        for name, where in bad:
            if name not in found:
                tr = trace_to(k)
                text = (f"invariant {name!r} violated at {where!r} after {len(tr)} steps:\n  "
                        + "\n  ".join(tr) + "\n  reached state:\n" + describe(s, tabs))
                found[name] = Violation(name, where, len(tr), tr, text)
        return not bad

    ok0 = check(k0, init, tables0 if request else None)
    complete = True
    if not ok0 and cfg.stop_at_first:
        queue.clear()
    while queue:
        k = queue.popleft()
        s = codec.state(k[0] if request else k)
        tabs = k[1] if request else None
        d = depth_of[k]
        for name, t, p in moves:
            if request and not request_allows(name, p, s, tabs, cfg):
                continue
            s2 = step(t, s, p)
            if s2 is None:
                continue
            if sum(s2.pending[b] for b in s2.block_ids) > cfg.max_pending:
                continue  # the launch bound
            fired[name] += 1
            edges += 1
            try:
                key2 = codec.key(s2)
            except Escaped as e:
                label = f"{name}({', '.join(f'{a}={v}' for a, v in p.items())})"
                found.setdefault("<explorer universe>", Violation(
                    "<explorer universe>", str(e), d + 1, trace_to(k) + [label],
                    f"{label} wrote outside the configured universe: {e}"))
                continue
            tabs2 = request_effect(name, p, tabs) if request else None
            k2 = (key2, tabs2) if request else key2
            if k2 in parent:
                continue
            label = f"{name}({', '.join(f'{a}={v}' for a, v in p.items())})"
            parent[k2] = (k, label)
            depth_of[k2] = d + 1
            max_depth = max(max_depth, d + 1)
            s2c = codec.state(key2)
            if check(k2, s2c, tabs2):
                queue.append(k2)  # violating states are reported, not expanded
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
        violations=found, checked=checked, dropped_fields=dropped,
    )
