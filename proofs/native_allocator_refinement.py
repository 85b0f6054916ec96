"""The native step path held to BlockAllocator, call by call: the differential campaign.

``BlockAllocator`` is held to the spec's call programs by the refinement campaign
(``proofs.refinement``); ``NativeAllocator`` (the request layer's step-level calls as native
loops over a ``NativePool``) is held here to ``BlockAllocator`` on seeded random workloads of
the calls it has: admissions with prefix hits (prompts share prefixes), growth one request
and many at a time, tokens appended (a step's one sampled token each also through
``append_token_many``, which hashes the blocks they end natively), launches published and
completed in any order, commits
(some refused: past what was issued, written or known), frees (some under launches in flight),
and bad arguments. Both must return the same values (tables, entries added, hit tokens, every
array of a launch) or raise the same error types, and end every call in the same pool state,
queue order and retire queue and the same tables, positions, tokens and hashes. The tests
and ``pagedkv verify`` run ``run_native_allocator_campaign``.
"""
# ruff: noqa: B023 - each operation's lambdas are called at once by AllocatorPair.do

from __future__ import annotations

import random
import time
from collections import Counter
from typing import Any

import numpy as np

from pagedkv.allocator import BlockAllocator, Launch
from pagedkv.allocator.native_allocator import NativeAllocator

from .native_refinement import snapshot

LAUNCH_ARRAYS = ("block_tables", "seq_lens", "query_lens", "slot_mapping",
                 "table_generations", "copies")


def requests_of(a: Any) -> dict[Any, tuple]:
    """Each request's (table, reserved, issued, computed, tokens, hashes)."""
    if isinstance(a, NativeAllocator):
        return {rid: (a.block_table(rid), a.num_reserved(rid), a.num_issued(rid),
                      a.num_computed(rid), list(req.tokens), list(req.hashes))
                for rid, req in a._requests.items()}
    return {rid: (list(r.table), r.reserved, r.issued, r.computed, list(r.tokens),
                  list(r.hashes)) for rid, r in a._requests.items()}


def _value(result: Any) -> Any:
    if isinstance(result, Launch):
        return (result.rids, result.seq, tuple(result.writes),
                *(np.asarray(getattr(result, f)).tolist() for f in LAUNCH_ARRAYS))
    return result


class AllocatorPair:
    """The same calls on a BlockAllocator and a NativeAllocator."""

    def __init__(self, num_blocks: int, block_size: int, checked: bool,
                 prefix_caching: bool = True) -> None:
        self.ref = BlockAllocator(num_blocks, block_size, checked=checked,
                                  prefix_caching=prefix_caching)
        self.nat = NativeAllocator(num_blocks, block_size, checked=checked,
                                   prefix_caching=prefix_caching)
        self.ops: Counter[str] = Counter()
        self.launches: list[tuple[Launch, Launch]] = []

    def do(self, name: str, call: Any) -> Any:
        """``call(allocator)`` on both: the same value or error type, then the same state."""
        self.ops[name] += 1
        outcomes = []
        for a in (self.ref, self.nat):
            try:
                outcomes.append(("ok", call(a)))
            except Exception as exc:  # noqa: BLE001 - compared by type
                outcomes.append(("raised", exc))
        (kind_r, got_r), (kind_n, got_n) = outcomes
        if kind_r != kind_n or (kind_r == "raised" and type(got_r) is not type(got_n)):
            raise AssertionError(f"{name}: BlockAllocator {kind_r} {got_r!r}, "
                                 f"NativeAllocator {kind_n} {got_n!r}")
        if kind_r == "ok" and _value(got_r) != _value(got_n):
            raise AssertionError(f"{name}: BlockAllocator returned {_value(got_r)!r}, "
                                 f"NativeAllocator {_value(got_n)!r}")
        self.same_state(name)
        return (got_r, got_n) if kind_r == "ok" else None

    def same_state(self, after: str) -> None:
        if snapshot(self.ref.pool) != snapshot(self.nat.pool):
            raise AssertionError(f"after {after}: the pools differ")
        if requests_of(self.ref) != requests_of(self.nat):
            raise AssertionError(f"after {after}: the requests differ")


