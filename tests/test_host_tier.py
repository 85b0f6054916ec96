"""HostPool: typed errors, atomicity, LRU eviction, and refinement of the host spec."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from pagedkv.allocator.errors import InvalidArgument, InvariantViolation, OutOfBlocks
from pagedkv.allocator.host import (
    DevicePinned,
    HostGuardViolation,
    HostMiss,
    HostPool,
    NoTransfer,
)
from pagedkv.spec.host import (
    HOST_BLOCK_FIELDS,
    HOST_FREE,
    HOST_STATES,
    HOST_TRANSITIONS,
    HostState,
    evictable,
    initial_host_state,
)
from pagedkv.spec.host_invariants import host_violations
from pagedkv.spec.ops import CONCRETE, flatten
from pagedkv.spec.states import NO_BLOCK


def _diff(a: HostState, b: HostState) -> list[str]:
    out = []
    for f in HOST_BLOCK_FIELDS:
        out += [f"{f}[{x}]" for x in a.block_ids if getattr(a, f)[x] != getattr(b, f)[x]]
    for f in ("hmap", "dreader"):
        if dict(flatten(getattr(a, f)).items()) != dict(flatten(getattr(b, f)).items()):
            out.append(f)
    out += [f"count[{st}]" for st in HOST_STATES if a.count[st] != b.count[st]]
    return out


def _stored(pool: HostPool, hashes, devs) -> list[int]:
    blocks = pool.prepare_store(hashes, devs)
    pool.complete_store([b for b in blocks if b is not None], True)
    return blocks


def test_store_then_hit_and_load() -> None:
    pool = HostPool(4)
    assert pool.lookup(11) is None
    [b] = pool.prepare_store([11], [5])
    assert pool.lookup(11) is None  # a store in flight is not a hit
    with pytest.raises(HostMiss):
        pool.prepare_load([11])
    assert pool.device_pinned(5)
    pool.complete_store([b], True)
    assert not pool.device_pinned(5)
    assert pool.lookup(11) == b
    assert pool.prepare_load([11]) == [b]
    assert pool.state_of(b) == "LOADING" and pool.num_evictable() == 0
    pool.complete_load([b])
    assert pool.state_of(b) == "STORED" and pool.check_all() == []


def test_already_stored_hash_is_skipped() -> None:
    pool = HostPool(2)
    _stored(pool, [1], [0])
    assert pool.prepare_store([1, 2], [0, 1])[0] is None


def test_lru_evicts_least_recently_used_unpinned() -> None:
    pool = HostPool(3)
    a, b, c = _stored(pool, [1, 2, 3], [0, 1, 2])
    pool.complete_load(pool.prepare_load([1]))  # 1 becomes most recently used
    pinned = pool.prepare_load([2])  # 2 is pinned by a load in flight
    [new] = pool.prepare_store([4], [9])
    assert new == c and pool.lookup(3) is None and pool.lookup(1) == a
    pool.complete_store([new], True)
    assert pool.lookup(2) == pinned[0]


def test_out_of_blocks_changes_nothing() -> None:
    pool = HostPool(2)
    _stored(pool, [1], [0])
    pool.prepare_load([1])
    before = pool.snapshot()
    with pytest.raises(OutOfBlocks) as e:
        pool.prepare_store([2, 3], [1, 2])
    assert (e.value.needed, e.value.available) == (2, 1)
    assert _diff(before, pool.snapshot()) == []


def test_device_pinned_refused_atomically() -> None:
    pool = HostPool(4)
    pool.prepare_store([1], [7])
    before = pool.snapshot()
    with pytest.raises(DevicePinned):
        pool.prepare_store([2, 3], [6, 7])
    assert _diff(before, pool.snapshot()) == []


def test_completion_without_transfer_refused() -> None:
    pool = HostPool(2)
    [b] = _stored(pool, [1], [0])
    before = pool.snapshot()
    with pytest.raises(NoTransfer):
        pool.complete_store([b], True)
    with pytest.raises(NoTransfer):
        pool.complete_load([b])
    assert _diff(before, pool.snapshot()) == []


def test_checked_mode_catches_a_corrupted_block() -> None:
    pool = HostPool(2)
    [b] = _stored(pool, [1], [0])
    pool._arrays["hash"][b] = 2  # corrupt: the map says 1 -> b
    with pytest.raises(InvariantViolation):
        pool.prepare_load([1])


def test_failed_store_frees_and_forgets() -> None:
    pool = HostPool(1)
    [b] = pool.prepare_store([1], [0])
    pool.complete_store([b], False)
    assert pool.lookup(1) is None and pool.state_of(b) == "FREE"
    assert not pool.device_pinned(0)


def test_miss_and_bad_input() -> None:
    pool = HostPool(2)
    with pytest.raises(HostMiss):
        pool.prepare_load([5])
    with pytest.raises(InvalidArgument):
        pool.prepare_store([0], [1])
    with pytest.raises(InvalidArgument):
        pool.prepare_store([1, 1], [1, 2])
    with pytest.raises(InvalidArgument):
        pool.prepare_store([1], [-1])
    with pytest.raises(InvalidArgument):
        pool.prepare_store([1], [1, 2])
    with pytest.raises(InvalidArgument):
        pool.complete_load([2])
    with pytest.raises(InvalidArgument):
        pool.complete_store([0], 1)
    with pytest.raises(InvalidArgument):
        HostPool(0)
    assert pool.check_all() == []


# --- refinement: HostPool agrees with the spec, in both directions ---------------------------
N = 4
HASHES = st.integers(1, 6)
DEVICES = st.integers(0, 5)
BLOCKS = st.integers(0, N - 1)


class HostMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.pool = HostPool(N)
        self.pool.trace = []
        self.spec = initial_host_state(N)

    def _spec_run(self, steps):
        """The spec's verdict on a planned call: the post-state, or None if a guard fails."""
        s = self.spec
        for name, params in steps:
            t = HOST_TRANSITIONS[name]
            if not CONCRETE.is_true(t.guard(CONCRETE, s, **params)):
                return None
            s = t.effect(CONCRETE, s, **params)
        return s

    def _expect(self, call, steps, error) -> None:
        post = self._spec_run(steps)
        before = self.pool.snapshot()
        if post is None:
            with pytest.raises(error):
                call()
            assert _diff(before, self.pool.snapshot()) == []
        else:
            call()
            self.spec = post
            assert _diff(self.spec, self.pool.snapshot()) == []

    @rule(items=st.lists(st.tuples(HASHES, DEVICES), max_size=3, unique_by=lambda x: x[0]))
    def prepare_store(self, items) -> None:
        hashes, devs = [h for h, _ in items], [d for _, d in items]
        s = self.spec
        new = [i for i, h in enumerate(hashes) if s.hmap[h] == NO_BLOCK]
        keep = {s.hmap[h] for h in hashes}
        room = sum(1 for b in range(N) if s.state[b] == HOST_FREE or (
            CONCRETE.is_true(evictable(CONCRETE, s, b)) and b not in keep))
        pinned = any(s.dreader[devs[i]] != NO_BLOCK for i in new) or len(
            {devs[i] for i in new}) < len(new)
        before = self.pool.snapshot()
        self.pool.trace.clear()
        if len(new) > room:
            with pytest.raises(OutOfBlocks):
                self.pool.prepare_store(hashes, devs)
            assert _diff(before, self.pool.snapshot()) == []
            return
        if pinned:
            with pytest.raises(DevicePinned):
                self.pool.prepare_store(hashes, devs)
            assert _diff(before, self.pool.snapshot()) == []
            return
        out = self.pool.prepare_store(hashes, devs)
        # the runtime's choice of blocks (LRU) replays on the spec, every guard holding
        post = self._spec_run(self.pool.trace)
        assert post is not None
        begins = [p for n, p in self.pool.trace if n == "store_begin"]
        assert [(p["h"], p["d"], p["b"]) for p in begins] == [
            (hashes[i], devs[i], out[i]) for i in new]
        assert all(out[i] is None for i in range(len(hashes)) if i not in new)
        self.spec = post
        assert _diff(self.spec, self.pool.snapshot()) == []

    @rule(blocks=st.lists(BLOCKS, max_size=3), success=st.booleans())
    def complete_store(self, blocks, success) -> None:
        name = "store_done" if success else "store_fail"
        self._expect(lambda: self.pool.complete_store(blocks, success),
                     [(name, {"b": b}) for b in blocks], NoTransfer)

    @rule(hashes=st.lists(HASHES, max_size=3))
    def prepare_load(self, hashes) -> None:
        self._expect(lambda: self.pool.prepare_load(hashes),
                     [("load_begin", {"b": self.spec.hmap[h]}) for h in hashes], HostMiss)

    @rule(blocks=st.lists(BLOCKS, max_size=3))
    def complete_load(self, blocks) -> None:
        self._expect(lambda: self.pool.complete_load(blocks),
                     [("load_done", {"b": b}) for b in blocks], NoTransfer)

    @rule(blocks=st.lists(BLOCKS, max_size=2))
    def discard(self, blocks) -> None:
        self._expect(lambda: self.pool.discard(blocks),
                     [("evict", {"b": b}) for b in blocks], HostGuardViolation)

    @rule(h=HASHES)
    def lookup(self, h) -> None:
        b = self.spec.hmap[h]
        hit = b != NO_BLOCK and self.spec.state[b] in (2, 3)
        assert self.pool.lookup(h) == (b if hit else None)

    @invariant()
    def invariants_hold(self) -> None:
        assert host_violations(self.spec, CONCRETE) == []
        assert self.pool.check_all() == []
        assert self.pool.num_free() == sum(self.spec.state[b] == HOST_FREE for b in range(N))


TestHostRefinement = HostMachine.TestCase
TestHostRefinement.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
