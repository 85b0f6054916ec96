"""The native pool held to BlockPool, op by op: the differential campaign.

``BlockPool`` is held to the spec by the refinement campaign (``proofs.refinement``); the
native pool (``allocator/native_pool.py``, the spec's transitions compiled to numba loops) is
held here to ``BlockPool`` on seeded random workloads: every operation of the pool layer
(holders, ``take_many`` with its evictions, releases, shares and prefix shares, admissions
and requests' ends as one call each (``admit``, ``finish``), publishes, writes and their
completions, commits and caching passes, rewinds, launches, completions and the watermark) is
made on both, and they must return the same blocks, raise the same error types, and end in
the same state, queue order and retire queue; at the end the native pool's structure and the
spec's invariants are scanned. Its generated code is held to the
interpreted spec separately (``native_pool.self_check``, at start-up). ``pagedkv verify``
runs ``run_native_campaign``; the tests run the same workloads.
"""
# ruff: noqa: B023 - each operation's lambdas are called at once by Pair.do, inside the loop

from __future__ import annotations

import random
import time
from collections import Counter
from typing import Any

import numpy as np

from pagedkv.allocator import BlockPool
from pagedkv.allocator.native_pool import NativePool
from pagedkv.spec import (
    ALLOCATED,
    CACHED,
    CONCRETE,
    PUBLISHED,
    REFERENCED,
    takeable,
    violations,
)

STATE_FIELDS = ("state", "ref", "retire", "wpend", "filled", "gen", "init", "hash", "queued",
                "count", "clock", "hmap", "held", "inflight")


def snapshot(pool: Any) -> dict:
    storage = pool.storage() if isinstance(pool, NativePool) else pool
    out = {f: getattr(storage, f) for f in STATE_FIELDS}
    out = {f: (dict(v) if isinstance(v, dict) else set(v) if isinstance(v, set) else list(v))
           for f, v in out.items()}
    out["held"] = {r: set(bs) for r, bs in storage.held.items()}
    out["queue"] = (pool.queue_order() if isinstance(pool, NativePool)
                    else pool.queue.order())
    out["retire_queue"] = list(pool.retire_queue)
    out["cached_busy"] = pool.cached_busy
    return out


def _outcome(fn: Any) -> Any:
    try:
        result = fn()
    except Exception as exc:  # noqa: BLE001 - compared by type
        return type(exc)
    if result is None or isinstance(result, int):
        return result
    if isinstance(result, tuple):  # admit's (blocks, hits)
        return [int(b) for b in result[0]], result[1]
    return [int(b) for b in result]


class Pair:
    """The same operation on a BlockPool and a NativePool."""

    def __init__(self, n: int, block_size: int, checked: bool, spec: Any = None) -> None:
        self.ref = BlockPool(n, block_size, checked=checked, spec=spec)
        self.nat = NativePool(n, block_size, checked=checked, spec=spec)
        self.B = block_size
        self.seen: list[tuple[str, object]] = []  # (op, its outcome: None, blocks or error)

    def do(self, name: str, ref_call: Any, nat_call: Any) -> Any:
        want, got = _outcome(ref_call), _outcome(nat_call)
        if got != want:  # raised, not asserted: the check must hold under python -O too
            raise AssertionError(f"{name}: native {got}, BlockPool {want}")
        if snapshot(self.nat) != snapshot(self.ref):
            raise AssertionError(f"state differs after {name}")
        self.seen.append((name, want))
        return want


def _share_prefix(ref: BlockPool, r: Any, hashes: list[int]) -> list[int]:
    """``NativePool.share_prefix`` on a BlockPool: the leading registered blocks, shared."""
    found = ref.prefix_hits(hashes)
    ref.run_many("share", [(b, r) for b in found])
    return found


def admit_room(ref: BlockPool, hashes: list[int]) -> int:
    """The most blocks ``admit`` of ``hashes`` can return on ref: its hits and the usable
    blocks left once those an allocation could take are revived."""
    hits = ref.prefix_hits(hashes)
    return len(hits) + ref.usable() - sum(bool(takeable(CONCRETE, ref.view, b)) for b in hits)


