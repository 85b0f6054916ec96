"""NativeAllocator against BlockAllocator as a hypothesis state machine: the calls of the
seeded campaign (``proofs.native_allocator_refinement``), chosen by hypothesis, so that a
difference is shrunk to a short program. Each step compares the values or error types and
the whole state (``AllocatorPair.do``); the invariant compares the spec's states and scans
the native one."""
# ruff: noqa: B023 - each call's lambdas are called at once by AllocatorPair.do

from __future__ import annotations

import pytest

pytest.importorskip("numba")

from hypothesis import settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.stateful import (  # noqa: E402
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from pagedkv.proofs.native_allocator_refinement import AllocatorPair  # noqa: E402

B = 2
PREFIX = [5, 6, 7, 8, 9]  # prompts share a prefix, so admissions find cached blocks


class NativeAgainstBlockAllocator(RuleBasedStateMachine):
    @initialize(blocks=st.integers(3, 12), checked=st.booleans())
    def start(self, blocks: int, checked: bool) -> None:
        self.pair = AllocatorPair(blocks, B, checked)
        self.live: list[str] = []
        self.serial = 0

    @property
    def ref(self):
        return self.pair.ref

    def _running(self) -> list[str]:
        return [r for r in self.live if self.ref._requests[r].table]

    @rule(shared=st.integers(0, len(PREFIX)), extra=st.lists(st.integers(0, 9), max_size=3),
          first=st.integers(0, 8))
    def admit(self, shared: int, extra: list[int], first: int) -> None:
        rid = f"r{self.serial}"
        self.serial += 1
        prompt = PREFIX[:shared] + extra or [1]
        if self.pair.do("add_request", lambda a: a.add_request(rid, prompt)) is not None:
            self.live.append(rid)
            self.pair.do("allocate", lambda a: a.allocate(rid, min(first, len(prompt))))

    @precondition(lambda self: self._running())
    @rule(data=st.data(), more=st.integers(0, 2 * B))
    def grow(self, data, more: int) -> None:
        rids = data.draw(st.lists(st.sampled_from(self._running()), min_size=1, unique=True))
        grow = [(r, self.ref.num_reserved(r) + more) for r in rids]
        self.pair.do("allocate_many", lambda a: a.allocate_many(grow))

    @precondition(lambda self: self.live)
    @rule(data=st.data(), token=st.integers(0, 9))
    def append(self, data, token: int) -> None:
        rids = data.draw(st.lists(st.sampled_from(self.live), min_size=1, unique=True))
        self.pair.do("append_tokens_many", lambda a: a.append_tokens_many(
            [(r, [token]) for r in rids]))

    @precondition(lambda self: self._running())
    @rule(data=st.data())
    def publish(self, data) -> None:
        rids = data.draw(st.lists(st.sampled_from(self._running()), min_size=1, unique=True))
        got = self.pair.do("publish", lambda a: a.publish(rids))
        if got is not None:
            self.pair.launches.append(got)

    @precondition(lambda self: self.pair.launches)
    @rule(data=st.data())
    def complete(self, data) -> None:
        i = data.draw(st.integers(0, len(self.pair.launches) - 1))
        ref_launch, nat_launch = self.pair.launches.pop(i)
        self.pair.do("complete", lambda a: (ref_launch if a is self.ref else nat_launch)
                     .complete())

    @precondition(lambda self: self._running())
    @rule(data=st.data(), past=st.integers(-1, 1))
    def commit(self, data, past: int) -> None:
        rids = data.draw(st.lists(st.sampled_from(self._running()), min_size=1, unique=True))
        updates = []
        for r in rids:
            req = self.ref._requests[r]
            updates.append((r, max(req.computed, min(req.issued, len(req.tokens))) + past))
        self.pair.do("commit_many", lambda a: a.commit_many(updates))

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def free(self, data) -> None:
        rid = data.draw(st.sampled_from(self.live))
        if self.pair.do("free", lambda a: a.free(rid)) is not None:
            self.live.remove(rid)

    @invariant()
    def the_same_spec_state(self) -> None:
        if hasattr(self, "pair"):
            assert self.ref.abstract() == self.pair.nat.abstract()
            self.pair.nat.check_invariants()


TestNativeAgainstBlockAllocator = NativeAgainstBlockAllocator.TestCase
TestNativeAgainstBlockAllocator.settings = settings(
    max_examples=100, stateful_step_count=40, deadline=None)
