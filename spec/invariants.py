"""The named invariants, written once, and the safety property each one serves.

Scopes say what an invariant ranges over:
- ``block``: ``pred(ops, s, b)`` must hold for every block b (proved over one symbolic block);
- ``hash``: ``pred(ops, s, h)`` for every hash h;
- ``holder``: ``pred(ops, s, r)`` for every holder r;
- ``launch``: ``pred(ops, s, L)`` for every launch number L;
- ``pool``: ``pred(ops, s)`` once, pool-wide (sums over ``s.block_ids``/``s.holder_ids``).

The request tables' invariants are in ``spec.request_invariants``, over ``spec.requests``' state.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .model import PoolState
from .states import (
    ALL_STATES,
    ALLOCATED,
    CACHED,
    FREE,
    ISSUED,
    NO_BLOCK,
    NO_HASH,
    PUBLISHED,
    RECLAIMED,
    REFERENCED,
    WATERMARK,
)

# The safety properties the invariants serve (used as the report's second column).
NO_DOUBLE_FREE = "no double free"
NO_EARLY_PUBLICATION = "no publication before initialization"
NO_RECYCLE_WHILE_PENDING = "no recycling while accesses are pending"
NO_UNWRITTEN_HIT = "no prefix hit on unwritten KV"
CONSERVATION = "every block accounted for exactly once"
COPY_ON_WRITE = "shared blocks are never written"
ISOLATION = "isolation between salts / requests"
TABLE_SHAPE = "tables map positions to blocks correctly"


@dataclass(frozen=True)
class Invariant:
    name: str
    scope: str
    pred: Callable[..., Any]
    property: str
    doc: str


def _in(ops: Any, x: Any, *values: Any) -> Any:
    return ops.Or(*[x == v for v in values])


def _state_in_range(ops: Any, s: PoolState, b: Any) -> Any:
    return _in(ops, s.state[b], *ALL_STATES)


def _conservation(ops: Any, s: PoolState) -> Any:
    exact = [
        s.count[st] == ops.Sum([ops.If(s.state[b] == st, 1, 0) for b in s.block_ids])
        for st in ALL_STATES
    ]
    return ops.And(ops.Sum([s.count[st] for st in ALL_STATES]) == s.num_blocks, *exact)


def _ref_matches_holders(ops: Any, s: PoolState, b: Any) -> Any:
    return s.ref[b] == ops.Sum([ops.If(s.holds[r][b], 1, 0) for r in s.holder_ids])


def _ref_nonnegative(ops: Any, s: PoolState, b: Any) -> Any:
    return s.ref[b] >= 0


def _ref_positive_iff_held(ops: Any, s: PoolState, b: Any) -> Any:
    st = s.state[b]
    return ops.And(
        (s.ref[b] > 0) == _in(ops, st, ALLOCATED, PUBLISHED, REFERENCED),
        ops.Implies(st == ALLOCATED, s.ref[b] == 1),
    )


def _initialized_iff_live(ops: Any, s: PoolState, b: Any) -> Any:
    return s.init[b] == _in(ops, s.state[b], ALLOCATED, PUBLISHED, REFERENCED, CACHED)


def _no_write_when_free(ops: Any, s: PoolState, b: Any) -> Any:
    return ops.And(
        ops.Implies(_in(ops, s.state[b], FREE, ALLOCATED), s.wpend[b] == 0),
        s.wpend[b] >= 0,
    )


def _reused_after_its_readers(ops: Any, s: PoolState, b: Any) -> Any:
    # A FREE block, and a new incarnation (ALLOCATED, PUBLISHED) of one, was retired before
    # the watermark: every launch that could have read its previous content has completed.
    return ops.And(
        s.retire[b] >= 0,
        s.retire[b] <= s.clock[ISSUED],
        ops.Implies(_in(ops, s.state[b], FREE, ALLOCATED, PUBLISHED),
                    s.retire[b] <= s.clock[WATERMARK]),
    )


def _watermark_bounds(ops: Any, s: PoolState) -> Any:
    return ops.And(s.clock[WATERMARK] >= 0, s.clock[WATERMARK] <= s.clock[ISSUED])


def _launch_window(ops: Any, s: PoolState, L: Any) -> Any:
    return ops.Implies(
        s.inflight[L], ops.And(L >= s.clock[WATERMARK], L < s.clock[ISSUED])
    )


def _hash_map_agrees_block(ops: Any, s: PoolState, b: Any) -> Any:
    hashed = s.hash[b] != NO_HASH
    return ops.And(
        hashed == _in(ops, s.state[b], REFERENCED, CACHED),
        ops.Implies(hashed, s.hmap[s.hash[b]] == b),
    )


def _hash_map_agrees_hash(ops: Any, s: PoolState, h: Any) -> Any:
    b = s.hmap[h]
    return ops.Implies(
        b != NO_BLOCK, ops.And(h != NO_HASH, b >= 0, b < s.num_blocks, s.hash[b] == h)
    )


def _cached_blocks_written(ops: Any, s: PoolState, b: Any) -> Any:
    return ops.Implies(
        _in(ops, s.state[b], REFERENCED, CACHED),
        ops.And(s.filled[b] == s.block_size, s.wpend[b] == 0),
    )


def _queue_is_free_and_cached(ops: Any, s: PoolState, b: Any) -> Any:
    return s.queued[b] == _in(ops, s.state[b], FREE, CACHED)


def _exclusive_writes(ops: Any, s: PoolState, b: Any) -> Any:
    st = s.state[b]
    return ops.And(
        s.filled[b] >= 0,
        s.filled[b] <= s.block_size,
        ops.Implies(_in(ops, st, FREE, RECLAIMED), s.filled[b] == 0),
        # A write begins only on an exclusively held block (begin_write); a fork may share
        # it while that write is in flight, so a pending write needs PUBLISHED, not ref 1.
        ops.Implies(s.wpend[b] > 0, _in(ops, st, PUBLISHED, RECLAIMED)),
    )


def _holders_consistent(ops: Any, s: PoolState, r: Any) -> Any:
    held = ops.Sum([ops.If(s.holds[r][b], 1, 0) for b in s.block_ids])
    return ops.And(s.nheld[r] == held, ops.Implies(ops.Not(s.alive[r]), s.nheld[r] == 0))


INVARIANTS: dict[str, Invariant] = {
    inv.name: inv
    for inv in (
        Invariant("state_in_range", "block", _state_in_range, CONSERVATION,
                  "every block is in exactly one of the six states"),
        Invariant("conservation", "pool", _conservation, CONSERVATION,
                  "per-state counts are exact and sum to the pool size"),
        Invariant("ref_matches_holders", "block", _ref_matches_holders, NO_DOUBLE_FREE,
                  "ref = number of live tables holding the block"),
        Invariant("ref_nonnegative", "block", _ref_nonnegative, NO_DOUBLE_FREE,
                  "ref never goes negative"),
        Invariant("ref_positive_iff_held", "block", _ref_positive_iff_held, NO_DOUBLE_FREE,
                  "ref > 0 exactly in ALLOCATED/PUBLISHED/REFERENCED; ALLOCATED has ref 1"),
        Invariant("initialized_iff_live", "block", _initialized_iff_live, NO_EARLY_PUBLICATION,
                  "every block a table or the cache can hand out has an initialized record"),
        Invariant("no_write_when_free", "block", _no_write_when_free,
                  NO_RECYCLE_WHILE_PENDING,
                  "no write is pending on a FREE or ALLOCATED block; writes >= 0"),
        Invariant("reused_after_its_readers", "block", _reused_after_its_readers,
                  NO_RECYCLE_WHILE_PENDING,
                  "a FREE, ALLOCATED or PUBLISHED block was retired below the watermark"),
        Invariant("watermark_bounds", "pool", _watermark_bounds, NO_RECYCLE_WHILE_PENDING,
                  "0 <= watermark <= launches issued"),
        Invariant("launch_window", "launch", _launch_window, NO_RECYCLE_WHILE_PENDING,
                  "a launch in flight is numbered in [watermark, issued): launches below the "
                  "watermark have all completed"),
        Invariant("hash_map_agrees", "block", _hash_map_agrees_block, NO_UNWRITTEN_HIT,
                  "a block has a hash exactly when REFERENCED/CACHED, and the map points back"),
        Invariant("one_block_per_hash", "hash", _hash_map_agrees_hash, NO_UNWRITTEN_HIT,
                  "the hash map points only at in-range blocks carrying that hash"),
        Invariant("cached_blocks_written", "block", _cached_blocks_written, NO_UNWRITTEN_HIT,
                  "REFERENCED/CACHED blocks are full and their writes have completed"),
        Invariant("queue_is_free_and_cached", "block", _queue_is_free_and_cached,
                  CONSERVATION, "the eviction queue holds exactly the FREE and CACHED blocks"),
        Invariant("exclusive_writes", "block", _exclusive_writes, COPY_ON_WRITE,
                  "writes only into PUBLISHED blocks, begun while held once (copy-on-write)"),
        Invariant("holders_consistent", "holder", _holders_consistent, NO_DOUBLE_FREE,
                  "a holder's ghost count matches what it holds; dead holders hold nothing"),
    )
}

PROPERTIES = (
    NO_DOUBLE_FREE,
    NO_EARLY_PUBLICATION,
    NO_RECYCLE_WHILE_PENDING,
    NO_UNWRITTEN_HIT,
    CONSERVATION,
    COPY_ON_WRITE,
    ISOLATION,
    TABLE_SHAPE,
)
