"""Non-vacuity: every transition is enabled in some state that satisfies every invariant.

Without this an induction proof could pass because a guard (or the invariants) are
unsatisfiable. One z3 sat query per transition, in the explicit bounded pool (the witness is a
concrete pool, printed in the spec's vocabulary) and in the symbolic one. The explorer adds
"fired at least once from the initial state" counts (``explore.ExploreResult.fired``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import z3

from pagedkv.spec.invariants import Invariant
from pagedkv.spec.transitions import Transition

from .induction import COUNTEREXAMPLE, PROVED, build_frame, solve
from .z3_model import (
    DEFAULT_BOUNDED,
    DEFAULT_INVARIANTS,
    DEFAULT_TRANSITIONS,
    BoundedConfig,
    decode_state,
    format_state,
)

ENABLED, DEAD = "enabled", "never enabled"


@dataclass
class Enabledness:
    transition: str
    mode: str
    result: str  # enabled | never enabled | unknown
    time_s: float
    witness: dict[str, Any] | None = None
    text: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_enabled(
    t: Transition, mode: str, invariants: Mapping[str, Invariant], cfg: BoundedConfig,
    timeout_ms: int = 20000,
) -> Enabledness:
    t0 = time.perf_counter()
    fr = build_frame(mode, t, invariants, cfg)
    guard = t.guard(fr.ops, fr.s, **fr.params)
    res, m, why = solve(fr.hyps + list(getattr(fr.ops, "side", [])) + [guard], timeout_ms)
    dt = round(time.perf_counter() - t0, 4)
    if res == COUNTEREXAMPLE:  # sat: a witness
        params = {p: str(m.eval(v, model_completion=True)) for p, v in fr.params.items()}
        w = {"params": params, "state": decode_state(m, fr.s, fr.universe)}
        text = f"{t.name}({params}) enabled in:\n{format_state(w['state'], '   ')}"
        return Enabledness(t.name, mode, ENABLED, dt, w, text)
    if res == PROVED:  # unsat: the guard never holds under the invariants
        return Enabledness(t.name, mode, DEAD, dt)
    return Enabledness(t.name, mode, "unknown", dt, None, why)


def nonvacuity(
    transitions: Mapping[str, Transition] = DEFAULT_TRANSITIONS,
    invariants: Mapping[str, Invariant] = DEFAULT_INVARIANTS,
    cfg: BoundedConfig = DEFAULT_BOUNDED,
    modes: tuple[str, ...] = ("bounded", "symbolic"),
    progress: Callable[[str], None] | None = None,
) -> dict[str, list[Enabledness]]:
    out: dict[str, list[Enabledness]] = {}
    for name, t in transitions.items():
        for mode in modes:
            e = check_enabled(t, mode, invariants, cfg)
            if progress:
                progress(f"non-vacuity[{mode}] {name}: {e.result}")
            out.setdefault(name, []).append(e)
    return out


__all__ = ["ENABLED", "DEAD", "Enabledness", "check_enabled", "nonvacuity", "z3"]
