"""The spec's state of a pool: per-block arrays, the hash map, holders, ghost counters.

The same ``PoolState`` carries concrete values (``Arr``/``Overlay``, or read-only views of the
runtime allocator) or z3 arrays. Fields:

- per block ``b``: ``state``, ``ref``, ``retire`` (the launch clock when its last holder let it
  go: launches numbered below it may still read it), ``wpend`` (launches writing it that have
  not completed), ``filled`` (slots written by issued launches),
  ``gen`` (generation, bumped when content is invalidated), ``init`` (record initialized),
  ``hash`` (``NO_HASH`` or its prefix hash), ``queued`` (in the eviction queue);
- ``hmap``: hash -> block (``NO_BLOCK`` if none);
- per holder ``r`` (a request's table, or any other owner of references): ``alive``,
  ``holds[r][b]`` and the ghost ``nheld[r]`` (number of blocks it holds);
- ghost ``count[s]``: number of blocks in state ``s`` (conservation is linear in it);
- per launch ``L`` (launches are numbered 0, 1, ... in publish order): ``inflight[L]``;
- ``clock[ISSUED]``: launches published so far (the next launch's number);
  ``clock[WATERMARK]``: every launch numbered below it has completed (epoch-based
  reclamation: a block retired at clock c is reusable once the watermark reaches c).

``block_ids`` and ``holder_ids`` enumerate the blocks and holders that pool-wide sums range
over: everything, concretely; a small fixed set in the bounded proofs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from .ops import Arr, flatten
from .states import ALL_STATES, FREE, ISSUED, NO_BLOCK, NO_HASH, WATERMARK

BLOCK_FIELDS = ("state", "ref", "retire", "wpend", "filled", "gen", "init", "hash", "queued")
ARRAY_FIELDS = BLOCK_FIELDS + ("hmap", "holds", "alive", "nheld", "count", "inflight", "clock")

# What each field is indexed by, declared once for every reader (z3 model, explorer, BMC): a
# block id, a prefix hash, a holder, a block state, a launch number or a clock key; ``holds``
# is indexed by holder, then block. Its default is the initial state's (``FIELD_DEFAULT``).
INDEX_KIND: dict[str, str] = {
    **dict.fromkeys(BLOCK_FIELDS, "block"),
    "hmap": "hash", "holds": "holder", "alive": "holder", "nheld": "holder", "count": "state",
    "inflight": "launch", "clock": "clock",
}


@dataclasses.dataclass(frozen=True)
class PoolState:
    state: Any
    ref: Any
    retire: Any
    wpend: Any
    filled: Any
    gen: Any
    init: Any
    hash: Any
    queued: Any
    hmap: Any
    holds: Any
    alive: Any
    nheld: Any
    count: Any
    inflight: Any
    clock: Any
    block_size: Any
    num_blocks: Any
    block_ids: tuple[Any, ...] = ()
    holder_ids: tuple[Any, ...] = ()

    def replace(self, **changes: Any) -> PoolState:
        return dataclasses.replace(self, **changes)

    def flattened(self) -> PoolState:
        """Concrete only: the same state with every overlay chain collapsed."""
        return self.replace(**{f: flatten(getattr(self, f)) for f in ARRAY_FIELDS})

    def block(self, b: Any) -> dict[str, Any]:
        return {f: getattr(self, f)[b] for f in BLOCK_FIELDS}


def initial_state(
    num_blocks: int, block_size: int, holder_ids: Iterable[Any] = ()
) -> PoolState:
    """A fresh pool: every block FREE and queued, nothing held, no hashes."""
    return PoolState(
        state=Arr(FREE),
        ref=Arr(0),
        retire=Arr(0),
        wpend=Arr(0),
        filled=Arr(0),
        gen=Arr(0),
        init=Arr(False),
        hash=Arr(NO_HASH),
        queued=Arr(True),
        hmap=Arr(NO_BLOCK),
        holds=Arr(Arr(False)),
        alive=Arr(False),
        nheld=Arr(0),
        count=Arr(0, {FREE: num_blocks}),
        inflight=Arr(False),
        clock=Arr(0),
        block_size=block_size,
        num_blocks=num_blocks,
        block_ids=tuple(range(num_blocks)),
        holder_ids=tuple(holder_ids),
    )


_TEMPLATE = initial_state(1, 1)
FIELD_DEFAULT: dict[str, Any] = {f: getattr(_TEMPLATE, f).default for f in ARRAY_FIELDS}


def states_equal(a: PoolState, b: PoolState) -> list[str]:
    """Concrete only: the fields (and entries) where two states differ; empty if equal."""
    diffs: list[str] = []
    for f in BLOCK_FIELDS:
        for blk in set(a.block_ids) | set(b.block_ids):
            if getattr(a, f)[blk] != getattr(b, f)[blk]:
                diffs.append(f"{f}[{blk}]: {getattr(a, f)[blk]!r} != {getattr(b, f)[blk]!r}")
    for s in ALL_STATES:
        if a.count[s] != b.count[s]:
            diffs.append(f"count[{s}]: {a.count[s]} != {b.count[s]}")
    ha, hb = flatten(a.hmap), flatten(b.hmap)
    if dict(ha.items()) != dict(hb.items()):
        diffs.append(f"hmap: {dict(ha.items())} != {dict(hb.items())}")
    for c, name in ((ISSUED, "ISSUED"), (WATERMARK, "WATERMARK")):
        if a.clock[c] != b.clock[c]:
            diffs.append(f"clock[{name}]: {a.clock[c]} != {b.clock[c]}")
    fa, fb = flatten(a.inflight), flatten(b.inflight)
    if {k for k, v in fa.items() if v} != {k for k, v in fb.items() if v}:
        diffs.append(f"inflight: {sorted(k for k, v in fa.items() if v)} != "
                     f"{sorted(k for k, v in fb.items() if v)}")
    for r in set(a.holder_ids) | set(b.holder_ids):
        if bool(a.alive[r]) != bool(b.alive[r]) or a.nheld[r] != b.nheld[r]:
            diffs.append(f"holder {r!r}: alive/nheld differ")
        for blk in set(a.block_ids) | set(b.block_ids):
            if bool(a.holds[r][blk]) != bool(b.holds[r][blk]):
                diffs.append(f"holds[{r!r}][{blk}] differs")
    return diffs
