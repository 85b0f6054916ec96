"""The refinement test: BlockAllocator driven by hypothesis, the spec as the model.

Every allocator call records the spec transitions it performs (``pool.trace``); the machine
replays them on its own spec model, so each transition's guard must hold in the model and the
model's post-state must equal ``allocator.abstract()``. Refused calls must record nothing and
change nothing. All invariants are checked after every step. Misuse rules call the block-level
pool directly with arguments that break a guard and expect the typed error.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hypothesis import event, note
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from pagedkv.allocator import (
    AllocatorError,
    BlockAllocator,
    CommitError,
    DoubleFree,
    DuplicateRequest,
    GuardViolation,
    InvalidArgument,
    OutOfBlocks,
    PendingAccess,
    PublishError,
    UnknownRequest,
)
from pagedkv.allocator.hashing import chain_hashes
from pagedkv.allocator.table import blocks_needed
from pagedkv.spec import (
    ALLOCATED,
    CACHED,
    FREE,
    ISSUED,
    PUBLISHED,
    RECLAIMED,
    REFERENCED,
    WATERMARK,
    initial_state,
    launch_ids,
    live_instances,
    states_equal,
    step,
    violations,
)
from pagedkv.spec.requests import summary, tables

RIDS = ("r0", "r1", "r2", "r3", "r4")
LIVE = "__live__:"  # CAMPAIGN key prefix: live instances of each invariant (sampled steps)
LIVE_EVERY = 10

# Campaign statistics, read by ``pagedkv verify``: "rule: outcome" labels and the step count.
CAMPAIGN: Counter[str] = Counter()
STEPS = "__steps__"
step_hook: Callable[[], None] | None = None


def _event(label: str) -> None:
    event(label)
    CAMPAIGN[label] += 1
SHARED_PREFIX = list(range(100, 132))


class FakeEvent:
    """Stands in for torch.cuda.Event: ``query()`` turns True when the test says so."""

    def __init__(self) -> None:
        self.done = False

    def query(self) -> bool:
        return self.done


@dataclass
class Expect:
    """What the machine knows of a live request, independent of the allocator."""

    tokens: list[int]
    salt: str | None
    reserved: int = 0
    issued: int = 0
    computed: int = 0
    started: bool = False
    table_len: int = 0
    launches: list[Any] = field(default_factory=list)


class AllocatorMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.alloc: BlockAllocator | None = None

    # ---- set-up -------------------------------------------------------------------------------
    @initialize(
        num_blocks=st.integers(6, 16),
        block_size=st.sampled_from([1, 2, 4]),
        prefix_caching=st.booleans(),
        checked=st.sampled_from([True, True, False]),
    )
    def setup(self, num_blocks: int, block_size: int, prefix_caching: bool, checked: bool):
        self.alloc = BlockAllocator(
            num_blocks, block_size, prefix_caching=prefix_caching, checked=checked
        )
        self.alloc.pool.trace = []
        self.B = block_size
        self.model = initial_state(num_blocks, block_size)
        self.expect: dict[str, Expect] = {}
        self.launches: list[Any] = []
        self.events: dict[int, FakeEvent] = {}
        self.fired = {"events": 0}
        initial = self.alloc.abstract()
        assert states_equal(initial.pool, self.model) == [], "initial state differs from spec"
        assert violations(initial.pool, initial.requests) == []

    # ---- the refinement check -----------------------------------------------------------------
    def _replay(self) -> None:
        trace = self.alloc.pool.trace
        for name, params in trace:
            if name == "open_holder":
                self.model = self.model.replace(
                    holder_ids=tuple(self.model.holder_ids) + (params["r"],)
                )
            post = step(self.model, name, **params)
            assert post is not None, f"{name}{params}: the spec's guard does not hold"
            self.model = post
            if name == "close_holder":
                self.model = self.model.replace(
                    holder_ids=tuple(r for r in self.model.holder_ids if r != params["r"])
                )
        trace.clear()
        diffs = states_equal(self.model, self.alloc.abstract().pool)
        assert not diffs, f"implementation and spec disagree: {diffs[:5]}"

    def _refused(self, call, error: type[BaseException] = AllocatorError) -> BaseException:
        """The call must raise ``error`` and change nothing."""
        before = self.alloc.abstract()
        try:
            call()
        except error as exc:
            assert self.alloc.pool.trace == [], f"refused call performed {self.alloc.pool.trace}"
            after = self.alloc.abstract()
            assert states_equal(before.pool, after.pool) == [], "refused call changed the pool"
            assert summary(before.requests) == summary(after.requests), (
                "refused call changed a request")
            return exc
        raise AssertionError(f"expected {error.__name__}")

    def _past_watermark(self, b: int) -> bool:
        """Every launch that may have read b's content has completed (spec: its retire clock
        is at or below the watermark)."""
        return self.model.retire[b] <= self.model.clock[WATERMARK]

    def _usable(self) -> int:
        m = self.model
        cached_idle = sum(
            1 for b in m.block_ids if m.state[b] == CACHED and self._past_watermark(b)
        )
        return m.count[FREE] + cached_idle

    def _revived(self, hits: list[int]) -> int:
        """Hits that take a block allocations could otherwise use (idle CACHED ones)."""
        return sum(1 for b in hits
                   if self.model.state[b] == CACHED and self._past_watermark(b))

    def _hits(self, e: Expect) -> list[int]:
        """The prefix hits the first allocate takes: all of them, whatever the first chunk."""
        if not self.alloc.prefix_caching:
            return []
        limit = len(e.tokens) - 1
        hashes = chain_hashes(e.tokens[: max(0, limit)], self.B, salt=e.salt)
        out = []
        for h in hashes:
            b = self.model.hmap[h]
            if b < 0:
                break
            out.append(b)
        return out

    # ---- request rules ------------------------------------------------------------------------
    @precondition(lambda self: self.alloc is not None and len(self.expect) < len(RIDS))
    @rule(
        data=st.data(),
        shared=st.integers(0, 9),
        tail=st.lists(st.integers(0, 3), max_size=3),
        salt=st.sampled_from([None, None, "tenant-a"]),
    )
    def add_request(self, data, shared: int, tail: list[int], salt: str | None):
        rid = data.draw(st.sampled_from([r for r in RIDS if r not in self.expect]))
        self._add(rid, shared, tail, salt)

    def duplicate_add(self, data):
        rid = data.draw(st.sampled_from(sorted(self.expect) or list(RIDS)))
        self._add(rid, 2, [1], None)

    def _add(self, rid: str, shared: int, tail: list[int], salt: str | None) -> None:
        tokens = SHARED_PREFIX[:shared] + tail or [0]
        if rid in self.expect:
            self._refused(lambda: self.alloc.add_request(rid, tokens), DuplicateRequest)
            _event("add_request: duplicate refused")
            return
        e = Expect(tokens, salt)
        cached = self.alloc.add_request(rid, tokens, cache_salt=salt)
        assert cached == len(self._hits(e)) * self.B
        assert cached < len(tokens)
        _event("add_request: ok" + (" with cached prefix" if cached else ""))
        self.expect[rid] = e
        self._replay()

    @precondition(lambda self: self.alloc is not None and self.expect)
    @rule(data=st.data())
    def allocate(self, data):
        rid = data.draw(st.sampled_from(sorted(self.expect)))
        e = self.expect[rid]
        n = e.reserved + data.draw(st.integers(0, 3 * self.B))
        before = self.alloc.block_table(rid)
        hits = [] if e.started else self._hits(e)
        asked, n = n, max(n, len(hits) * self.B)  # a first chunk smaller than the hits
        need = blocks_needed(n, self.B) - e.table_len - len(hits)
        revived = self._revived(hits)
        # Events only turn done in event_fires, which reclaims at once: the spec's room is
        # exactly what the allocator can take.
        if need > self._usable() - revived:
            self._refused(lambda: self.alloc.allocate(rid, asked), OutOfBlocks)
            _event("allocate: OutOfBlocks")
            return
        table = self.alloc.allocate(rid, asked)
        self._replay()
        self._sync_launches()
        assert table[: len(before)] == before, "growth must only append"
        assert len(table) == blocks_needed(n, self.B)
        assert table[len(before) : len(before) + len(hits)] == hits
        if not e.started:
            e.started = True
            e.computed = e.issued = len(hits) * self.B
        e.reserved, e.table_len = n, len(table)
        assert self.alloc.num_computed(rid) == e.computed
        _event("allocate: ok" + (" with prefix hits" if hits else "")
               + (" (first chunk smaller than the hits)" if asked < n else ""))

    def shrink_refused(self, data):
        rid = data.draw(st.sampled_from(sorted(r for r, e in self.expect.items() if e.reserved)))
        e = self.expect[rid]
        self._refused(lambda: self.alloc.allocate(rid, e.reserved - 1), InvalidArgument)
        _event("shrink refused")

    @precondition(lambda self: self.alloc is not None and self.expect)
    @rule(data=st.data(), extra=st.lists(st.integers(0, 3), min_size=1, max_size=4))
    def append_tokens(self, data, extra):
        rid = data.draw(st.sampled_from(sorted(self.expect)))
        self.alloc.append_tokens(rid, extra)
        self.expect[rid].tokens += extra
        self._replay()

    @precondition(lambda self: self.alloc is not None and any(
        e.reserved > max(e.computed, 1) for e in self.expect.values()))
    @rule(data=st.data())
    def truncate(self, data):
        """Speculative decoding: drop rejected lookahead positions (spec: release, rewind)."""
        rid = data.draw(st.sampled_from(sorted(
            r for r, e in self.expect.items() if e.reserved > max(e.computed, 1))))
        e = self.expect[rid]
        n = data.draw(st.integers(max(e.computed, 1), e.reserved))
        table = self.alloc.block_table(rid)
        keep = blocks_needed(n, self.B)
        k = n - (keep - 1) * self.B
        tail = table[keep - 1] if n % self.B and n < e.issued else None
        if tail is not None and self.model.filled[tail] > k and step(
                self.model, "rewind", b=tail, r=rid, k=k) is None:
            self._refused(lambda: self.alloc.truncate(rid, n), CommitError)
            _event("truncate: refused (kept block shared or being written)")
            return
        out = self.alloc.truncate(rid, n)
        self._replay()
        assert out == table[:keep]
        e.reserved, e.issued, e.table_len = n, min(e.issued, n), keep
        del e.tokens[n:]
        _event("truncate: ok" + (" (rewound a kept block)" if tail is not None else ""))

    def publish_nothing_allocated(self, data):
        empty = sorted(r for r, e in self.expect.items() if e.reserved == 0)
        if empty:
            rid = data.draw(st.sampled_from(empty))
            self._refused(lambda: self.alloc.publish([rid]), InvalidArgument)
            _event("publish: refused (nothing allocated)")

    @precondition(lambda self: any(e.reserved > 0 for e in self.expect.values()))
    @rule(data=st.data())
    def publish(self, data):
        ready = sorted(r for r, e in self.expect.items() if e.reserved > 0)
        rids = data.draw(st.lists(st.sampled_from(ready), min_size=1, max_size=3, unique=True))
        unknown = any(self.expect[r].reserved > len(self.expect[r].tokens) for r in rids)
        try:
            launch = self.alloc.publish(rids)
        except OutOfBlocks:
            self._replay()
            return
        self._replay()
        self._sync_launches()
        for k, r in enumerate(rids):
            e = self.expect[r]
            assert launch.seq_lens[k] == e.reserved
            assert launch.query_lens[k] == e.reserved - e.issued
            e.issued = e.reserved
            e.launches.append(launch)
        assert len(launch.slot_mapping) == int(launch.query_lens.sum())
        assert (launch.slot_mapping >= 0).all()
        assert len(set(launch.slot_mapping.tolist())) == len(launch.slot_mapping)
        launch.check_current()
        self.launches.append(launch)
        _event("publish: ok" + (" with copy-on-write" if len(launch.copies) else "")
               + (" (token ids not known yet)" if unknown else ""))

    def _sync_launches(self) -> None:
        """Launches the allocator completed itself (through recorded events at reclaim)."""
        self.launches = [launch for launch in self.launches if not launch.completed]

    @precondition(lambda self: self.alloc is not None and self.launches)
    @rule(data=st.data(), late=st.booleans())
    def complete_launch(self, data, late: bool):
        launch = data.draw(st.sampled_from(self.launches))
        if late:  # record an event that turns done later; reclaim() completes it
            ev = FakeEvent()
            launch.record(ev)
            self.events[len(self.events) + sum(self.fired.values())] = ev  # stable keys
            self.alloc.reclaim()
            assert not launch.completed
            self._replay()
            _event("complete_launch: event recorded (late)")
            return
        pending_before = len(self._reclaimed_pending())
        launch.complete()
        self.launches.remove(launch)
        self._replay()
        if len(self._reclaimed_pending()) < pending_before:
            _event("complete_launch: recycled after late completion")
        self._refused(launch.complete, AllocatorError)
        _event("complete_launch: now")

    @precondition(lambda self: self.alloc is not None and self.events)
    @rule(data=st.data())
    def event_fires(self, data):
        key = data.draw(st.sampled_from(sorted(self.events)))
        self.events.pop(key).done = True
        self.fired["events"] += 1
        freed = self.alloc.reclaim()
        assert freed >= 0
        _event("event_fires: " + ("recycled after late completion" if freed else "no recycle"))
        self._replay()
        self._sync_launches()

    @precondition(lambda self: self.alloc is not None and self.expect)
    @rule(data=st.data())
    def commit(self, data):
        rid = data.draw(st.sampled_from(sorted(self.expect)))
        e = self.expect[rid]
        n = data.draw(st.integers(max(0, e.computed - 1), e.reserved + 1))
        if not self._commit_ok(rid, e, n):
            self._refused(lambda: self.alloc.commit(rid, n), CommitError)
            _event("commit: refused")
            return
        cached_before = self.model.count[REFERENCED]
        self.alloc.commit(rid, n)
        e.computed = n
        self._replay()
        grew = self.model.count[REFERENCED] > cached_before
        _event("commit: ok" + (" (blocks entered the cache)" if grew else ""))

    def _commit_ok(self, rid: str, e: Expect, n: int) -> bool:
        if n < e.computed or n > e.issued or n > len(e.tokens):
            return False
        m, table = self.model, self.alloc.block_table(rid)
        for i in range(e.computed // self.B, blocks_needed(n, self.B)):
            b = table[i]
            upto = min(self.B, n - i * self.B)
            if m.state[b] != REFERENCED and not (m.filled[b] >= upto and m.wpend[b] == 0):
                return False
        return True

    @precondition(lambda self: self.alloc is not None and 0 < len(self.expect) < len(RIDS))
    @rule(data=st.data())
    def fork(self, data):
        parent = data.draw(st.sampled_from(sorted(self.expect)))
        child = data.draw(st.sampled_from([r for r in RIDS if r not in self.expect]))
        self.fork_child(parent, child)

    def _fork_allowed(self, parent: str, child: str) -> bool:
        """The spec's answer: the child can share every written block of the parent (the
        share guard, with the child's table open) and take a fresh one for each block never
        handed to a kernel (ALLOCATED)."""
        m = self.model
        if self.expect[parent].issued > len(self.expect[parent].tokens):
            return False  # KV of token ids nobody has seen is never shared
        opened = step(m.replace(holder_ids=(*m.holder_ids, child)), "open_holder", r=child)
        table = self.alloc.block_table(parent)
        fresh = sum(1 for b in table if m.state[b] == ALLOCATED)
        shared_ok = all(step(opened, "share", b=b, r=child) is not None
                        for b in table if m.state[b] != ALLOCATED)
        return shared_ok and fresh <= self._usable()

    def fork_child(self, parent: str, child: str) -> None:
        allowed = self._fork_allowed(parent, child)
        try:
            table = self.alloc.fork(parent, child)
        except AllocatorError as exc:
            assert not allowed, f"the spec allows fork({parent!r}, {child!r}); refused: {exc}"
            self.alloc.pool.trace.clear()  # open/close of the child cancel out
            self._replay()
            assert child not in self.alloc.requests
            _event("fork: refused")
            return
        assert allowed, f"fork({parent!r}, {child!r}) succeeded where the spec refuses"
        self._replay()
        p = self.expect[parent]
        self.expect[child] = Expect(
            list(p.tokens), p.salt, p.reserved, p.issued, p.computed, p.started, len(table)
        )
        _event("fork: ok")

    @precondition(lambda self: self.alloc is not None and self.expect)
    @rule(data=st.data(), readmit=st.booleans())
    def free(self, data, readmit: bool):
        """Finish a request, or preempt it (free + re-add, which re-hits the cached prefix)."""
        rid = data.draw(st.sampled_from(sorted(self.expect)))
        e = self.expect.pop(rid)
        self.alloc.free(rid)
        self._replay()
        self._refused(lambda: self.alloc.free(rid), UnknownRequest)
        if readmit:
            e2 = Expect(list(e.tokens), e.salt)
            cached = self.alloc.add_request(rid, e.tokens, cache_salt=e.salt)
            assert cached == len(self._hits(e2)) * self.B
            self.expect[rid] = e2
            self._replay()
            _event("free: preempted" + (", prefix re-hit" if cached else ""))
        else:
            _event("free: finished")

    @precondition(lambda self: self.alloc is not None and self.expect)
    @rule(data=st.data(), finish=st.sampled_from(["complete", "complete", "in flight"]))
    def serve_step(self, data, finish: str):
        """One engine step for a request: cover its known tokens, launch, and usually complete,
        commit and sample a token. Steers toward commits, cache hits and copy-on-write."""
        rid = data.draw(st.sampled_from(sorted(self.expect)))
        e = self.expect[rid]
        if e.reserved > len(e.tokens):  # sample the tokens the allocated positions will hold
            extra = data.draw(st.lists(st.integers(0, 3), min_size=e.reserved - len(e.tokens),
                                       max_size=e.reserved - len(e.tokens)))
            self.alloc.append_tokens(rid, extra)
            e.tokens += extra
        target = max(e.reserved, len(e.tokens))
        if target > e.reserved:
            hits = [] if e.started else self._hits(e)
            target = max(target, len(hits) * self.B)
            need = blocks_needed(target, self.B) - e.table_len - len(hits)
            revived = self._revived(hits)
            if need > self._usable() - revived:
                _event("serve_step: no room")
                return
            self.allocate_exact(rid, target)
        try:
            launch = self.alloc.publish([rid])
        except OutOfBlocks:
            self._replay()
            _event("serve_step: no room for copy-on-write")
            return
        self._replay()
        if len(launch.copies):
            _event("serve_step: copy-on-write")
        e.issued = e.reserved
        if finish == "in flight":
            self.launches.append(launch)
            _event("serve_step: left in flight")
            return
        launch.complete()
        self._replay()
        cached_before = self.model.count[REFERENCED]
        if self._commit_ok(rid, e, e.issued):
            self.alloc.commit(rid, e.issued)
            e.computed = e.issued
            self._replay()
        token = data.draw(st.integers(0, 3))
        self.alloc.append_tokens(rid, [token])
        e.tokens.append(token)
        _event("serve_step: served" + (
            ", blocks entered the cache" if self.model.count[REFERENCED] > cached_before else ""))

    def allocate_exact(self, rid: str, n: int) -> None:
        e = self.expect[rid]
        hits = [] if e.started else self._hits(e)
        table = self.alloc.allocate(rid, n)
        self._replay()
        n = max(n, len(hits) * self.B)
        assert len(table) == blocks_needed(n, self.B)
        if not e.started:
            e.started = True
            e.computed = e.issued = len(hits) * self.B
            if hits:
                _event("serve_step: prefix hits taken")
        e.reserved, e.table_len = n, len(table)

    def _cow_candidates(self) -> list[str]:
        return [r for r, e in self.expect.items()
                if e.issued % self.B and e.issued == e.reserved == e.computed]

    @precondition(lambda self: len(self.expect) < len(RIDS) and self._cow_candidates())
    @rule(data=st.data(), token=st.integers(0, 3))
    def fork_then_write(self, data, token: int):
        """Fork a request whose last block is partial, then write the child's next token: the
        shared partial block must be copied (copy-on-write), never written in place."""
        parent = data.draw(st.sampled_from(sorted(self._cow_candidates())))
        child = data.draw(st.sampled_from([r for r in RIDS if r not in self.expect]))
        self.fork_child(parent, child)
        if child not in self.expect:
            return
        e = self.expect[child]
        shared_block = self.alloc.block_table(child)[e.issued // self.B]
        self.alloc.append_tokens(child, [token])
        e.tokens.append(token)
        if self._usable() < 1:
            _event("fork_then_write: no room")
            return
        self.allocate_exact(child, e.reserved + 1)
        try:
            launch = self.alloc.publish([child])
        except OutOfBlocks:
            self._replay()
            _event("fork_then_write: no room for the copy")
            return
        self._replay()
        e.issued = e.reserved
        assert launch.copies.tolist() == [[shared_block, self.alloc.block_table(child)[
            (e.reserved - 1) // self.B]]], "a shared partial block was not copied"
        assert self.model.ref[shared_block] >= 1
        self.launches.append(launch)
        _event("fork_then_write: copy-on-write")

    @precondition(lambda self: any(not launch.completed for launch in self.launches))
    @rule(data=st.data())
    def free_while_in_flight(self, data):
        """Finish a request whose launch is still running: its blocks must wait to recycle."""
        live = [r for launch in self.launches if not launch.completed for r in launch.rids
                if r in self.expect]
        if not live:
            return
        rid = data.draw(st.sampled_from(sorted(set(live))))
        self.expect.pop(rid)
        self.alloc.free(rid)
        self._replay()
        pending = len(self._reclaimed_pending())
        _event("free_while_in_flight" + (": blocks wait for the launch" if pending else ""))

    def bad_arguments(self, data):
        rid = data.draw(st.sampled_from(RIDS))
        n = data.draw(st.sampled_from([-1, 1.5, True]))
        if rid in self.expect:
            self._refused(lambda: self.alloc.allocate(rid, n), InvalidArgument)
            self._refused(lambda: self.alloc.commit(rid, n), InvalidArgument)
        else:
            self._refused(lambda: self.alloc.allocate(rid, 1), UnknownRequest)
            self._refused(lambda: self.alloc.publish([rid]), UnknownRequest)
        _event("bad_arguments refused")

    # ---- block-level rules: legal pool operations and misuse -----------------------------------
    def evict_or_recycle(self, data):
        """Direct pool calls that keep request tables intact: succeed exactly when the
        spec's guard holds."""
        cached = [b for b in self.model.block_ids if self.model.state[b] == CACHED]
        if cached and data.draw(st.booleans()):  # steer toward evictions that are allowed
            b = data.draw(st.sampled_from(cached))
        else:
            b = data.draw(st.integers(0, self.alloc.num_blocks - 1))
        name = data.draw(st.sampled_from(["evict", "recycle"]))
        call = getattr(self.alloc.pool, name)
        if step(self.model, name, b=b) is None:
            self._refused(lambda: call(b), AllocatorError)
            _event(f"pool.{name}: refused")
        else:
            call(b)
            self._replay()
            _event(f"pool.{name}: ok")

    def _reclaimed_pending(self) -> list[int]:
        m = self.model
        return [b for b in m.block_ids if m.state[b] == RECLAIMED
                and (not self._past_watermark(b) or m.wpend[b] > 0)]

    def _draw_unheld(self, data) -> tuple[str, int]:
        """A (holder, block) pair where the holder (maybe an unknown one) lacks the block."""
        r = data.draw(st.sampled_from(sorted(self.expect) + ["ghost"]))
        held = set(self.alloc.block_table(r)) if r in self.expect else set()
        choices = [b for b in range(self.alloc.num_blocks) if b not in held]
        if not choices:
            r, choices = "ghost", list(range(self.alloc.num_blocks))
        return r, data.draw(st.sampled_from(choices))

    def double_free(self, data):
        """Release a block the holder does not hold: DoubleFree, nothing changes."""
        r, b = self._draw_unheld(data)
        self._refused(lambda: self.alloc.pool.release(b, r), DoubleFree)
        _event(f"double_free refused ({'freed' if self.model.ref[b] == 0 else 'held by another'})")

    def recycle_while_pending(self, data):
        b = data.draw(st.sampled_from(self._reclaimed_pending()))
        self._refused(lambda: self.alloc.pool.recycle(b), PendingAccess)
        _event("recycle_while_pending refused")

    def publish_unowned(self, data):
        """Hand a kernel a block the request does not hold (maybe not even initialized)."""
        r, b = self._draw_unheld(data)
        if data.draw(st.booleans()):
            self._refused(lambda: self.alloc.pool.publish(b, r), PublishError)
        else:
            self._refused(lambda: self.alloc.pool.begin_write(b, r, 1), PublishError)
        _event("publish_unowned refused")

    def launch_misnumbered(self, data):
        """A launch must take the next number, and only an in-flight launch completes."""
        issued = self.model.clock[ISSUED]
        if data.draw(st.booleans()):
            L = data.draw(st.sampled_from([issued + 1, max(0, issued - 1), issued + 7]))
            if L != issued:
                self._refused(lambda: self.alloc.pool.launch(L), GuardViolation)
        else:
            inflight = {launch.seq for launch in self.launches if not launch.completed}
            L = data.draw(st.sampled_from(sorted({0, issued, issued + 3} - inflight)))
            self._refused(lambda: self.alloc.pool.complete(L), GuardViolation)
        _event("launch_misnumbered refused")

    def allocate_taken_block(self, data):
        taken = [b for b in self.model.block_ids if self.model.state[b] != FREE]
        b = data.draw(st.sampled_from(taken))
        r = data.draw(st.sampled_from(sorted(self.expect)))
        self._refused(lambda: self.alloc.pool.allocate(b, r), AllocatorError)
        _event("allocate_taken_block refused")

    # ---- invariants ---------------------------------------------------------------------------
    def _misuse_kinds(self) -> list[str]:
        kinds = ["double_free", "publish_unowned", "bad_arguments", "evict_or_recycle",
                 "launch_misnumbered"]
        if self._reclaimed_pending():
            kinds.append("recycle_while_pending")
        if self.expect:
            kinds += ["duplicate_add", "publish_nothing_allocated"]
            if any(self.model.state[b] != FREE for b in self.model.block_ids):
                kinds.append("allocate_taken_block")
            if any(e.reserved > 0 for e in self.expect.values()):
                kinds.append("shrink_refused")
        return kinds

    @precondition(lambda self: self.alloc is not None)
    @rule(data=st.data())
    def misuse(self, data):
        """One call that breaks a guard or the API's rules: the typed error, nothing changes."""
        kind = data.draw(st.sampled_from(self._misuse_kinds()))
        getattr(self, kind)(data)

    @invariant()
    def all_invariants_hold(self):
        if self.alloc is None:
            return
        CAMPAIGN[STEPS] += 1
        if step_hook is not None:
            step_hook()
        self.alloc.check_invariants()
        a = self.alloc.abstract()
        if CAMPAIGN[STEPS] % LIVE_EVERY == 0:
            for name, n in live_instances(a.pool, a.requests).items():
                CAMPAIGN[LIVE + name] += n
        spec_tables = tables(a.requests)
        assert set(spec_tables) == set(self.expect)
        for rid, (entries, reserved, computed) in spec_tables.items():
            e = self.expect[rid]
            assert (reserved, computed) == (e.reserved, e.computed), rid
            assert len(entries) == e.table_len
        counts = self.alloc.stats()
        m = self.model
        assert counts["free"] == m.count[FREE]
        assert counts["held"] == m.count[ALLOCATED] + m.count[PUBLISHED] + m.count[REFERENCED]
        busy = sum(1 for b in m.block_ids if m.state[b] == CACHED and not self._past_watermark(b))
        assert counts["cached"] == m.count[CACHED]
        assert counts["evictable_after_launches"] == busy
        assert counts["allocatable_now"] == self._usable()
        assert counts["waiting_on_launches"] == m.count[RECLAIMED] + busy
        assert counts["inflight_launches"] == sum(1 for L in launch_ids(m) if m.inflight[L])
        assert counts["occupancy_tokens"] == sum(e.reserved for e in self.expect.values())
        assert counts["occupancy_blocks"] == sum(e.table_len for e in self.expect.values())
        # Reclamation is eager: the watermark is as far as the spec lets it go, and every
        # block the spec lets recycle is FREE (nothing waits longer than its readers).
        assert step(m, "advance") is None, "the watermark lags behind completed launches"
        stuck = [b for b in m.block_ids
                 if m.state[b] == RECLAIMED and step(m, "recycle", b=b) is not None]
        assert not stuck, f"blocks {stuck} could be recycled but are not"
        note(f"counts={counts}")

    def teardown(self):
        if self.alloc is not None:
            for launch in list(self.launches):
                if not launch.completed:
                    launch.complete()
            self.alloc.check_invariants()


TestAllocatorMachine = AllocatorMachine.TestCase
