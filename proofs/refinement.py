"""The refinement test: BlockAllocator driven by hypothesis, the spec as the model.

Every allocator call records the spec transitions it performs (``pool.trace``); the machine
replays them on its own spec model, so each transition's guard must hold in the model and the
model's post-state must equal ``allocator.abstract()``. Refused calls must record nothing and
change nothing. All invariants are checked after every step. Misuse rules call the block-level
pool directly with arguments that break a guard and expect the typed error.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from hypothesis import event, note
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from pagedkv.allocator import (
    AllocatorError,
    BlockAllocator,
    DoubleFree,
    DuplicateRequest,
    GuardViolation,
    InvalidArgument,
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
    Transition,
    initial_state,
    launch_ids,
    live_instances,
    states_equal,
    step,
    violations,
)
from pagedkv.spec.calls import CallRefused, run_call
from pagedkv.spec.request_spec import as_request_spec
from pagedkv.spec.requests import count, summary, tables

from .call_refinement import CallModel

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
    """What the machine knows of a live request, independent of the allocator: its tokens
    (the spec's programs take the chain values computed from them) and its launches."""

    tokens: list[int]
    salt: str | None
    launches: list[Any] = field(default_factory=list)


class AllocatorMachine(RuleBasedStateMachine):
    # The pool transitions the allocator enforces and the machine's model runs (None: the spec
    # as written); ``for_spec`` makes a machine over a changed one (the canaries' weakened
    # guards), with nothing patched.
    spec: ClassVar[Mapping[str, Transition] | None] = None

    @classmethod
    def for_spec(cls, spec: Mapping[str, Transition] | None) -> type[AllocatorMachine]:
        return type(f"{cls.__name__}ForSpec", (cls,), {"spec": spec})

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
            num_blocks, block_size, prefix_caching=prefix_caching, checked=checked,
            spec=self.spec,
        )
        self.alloc.pool.trace = []
        self.B = block_size
        self.model = initial_state(num_blocks, block_size)
        self.calls = CallModel(self.alloc, as_request_spec(self.spec))
        self.expect: dict[str, Expect] = {}
        self.launches: list[Any] = []
        self.events: dict[int, FakeEvent] = {}
        self.fired = {"events": 0}
        initial = self.alloc.abstract()
        assert states_equal(initial.pool, self.model) == [], "initial state differs from spec"
        assert violations(initial.pool, initial.requests) == []

    # ---- the refinement checks ----------------------------------------------------------------
    def _replay(self) -> None:
        """Pool level: each recorded pool transition's guard holds in the machine's own pool
        model, and the model ends where the allocator's pool is."""
        trace = self.alloc.pool.trace
        for name, params in trace:
            if name == "open_holder":
                self.model = self.model.replace(
                    holder_ids=tuple(self.model.holder_ids) + (params["r"],)
                )
            post = step(self.model, name, self.spec, **params)
            assert post is not None, f"{name}{params}: the spec's guard does not hold"
            self.model = post
            if name == "close_holder":
                self.model = self.model.replace(
                    holder_ids=tuple(r for r in self.model.holder_ids if r != params["r"])
                )
        trace.clear()
        diffs = states_equal(self.model, self.alloc.abstract().pool)
        assert not diffs, f"implementation and spec disagree: {diffs[:5]}"

    def _call(self, call: str, args: tuple[Any, ...], do: Callable[[], Any],
              error: type[BaseException] = AllocatorError) -> tuple[bool, Any]:
        """Call level, both directions: ``do`` succeeds exactly when the program of ``call``
        in ``spec.calls`` can run, and ends where it does; a refusal raises ``error`` and
        changes nothing. Then the pool-level replay. Returns (succeeded, value or error)."""
        before = self.alloc.abstract()
        out = self.calls.check(call, args, do)
        if isinstance(out, AllocatorError):
            assert isinstance(out, error), f"{call}{args!r}: expected {error.__name__}: {out!r}"
            self._unchanged(before, f"refused {call}")
            return False, out
        self._replay()
        return True, out

    def _unchanged(self, before: Any, what: str) -> None:
        assert self.alloc.pool.trace == [], f"{what} performed {self.alloc.pool.trace}"
        after = self.alloc.abstract()
        assert states_equal(before.pool, after.pool) == [], f"{what} changed the pool"
        assert summary(before.requests) == summary(after.requests), f"{what} changed a request"

    def _refused(self, call, error: type[BaseException] = AllocatorError) -> BaseException:
        """A call outside the request programs (a direct pool call, a bad argument) must
        raise ``error`` and change nothing."""
        before = self.alloc.abstract()
        try:
            call()
        except error as exc:
            self._unchanged(before, "refused call")
            return exc
        raise AssertionError(f"expected {error.__name__}")

    def _pos(self, rid: str, name: str) -> int:
        """A position of rid (reserved, issued, computed, known) in the spec's state."""
        return count(self.calls.state, name, rid)

    def _table_len(self, rid: str) -> int:
        return self.calls.state.tlen[rid]

    def _chain(self, e: Expect) -> list[int]:
        return chain_hashes(e.tokens, self.B, salt=e.salt)

    def _past_watermark(self, b: int) -> bool:
        """Every launch that may have read b's content has completed (spec: its retire clock
        is at or below the watermark)."""
        return self.model.retire[b] <= self.model.clock[WATERMARK]

    def _usable(self) -> int:
        """What ``stats()['allocatable_now']`` must say: FREE and idle CACHED blocks."""
        m = self.model
        cached_idle = sum(
            1 for b in m.block_ids if m.state[b] == CACHED and self._past_watermark(b)
        )
        return m.count[FREE] + cached_idle

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
        e = Expect(tokens, salt)
        ok, cached = self._call(
            "add_request", (rid, len(tokens), self._chain(e)),
            lambda: self.alloc.add_request(rid, tokens, cache_salt=salt), DuplicateRequest)
        if not ok:
            _event("add_request: duplicate refused")
            return
        assert cached == self.calls.last.result, "cached prefix differs from the spec's hits"
        assert cached < len(tokens)
        _event("add_request: ok" + (" with cached prefix" if cached else ""))
        self.expect[rid] = e

    def _allocate(self, rid: str, n: int, label: str) -> bool:
        before = self.alloc.block_table(rid)
        empty = not before
        ok, table = self._call("allocate", (rid, n), lambda: self.alloc.allocate(rid, n))
        if not ok:
            _event(f"{label}: OutOfBlocks")
            return False
        assert table[: len(before)] == before, "growth must only append"
        hits = empty and self._pos(rid, "computed") > 0
        _event(f"{label}: ok" + (" with prefix hits" if hits else "")
               + (" (first chunk smaller than the hits)" if n < self._pos(rid, "reserved")
                  else ""))
        return True

    @precondition(lambda self: self.alloc is not None and self.expect)
    @rule(data=st.data())
    def allocate(self, data):
        rid = data.draw(st.sampled_from(sorted(self.expect)))
        self._allocate(rid, self._pos(rid, "reserved") + data.draw(st.integers(0, 3 * self.B)),
                       "allocate")

    def shrink_refused(self, data):
        rid = data.draw(st.sampled_from(sorted(
            r for r in self.expect if self._pos(r, "reserved"))))
        n = self._pos(rid, "reserved") - 1
        self._call("allocate", (rid, n), lambda: self.alloc.allocate(rid, n), InvalidArgument)
        _event("shrink refused")

    def _append(self, rid: str, extra: list[int]) -> None:
        e = self.expect[rid]
        tokens = e.tokens + extra
        ok, _ = self._call("append_tokens", (rid, len(tokens), chain_hashes(
            tokens, self.B, salt=e.salt)), lambda: self.alloc.append_tokens(rid, extra))
        assert ok
        e.tokens = tokens

    @precondition(lambda self: self.alloc is not None and self.expect)
    @rule(data=st.data(), extra=st.lists(st.integers(0, 3), min_size=1, max_size=4))
    def append_tokens(self, data, extra):
        self._append(data.draw(st.sampled_from(sorted(self.expect))), extra)

    def _truncatable(self) -> list[str]:
        return sorted(r for r in self.expect
                      if self._pos(r, "reserved") > max(self._pos(r, "computed"), 1))

    @precondition(lambda self: self.alloc is not None and self._truncatable())
    @rule(data=st.data())
    def truncate(self, data):
        """Speculative decoding: drop rejected lookahead positions (spec: release, rewind)."""
        rid = data.draw(st.sampled_from(self._truncatable()))
        n = data.draw(st.integers(self._pos(rid, "computed") - 1, self._pos(rid, "reserved")))
        table = self.alloc.block_table(rid)
        keep = blocks_needed(max(n, 0), self.B)
        rewound = 0 < keep and self.model.filled[table[keep - 1]] > n - (keep - 1) * self.B
        ok, out = self._call("truncate", (rid, n), lambda: self.alloc.truncate(rid, n))
        if not ok:
            _event("truncate: refused" + (" (below computed or none kept)" if n < max(
                1, self._pos(rid, "computed")) else " (kept block shared or being written)"))
            return
        assert out == table[: len(out)]
        del self.expect[rid].tokens[n:]
        _event("truncate: ok" + (" (rewound a kept block)" if rewound else ""))

    def publish_nothing_allocated(self, data):
        empty = sorted(r for r in self.expect if self._pos(r, "reserved") == 0)
        if empty:
            rid = data.draw(st.sampled_from(empty))
            self._call("publish", ([rid],), lambda: self.alloc.publish([rid]), InvalidArgument)
            _event("publish: refused (nothing allocated)")

    def _publish(self, rids: list[str], label: str) -> Any:
        unknown = any(self._pos(r, "reserved") > self._pos(r, "known") for r in rids)
        ok, launch = self._call("publish", (rids,), lambda: self.alloc.publish(rids))
        if not ok:
            _event(f"{label}: no room for copy-on-write")
            return None
        seq_lens, query_lens = self.calls.last.result
        assert launch.seq_lens.tolist() == seq_lens
        assert launch.query_lens.tolist() == query_lens
        assert len(launch.slot_mapping) == int(launch.query_lens.sum())
        assert (launch.slot_mapping >= 0).all()
        assert len(set(launch.slot_mapping.tolist())) == len(launch.slot_mapping)
        launch.check_current()
        for r in rids:
            self.expect[r].launches.append(launch)
        _event(f"{label}: ok" + (" with copy-on-write" if len(launch.copies) else "")
               + (" (token ids not known yet)" if unknown else ""))
        return launch

    @precondition(lambda self: any(self._pos(r, "reserved") > 0 for r in self.expect))
    @rule(data=st.data())
    def publish(self, data):
        ready = sorted(r for r in self.expect if self._pos(r, "reserved") > 0)
        rids = data.draw(st.lists(st.sampled_from(ready), min_size=1, max_size=3, unique=True))
        launch = self._publish(rids, "publish")
        if launch is not None:
            self.launches.append(launch)

    def _sync_launches(self) -> None:
        """Launches the allocator completed itself (through recorded events at reclaim)."""
        self.launches = [launch for launch in self.launches if not launch.completed]

    def _complete(self, launch: Any) -> None:
        ok, _ = self._call("complete", (launch.seq, list(launch.writes)), launch.complete)
        assert ok

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
        self._complete(launch)
        self.launches.remove(launch)
        if len(self._reclaimed_pending()) < pending_before:
            _event("complete_launch: recycled after late completion")
        self._call("complete", (launch.seq, list(launch.writes)), launch.complete)
        _event("complete_launch: now")

    @precondition(lambda self: self.alloc is not None and self.events)
    @rule(data=st.data())
    def event_fires(self, data):
        key = data.draw(st.sampled_from(sorted(self.events)))
        self.events.pop(key).done = True
        self.fired["events"] += 1
        done = [launch for launch in self.alloc.inflight if launch.event_done()]
        freed = self.alloc.reclaim()
        assert freed >= 0
        state = self.calls.state
        for launch in done:  # reclaim() is the completion of each launch whose event is done
            state = run_call(state, "complete", launch.seq, list(launch.writes),
                             spec=self.calls.spec).state
        self.calls.expect_state(state, "reclaim()")
        _event("event_fires: " + ("recycled after late completion" if freed else "no recycle"))
        self._replay()
        self._sync_launches()

    def _commit(self, rid: str, n: int, label: str) -> bool:
        cached_before = self.model.count[REFERENCED]
        ok, _ = self._call("commit", (rid, n), lambda: self.alloc.commit(rid, n))
        if not ok:
            _event(f"{label}: refused")
            return False
        grew = self.model.count[REFERENCED] > cached_before
        _event(f"{label}: ok" + (" (blocks entered the cache)" if grew else ""))
        return True

    @precondition(lambda self: self.alloc is not None and self.expect)
    @rule(data=st.data())
    def commit(self, data):
        rid = data.draw(st.sampled_from(sorted(self.expect)))
        lo = max(0, self._pos(rid, "computed") - 1)
        self._commit(rid, data.draw(st.integers(lo, self._pos(rid, "reserved") + 1)), "commit")

    @precondition(lambda self: self.alloc is not None and 0 < len(self.expect) < len(RIDS))
    @rule(data=st.data())
    def fork(self, data):
        parent = data.draw(st.sampled_from(sorted(self.expect)))
        child = data.draw(st.sampled_from([r for r in RIDS if r not in self.expect]))
        self.fork_child(parent, child)

    def fork_child(self, parent: str, child: str) -> bool:
        ok, _ = self._call("fork", (parent, child), lambda: self.alloc.fork(parent, child))
        if not ok:
            assert child not in self.alloc.requests
            _event("fork: refused")
            return False
        p = self.expect[parent]
        self.expect[child] = Expect(list(p.tokens), p.salt)
        _event("fork: ok")
        return True

    def _free(self, rid: str) -> None:
        self.expect.pop(rid)
        ok, _ = self._call("free", (rid,), lambda: self.alloc.free(rid))
        assert ok
        self._call("free", (rid,), lambda: self.alloc.free(rid), UnknownRequest)

    @precondition(lambda self: self.alloc is not None and self.expect)
    @rule(data=st.data(), readmit=st.booleans())
    def free(self, data, readmit: bool):
        """Finish a request, or preempt it (free + re-add, which re-hits the cached prefix)."""
        rid = data.draw(st.sampled_from(sorted(self.expect)))
        e = self.expect[rid]
        self._free(rid)
        if readmit:
            ok, cached = self._call(
                "add_request", (rid, len(e.tokens), self._chain(e)),
                lambda: self.alloc.add_request(rid, e.tokens, cache_salt=e.salt))
            assert ok and cached == self.calls.last.result
            self.expect[rid] = Expect(list(e.tokens), e.salt)
            _event("free: preempted" + (", prefix re-hit" if cached else ""))
        else:
            _event("free: finished")

    @precondition(lambda self: self.alloc is not None and self.expect)
    @rule(data=st.data(), finish=st.sampled_from(["complete", "complete", "in flight"]))
    def serve_step(self, data, finish: str):
        """One engine step for a request: cover its known tokens, launch, and usually complete,
        commit and sample a token. Steers toward commits, cache hits and copy-on-write."""
        rid = data.draw(st.sampled_from(sorted(self.expect)))
        missing = self._pos(rid, "reserved") - self._pos(rid, "known")
        if missing > 0:  # sample the tokens the allocated positions will hold
            self._append(rid, data.draw(st.lists(st.integers(0, 3), min_size=missing,
                                                 max_size=missing)))
        target = self._pos(rid, "known")
        if target > self._pos(rid, "reserved") or not self._table_len(rid):
            if isinstance(self.calls.allowed("allocate", rid, target), CallRefused):
                _event("serve_step: no room")
                return
            assert self._allocate(rid, target, "serve_step allocate")
        if self._pos(rid, "reserved") == 0:
            return
        launch = self._publish([rid], "serve_step")
        if launch is None:
            return
        if finish == "in flight":
            self.launches.append(launch)
            _event("serve_step: left in flight")
            return
        self._complete(launch)
        if not isinstance(self.calls.allowed("commit", rid, self._pos(rid, "issued")),
                          CallRefused):
            self._commit(rid, self._pos(rid, "issued"), "serve_step commit")
        self._append(rid, [data.draw(st.integers(0, 3))])
        _event("serve_step: served")

    @precondition(lambda self: self.alloc is not None and self.expect)
    @rule(data=st.data(), call=st.sampled_from(
        ["allocate_many", "extend", "commit_many", "append_tokens_many", "free_many"]),
        twice=st.sampled_from([False, False, False, True]))
    def step_level(self, data, call: str, twice: bool):
        """The step-level calls, each the repetition of its single call in the spec
        (``spec.calls``): checked against their programs like the others. ``twice`` names a
        request twice, which both refuse."""
        running = sorted(r for r in self.expect if self._table_len(r))
        choose = running if call == "allocate_many" and running and not twice else sorted(
            self.expect)  # steer allocate_many toward running requests, which it grows
        rids = data.draw(st.lists(st.sampled_from(choose), min_size=1, max_size=3,
                                  unique=True))
        if twice:
            rids = [*rids, rids[0]]
        tables = {r: self.alloc.block_table(r) for r in rids}
        if call == "allocate_many":
            grow = [(r, self._pos(r, "reserved") + data.draw(st.integers(0, 2 * self.B)))
                    for r in rids]
            ok, added = self._call("allocate_many", (grow,),
                                   lambda: self.alloc.allocate_many(grow))
            if ok:
                for (r, _), new in zip(grow, added, strict=True):
                    assert self.alloc.block_table(r) == tables[r] + new
        elif call == "extend":
            r = rids[0]
            n = self._pos(r, "reserved") + data.draw(st.integers(0, 2 * self.B))
            ok, new = self._call("allocate", (r, n), lambda: self.alloc.extend(r, n))
            if ok:
                assert self.alloc.block_table(r) == tables[r] + new
        elif call == "commit_many":
            updates = [(r, data.draw(st.integers(max(0, self._pos(r, "computed") - 1),
                                                 self._pos(r, "reserved") + 1)))
                       for r in rids]
            ok, _ = self._call("commit_many", (updates,),
                               lambda: self.alloc.commit_many(updates))
        elif call == "append_tokens_many":
            extra = [(r, data.draw(st.lists(st.integers(0, 3), min_size=1, max_size=3)))
                     for r in rids]
            known = {r: self.expect[r].tokens + x for r, x in extra}
            ok, _ = self._call(
                "append_tokens_many",
                ([(r, len(known[r]), chain_hashes(known[r], self.B, salt=self.expect[r].salt))
                  for r, _ in extra],),
                lambda: self.alloc.append_tokens_many(extra))
            if ok:
                for r, tokens in known.items():
                    self.expect[r].tokens = tokens
        else:
            ok, _ = self._call("free_many", (rids,), lambda: self.alloc.free_many(rids))
            if ok:
                for r in rids:
                    self.expect.pop(r)
        assert not (ok and twice and call != "extend"), f"{call} took a request twice"
        _event(f"step_level {call}: " + ("ok" if ok else "refused"))

    def _cow_candidates(self) -> list[str]:
        return [r for r in self.expect
                if self._pos(r, "issued") % self.B
                and self._pos(r, "issued") == self._pos(r, "reserved") == self._pos(
                    r, "computed")]

    @precondition(lambda self: len(self.expect) < len(RIDS) and self._cow_candidates())
    @rule(data=st.data(), token=st.integers(0, 3))
    def fork_then_write(self, data, token: int):
        """Fork a request whose last block is partial, then write the child's next token: the
        shared partial block must be copied (copy-on-write), never written in place."""
        parent = data.draw(st.sampled_from(sorted(self._cow_candidates())))
        child = data.draw(st.sampled_from([r for r in RIDS if r not in self.expect]))
        if not self.fork_child(parent, child):
            return
        issued = self._pos(child, "issued")
        shared_block = self.alloc.block_table(child)[issued // self.B]
        self._append(child, [token])
        if not self._allocate(child, self._pos(child, "reserved") + 1, "fork_then_write"):
            return
        launch = self._publish([child], "fork_then_write")
        if launch is None:
            return
        new = self.alloc.block_table(child)[(self._pos(child, "reserved") - 1) // self.B]
        assert launch.copies.tolist() == [[shared_block, new]], (
            "a shared partial block was not copied")
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
        self._free(data.draw(st.sampled_from(sorted(set(live)))))
        pending = len(self._reclaimed_pending())
        _event("free_while_in_flight" + (": blocks wait for the launch" if pending else ""))

    def bad_arguments(self, data):
        rid = data.draw(st.sampled_from(RIDS))
        n = data.draw(st.sampled_from([-1, 1.5, True]))
        if rid in self.expect:
            self._refused(lambda: self.alloc.allocate(rid, n), InvalidArgument)
            self._refused(lambda: self.alloc.commit(rid, n), InvalidArgument)
        else:
            self._call("allocate", (rid, 1), lambda: self.alloc.allocate(rid, 1),
                       UnknownRequest)
            self._call("publish", ([rid],), lambda: self.alloc.publish([rid]), UnknownRequest)
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
        if step(self.model, name, self.spec, b=b) is None:
            self._refused(lambda: call(b), AllocatorError)
            _event(f"pool.{name}: refused")
        else:
            call(b)
            self.calls.follow(self.alloc.pool.trace)
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
            if any(self._pos(r, "reserved") > 0 for r in self.expect):
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
        assert set(tables(a.requests)) == set(self.expect)
        assert summary(a.requests) == summary(self.calls.state), "tables differ from the spec"
        for rid, e in self.expect.items():
            assert self._pos(rid, "known") == len(e.tokens), rid
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
        assert counts["occupancy_tokens"] == sum(self._pos(r, "reserved") for r in self.expect)
        assert counts["occupancy_blocks"] == sum(self._table_len(r) for r in self.expect)
        # Reclamation is eager: the watermark is as far as the spec lets it go, and every
        # block the spec lets recycle is FREE (nothing waits longer than its readers).
        assert step(m, "advance", self.spec) is None, "the watermark lags behind completed launches"
        stuck = [b for b in m.block_ids
                 if m.state[b] == RECLAIMED and step(m, "recycle", self.spec, b=b) is not None]
        assert not stuck, f"blocks {stuck} could be recycled but are not"
        note(f"counts={counts}")

    def teardown(self):
        if self.alloc is not None:
            for launch in list(self.launches):
                if not launch.completed:
                    launch.complete()
            self.alloc.check_invariants()


TestAllocatorMachine = AllocatorMachine.TestCase