def random_workload(seed: int, checked: bool, steps: int = 200) -> AllocatorPair:
    """Seeded random calls on an AllocatorPair (small pools, so that evictions, refusals and
    frees under launches in flight all happen)."""
    rng = random.Random(seed)
    B = rng.choice((1, 2, 4))
    pair = AllocatorPair(rng.randint(6, 24), B, checked, prefix_caching=seed % 5 != 4)
    prefixes = [[rng.randrange(50) for _ in range(rng.randint(1, 4 * B))] for _ in range(3)]
    live: list[str] = []
    made = 0

    def running() -> list[str]:
        return [rid for rid in live if pair.ref._requests[rid].table]

    def some(rids: list[str], most: int) -> list[str]:
        chosen = rng.sample(rids, rng.randint(1, min(most, len(rids))))
        if rng.random() < 0.05:  # now and then one that does not belong: refused
            chosen.append(rng.choice(live + ["x0"]))
        return chosen

    for _ in range(steps):
        op = rng.random()
        run = running()
        pick = rng.choice(live) if live and rng.random() < 0.95 else f"x{rng.randrange(99)}"
        if op < 0.12 or not live:
            made += 1
            rid = f"r{made}" if rng.random() < 0.95 or not live else rng.choice(live)
            prompt = rng.choice(prefixes) + [rng.randrange(50) for _ in range(rng.randrange(3))]
            got = pair.do("add_request", lambda a: a.add_request(rid, prompt))
            if got is not None:
                live.append(rid)
                if rng.random() < 0.8:
                    n = rng.randint(1, len(prompt))
                    pair.do("allocate", lambda a: a.allocate(rid, n))
        elif op < 0.22:
            n = rng.choice((rng.randint(0, 8 * B), rng.randint(0, 8 * B), "bad", -1))
            pair.do("allocate", lambda a: a.allocate(pick, n))
        elif op < 0.4 and run:
            grow = []
            for rid in some(run, 8):
                r = pair.ref._requests.get(rid)
                base = r.reserved if r is not None else 0
                grow.append((rid, base + rng.randint(-1 if rng.random() < 0.03 else 0, 2 * B)))
            pair.do("allocate_many", lambda a: a.allocate_many(grow))
        elif op < 0.5 and live:
            most = 1 if rng.random() < 0.5 else 2
            toks = [(rid, [rng.randrange(50) for _ in range(rng.randint(1, most))])
                    for rid in some(live, 8)]
            rids = [rid for rid, _ in toks]
            if (most == 1 and len(set(rids)) == len(rids)
                    and set(rids) <= set(pair.nat._requests)):
                # a step's sampled tokens: the native one-token-each path (natively hashed)
                pair.do("append_token_many", lambda a: a.append_tokens_many(toks)
                        if a is pair.ref else a.append_token_many(
                            [a._requests[rid] for rid in rids], [t[0] for _, t in toks]))
            else:
                pair.do("append_tokens_many", lambda a: a.append_tokens_many(toks))
        elif op < 0.65 and run:
            chosen = some(run, 4)
            got = pair.do("publish", lambda a: a.publish(chosen))
            if got is not None:
                pair.launches.append(got)
        elif op < 0.77 and pair.launches:
            ref_launch, nat_launch = pair.launches.pop(rng.randrange(len(pair.launches)))
            pair.do("complete", lambda a: (ref_launch if a is pair.ref else nat_launch)
                    .complete())
        elif op < 0.92 and run:
            updates = []
            for rid in some(run, 8):
                r = pair.ref._requests.get(rid)
                if r is None:
                    updates.append((rid, 1))
                    continue
                top = min(r.issued, len(r.tokens))
                n = rng.randint(r.computed, top) if top >= r.computed else r.computed
                updates.append((rid, n + (rng.random() < 0.05) - (rng.random() < 0.03)))
            pair.do("commit_many", lambda a: a.commit_many(updates))
        elif live:
            got = pair.do("free", lambda a: a.free(pick))
            if got is not None:
                live.remove(pick)
    if pair.ref.abstract() != pair.nat.abstract():  # the spec's state, launches in flight
        raise AssertionError("the spec's states differ (abstract())")
    pair.nat.check_invariants()
    for ref_launch, nat_launch in pair.launches:
        pair.do("complete", lambda a: (ref_launch if a is pair.ref else nat_launch).complete())
    for rid in list(live):
        pair.do("free", lambda a: a.free(rid))
    errors = pair.nat.pool.structure_errors()
    if errors:
        raise AssertionError(f"seed {seed}: the native pool's structure: {errors[:3]}")
    return pair


def run_native_allocator_campaign(seeds: range = range(12), steps: int = 200
                                  ) -> dict[str, Any]:
    """``random_workload`` on each seed, checked and unchecked mode alternately; the first
    difference fails it (its message says the seed and the call). Counts the calls, and
    those refused by both."""
    t0 = time.perf_counter()
    ops: Counter[str] = Counter()
    try:
        for seed in seeds:
            ops += random_workload(seed, checked=seed % 2 == 1, steps=steps).ops
    except AssertionError as exc:
        return {"ok": False, "error": f"seed {seed}: {exc}",
                "elapsed_s": round(time.perf_counter() - t0, 2)}
    return {"ok": True, "seeds": [seeds.start, seeds.stop], "ops": sum(ops.values()),
            "by_call": dict(sorted(ops.items())),
            "elapsed_s": round(time.perf_counter() - t0, 2)}
