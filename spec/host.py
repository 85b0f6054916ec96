"""The host (CPU) tier's lifecycle, written once: its state, and guard and effect of each step.

A host block holds one device block's KV, copied off the device (offload, swap-out) and back
(prefix hit on the host, swap-in). Its states:

- ``HOST_FREE``: no content, no hash, no pins;
- ``HOST_STORING``: a device -> host copy is in flight; the device source block ``src[b]`` is
  pinned (``dreader[src[b]] == b``: counted as read by this store) until the store completes;
- ``HOST_STORED``: holds the KV of hash ``hash[b]``; evictable (LRU) while unpinned;
- ``HOST_LOADING``: ``pins[b]`` host -> device copies of it are in flight; not evictable.

Fields (concrete ``Arr``/``Overlay`` or the runtime's containers, or z3 arrays):

- per host block ``b``: ``state``, ``hash`` (``NO_HASH`` or the content hash), ``pins``
  (transfers in flight that use it), ``src`` (the device block a store reads, ``NO_BLOCK``);
- ``hmap``: hash -> host block (``NO_BLOCK`` if none); a STORING block is already in it, so a
  hash is never stored twice, but only STORED/LOADING blocks are hits (``loadable``);
- ``dreader``: device block -> the host block whose store reads it (``NO_BLOCK`` if none);
- ghost ``count[st]``: host blocks in state ``st``.

Every guard and effect uses only ``ops`` connectives (see ``spec.ops``), so the same function
evaluates on concrete values (the runtime ``allocator.host.HostPool``, tests) and on z3 terms
(``proofs.host_induction``). A multi-block call is a sequence of these one-block transitions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .explain import Vocabulary
from .ops import Arr
from .states import NO_BLOCK, NO_HASH

HOST_FREE, HOST_STORING, HOST_STORED, HOST_LOADING = 0, 1, 2, 3
HOST_STATES = (HOST_FREE, HOST_STORING, HOST_STORED, HOST_LOADING)
HOST_STATE_NAMES = {HOST_FREE: "FREE", HOST_STORING: "STORING", HOST_STORED: "STORED",
                    HOST_LOADING: "LOADING"}

HOST_BLOCK_FIELDS = ("state", "hash", "pins", "src")
HOST_ARRAY_FIELDS = HOST_BLOCK_FIELDS + ("hmap", "dreader", "count")
# What each transition parameter ranges over: a host block, a content hash, a device block.
HOST_PARAM_KINDS: dict[str, str] = {"b": "block", "h": "hash", "d": "device"}


@dataclass(frozen=True)
class HostState:
    state: Any
    hash: Any
    pins: Any
    src: Any
    hmap: Any
    dreader: Any
    count: Any
    num_blocks: Any
    block_ids: tuple[Any, ...] = ()

    def replace(self, **changes: Any) -> HostState:
        return dataclasses.replace(self, **changes)


def initial_host_state(num_blocks: int) -> HostState:
    """A fresh host tier: every block FREE, nothing stored, no device block read."""
    return HostState(
        state=Arr(HOST_FREE), hash=Arr(NO_HASH), pins=Arr(0), src=Arr(NO_BLOCK),
        hmap=Arr(NO_BLOCK), dreader=Arr(NO_BLOCK), count=Arr(0, {HOST_FREE: num_blocks}),
        num_blocks=num_blocks, block_ids=tuple(range(num_blocks)),
    )


@dataclass(frozen=True)
class HostTransition:
    name: str
    params: tuple[str, ...]
    guard: Callable[..., Any]
    effect: Callable[..., HostState]
    doc: str


def in_host_pool(ops: Any, s: HostState, b: Any) -> Any:
    """Host block ids name blocks of this tier (out-of-range ids must not default to FREE)."""
    return ops.And(b >= 0, b < s.num_blocks)


def loadable(ops: Any, s: HostState, b: Any) -> Any:
    """b holds complete KV: a prefix hit may load it (STORED, or already LOADING)."""
    return ops.Or(s.state[b] == HOST_STORED, s.state[b] == HOST_LOADING)


def evictable(ops: Any, s: HostState, b: Any) -> Any:
    """b may be dropped to make room: STORED, so no transfer pins it (a store in flight is
    STORING, a load LOADING; ``host_pins_match_state`` gives STORED blocks 0 pins)."""
    return ops.And(in_host_pool(ops, s, b), s.state[b] == HOST_STORED)


def device_pinned(ops: Any, s: HostState, d: Any) -> Any:
    """Device block d is read by a store in flight: it must not be freed or overwritten."""
    return s.dreader[d] != NO_BLOCK


def _move(ops: Any, s: HostState, b: Any, new: Any) -> dict[str, Any]:
    """Change b's state, keeping the ghost per-state counters exact."""
    old = s.state[b]
    count = ops.store(s.count, old, s.count[old] - 1)
    count = ops.store(count, new, count[new] + 1)
    return {"state": ops.store(s.state, b, new), "count": count}


# --- store_begin: FREE -> STORING, a copy of device block d under hash h starts -------------
def _store_begin_guard(ops: Any, s: HostState, b: Any, h: Any, d: Any) -> Any:
    return ops.And(
        in_host_pool(ops, s, b), s.state[b] == HOST_FREE,
        h != NO_HASH, s.hmap[h] == NO_BLOCK,
        d >= 0, ops.Not(device_pinned(ops, s, d)),
    )