def _admit(pair: Pair, rng: random.Random, r: str) -> None:
    """``admit`` of r (an open holder at times: refused) on both pools: the hashes of some
    registered blocks in a random order, at times with a digest never registered among them
    or a block's hash twice (its second share refused); n blocks in all, at times fewer than
    the hashes or more than the pool has."""
    ref = pair.ref
    hashes = [ref.hash[b] for b in rng.sample(sorted(ref.hmap.values()),
                                              rng.randrange(0, len(ref.hmap) + 1))]
    if hashes and rng.random() < 0.2:
        hashes.insert(rng.randrange(len(hashes) + 1), 2**255 - 1)
    if hashes and rng.random() < 0.1:
        hashes.insert(rng.randrange(len(hashes) + 1), rng.choice(hashes))
    n = len(hashes) + rng.randrange(0, 3)
    if rng.random() < 0.3:  # at the room's edge: every usable block, or one more
        n = max(n, admit_room(ref, hashes) + rng.randrange(0, 2))
    elif hashes and rng.random() < 0.1:
        n = ref.num_blocks + 1 if rng.random() < 0.5 else len(hashes) - 1
    cached = len(ref.hmap)
    pair.do("admit", lambda: ref.admit(r, hashes, n), lambda: pair.nat.admit(r, hashes, n))
    if len(ref.hmap) < cached:
        pair.seen.append(("evicted", cached - len(ref.hmap)))


