"""A long random serving soak of ``BlockAllocator``, checked by an oracle of in-flight launches.

The driver makes the calls a serving engine makes, in a random mix: requests arrive with shared
system prompts (so prefix hits happen) and different salts; prompts are prefilled in chunks;
launches of several requests are published and complete late and out of order (several in
flight, a random one completes: directly, through a recorded event polled by ``reclaim()``, or by
the allocator's own reclaim when it is short of blocks); positions are committed once their
launches completed; sampled tokens are appended before their position is allocated; running
requests fork (parallel sampling: parent and child then write different tokens, which makes
copy-on-write copies); requests finish, abort or are preempted (free, then ``add_request`` with
the tokens so far), all while launches are in flight. Refusals the engine expects
(``OutOfBlocks``; a fork refused while the parent's writes are pending) are skipped.

The oracle: a launch may read or write every block in its ``block_tables`` and both columns of
its ``copies`` until it completes. Each such block is recorded with the generation the launch
saw (``table_generations``; for a copy source, its generation just before ``publish``). After
every allocator call, for every block of every in-flight launch:

* it is not FREE and not ALLOCATED (both mean it was recycled: a launch's blocks were at least
  published), and
* its generation is the recorded one, or one more with the block RECLAIMED (invalidated while
  pinned, waiting for the launch): anything else means it was handed out again.

A block recorded by two in-flight launches with different generations was handed out again
while the older one was in flight. Within one launch, no block is both a copy source and a copy
destination, no destination appears twice, each destination is a fresh block of exactly one
table row, and each source was in a table of one of the launch's requests before publish. A
failure raises ``SoakFailure`` (an ``AssertionError``) naming the call, the launch and the
block. ``check_invariants()`` runs every ``check_every`` calls and at the end, with a mirror of
each request's positions and the ``stats()`` sums.

    python -m pagedkv.proofs.soak --ops 1000000 --seed 0
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable
from typing import Any

from pagedkv.allocator import (
    AllocatorError,
    BlockAllocator,
    CommitError,
    GuardViolation,
    Launch,
    LaunchAlreadyCompleted,
    OutOfBlocks,
)
from pagedkv.spec.states import ALLOCATED, CACHED, FREE, RECLAIMED, state_name


def stat_parts(stats: dict[str, int]) -> dict[str, int]:
    """``stats()`` as blocks per lifecycle group: free, cached (zero-ref), held (by a table),
    reclaimed (waiting for launches)."""
    return {
        "free": stats["free"],
        "cached": stats["cached"],
        "held": stats["held"],
        "reclaimed": stats["reclaimed_waiting"],
    }


def block_counts(alloc: BlockAllocator, stats: dict[str, int] | None = None) -> str | None:
    """None if ``stats()`` agrees with the blocks' states (``alloc.state``) and sums to the
    pool; otherwise what disagrees."""
    parts = stat_parts(alloc.stats() if stats is None else stats)
    seen = dict.fromkeys(parts, 0)
    group = {FREE: "free", CACHED: "cached", RECLAIMED: "reclaimed"}
    for b in range(alloc.num_blocks):
        seen[group.get(alloc.state(b), "held")] += 1
    if parts != seen or sum(parts.values()) != alloc.num_blocks:
        return f"stats() counts {parts}, the blocks' states {seen} ({alloc.num_blocks} blocks)"
    return None


class SoakFailure(AssertionError):
    """The oracle saw an unsafe allocator state (or the allocator refused a valid call)."""


class FakeEvent:
    """A recorded event the driver turns done at a random later time."""

    __slots__ = ("done",)

    def __init__(self) -> None:
        self.done = False

    def query(self) -> bool:
        return self.done


class _Req:
    __slots__ = ("rid", "tokens", "max_len", "reserved", "issued", "computed", "started",
                 "pending")

    def __init__(self, rid: str, tokens: list[int], max_len: int) -> None:
        self.rid = rid
        self.tokens = tokens  # mirror of the token ids the allocator knows
        self.max_len = max_len
        self.reserved = 0
        self.issued = 0
        self.computed = 0
        self.started = False
        self.pending: dict[int, int] = {}  # launch no -> first position it writes

    def frontier(self) -> int:
        """Positions below this were written by launches that all completed."""
        return min(self.pending.values()) if self.pending else self.issued


class _Flight:
    __slots__ = ("no", "launch", "op", "blocks", "writers", "event")

    def __init__(self, no: int, launch: Launch, op: int, blocks: dict[int, int],
                 writers: list[_Req], event: FakeEvent | None) -> None:
        self.no, self.launch, self.op = no, launch, op
        self.blocks = blocks  # block -> generation the launch saw
        self.writers = writers
        self.event = event

    def name(self) -> str:
        return f"launch #{self.no} (published at call {self.op}, requests {list(self.launch.rids)})"


_WEIGHTS = (
    ("add", 7), ("allocate", 24), ("append", 14), ("publish", 15), ("complete", 13),
    ("commit", 7), ("fork", 5), ("finish", 6), ("preempt", 2), ("reclaim", 3),
    ("again", 1), ("abort", 1), ("truncate", 3),
)


class Soak:
    """The driver and its oracle; ``run_soak`` is the entry point."""

    def __init__(
        self,
        seed: int,
        *,
        num_blocks: int,
        block_size: int,
        checked: bool,
        check_every: int,
        max_requests: int,
        max_inflight: int,
        make_allocator: Callable[..., BlockAllocator],
    ) -> None:
        self.rng = rng = random.Random(seed)
        self.alloc = make_allocator(num_blocks, block_size, checked=checked)
        self.num_blocks, self.B = num_blocks, block_size
        self.check_every = max(1, check_every)
        self.max_requests, self.max_inflight = max_requests, max_inflight
        pool = getattr(self.alloc, "pool", None)
        self._state = getattr(pool, "state", None)
        self._gen = getattr(pool, "gen", None)
        self.live: dict[str, _Req] = {}
        self.rids: list[str] = []
        self.flights: list[_Flight] = []
        self.prot: dict[int, list[int]] = {}  # block -> [generation seen, launches in flight]
        self.done_launches: list[Launch] = []
        self.to_commit: list[_Req] = []  # writers of launches that landed, to commit next
        self.calls = 0
        self.what = ""
        self.next_rid = 0
        self.next_launch = 0
        self.systems = [[rng.randrange(1, 30000) for _ in range(n)]
                        for n in (block_size, 2 * block_size + 1, 3 * block_size - 1, 5)]
        self.salts: tuple[Any, ...] = (None, None, None, "tenant-a", b"tenant-b")
        self.f: dict[str, Any] = dict.fromkeys((
            "ops", "launches", "completions", "completed_out_of_order", "completed_by_reclaim",
            "completed_directly", "events_recorded", "forks", "copies", "preemptions",
            "truncations", "requests_added", "requests_finished", "aborts", "commits",
            "tokens_appended", "prefix_hit_tokens", "first_allocations",
            "already_completed_refusals", "max_inflight_seen", "invariant_scans"), 0)
        self.refusals: dict[str, int] = {}
        self._seq = [getattr(self, f"op_{name}") for name, w in _WEIGHTS for _ in range(w)]

    # ---- the oracle ----------------------------------------------------------------------------
    def fail(self, msg: str) -> None:
        raise SoakFailure(f"call {self.calls} ({self.what}): {msg}")

    def _states(self) -> tuple[Any, Any]:
        if self._state is not None and self._gen is not None:
            return self._state, self._gen
        a = self.alloc
        return [a.state(b) for b in range(self.num_blocks)], a.block_generations().tolist()

    def _sync(self) -> None:
        """Launches the call completed (``reclaim()``, also inside allocate and publish) land."""
        for fl in [fl for fl in self.flights if fl.launch.completed]:
            self._landed(fl, by_reclaim=True)

    def after(self) -> None:
        """Called after every allocator call."""
        self.calls += 1
        self._sync()
        state, gen = self._states()
        for b, (g, _) in self.prot.items():
            st, cur = state[b], gen[b]
            if st == FREE or st == ALLOCATED or (cur != g and not (cur == g + 1
                                                                  and st == RECLAIMED)):
                holders = [fl.name() for fl in self.flights if b in fl.blocks]
                self.fail(
                    f"block {b} is in the read/write set of in-flight {', '.join(holders)} "
                    f"with generation {g}, but it is now {state_name(st)} with generation "
                    f"{cur}: handed out again while the launch still uses it"
                )
        if self.calls % self.check_every == 0:
            self.scan()
        while self.to_commit:
            req = self.to_commit.pop()
            if self.live.get(req.rid) is req:
                self._commit(req)

    def scan(self) -> None:
        a = self.alloc
        a.check_invariants()
        self.f["invariant_scans"] += 1
        if len(a.inflight) != len(self.flights):
            self.fail(f"allocator has {len(a.inflight)} launches in flight, the driver "
                      f"{len(self.flights)}")
        s = a.stats()
        counts = block_counts(a, s)
        if counts is not None:
            self.fail(counts)
        if s["inflight_launches"] != len(self.flights):
            self.fail(f"stats say {s['inflight_launches']} launches in flight, the driver "
                      f"{len(self.flights)}")
        for rid, req in self.live.items():
            got = (a.num_reserved(rid), a.num_computed(rid), len(a.block_table(rid)))
            want = (req.reserved, req.computed, -(-req.reserved // self.B))
            if got != want:
                self.fail(f"request {rid!r}: (reserved, computed, table length) {got}, the "
                          f"driver expects {want}")

    def validate(self, no: int, launch: Any, batch: list[_Req], gens_before: list[int],
                 before: list[set[int]]) -> dict[int, int]:
        """The launch's rows match the requests; its copies are sound. Returns its read/write
        set: block -> the generation the launch uses."""
        rids = [r.rid for r in batch]
        bt, tg = launch.block_tables.tolist(), launch.table_generations.tolist()
        copies = launch.copies.tolist()
        probe = _Flight(no, launch, self.calls + 1, {}, [], None)
        if list(launch.rids) != rids or len(bt) != len(rids):
            self.fail(f"{probe.name()}: rows {list(launch.rids)} for publish({rids})")
        for k, req in enumerate(batch):
            if (int(launch.seq_lens[k]), int(launch.query_lens[k])) != (
                    req.reserved, req.reserved - req.issued):
                self.fail(f"{probe.name()} row {k}: seq_len/query_len "
                          f"{int(launch.seq_lens[k])}/{int(launch.query_lens[k])}, expected "
                          f"{req.reserved}/{req.reserved - req.issued}")
        blocks: dict[int, int] = {}
        rows_of: dict[int, int] = {}
        for row, grow in zip(bt, tg, strict=True):
            for b, g in zip(row, grow, strict=True):
                if b < 0:
                    continue
                if blocks.setdefault(b, g) != g:
                    self.fail(f"{probe.name()}: block {b} appears with generations "
                              f"{blocks[b]} and {g}")
                rows_of[b] = rows_of.get(b, 0) + 1
        dsts = [c[1] for c in copies]
        was = set().union(*before)
        for src, dst in copies:
            if src in dsts:
                self.fail(f"{probe.name()}: block {src} is both a copy source and a copy "
                          f"destination (copies {copies})")
            if dsts.count(dst) > 1:
                self.fail(f"{probe.name()}: copy destination {dst} appears twice "
                          f"(copies {copies})")
            if src not in was:
                self.fail(f"{probe.name()}: copy source {src} was in no table of the launch's "
                          f"requests before publish")
            if dst in was or rows_of.get(dst, 0) != 1:
                self.fail(f"{probe.name()}: copy destination {dst} is not a fresh block of "
                          f"exactly one table row (copies {copies})")
            g = gens_before[src]
            if blocks.setdefault(src, g) != g:
                self.fail(f"{probe.name()}: copy source {src} had generation {g} before "
                          f"publish, its table entry has {blocks[src]}")
        return blocks

    def _protect(self, fl: _Flight) -> None:
        for b, g in fl.blocks.items():
            p = self.prot.get(b)
            if p is None:
                self.prot[b] = [g, 1]
            elif p[0] != g:
                older = [o.name() for o in self.flights if b in o.blocks]
                self.fail(f"block {b} appears in {fl.name()} with generation {g}, but in-flight "
                          f"{', '.join(older)} saw generation {p[0]}: handed out again")
            else:
                p[1] += 1

    def _landed(self, fl: _Flight, *, by_reclaim: bool) -> None:
        self.flights.remove(fl)
        self.f["completions"] += 1
        self.f["completed_by_reclaim" if by_reclaim else "completed_directly"] += 1
        if any(o.no < fl.no for o in self.flights):
            self.f["completed_out_of_order"] += 1
        for b in fl.blocks:
            p = self.prot[b]
            p[1] -= 1
            if p[1] == 0:
                del self.prot[b]
        for req in fl.writers:
            req.pending.pop(fl.no, None)
        self.done_launches.append(fl.launch)
        if len(self.done_launches) > 8:
            del self.done_launches[0]
        if self.rng.random() < 0.5:
            self.to_commit.extend(fl.writers)

    def refused(self, err: AllocatorError) -> None:
        name = type(err).__name__
        self.refusals[name] = self.refusals.get(name, 0) + 1
        self.after()

    # ---- helpers -------------------------------------------------------------------------------
    def _pick(self, cond: Callable[[_Req], bool], tries: int = 4) -> _Req | None:
        if not self.rids:
            return None
        for _ in range(tries):
            req = self.live[self.rng.choice(self.rids)]
            if cond(req):
                return req
        return None

    def _add(self, rid: str, tokens: list[int], max_len: int) -> None:
        rng = self.rng
        salt = rng.choice(self.salts)
        extra: tuple[Any, ...] = ("lora-1",) if rng.random() < 0.05 else ()
        self.what = f"add_request({rid!r}, {len(tokens)} tokens)"
        self.alloc.add_request(rid, tokens, cache_salt=salt, extra_keys=extra)
        req = _Req(rid, list(tokens), max_len)
        self.live[rid] = req
        self.rids.append(rid)
        self.f["requests_added"] += 1
        self.after()

    def _free(self, req: _Req) -> None:
        self.what = f"free({req.rid!r})"
        self.alloc.free(req.rid)
        del self.live[req.rid]
        self.rids.remove(req.rid)
        self.after()

    def _commit(self, req: _Req) -> None:
        n = req.frontier()
        if req.pending:  # a later launch may still write the block the frontier is in
            n -= n % self.B
        if n <= req.computed:
            return
        if self.rng.random() < 0.2:
            n = self.rng.randint(req.computed + 1, n)
            if req.pending:
                n = max(req.computed, n - n % self.B)
                if n == req.computed:
                    return
        self.what = f"commit({req.rid!r}, {n})"
        self.alloc.commit(req.rid, n)
        req.computed = n
        self.f["commits"] += 1
        self.after()

    def _complete_one(self) -> None:
        if not self.flights:
            return
        rng = self.rng
        fl = rng.choice(self.flights)
        if fl.event is not None and rng.random() < 0.7:
            fl.event.done = True
            if rng.random() < 0.5:
                self.what = "reclaim()"
                self.alloc.reclaim()
                self.after()
            return
        self.what = f"complete() of {fl.name()}"
        fl.launch.complete()
        if not fl.launch.completed:
            self.fail(f"{fl.name()}: complete() returned but the launch is not completed")
        self._landed(fl, by_reclaim=False)
        self.after()

    def _preempt_for(self, keep: _Req | None) -> None:
        """Make room: complete a launch, or preempt another request."""
        if self.flights and self.rng.random() < 0.6:
            self._complete_one()
            return
        victim = self._pick(lambda r: r is not keep and r.reserved > 0, tries=6)
        if victim is not None:
            self._preempt(victim)

    def _preempt(self, req: _Req) -> None:
        self._free(req)
        self.f["preemptions"] += 1
        self._add(req.rid, list(req.tokens), req.max_len)

    # ---- the operations ------------------------------------------------------------------------
    def op_add(self) -> None:
        if len(self.live) >= self.max_requests:
            return
        rng = self.rng
        prompt = list(rng.choice(self.systems)) if rng.random() < 0.85 else []
        prompt += [rng.randrange(1, 30000) for _ in range(rng.randint(1, 3 * self.B))]
        rid = f"q{self.next_rid}"
        self.next_rid += 1
        self._add(rid, prompt, len(prompt) + rng.randint(1, 6 * self.B))

    def op_allocate(self) -> None:
        req = self._pick(lambda r: r.reserved < len(r.tokens))
        if req is None:
            return
        n = min(len(req.tokens), req.reserved + self.rng.randint(1, 2 * self.B))
        self.what = f"allocate({req.rid!r}, {n})"
        try:
            self.alloc.allocate(req.rid, n)
        except OutOfBlocks as err:
            self.refused(err)
            self._preempt_for(req)
            return
        if not req.started:  # the first call takes the prefix hits (it may cover them all)
            req.started = True
            req.computed = req.issued = self.alloc.num_computed(req.rid)
            n = max(n, req.computed)
            self.f["prefix_hit_tokens"] += req.computed
            self.f["first_allocations"] += 1
        req.reserved = n
        self.after()

    def op_append(self) -> None:
        req = self._pick(lambda r: r.reserved == r.issued == len(r.tokens) < r.max_len)
        if req is None:
            return
        tok = self.rng.randrange(1, 30000)
        self.what = f"append_tokens({req.rid!r}, [{tok}])"
        self.alloc.append_tokens(req.rid, [tok])
        req.tokens.append(tok)
        self.f["tokens_appended"] += 1
        self.after()

    def op_publish(self) -> None:
        if len(self.flights) >= self.max_inflight:
            self._complete_one()
            return
        rng = self.rng
        size = rng.randint(1, 6)
        batch: list[_Req] = []
        seen: set[str] = set()
        for rid in rng.sample(self.rids, min(len(self.rids), 10)):
            req = self.live[rid]
            if rid in seen or req.reserved == 0:
                continue
            if req.issued < req.reserved or rng.random() < 0.03:
                batch.append(req)
                seen.add(rid)
                if len(batch) == size:
                    break
        if not batch:
            return
        a = self.alloc
        rids = [r.rid for r in batch]
        self.what = f"publish({rids})"
        gens_before = a.block_generations().tolist()
        before = [set(a.block_table(r)) for r in rids]
        try:
            launch = a.publish(rids)
        except OutOfBlocks as err:
            self.refused(err)
            self._preempt_for(None)
            return
        self._sync()  # publish may reclaim: blocks of launches it completed may be reused
        no = self.next_launch = self.next_launch + 1
        blocks = self.validate(no, launch, batch, gens_before, before)
        self.f["copies"] += len(launch.copies)
        event = None
        if rng.random() < 0.5:
            event = FakeEvent()
            launch.record(event)
            self.f["events_recorded"] += 1
        fl = _Flight(no, launch, self.calls + 1, blocks, [], event)
        for req in batch:
            if req.issued < req.reserved:
                req.pending[no] = req.issued
                fl.writers.append(req)
                req.issued = req.reserved
        self._protect(fl)
        self.flights.append(fl)
        self.f["launches"] += 1
        self.f["max_inflight_seen"] = max(self.f["max_inflight_seen"], len(self.flights))
        self.after()
        if event is not None and rng.random() < 0.1:
            self.what = f"complete() of {fl.name()} (event recorded, not done)"
            if not fl.launch.completed:
                launch.complete()
                self._landed(fl, by_reclaim=False)
                self.after()

    def op_complete(self) -> None:
        self._complete_one()

    def op_reclaim(self) -> None:
        for fl in self.flights:
            if fl.event is not None and self.rng.random() < 0.5:
                fl.event.done = True
        self.what = "reclaim()"
        self.alloc.reclaim()
        self.after()

    def op_again(self) -> None:
        """complete() on a launch that already completed is refused."""
        if not self.done_launches:
            return
        launch = self.rng.choice(self.done_launches)
        self.what = "complete() of a completed launch"
        try:
            launch.complete()
        except LaunchAlreadyCompleted:
            self.f["already_completed_refusals"] += 1
        else:
            self.fail("complete() of an already completed launch was accepted")
        self.after()

    def op_commit(self) -> None:
        req = self._pick(lambda r: r.frontier() > r.computed)
        if req is not None:
            self._commit(req)

    def op_fork(self) -> None:
        if len(self.live) >= self.max_requests:
            return
        parent = self._pick(lambda r: r.started and r.reserved > 0)
        if parent is None:
            return
        child = f"{parent.rid}/{self.next_rid}"
        self.next_rid += 1
        self.what = f"fork({parent.rid!r}, {child!r})"
        try:
            self.alloc.fork(parent.rid, child)
        except OutOfBlocks as err:
            self.refused(err)
            return
        except GuardViolation as err:
            if not parent.pending:
                raise
            self.refused(err)  # the parent's writes are pending: expected
            return
        c = _Req(child, list(parent.tokens), parent.max_len)
        c.reserved, c.issued, c.computed, c.started = (
            parent.reserved, parent.issued, parent.computed, True)
        c.pending = dict(parent.pending)
        for fl in self.flights:
            if fl.no in c.pending:
                fl.writers.append(c)
        self.live[child] = c
        self.rids.append(child)
        self.f["forks"] += 1
        self.after()

    def op_truncate(self) -> None:
        """Speculative decoding: drop rejected draft positions, maybe while launches fly."""
        req = self._pick(lambda r: r.reserved > max(r.computed, 1))
        if req is None:
            return
        n = self.rng.randint(max(req.computed, 1), req.reserved)
        self.what = f"truncate({req.rid!r}, {n})"
        try:
            self.alloc.truncate(req.rid, n)
        except CommitError as err:  # the kept partial block is shared or being written
            self.refused(err)
            return
        req.reserved, req.issued = n, min(req.issued, n)
        del req.tokens[n:]
        req.pending = {no: first for no, first in req.pending.items() if first < n}
        self.f["truncations"] += 1
        self.after()

    def op_finish(self) -> None:
        req = self._pick(lambda r: r.issued == r.reserved == len(r.tokens) >= r.max_len, 8)
        if req is None:
            return
        if self.rng.random() < 0.5:
            self._commit(req)
        self._free(req)
        self.f["requests_finished"] += 1

    def op_abort(self) -> None:
        req = self._pick(lambda r: True)
        if req is not None:
            self._free(req)
            self.f["aborts"] += 1

    def op_preempt(self) -> None:
        if self.rng.random() < 0.5:
            return
        req = self._pick(lambda r: r.started)
        if req is not None:
            self._preempt(req)

    # ---- the run -------------------------------------------------------------------------------
    def step(self) -> None:
        """One random operation of the mix (zero, one or a few allocator calls)."""
        seq = self._seq
        seq[int(self.rng.random() * len(seq))]()

    def run(self, ops: int) -> dict[str, Any]:
        rng, seq = self.rng, self._seq
        n = len(seq)
        started = time.perf_counter()
        try:
            while self.calls < ops:
                seq[int(rng.random() * n)]()
            self.drain()
        except (SoakFailure, AssertionError):
            raise
        except AllocatorError as err:
            raise SoakFailure(
                f"call {self.calls + 1} ({self.what}): unexpected refusal "
                f"{type(err).__name__}: {err}") from err
        seconds = time.perf_counter() - started
        f = self.f
        f["ops"] = self.calls
        f["refusals"] = dict(sorted(self.refusals.items()))
        f["seconds"] = round(seconds, 3)
        f["ops_per_s"] = round(self.calls / seconds) if seconds > 0 else 0
        f["final_stats"] = self.alloc.stats()
        return f

    def drain(self) -> None:
        """Complete everything, commit, free every request: the pool must be all usable."""
        while self.flights:
            fl = self.flights[0]
            self.what = f"complete() of {fl.name()} (drain)"
            fl.launch.complete()
            self._landed(fl, by_reclaim=False)
            self.after()
        for req in list(self.live.values()):
            self._commit(req)
            self._free(req)
        self.scan()
        parts = stat_parts(self.alloc.stats())
        if parts["free"] + parts["cached"] != self.num_blocks:
            self.fail(f"after the drain not every block is free or cached: {parts}")


def run_soak(
    ops: int,
    seed: int,
    *,
    num_blocks: int = 64,
    block_size: int = 4,
    checked: bool = False,
    check_every: int = 1000,
    max_requests: int = 16,
    max_inflight: int = 6,
    make_allocator: Callable[..., BlockAllocator] = BlockAllocator,
) -> dict[str, Any]:
    """Run ``ops`` allocator calls of the random serving mix (seeded), checking the oracle after
    each; raise ``SoakFailure`` on the first unsafe state. Returns the figures."""
    soak = Soak(seed, num_blocks=num_blocks, block_size=block_size, checked=checked,
                check_every=check_every, max_requests=max_requests, max_inflight=max_inflight,
                make_allocator=make_allocator)
    return soak.run(ops)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pagedkv.proofs.soak", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ops", type=int, default=100_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-blocks", type=int, default=64)
    p.add_argument("--block-size", type=int, default=4)
    p.add_argument("--checked", action="store_true", help="the allocator's checked mode")
    p.add_argument("--check-every", type=int, default=1000)
    p.add_argument("--max-requests", type=int, default=16)
    p.add_argument("--max-inflight", type=int, default=6)
    args = p.parse_args(argv)
    try:
        figures = run_soak(args.ops, args.seed, num_blocks=args.num_blocks,
                           block_size=args.block_size, checked=args.checked,
                           check_every=args.check_every, max_requests=args.max_requests,
                           max_inflight=args.max_inflight)
    except AssertionError as err:
        print(f"FAIL (seed {args.seed}): {err}")
        return 1
    width = max(map(len, figures))
    for key, value in figures.items():
        print(f"{key:<{width}}  {value}")
    print(f"ok: {figures['ops']} calls at {figures['ops_per_s']} ops/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
