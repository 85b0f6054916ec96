"""The lifecycle transitions, written once: guard and effect of each, as data.

``guard(ops, s, **params)`` is a boolean term; ``effect(ops, s, **params)`` returns the
post-state. Both use only ``ops`` connectives, comparisons, linear arithmetic and array
reads/``ops.store`` so they evaluate on concrete values and on z3 terms alike.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .model import PoolState
from .states import (
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

# What each transition parameter ranges over, declared once for every reader of the spec
# (z3 model, explorer, compiled-guard probes, diagram): a block id, a holder (request table),
# a prefix hash, a count of slots in one block (0..block_size), or a launch number.
PARAM_KINDS: dict[str, str] = {
    "b": "block", "r": "holder", "h": "hash", "w": "slots", "k": "slots", "L": "launch",
}


@dataclass(frozen=True)
class Transition:
    name: str
    params: tuple[str, ...]
    guard: Callable[..., Any]
    effect: Callable[..., PoolState]
    doc: str

    def enabled(self, ops: Any, s: PoolState, **params: Any) -> Any:
        return self.guard(ops, s, **params)

    def apply(self, ops: Any, s: PoolState, **params: Any) -> PoolState:
        return self.effect(ops, s, **params)


def _set(ops: Any, arr: Any, key: Any, value: Any) -> Any:
    return ops.store(arr, key, value)


def _move(ops: Any, s: PoolState, b: Any, new_state: Any) -> dict[str, Any]:
    """Change block b's state, keeping the ghost per-state counters exact."""
    old = s.state[b]
    count = _set(ops, s.count, old, s.count[old] - 1)
    count = _set(ops, count, new_state, count[new_state] + 1)
    return {"state": _set(ops, s.state, b, new_state), "count": count}


def _hold(ops: Any, s: PoolState, r: Any, b: Any, held: Any) -> dict[str, Any]:
    delta = ops.If(held, 1, -1)
    return {
        "holds": _set(ops, s.holds, r, _set(ops, s.holds[r], b, held)),
        "nheld": _set(ops, s.nheld, r, s.nheld[r] + delta),
    }


def _in_pool(s: PoolState, b: Any) -> list[Any]:
    """Block ids name blocks of this pool (out-of-range ids must not default to FREE)."""
    return [b >= 0, b < s.num_blocks]


def _held_state(ops: Any, st: Any) -> Any:
    return ops.Or(st == ALLOCATED, st == PUBLISHED, st == REFERENCED)


# --- allocate: FREE -> ALLOCATED -------------------------------------------------------------
def _allocate_guard(ops: Any, s: PoolState, b: Any, r: Any) -> Any:
    return ops.And(
        *_in_pool(s, b), s.state[b] == FREE, s.retire[b] <= s.clock[WATERMARK], s.alive[r],
        ops.Not(s.holds[r][b]),
    )


def _allocate_effect(ops: Any, s: PoolState, b: Any, r: Any) -> PoolState:
    return s.replace(
        **_move(ops, s, b, ALLOCATED),
        **_hold(ops, s, r, b, True),
        ref=_set(ops, s.ref, b, 1),
        init=_set(ops, s.init, b, True),
        filled=_set(ops, s.filled, b, 0),
        queued=_set(ops, s.queued, b, False),
    )


# --- publish: ALLOCATED -> PUBLISHED ---------------------------------------------------------
def _publish_guard(ops: Any, s: PoolState, b: Any, r: Any) -> Any:
    return ops.And(
        *_in_pool(s, b), s.state[b] == ALLOCATED, s.init[b], s.alive[r], s.holds[r][b]
    )


def _publish_effect(ops: Any, s: PoolState, b: Any, r: Any) -> PoolState:
    return s.replace(**_move(ops, s, b, PUBLISHED))


