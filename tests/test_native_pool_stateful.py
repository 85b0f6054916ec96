"""NativePool against BlockPool as a hypothesis state machine: the same operations as the
seeded campaign (``proofs.native_refinement``), chosen by hypothesis, so a difference is
shrunk to a short program. Each step compares results, errors and the whole state
(``Pair.do``); the invariant compares the structure and the spec's invariants."""

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

from pagedkv.proofs.native_refinement import Pair, admit_room  # noqa: E402
from pagedkv.spec import (  # noqa: E402
    ALLOCATED,
    CACHED,
    PUBLISHED,
    REFERENCED,
    violations,
)

BLOCK = 2


class NativeAgainstBlockPool(RuleBasedStateMachine):
    @initialize(blocks=st.integers(1, 8), checked=st.booleans())
    def start(self, blocks: int, checked: bool) -> None:
        self.pair = Pair(blocks, BLOCK, checked)
        self.holders: list[str] = []
        self.serial = 0
        self.inflight: list[int] = []

    @property
    def ref(self):
        return self.pair.ref

    def _held(self, r: str) -> list[int]:
        return sorted(self.ref.held.get(r, ()))

    @rule()
    def open_holder(self) -> None:
        r = f"r{self.serial}"
        self.serial += 1
        self.holders.append(r)
        self.pair.do("open_holder", lambda: self.ref.open_holder(r),
                     lambda: self.pair.nat.open_holder(r))

    @precondition(lambda self: self.holders)
    @rule(data=st.data(), n=st.integers(0, 3))
    def take(self, data, n: int) -> None:
        r = data.draw(st.sampled_from(self.holders))
        if self.ref.usable() >= n:
            self.pair.do("take_many", lambda: self.ref.take_many(r, n),
                         lambda: self.pair.nat.take_many(r, n))

    @precondition(lambda self: self.holders)
    @rule(data=st.data(), stray=st.booleans())
    def release(self, data, stray: bool) -> None:
        r = data.draw(st.sampled_from(self.holders))
        held = self._held(r)
        blocks = data.draw(st.permutations(held)) if held else []
        blocks = blocks[:data.draw(st.integers(0, len(blocks)))]
        if stray:  # a block r may not hold: a DoubleFree after the others, on both
            blocks.append(data.draw(st.integers(0, self.ref.num_blocks - 1)))
        self.pair.do("release_many", lambda: self.ref.run_many("release",
                                                               [(b, r) for b in blocks]),
                     lambda: self.pair.nat.release_many(r, blocks))

    @precondition(lambda self: self.holders)
    @rule(data=st.data())
    def share(self, data) -> None:
        r = data.draw(st.sampled_from(self.holders))
        cands = [b for b in range(self.ref.num_blocks) if b not in self.ref.held[r]
                 and self.ref.state[b] in (PUBLISHED, REFERENCED, CACHED)]
        if cands:
            blocks = data.draw(st.lists(st.sampled_from(cands), min_size=1, max_size=3,
                                        unique=True))
            self.pair.do("share_many", lambda: self.ref.run_many("share",
                                                                 [(b, r) for b in blocks]),
                         lambda: self.pair.nat.share_many(r, blocks))

    @precondition(lambda self: self.holders)
    @rule(data=st.data())
    def publish_and_write(self, data) -> None:
        r = data.draw(st.sampled_from(self.holders))
        mine = [b for b in self._held(r) if self.ref.state[b] == ALLOCATED]
        if mine:
            self.pair.do("publish_many", lambda: self.ref.run_many("publish",
                                                                   [(b, r) for b in mine]),
                         lambda: self.pair.nat.publish_many(r, mine))
        mine = [b for b in self._held(r) if self.ref.state[b] == PUBLISHED
                and self.ref.filled[b] < BLOCK]
        if mine:
            w = data.draw(st.integers(1, BLOCK))
            self.pair.do("begin_write_many",
                         lambda: self.ref.run_many("begin_write", [(b, r, w) for b in mine]),
                         lambda: self.pair.nat.begin_write_many(r, mine, w))

    @rule(data=st.data())
    def end_write(self, data) -> None:
        pending = [b for b in range(self.ref.num_blocks) if self.ref.wpend[b] > 0]
        if pending:
            b = data.draw(st.sampled_from(pending))
            self.pair.do("end_write_many", lambda: self.ref.run_many("end_write", [(b,)]),
                         lambda: self.pair.nat.end_write_many([b]))

    @precondition(lambda self: self.holders)
    @rule(data=st.data(), h=st.integers(1, 4))
    def commit(self, data, h: int) -> None:
        r = data.draw(st.sampled_from(self.holders))
        full = [b for b in self._held(r) if self.ref.state[b] == PUBLISHED
                and self.ref.filled[b] == BLOCK]
        if full:
            b = data.draw(st.sampled_from(full))
            self.pair.do("commit_many", lambda: self.ref.run_many("commit", [(b, r, h)]),
                         lambda: self.pair.nat.commit_many(r, [b], [h]))

    @precondition(lambda self: self.holders)
    @rule(data=st.data())
    def rewind(self, data) -> None:
        r = data.draw(st.sampled_from(self.holders))
        mine = [b for b in self._held(r) if self.ref.state[b] == PUBLISHED]
        if mine:
            b = data.draw(st.sampled_from(mine))
            k = data.draw(st.integers(0, BLOCK))
            self.pair.do("rewind", lambda: self.ref.rewind(b, r, k),
                         lambda: self.pair.nat.rewind(b, r, k))

    @rule()
    def launch(self) -> None:
        L = self.ref.clock[0]
        self.pair.do("launch", lambda: self.ref.launch(L),
                     lambda: None if self.pair.nat.launch() == L else L)
        self.inflight.append(L)

    @precondition(lambda self: self.inflight)
    @rule(data=st.data())
    def complete(self, data) -> None:
        L = data.draw(st.sampled_from(self.inflight))
        self.inflight.remove(L)
        self.pair.do("complete", lambda: self.ref.complete(L),
                     lambda: self.pair.nat.complete(L))
        self.pair.do("advance_watermark", self.ref.advance_watermark,
                     self.pair.nat.advance_watermark)

    @rule(data=st.data(), extra=st.integers(-1, 3), edge=st.booleans(), reopen=st.booleans())
    def admit(self, data, extra: int, edge: bool, reopen: bool) -> None:
        """An admission: registered hashes in any order, at times one never registered or
        one twice; n the hashes and ``extra`` more (fewer at -1: refused), or at the room's
        ``edge`` (all it can take, or one more: refused); of an open holder where
        ``reopen`` (refused)."""
        known = sorted(self.ref.hmap)
        hashes = data.draw(st.lists(st.sampled_from([*known, 9]) if known else st.just(9),
                                    max_size=4))
        if reopen and self.holders:
            r = data.draw(st.sampled_from(self.holders))
        else:
            r = f"r{self.serial}"
            self.serial += 1
        n = max(len(hashes) + extra, 0)
        if edge:
            n = max(admit_room(self.ref, hashes) + extra % 2, len(hashes))
        self.pair.do("admit", lambda: self.ref.admit(r, hashes, n),
                     lambda: self.pair.nat.admit(r, hashes, n))
        if r in self.ref.held and r not in self.holders:
            self.holders.append(r)

    @precondition(lambda self: self.holders)
    @rule(data=st.data(), stray=st.booleans())
    def finish(self, data, stray: bool) -> None:
        """A request's end: its blocks (at times some of them only: the close refused, or
        with a block it may not hold: DoubleFree) released, then closed."""
        r = data.draw(st.sampled_from(self.holders))
        blocks = data.draw(st.permutations(self._held(r)))
        blocks = blocks[:data.draw(st.integers(max(len(blocks) - 1, 0), len(blocks)))]
        if stray:
            blocks.append(data.draw(st.integers(0, self.ref.num_blocks - 1)))
        self.pair.do("finish", lambda: self.ref.finish(r, blocks),
                     lambda: self.pair.nat.finish(r, blocks))
        if r not in self.ref.held:
            self.holders.remove(r)

    @precondition(lambda self: self.holders)
    @rule(data=st.data())
    def close_holder(self, data) -> None:
        r = data.draw(st.sampled_from(self.holders))
        if not self._held(r):
            self.holders.remove(r)
        self.pair.do("close_holder", lambda: self.ref.close_holder(r),
                     lambda: self.pair.nat.close_holder(r))

    @invariant()
    def structure_and_spec_invariants(self) -> None:
        assert self.pair.nat.structure_errors() == []
        assert violations(self.pair.nat.abstract()) == []


TestNativeAgainstBlockPool = NativeAgainstBlockPool.TestCase
TestNativeAgainstBlockPool.settings = settings(max_examples=60, stateful_step_count=40)
