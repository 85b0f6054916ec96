"""The request layer as a value to pass in: ``RequestSpec``.

A runtime, a call program, a refinement model or a prover that is to run a changed spec is given
one, never a patched module global. A ``RequestSpec`` holds the pool transitions the request
steps name, the rules the request plans call by name and a runtime evaluates on its own counts
too (``RULES``), and the request transitions over both. ``REQUEST_SPEC`` is the spec as written
(its transitions are ``spec.requests.REQUEST_TRANSITIONS`` themselves).
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import requests
from .requests import REQUEST_TRANSITIONS, RequestTransition, hit_limit, leading_hits
from .transitions import TRANSITIONS, Transition

RULES = ("may_hit", "commit_bounds", "slots_written")
"""The names in ``spec.requests`` that a ``RequestSpec`` may bind to other rules."""


@dataclass(frozen=True)
class RequestSpec:
    """The request layer: ``pool``, the pool transitions its steps name; ``may_hit``,
    ``commit_bounds`` and ``slots_written``, the rules its plans call; ``transitions``, the
    request transitions over them. ``REQUEST_SPEC.replace(may_hit=...)`` runs the same plans
    with that rule: pass it to the call programs (``spec.calls``), ``BlockAllocator(spec=...)``
    and ``KVCacheManager(spec=...)`` and every one of them evaluates the change."""

    pool: Mapping[str, Transition] = field(default_factory=lambda: TRANSITIONS)
    may_hit: Callable[..., Any] = requests.may_hit
    commit_bounds: Callable[..., list[Any]] = requests.commit_bounds
    slots_written: Callable[..., Any] = requests.slots_written
    transitions: Mapping[str, RequestTransition] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "transitions", _transitions_over(self))

    def replace(self, **changes: Any) -> RequestSpec:
        return dataclasses.replace(self, **changes)

    def leading_hits(self, chain: Sequence[int], known: int, B: int,
                     lookup: Callable[[int], Any | None], start: int = 0) -> list[Any]:
        """``spec.requests.leading_hits`` with this spec's ``may_hit``."""
        return leading_hits(chain, known, B, lookup, start, self.may_hit)

    def hit_limit(self, entries: int, known: int, B: int, start: int = 0) -> int:
        """``spec.requests.hit_limit`` with this spec's ``may_hit``."""
        return hit_limit(entries, known, B, start, self.may_hit)


def _transitions_over(spec: RequestSpec) -> Mapping[str, RequestTransition]:
    """``REQUEST_TRANSITIONS`` over spec's pool transitions, their plans reading spec's rules.
    Each function of ``spec.requests`` is rebound to one namespace where the rule names are
    spec's, so a plan's helpers read them too; the source is the same, so ``spec.explain``
    says a changed rule's conditions as written."""
    module = vars(requests)
    changed = {n: getattr(spec, n) for n in RULES if getattr(spec, n) is not module[n]}
    if not changed and spec.pool is TRANSITIONS:
        return REQUEST_TRANSITIONS  # the very transitions: what the canaries and provers read
    names = dict(module, **changed)
    rebound: dict[int, types.FunctionType] = {}  # by the id of the function as written
    for n, v in module.items():
        if isinstance(v, types.FunctionType) and v.__globals__ is module and n not in changed:
            names[n] = rebound[id(v)] = _rebound(v, names)
    # (a plan made by a factory, such as _passthrough's, names no rule: it is kept)
    return {n: dataclasses.replace(t, plan=rebound.get(id(t.plan), t.plan), pool=spec.pool)
            for n, t in REQUEST_TRANSITIONS.items()}


def _rebound(fn: types.FunctionType, names: dict[str, Any]) -> types.FunctionType:
    """fn, reading its globals from ``names``."""
    out = types.FunctionType(fn.__code__, names, fn.__name__, fn.__defaults__, fn.__closure__)
    out.__kwdefaults__, out.__qualname__, out.__doc__ = (
        fn.__kwdefaults__, fn.__qualname__, fn.__doc__)
    out.__module__ = fn.__module__
    return out


REQUEST_SPEC = RequestSpec()


def as_request_spec(spec: RequestSpec | Mapping[str, Transition] | None) -> RequestSpec:
    """A runtime's ``spec=`` argument as a ``RequestSpec``: None is ``REQUEST_SPEC``; a mapping
    of pool transitions is the request layer as written over those transitions."""
    if spec is None:
        return REQUEST_SPEC
    if isinstance(spec, RequestSpec):
        return spec
    if isinstance(spec, Mapping):
        return RequestSpec(pool=spec)
    raise TypeError(f"spec must be a RequestSpec or a mapping of pool transitions, "
                    f"got {type(spec).__name__}")