# --- begin_write: a launch through r's table writes w slots of b ------------------------------
# Reads are not tracked per block: a launch pins, by its number, every block a table holds
# when it is published (``launch``), and a block let go is reused only past the watermark.
def _begin_write_guard(ops: Any, s: PoolState, b: Any, r: Any, w: Any) -> Any:
    return ops.And(
        *_in_pool(s, b),
        s.alive[r],
        s.holds[r][b],
        s.init[b],
        s.state[b] == PUBLISHED,
        s.ref[b] == 1,
        w > 0,
        s.filled[b] + w <= s.block_size,
    )


def _begin_write_effect(ops: Any, s: PoolState, b: Any, r: Any, w: Any) -> PoolState:
    return s.replace(
        wpend=_set(ops, s.wpend, b, s.wpend[b] + 1),
        filled=_set(ops, s.filled, b, s.filled[b] + w),
    )


# --- end_write: a launch that wrote b completed its write ------------------------------------
def _end_write_guard(ops: Any, s: PoolState, b: Any) -> Any:
    return ops.And(*_in_pool(s, b), s.wpend[b] > 0)


def _end_write_effect(ops: Any, s: PoolState, b: Any) -> PoolState:
    return s.replace(wpend=_set(ops, s.wpend, b, s.wpend[b] - 1))


# --- launch: launch L (the next number) is published; it may read every block held now -------
def _launch_guard(ops: Any, s: PoolState, L: Any) -> Any:
    return L == s.clock[ISSUED]


def _launch_effect(ops: Any, s: PoolState, L: Any) -> PoolState:
    return s.replace(
        inflight=_set(ops, s.inflight, L, True),
        clock=_set(ops, s.clock, ISSUED, s.clock[ISSUED] + 1),
    )


# --- complete: launch L's kernels are done (in any order) ------------------------------------
def _complete_guard(ops: Any, s: PoolState, L: Any) -> Any:
    return s.inflight[L]


def _complete_effect(ops: Any, s: PoolState, L: Any) -> PoolState:
    return s.replace(inflight=_set(ops, s.inflight, L, False))


# --- advance: the watermark passes the oldest launch once it completed -----------------------
def _advance_guard(ops: Any, s: PoolState) -> Any:
    low = s.clock[WATERMARK]
    return ops.And(low < s.clock[ISSUED], ops.Not(s.inflight[low]))


def _advance_effect(ops: Any, s: PoolState) -> PoolState:
    return s.replace(clock=_set(ops, s.clock, WATERMARK, s.clock[WATERMARK] + 1))


# --- rewind: r drops the written slots of b from k on (rejected speculative tokens) ----------
def _rewind_guard(ops: Any, s: PoolState, b: Any, r: Any, k: Any) -> Any:
    return ops.And(
        *_in_pool(s, b),
        s.state[b] == PUBLISHED,
        s.holds[r][b],
        s.ref[b] == 1,
        s.wpend[b] == 0,
        k >= 0,
        k <= s.filled[b],
    )


def _rewind_effect(ops: Any, s: PoolState, b: Any, r: Any, k: Any) -> PoolState:
    return s.replace(filled=_set(ops, s.filled, b, k))


# --- commit: PUBLISHED -> REFERENCED, registered under hash h --------------------------------
def _commit_guard(ops: Any, s: PoolState, b: Any, r: Any, h: Any) -> Any:
    return ops.And(
        *_in_pool(s, b),
        s.state[b] == PUBLISHED,
        s.holds[r][b],
        s.filled[b] == s.block_size,
        s.wpend[b] == 0,
        h != NO_HASH,
        s.hmap[h] == NO_BLOCK,
    )


def _commit_effect(ops: Any, s: PoolState, b: Any, r: Any, h: Any) -> PoolState:
    return s.replace(
        **_move(ops, s, b, REFERENCED),
        hash=_set(ops, s.hash, b, h),
        hmap=_set(ops, s.hmap, h, b),
    )


