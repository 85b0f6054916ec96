"""The host tier's invariants, written once (over ``spec.host.HostState``).

Scopes: ``block`` (every host block b), ``hash`` (every hash h), ``device`` (every device
block d), ``pool`` (once; sums over ``s.block_ids``).
"""

from __future__ import annotations

from typing import Any

from .host import (
    HOST_FREE,
    HOST_LOADING,
    HOST_STATES,
    HOST_STORED,
    HOST_STORING,
    HostState,
    in_host_pool,
)
from .invariants import CONSERVATION, NO_RECYCLE_WHILE_PENDING, NO_UNWRITTEN_HIT, Invariant
from .states import NO_BLOCK, NO_HASH


def _state_in_range(ops: Any, s: HostState, b: Any) -> Any:
    return ops.Or(*[s.state[b] == st for st in HOST_STATES])


def _hash_map_agrees_block(ops: Any, s: HostState, b: Any) -> Any:
    hashed = s.hash[b] != NO_HASH
    return ops.And(
        hashed == (s.state[b] != HOST_FREE),
        ops.Implies(hashed, s.hmap[s.hash[b]] == b),
    )


def _one_block_per_hash(ops: Any, s: HostState, h: Any) -> Any:
    b = s.hmap[h]
    return ops.Implies(
        b != NO_BLOCK, ops.And(h != NO_HASH, in_host_pool(ops, s, b), s.hash[b] == h)
    )


def _pins_match_state(ops: Any, s: HostState, b: Any) -> Any:
    st, pins = s.state[b], s.pins[b]
    return ops.And(
        pins >= 0,
        ops.Implies(st == HOST_FREE, pins == 0),
        ops.Implies(st == HOST_STORING, pins == 1),
        ops.Implies(st == HOST_STORED, pins == 0),
        ops.Implies(st == HOST_LOADING, pins >= 1),
    )


def _store_reads_its_source(ops: Any, s: HostState, b: Any) -> Any:
    storing = s.state[b] == HOST_STORING
    return ops.And(
        (s.src[b] != NO_BLOCK) == storing,
        ops.Implies(storing, ops.And(s.src[b] >= 0, s.dreader[s.src[b]] == b)),
    )


def _device_reader_is_storing(ops: Any, s: HostState, d: Any) -> Any:
    r = s.dreader[d]
    return ops.Implies(
        r != NO_BLOCK,
        ops.And(d >= 0, in_host_pool(ops, s, r), s.state[r] == HOST_STORING, s.src[r] == d),
    )


def _conservation(ops: Any, s: HostState) -> Any:
    exact = [
        s.count[st] == ops.Sum([ops.If(s.state[b] == st, 1, 0) for b in s.block_ids])
        for st in HOST_STATES
    ]
    # The total is plain addition over the four states, not a sum over blocks.
    total = s.count[HOST_FREE] + s.count[HOST_STORING] + s.count[HOST_STORED]
    return ops.And(total + s.count[HOST_LOADING] == s.num_blocks, *exact)


HOST_INVARIANTS: dict[str, Invariant] = {
    inv.name: inv
    for inv in (
        Invariant("host_state_in_range", "block", _state_in_range, CONSERVATION,
                  "every host block is FREE, STORING, STORED or LOADING"),
        Invariant("host_hash_map_agrees", "block", _hash_map_agrees_block, NO_UNWRITTEN_HIT,
                  "a host block has a hash exactly when not FREE, and the map points back"),
        Invariant("host_one_block_per_hash", "hash", _one_block_per_hash, NO_UNWRITTEN_HIT,
                  "the host hash map points only at in-range blocks carrying that hash"),
        Invariant("host_pins_match_state", "block", _pins_match_state,
                  NO_RECYCLE_WHILE_PENDING,
                  "STORING has the store's pin, LOADING >= 1 pin, FREE/STORED none: a pinned "
                  "block is never FREE or evictable"),
        Invariant("host_store_reads_its_source", "block", _store_reads_its_source,
                  NO_RECYCLE_WHILE_PENDING,
                  "a block has a device source exactly while STORING, and that source is "
                  "pinned by it"),
        Invariant("host_device_reader_is_storing", "device", _device_reader_is_storing,
                  NO_RECYCLE_WHILE_PENDING,
                  "a pinned device block is read by exactly one STORING host block"),
        Invariant("host_conservation", "pool", _conservation, CONSERVATION,
                  "per-state host counts are exact and sum to the tier's size"),
    )
}


def host_violations(s: HostState, ops: Any, devices: Any = ()) -> list[str]:
    """Concrete only: every violated invariant instance, over all blocks, stored hashes and
    the given device blocks (plus those the state names)."""
    hashes = {s.hash[b] for b in s.block_ids} | {0}
    dev = set(devices) | {s.src[b] for b in s.block_ids}
    out = []
    for inv in HOST_INVARIANTS.values():
        pts: Any = {"block": s.block_ids, "hash": sorted(hashes), "device": sorted(dev),
                    "pool": [None]}[inv.scope]
        for p in pts:
            ok = inv.pred(ops, s) if inv.scope == "pool" else inv.pred(ops, s, p)
            if not ops.is_true(ok):
                out.append(f"{inv.name} at {inv.scope} {p}")
    return out
