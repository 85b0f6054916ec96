"""Epoch normalization: a pool's launch clock seen from its watermark (no z3 needed).

The spec numbers launches 0, 1, 2, ... and keeps two clock values (``clock[ISSUED]``,
``clock[WATERMARK]``) and a ``retire`` stamp per block; they grow without bound, so a search
over concrete states (the explorer, the diagram generator) would never finish. They are only
ever *compared*: the spec reads a clock value (a clock entry, a retire stamp, a launch number
or an index of ``inflight``) only in a comparison with another one or with 0, adds 1 to a
clock entry, stores ``clock[ISSUED]`` as a retire stamp, and indexes ``inflight`` with one.
So a state can be replaced by the one seen from its watermark ``W``:

* every clock entry and every launch number moves down by ``W`` (``inflight[L]`` becomes
  ``inflight[L - W]``, launch parameters ``L`` become ``L - W``): the watermark becomes 0;
* every retire stamp ``r`` becomes ``max(r - W, 0)``: a stamp at or below the watermark only
  ever compares as "at or below the watermark", and below every launch number in flight
  (``launch_window``: those are ``>= W``) and ``clock[ISSUED]`` (``>= W``).

``normalize`` is that map (``alpha`` below). It is a bisimulation between the spec's states
and the normalized ones - a guard holds in a state iff it holds (with shifted parameters) in
the normalized state, the two successors normalize to the same state, and an invariant holds
in one iff it holds in the other - for every state that satisfies the invariants. The
explorer does not take that on trust: ``explore.normalization_lemma`` proves it with z3 for
the transitions and invariants at hand (a spec that compared a retire stamp with a constant
other than 0, or stored a clock value in a field this module does not shift, fails it).

Which fields carry clock values is declared here, once:
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pagedkv.spec.model import PoolState
from pagedkv.spec.ops import Arr, Overlay, flatten
from pagedkv.spec.states import ISSUED, WATERMARK

CLOCK_FIELD = "clock"  # indexed by ISSUED / WATERMARK; its values are clock values
LAUNCH_INDEXED = ("inflight",)  # arrays indexed by launch number
CLOCK_VALUED = ("retire",)  # per-block fields whose values are clock values (stamps)
CLOCK_KEYS = (ISSUED, WATERMARK)


class NotNormal(Exception):
    """A state the normalization cannot represent without losing something (a launch below the
    watermark still in flight): never in a state that satisfies ``launch_window``."""


def _flat(arr: Any) -> Arr:
    return flatten(arr) if isinstance(arr, Arr | Overlay) else arr


def watermark(s: PoolState) -> int:
    return int(s.clock[WATERMARK])


def window(s: PoolState) -> int:
    """Launches issued and not yet passed by the watermark."""
    return int(s.clock[ISSUED]) - int(s.clock[WATERMARK])


def in_flight(s: PoolState) -> list[int]:
    return sorted(k for k, v in _flat(s.inflight).items() if v)


def normalize(s: PoolState, blocks: Iterable[Any] | None = None) -> PoolState:
    """alpha(s): the state seen from its watermark (module doc). ``blocks``: the block ids whose
    stamps to shift (default ``s.block_ids``)."""
    c = watermark(s)
    if c == 0:
        stamps_ok = all(int(getattr(s, f)[b]) >= 0 for f in CLOCK_VALUED
                        for b in (s.block_ids if blocks is None else blocks))
        if stamps_ok:
            return s
    out: dict[str, Any] = {}
    clock = _flat(s.clock)
    out[CLOCK_FIELD] = Arr(clock.default, {**dict(clock.items()),
                                           **{k: clock[k] - c for k in CLOCK_KEYS}})
    for f in LAUNCH_INDEXED:
        arr = _flat(getattr(s, f))
        moved = {}
        for L, v in arr.items():
            if L < c:
                raise NotNormal(f"{f}[{L}] = {v!r} below the watermark {c}")
            moved[L - c] = v
        out[f] = Arr(arr.default, moved)
    for f in CLOCK_VALUED:
        arr = _flat(getattr(s, f))
        ids = s.block_ids if blocks is None else blocks
        out[f] = Arr(max(arr.default - c, 0), {b: max(int(arr[b]) - c, 0) for b in ids})
    return s.replace(**out)


def shift_params(params: Mapping[str, Any], kinds: Mapping[str, str], c: int) -> dict[str, Any]:
    """Launch parameters as seen from watermark ``c``."""
    return {p: (v - c if kinds.get(p) == "launch" else v) for p, v in params.items()}