# --- share: a prefix hit or a fork takes one more reference (revives ZERO-REF CACHED) --------
# A fork may share a PUBLISHED block whose write is still in flight: every launch that reads it
# through the new holder's table is published later, and launches run in publish order on one
# stream, so it reads the finished write. No write can begin on it while it is shared
# (begin_write needs ref 1), and it is hashed only once the write completed (commit).
def _share_guard(ops: Any, s: PoolState, b: Any, r: Any) -> Any:
    st = s.state[b]
    return ops.And(
        *_in_pool(s, b),
        ops.Or(st == PUBLISHED, st == REFERENCED, st == CACHED),
        s.alive[r],
        ops.Not(s.holds[r][b]),
    )


def _share_effect(ops: Any, s: PoolState, b: Any, r: Any) -> PoolState:
    st = s.state[b]
    return s.replace(
        **_move(ops, s, b, ops.If(st == CACHED, REFERENCED, st)),
        **_hold(ops, s, r, b, True),
        ref=_set(ops, s.ref, b, s.ref[b] + 1),
        queued=_set(ops, s.queued, b, False),
    )


# --- release: ref - 1; at 0 REFERENCED -> CACHED, ALLOCATED/PUBLISHED -> RECLAIMED -----------
# At 0 the block is retired at the current clock: the launches issued so far may read it.
def _release_guard(ops: Any, s: PoolState, b: Any, r: Any) -> Any:
    return ops.And(*_in_pool(s, b), s.ref[b] > 0, s.holds[r][b], _held_state(ops, s.state[b]))


def _release_effect(ops: Any, s: PoolState, b: Any, r: Any) -> PoolState:
    st = s.state[b]
    last = s.ref[b] == 1
    to_cache = ops.And(last, st == REFERENCED)
    invalidate = ops.And(last, st != REFERENCED)
    return s.replace(
        **_move(ops, s, b, ops.If(to_cache, CACHED, ops.If(invalidate, RECLAIMED, st))),
        **_hold(ops, s, r, b, False),
        ref=_set(ops, s.ref, b, s.ref[b] - 1),
        retire=_set(ops, s.retire, b, ops.If(last, s.clock[ISSUED], s.retire[b])),
        init=_set(ops, s.init, b, ops.If(invalidate, False, s.init[b])),
        gen=_set(ops, s.gen, b, s.gen[b] + ops.If(invalidate, 1, 0)),
        filled=_set(ops, s.filled, b, ops.If(invalidate, 0, s.filled[b])),
        queued=_set(ops, s.queued, b, ops.Or(s.queued[b], to_cache)),
    )


# --- evict: ZERO-REF CACHED -> RECLAIMED -----------------------------------------------------
def _evict_guard(ops: Any, s: PoolState, b: Any) -> Any:
    return ops.And(*_in_pool(s, b), s.state[b] == CACHED)


def _evict_effect(ops: Any, s: PoolState, b: Any) -> PoolState:
    return s.replace(
        **_move(ops, s, b, RECLAIMED),
        hmap=_set(ops, s.hmap, s.hash[b], NO_BLOCK),
        hash=_set(ops, s.hash, b, NO_HASH),
        init=_set(ops, s.init, b, False),
        gen=_set(ops, s.gen, b, s.gen[b] + 1),
        filled=_set(ops, s.filled, b, 0),
        queued=_set(ops, s.queued, b, False),
    )


# --- recycle: RECLAIMED -> FREE once every launch that may have seen it completed -------------
def _recycle_guard(ops: Any, s: PoolState, b: Any) -> Any:
    return ops.And(
        *_in_pool(s, b),
        s.state[b] == RECLAIMED, s.retire[b] <= s.clock[WATERMARK], s.wpend[b] == 0)


def _recycle_effect(ops: Any, s: PoolState, b: Any) -> PoolState:
    return s.replace(**_move(ops, s, b, FREE), queued=_set(ops, s.queued, b, True))


# --- holders (request tables) open and close --------------------------------------------------
def _open_guard(ops: Any, s: PoolState, r: Any) -> Any:
    return ops.Not(s.alive[r])


