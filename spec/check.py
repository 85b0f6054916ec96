"""Evaluate the invariants on a concrete state, and run transitions on a concrete model."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .invariants import INVARIANTS, Invariant
from .model import PoolState
from .ops import CONCRETE, Arr, ConcreteOps, Overlay, flatten
from .request_invariants import REQUEST_INVARIANTS
from .requests import RequestState
from .transitions import TRANSITIONS, Transition


def hash_ids(s: PoolState) -> set[Any]:
    """Every hash that a block carries or the map knows (the concrete range of ``hash`` scope)."""
    from .ops import flatten

    keys = {h for h, _ in flatten(s.hmap).items()}
    keys |= {s.hash[b] for b in s.block_ids}
    return keys


def launch_ids(s: PoolState) -> list[Any]:
    """The launches a concrete state knows: those in flight, and the next number (the
    ``launch`` scope's concrete range; every other number reads the default, not in flight).
    ``s.inflight`` is a spec array or any mapping view with ``items()``."""
    from .ops import Arr, Overlay, flatten
    from .states import ISSUED

    arr = flatten(s.inflight) if isinstance(s.inflight, Arr | Overlay) else s.inflight
    return sorted({k for k, v in arr.items() if v} | {s.clock[ISSUED]})


def held_blocks(s: PoolState, r: Any) -> list[Any]:
    """Concrete: the blocks holder r holds."""
    row = s.holds[r]
    if isinstance(row, Arr | Overlay):
        return [b for b, v in flatten(row).items() if v]
    return [b for b in s.block_ids if row[b]]


def request_points(inv: Invariant, s: RequestState, holders: Iterable[Any]
                   ) -> list[tuple[Any, ...]]:
    """The concrete points a table invariant ranges over: every request, each of its entries,
    each block it holds or names, every block of the pool."""
    holders = list(holders)
    if inv.scope == "holder":
        return [(r,) for r in holders]
    if inv.scope == "entry":
        return [(r, i) for r in holders for i in range(s.tlen[r])]
    if inv.scope == "holding":
        return [(r, b) for r in holders
                for b in sorted(set(held_blocks(s.pool, r))
                                | {s.tab[r][i] for i in range(s.tlen[r])})]
    if inv.scope == "block":
        return [(b,) for b in s.pool.block_ids]
    raise ValueError(f"unknown request invariant scope {inv.scope!r}")  # pragma: no cover


def request_violations(s: RequestState, holders: Iterable[Any] | None = None
                       ) -> list[tuple[str, Any]]:
    """(table invariant, where) for every table invariant failing on a concrete state."""
    holders = list(s.pool.holder_ids if holders is None else holders)
    out: list[tuple[str, Any]] = []
    for inv in REQUEST_INVARIANTS.values():
        out += [(inv.name, pt if len(pt) > 1 else pt[0]) for pt in request_points(inv, s, holders)
                if not inv.pred(CONCRETE, s, *pt)]
    return out


def violations(
    s: PoolState,
    requests: RequestState | None = None,
    names: Iterable[str] | None = None,
    blocks: Iterable[Any] | None = None,
) -> list[tuple[str, Any]]:
    """(invariant name, where) for every invariant that fails on a concrete state: the pool's,
    and the tables' when the request layer's state is given.

    ``blocks`` narrows the block-scoped invariants to the given blocks (checked mode's
    per-touched-block check); by default every invariant is evaluated everywhere.
    """
    selected: list[Invariant] = [INVARIANTS[n] for n in (names or INVARIANTS)]
    block_range = list(s.block_ids) if blocks is None else list(blocks)
    out: list[tuple[str, Any]] = []
    for inv in selected:
        if inv.scope == "block":
            out += [(inv.name, b) for b in block_range if not inv.pred(CONCRETE, s, b)]
        elif blocks is not None:
            continue
        elif inv.scope == "hash":
            out += [(inv.name, h) for h in hash_ids(s) if not inv.pred(CONCRETE, s, h)]
        elif inv.scope == "holder":
            out += [(inv.name, r) for r in s.holder_ids if not inv.pred(CONCRETE, s, r)]
        elif inv.scope == "launch":
            out += [(inv.name, L) for L in launch_ids(s) if not inv.pred(CONCRETE, s, L)]
        elif inv.scope == "pool":
            if not inv.pred(CONCRETE, s):
                out.append((inv.name, "pool"))
        else:  # pragma: no cover - a spec authoring error
            raise ValueError(f"unknown invariant scope {inv.scope!r}")
    if requests is not None and blocks is None:
        out += request_violations(requests)
    return out


class _PremiseOps(ConcreteOps):
    """ConcreteOps that notes whether an implication's premise held (the instance was live)."""

    def __init__(self) -> None:
        self.premises = 0
        self.live = 0

    def Implies(self, a: Any, b: Any) -> bool:
        self.premises += 1
        if a:
            self.live += 1
        return (not a) or bool(b)


def _instances(inv: Invariant, s: PoolState) -> list[tuple[Any, ...]]:
    if inv.scope == "block":
        return [(b,) for b in s.block_ids]
    if inv.scope == "hash":
        return [(h,) for h in hash_ids(s)]
    if inv.scope == "holder":
        return [(r,) for r in s.holder_ids]
    if inv.scope == "launch":
        return [(L,) for L in launch_ids(s)]
    return [()]


def live_instances(s: PoolState, requests: RequestState | None = None) -> dict[str, int]:
    """Per invariant, its instances on this state that are not vacuously true: every instance
    of an invariant with no implication, else those where some implication's premise holds.
    Evidence that a check exercised the invariant, not only that it passed."""
    out: dict[str, int] = {}
    for inv in INVARIANTS.values():
        out[inv.name] = _live(inv, s, _instances(inv, s))
    if requests is not None:
        for inv in REQUEST_INVARIANTS.values():
            out[inv.name] = _live(inv, requests, request_points(inv, requests, s.holder_ids))
    return out


def _live(inv: Invariant, s: Any, points: Iterable[tuple[Any, ...]]) -> int:
    n = 0
    for args in points:
        ops = _PremiseOps()
        inv.pred(ops, s, *args)
        n += ops.live > 0 or ops.premises == 0
    return n


def step(s: PoolState, name: str, transitions: Mapping[str, Transition] | None = None,
         **params: Any) -> PoolState | None:
    """Run one transition on a concrete model: the post-state, or None if the guard fails.
    ``transitions``: the spec to run it in (default ``spec.TRANSITIONS``)."""
    t = (TRANSITIONS if transitions is None else transitions)[name]
    if not t.guard(CONCRETE, s, **params):
        return None
    return t.effect(CONCRETE, s, **params).flattened()


def spec_digest() -> str:
    """sha256 over the spec's source files: the report names exactly what was proved."""
    h = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()