def _store_begin_effect(ops: Any, s: HostState, b: Any, h: Any, d: Any) -> HostState:
    return s.replace(
        **_move(ops, s, b, HOST_STORING),
        hash=ops.store(s.hash, b, h),
        hmap=ops.store(s.hmap, h, b),
        pins=ops.store(s.pins, b, 1),
        src=ops.store(s.src, b, d),
        dreader=ops.store(s.dreader, d, b),
    )


# --- store_done: STORING -> STORED, the copy completed; the device source is let go ---------
def _storing_guard(ops: Any, s: HostState, b: Any) -> Any:
    return ops.And(in_host_pool(ops, s, b), s.state[b] == HOST_STORING)


def _store_done_effect(ops: Any, s: HostState, b: Any) -> HostState:
    return s.replace(
        **_move(ops, s, b, HOST_STORED),
        pins=ops.store(s.pins, b, 0),
        src=ops.store(s.src, b, NO_BLOCK),
        dreader=ops.store(s.dreader, s.src[b], NO_BLOCK),
    )


# --- store_fail: STORING -> FREE, the copy failed; hash dropped, device source let go -------
def _store_fail_effect(ops: Any, s: HostState, b: Any) -> HostState:
    return s.replace(
        **_move(ops, s, b, HOST_FREE),
        hmap=ops.store(s.hmap, s.hash[b], NO_BLOCK),
        hash=ops.store(s.hash, b, NO_HASH),
        pins=ops.store(s.pins, b, 0),
        src=ops.store(s.src, b, NO_BLOCK),
        dreader=ops.store(s.dreader, s.src[b], NO_BLOCK),
    )


# --- load_begin: STORED/LOADING -> LOADING, one more host -> device copy pins b -------------
def _load_begin_guard(ops: Any, s: HostState, b: Any) -> Any:
    return ops.And(in_host_pool(ops, s, b), loadable(ops, s, b))


def _load_begin_effect(ops: Any, s: HostState, b: Any) -> HostState:
    return s.replace(**_move(ops, s, b, HOST_LOADING), pins=ops.store(s.pins, b, s.pins[b] + 1))


# --- load_done: one copy of b completed; the last one returns it to STORED ------------------
def _load_done_guard(ops: Any, s: HostState, b: Any) -> Any:
    return ops.And(in_host_pool(ops, s, b), s.state[b] == HOST_LOADING)  # so pins >= 1


def _load_done_effect(ops: Any, s: HostState, b: Any) -> HostState:
    last = s.pins[b] == 1
    return s.replace(
        **_move(ops, s, b, ops.If(last, HOST_STORED, HOST_LOADING)),
        pins=ops.store(s.pins, b, s.pins[b] - 1),
    )


# --- evict: unpinned STORED -> FREE; its hash leaves the map -------------------------------
def _evict_guard(ops: Any, s: HostState, b: Any) -> Any:
    return evictable(ops, s, b)


def _evict_effect(ops: Any, s: HostState, b: Any) -> HostState:
    return s.replace(
        **_move(ops, s, b, HOST_FREE),
        hmap=ops.store(s.hmap, s.hash[b], NO_BLOCK),
        hash=ops.store(s.hash, b, NO_HASH),
    )


HOST_TRANSITIONS: dict[str, HostTransition] = {
    t.name: t
    for t in (
        HostTransition("store_begin", ("b", "h", "d"), _store_begin_guard, _store_begin_effect,
                       "FREE -> STORING: copy device block d under hash h [h not on the host, "
                       "d not already read by a store]; d pinned"),
        HostTransition("store_done", ("b",), _storing_guard, _store_done_effect,
                       "STORING -> STORED: the copy completed; d let go"),
        HostTransition("store_fail", ("b",), _storing_guard, _store_fail_effect,
                       "STORING -> FREE: the copy failed; hash dropped, d let go"),
        HostTransition("load_begin", ("b",), _load_begin_guard, _load_begin_effect,
                       "STORED/LOADING -> LOADING: a host -> device copy pins b"),
        HostTransition("load_done", ("b",), _load_done_guard, _load_done_effect,
                       "a copy of b completed; pins - 1; at 0 LOADING -> STORED"),
        HostTransition("evict", ("b",), _evict_guard, _evict_effect,
                       "unpinned STORED -> FREE (LRU victim); hash dropped"),
    )
}


# How refusals name the host tier's fields and states (``spec.explain.failed_conditions``).
HOST_WORDS = Vocabulary(
    fields={
        "state": "the state of host block {0}",
        "hash": "the hash host block {0} holds",
        "pins": "the copies in flight that use host block {0}",
        "src": "the device block host block {0} copies",
        "hmap": "the host block holding hash {0}",
        "dreader": "the host block whose store reads device block {0}",
        "count": "the number of host blocks in state {0}",
    },
    flags={},
    state_name=lambda v: HOST_STATE_NAMES.get(v, repr(v)),
    constants={**{f"HOST_{n}": n for n in HOST_STATE_NAMES.values()},
               "NO_HASH": "none", "NO_BLOCK": "none"},
    owner="host tier",
)


def host_step(s: HostState, name: str, ops: Any, **params: Any) -> HostState:
    """Apply one transition whose guard the caller has checked (concrete or symbolic)."""
    return HOST_TRANSITIONS[name].effect(ops, s, **params)
