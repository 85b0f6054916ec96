"""Evaluate the invariants on a concrete state, and run transitions on a concrete model."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .invariants import INVARIANTS, Invariant, TableView
from .model import PoolState
from .ops import CONCRETE
from .transitions import TRANSITIONS


def hash_ids(s: PoolState) -> set[Any]:
    """Every hash that a block carries or the map knows (the concrete range of ``hash`` scope)."""
    from .ops import flatten

    keys = {h for h, _ in flatten(s.hmap).items()}
    keys |= {s.hash[b] for b in s.block_ids}
    return keys


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
        elif inv.scope == "pool":
            if not inv.pred(CONCRETE, s):
                out.append((inv.name, "pool"))
        elif inv.scope == "table":
            out += [(inv.name, t.holder) for t in tables if not inv.pred(CONCRETE, s, t)]
        else:  # pragma: no cover - a spec authoring error
            raise ValueError(f"unknown invariant scope {inv.scope!r}")
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
