"""Evaluate the invariants on a concrete state, and run transitions on a concrete model."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .invariants import INVARIANTS, Invariant, TableView
from .model import PoolState
from .ops import CONCRETE, ConcreteOps
from .transitions import TRANSITIONS


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


def violations(
    s: PoolState,
    tables: Iterable[TableView] = (),
    names: Iterable[str] | None = None,
    blocks: Iterable[Any] | None = None,
) -> list[tuple[str, Any]]:
    """(invariant name, where) for every invariant that fails on a concrete state.

    ``blocks`` narrows the block-scoped invariants to the given blocks (checked mode's
    per-touched-block check); by default every invariant is evaluated everywhere.
    """
    selected: list[Invariant] = [INVARIANTS[n] for n in (names or INVARIANTS)]
    tables = list(tables)
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
        elif inv.scope == "table":
            out += [(inv.name, t.holder) for t in tables if not inv.pred(CONCRETE, s, t)]
        else:  # pragma: no cover - a spec authoring error
            raise ValueError(f"unknown invariant scope {inv.scope!r}")
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


def _instances(inv: Invariant, s: PoolState, tables: list[TableView]) -> list[tuple[Any, ...]]:
    if inv.scope == "block":
        return [(b,) for b in s.block_ids]
    if inv.scope == "hash":
        return [(h,) for h in hash_ids(s)]
    if inv.scope == "holder":
        return [(r,) for r in s.holder_ids]
    if inv.scope == "launch":
        return [(L,) for L in launch_ids(s)]
    if inv.scope == "table":
        return [(t,) for t in tables]
    return [()]


def live_instances(s: PoolState, tables: Iterable[TableView] = ()) -> dict[str, int]:
    """Per invariant, its instances on this state that are not vacuously true: every instance
    of an invariant with no implication, else those where some implication's premise holds.
    Evidence that a check exercised the invariant, not only that it passed."""
    tables = list(tables)
    out: dict[str, int] = {}
    for inv in INVARIANTS.values():
        n = 0
        for args in _instances(inv, s, tables):
            ops = _PremiseOps()
            inv.pred(ops, s, *args)
            n += ops.live > 0 or ops.premises == 0
        out[inv.name] = n
    return out


def step(s: PoolState, name: str, **params: Any) -> PoolState | None:
    """Run one transition on a concrete model: the post-state, or None if the guard fails."""
    t = TRANSITIONS[name]
    if not t.guard(CONCRETE, s, **params):
        return None
    return t.effect(CONCRETE, s, **params).flattened()


def spec_digest() -> str:
    """sha256 over the spec's source files: the report names exactly what was proved."""
    h = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()