def random_workload(seed: int, checked: bool, steps: int = 300) -> Pair:
    """A seeded program of pool operations on both pools. On odd seeds the native holder set
    starts at 16 cells instead of 1,024, so its probe runs collide, wrap around its end and
    close up after deletions, and it is rehashed as it grows."""
    rng = random.Random(seed)
    pair = Pair(rng.choice((6, 12, 24)), 4, checked)
    ref, nat = pair.ref, pair.nat
    if seed % 2:
        nat.K = np.full(16, -1, np.int64)
        nat._keys_half = 8
    holders: list[str] = []
    serial = 0
    inflight: list[int] = []
    for _ in range(steps):
        op = rng.random()
        if op < 0.06 or not holders:
            r = f"r{serial}"
            serial += 1
            holders.append(r)
            pair.do("open_holder", lambda r=r: ref.open_holder(r),
                    lambda r=r: nat.open_holder(r))
            continue
        r = rng.choice(holders)
        held = sorted(ref.held.get(r, ()))
        if op < 0.26:
            n = rng.randrange(0, 4)
            if ref.usable() >= n:
                cached = len(ref.hmap)
                if n == 1 and len(held) % 2:  # (no draw of its own: the seeds' runs stay)
                    pair.do("take", lambda: ref.take(r), lambda: nat.take(r))
                else:
                    pair.do("take_many", lambda: ref.take_many(r, n),
                            lambda: nat.take_many(r, n))
                if len(ref.hmap) < cached:
                    pair.seen.append(("evicted", cached - len(ref.hmap)))
        elif op < 0.38 and held:
            blocks = rng.sample(held, rng.randrange(1, len(held) + 1))
            if rng.random() < 0.1:  # a block r does not hold: DoubleFree after the others
                blocks.append(rng.randrange(ref.num_blocks))
            if rng.random() < 0.25:  # a request's end: r closed if it then holds nothing
                pair.do("finish", lambda: ref.finish(r, blocks), lambda: nat.finish(r, blocks))
                if r not in ref.held:
                    holders.remove(r)
            elif len(blocks) == 1 and len(held) % 2:
                pair.do("release", lambda: ref.release(blocks[0], r),
                        lambda: nat.release(blocks[0], r))
            else:
                pair.do("release_many",
                        lambda: ref.run_many("release", [(b, r) for b in blocks]),
                        lambda: nat.release_many(r, blocks))
        elif op < 0.44 and rng.random() < (0.6 if ref.hmap else 0.1):
            # an admission, mostly where blocks are registered (of r, open already: refused)
            new = f"r{serial}" if rng.random() < 0.9 else r
            serial += 1
            _admit(pair, rng, new)
            if new in ref.held and new not in holders:
                holders.append(new)
        elif op < 0.44:
            shareable = (REFERENCED, CACHED, PUBLISHED) if rng.random() < 0.2 else (REFERENCED,
                                                                                    CACHED)
            cands = [b for b in range(ref.num_blocks)
                     if ref.state[b] in shareable and b not in held]
            if cands:
                blocks = rng.sample(cands, rng.randrange(1, len(cands) + 1))
                if len(held) % 2:  # (no draw of its own) the blocks' hashes, as a prefix
                    hashes = [ref.hash[b] for b in blocks]
                    pair.do("share_prefix", lambda: _share_prefix(ref, r, hashes),
                            lambda: nat.share_prefix(r, hashes))
                else:
                    pair.do("share_many",
                            lambda: ref.run_many("share", [(b, r) for b in blocks]),
                            lambda: nat.share_many(r, blocks))
        elif op < 0.54:
            mine = [b for b in held if ref.state[b] == ALLOCATED]
            if mine:
                pair.do("publish_many", lambda: ref.run_many("publish", [(b, r) for b in mine]),
                        lambda: nat.publish_many(r, mine))
        elif op < 0.66:
            mine = [b for b in held if ref.state[b] == PUBLISHED and ref.ref[b] == 1
                    and ref.filled[b] < pair.B]
            if mine:
                w = [rng.randrange(1, pair.B - ref.filled[b] + 1) for b in mine]
                pair.do("begin_write_many",
                        lambda: ref.run_many("begin_write", [(b, r, k) for b, k in
                                                             zip(mine, w, strict=True)]),
                        lambda: nat.begin_write_many(r, mine, w[0] if len(set(w)) == 1 else w))
        elif op < 0.74:
            pending = [b for b in range(ref.num_blocks) if ref.wpend[b] > 0]
            if pending:
                blocks = rng.sample(pending, rng.randrange(1, len(pending) + 1))
                pair.do("end_write_many",
                        lambda: ref.run_many("end_write", [(b,) for b in blocks]),
                        lambda: nat.end_write_many(blocks))
        elif op < 0.77:
            mine = [b for b in held if ref.state[b] == PUBLISHED and ref.ref[b] == 1
                    and ref.wpend[b] == 0]
            if mine:
                b = rng.choice(mine)
                k = rng.randrange(0, ref.filled[b] + 1) if rng.random() < 0.9 else pair.B + 1
                pair.do("rewind", lambda: ref.rewind(b, r, k), lambda: nat.rewind(b, r, k))
        elif op < 0.84:
            full = [b for b in held if ref.state[b] == PUBLISHED and ref.filled[b] == pair.B
                    and (ref.wpend[b] == 0 or rng.random() < 0.2)]
            if full:
                hashes = [rng.randrange(1, 6) if rng.random() < 0.5 else 2**255 + serial + i
                          for i, _ in enumerate(full)]
                serial += len(full)
                if len(held) % 2:  # (no draw of its own: the seeds' runs stay)
                    # a block committed already, and any hash registered already, is not due
                    extra = [b for b in held if ref.state[b] == REFERENCED][:1]
                    full, hashes = full + extra, hashes + hashes[:len(extra)]
                    pair.do("cache_many", lambda: ref.cache_many(r, full, hashes),
                            lambda: nat.cache_many(r, full, hashes))
                    pair.seen.append(("cache_skipped", sum(
                        ref.hmap.get(h) != b for b, h in zip(full, hashes, strict=True))))
                else:
                    pair.do("commit_many",
                            lambda: ref.run_many("commit", [(b, r, h) for b, h in
                                                            zip(full, hashes, strict=True)]),
                            lambda: nat.commit_many(r, full, hashes))
        elif op < 0.9:
            L = ref.clock[0]
            pair.do("launch", lambda: ref.launch(L), lambda: None if nat.launch() == L else L)
            inflight.append(L)
        elif op < 0.96 and inflight:
            L = inflight.pop(rng.randrange(len(inflight)))
            pair.do("complete", lambda: ref.complete(L), lambda: nat.complete(L))
            pair.do("advance_watermark", ref.advance_watermark, nat.advance_watermark)
        elif not held:
            holders.remove(r)
            pair.do("close_holder", lambda: ref.close_holder(r), lambda: nat.close_holder(r))
    wrong = nat.structure_errors() + violations(nat.abstract())
    if wrong:
        raise AssertionError(f"after the workload: {wrong[:3]}")
    return pair


def run_native_campaign(seeds: range = range(16), steps: int = 300) -> dict[str, Any]:
    """``random_workload`` on each seed (checked and unchecked mode alternately); the first
    difference fails it (its message says where). Counts the operations and their outcomes."""
    t0 = time.perf_counter()
    outcomes: Counter[str] = Counter()
    try:
        for seed in seeds:
            for name, out in random_workload(seed, checked=seed % 2 == 0, steps=steps).seen:
                outcomes[f"{name}: {out.__name__ if isinstance(out, type) else 'ok'}"] += 1
    except AssertionError as exc:
        return {"ok": False, "error": f"seed {seed}: {exc}",
                "elapsed_s": round(time.perf_counter() - t0, 2)}
    return {"ok": True, "seeds": [seeds.start, seeds.stop], "ops": sum(outcomes.values()),
            "outcomes": dict(sorted(outcomes.items())),
            "elapsed_s": round(time.perf_counter() - t0, 2)}