def _open_effect(ops: Any, s: PoolState, r: Any) -> PoolState:
    return s.replace(alive=_set(ops, s.alive, r, True))


def _close_guard(ops: Any, s: PoolState, r: Any) -> Any:
    return ops.And(s.alive[r], s.nheld[r] == 0)


def _close_effect(ops: Any, s: PoolState, r: Any) -> PoolState:
    return s.replace(alive=_set(ops, s.alive, r, False))


def slots_written(ops: Any, s: PoolState, b: Any, k: Any) -> Any:
    """Slots [0, k) of b were written by launches that have all completed."""
    return ops.And(s.filled[b] >= k, s.wpend[b] == 0)


def takeable(ops: Any, s: PoolState, b: Any) -> Any:
    """An allocation may take b now: FREE, or CACHED and evicted then recycled first; either
    way no launch that may read it is in flight (its retire clock is past the watermark)."""
    return ops.And(ops.Or(s.state[b] == FREE, s.state[b] == CACHED),
                   s.retire[b] <= s.clock[WATERMARK])


def cache_due(ops: Any, s: PoolState, b: Any, h: Any) -> Any:
    """Caching b under hash h is due (``commit``'s policy, not its guard): b is PUBLISHED --
    not cached yet -- and no block is registered under h (where one is, it stays the block
    hits find, and b stays the request's own)."""
    return ops.And(s.state[b] == PUBLISHED, s.hmap[h] == NO_BLOCK)


TRANSITIONS: dict[str, Transition] = {
    t.name: t
    for t in (
        Transition("allocate", ("b", "r"), _allocate_guard, _allocate_effect,
                   "FREE -> ALLOCATED for holder r [launches that saw it completed]"),
        Transition("publish", ("b", "r"), _publish_guard, _publish_effect,
                   "ALLOCATED -> PUBLISHED [record initialized; r's table holds it]"),
        Transition("begin_write", ("b", "r", "w"), _begin_write_guard, _begin_write_effect,
                   "a launch through r's table writes w slots of its exclusive PUBLISHED b"),
        Transition("end_write", ("b",), _end_write_guard, _end_write_effect,
                   "a launch that wrote b completed"),
        Transition("launch", ("L",), _launch_guard, _launch_effect,
                   "launch L (the next number) is published; it may read any held block"),
        Transition("complete", ("L",), _complete_guard, _complete_effect,
                   "launch L completed (launches complete in any order)"),
        Transition("advance", (), _advance_guard, _advance_effect,
                   "the watermark passes the oldest launch [it completed]"),
        Transition("rewind", ("b", "r", "k"), _rewind_guard, _rewind_effect,
                   "r keeps only the first k written slots of its exclusive PUBLISHED block b "
                   "[no write pending]"),
        Transition("commit", ("b", "r", "h"), _commit_guard, _commit_effect,
                   "PUBLISHED -> REFERENCED under hash h [full, written, write completed, "
                   "h not cached]"),
        Transition("share", ("b", "r"), _share_guard, _share_effect,
                   "prefix hit or fork: ref + 1; ZERO-REF CACHED -> REFERENCED"),
        Transition("release", ("b", "r"), _release_guard, _release_effect,
                   "ref - 1 [r holds b, else DoubleFree]; at 0 -> CACHED or RECLAIMED, "
                   "retired at the clock"),
        Transition("evict", ("b",), _evict_guard, _evict_effect,
                   "ZERO-REF CACHED -> RECLAIMED; hash dropped, generation bumped"),
        Transition("recycle", ("b",), _recycle_guard, _recycle_effect,
                   "RECLAIMED -> FREE [the watermark passed its retire clock; no write pending]"),
        Transition("open_holder", ("r",), _open_guard, _open_effect,
                   "a request's table comes into being"),
        Transition("close_holder", ("r",), _close_guard, _close_effect,
                   "a request's table goes away [it holds nothing]"),
    )
}
