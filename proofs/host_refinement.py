"""The host tier's refinement machine: ``HostPool`` against the host spec, both directions.

Each rule makes one ``HostPool`` call and asks the spec for its verdict: the call must succeed
exactly when every guard of its planned transitions holds (``prepare_store``'s choice of
blocks, FREE first then LRU victims, is replayed on the spec from the pool's trace), a refused
call raises the typed error and changes nothing, and a successful one lands on the spec's
post-state. After every step every host invariant holds in the spec and in the pool.
``run_host_campaign`` runs it with fixed seeds for ``pagedkv verify``; the tests run it too.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from pagedkv.allocator.errors import OutOfBlocks
from pagedkv.allocator.host import DevicePinned, HostGuardViolation, HostMiss, HostPool, NoTransfer
from pagedkv.spec.host import (
    HOST_BLOCK_FIELDS,
    HOST_FREE,
    HOST_STATES,
    HOST_TRANSITIONS,
    HostState,
    evictable,
    initial_host_state,
    loadable,
)
from pagedkv.spec.host_invariants import host_violations
from pagedkv.spec.ops import CONCRETE, flatten
from pagedkv.spec.states import NO_BLOCK

N = 4
MAX_HASH = 6
HASHES = st.integers(1, MAX_HASH)
DEVICES = st.integers(0, 5)
BLOCKS = st.integers(0, N - 1)

CAMPAIGN: Counter[str] = Counter()
STEPS = "__steps__"
pool_factory: Callable[[int], HostPool] = HostPool  # the implementation under test


class RefinementError(AssertionError):
    """The host pool and the host spec disagree."""


def state_diff(a: HostState, b: HostState) -> list[str]:
    """The fields (and cells) where two host states differ."""
    out = []
    for f in HOST_BLOCK_FIELDS:
        out += [f"{f}[{x}]" for x in a.block_ids if getattr(a, f)[x] != getattr(b, f)[x]]
    for f in ("hmap", "dreader"):
        if dict(flatten(getattr(a, f)).items()) != dict(flatten(getattr(b, f)).items()):
            out.append(f)
    out += [f"count[{s}]" for s in HOST_STATES if a.count[s] != b.count[s]]
    return out


def _agree(a: HostState, b: HostState, what: str) -> None:
    diff = state_diff(a, b)
    if diff:
        raise RefinementError(f"{what}: the pool and the spec differ at {diff}")


class HostMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.pool = pool_factory(N)
        self.pool.trace = []
        self.spec = initial_host_state(N)

    def _note(self, label: str) -> None:
        event(label)
        CAMPAIGN[label] += 1

    def _spec_run(self, steps: Any) -> HostState | None:
        """The spec's verdict on a planned call: the post-state, or None if a guard fails."""
        s = self.spec
        for name, params in steps:
            t = HOST_TRANSITIONS[name]
            if not CONCRETE.is_true(t.guard(CONCRETE, s, **params)):
                return None
            s = t.effect(CONCRETE, s, **params)
        return s

    def _refused(self, rule_name: str, call: Callable[[], Any], error: type) -> None:
        before = self.pool.snapshot()
        try:
            call()
        except error:
            _agree(before, self.pool.snapshot(), f"{rule_name} refused but changed the pool")
            self._note(f"{rule_name}: refused")
            return
        raise RefinementError(f"{rule_name}: the spec refuses it, the pool did not "
                              f"raise {error.__name__}")

    def _expect(self, rule_name: str, call: Callable[[], Any], steps: Any,
                error: type) -> None:
        post = self._spec_run(steps)
        if post is None:
            self._refused(rule_name, call, error)
            return
        call()  # a refusal here is one the spec would not make: the error propagates
        self.spec = post
        _agree(self.spec, self.pool.snapshot(), rule_name)
        self._note(f"{rule_name}: ok")

    @rule(items=st.lists(st.tuples(HASHES, DEVICES), max_size=3, unique_by=lambda x: x[0]))
    def prepare_store(self, items: list[tuple[int, int]]) -> None:
        hashes, devs = [h for h, _ in items], [d for _, d in items]
        s = self.spec
        new = [i for i, h in enumerate(hashes) if s.hmap[h] == NO_BLOCK]
        keep = {s.hmap[h] for h in hashes}
        room = sum(1 for b in range(N) if s.state[b] == HOST_FREE or (
            CONCRETE.is_true(evictable(CONCRETE, s, b)) and b not in keep))
        pinned = any(s.dreader[devs[i]] != NO_BLOCK for i in new) or len(
            {devs[i] for i in new}) < len(new)
        self.pool.trace.clear()
        if len(new) > room:
            self._refused("prepare_store", lambda: self.pool.prepare_store(hashes, devs),
                          OutOfBlocks)
            return
        if pinned:
            self._refused("prepare_store", lambda: self.pool.prepare_store(hashes, devs),
                          DevicePinned)
            return
        out = self.pool.prepare_store(hashes, devs)
        post = self._spec_run(self.pool.trace)  # the pool's choice of blocks, on the spec
        if post is None:
            raise RefinementError(f"prepare_store: the pool ran {self.pool.trace}, a guard "
                                  "of which the spec does not hold")
        begins = [p for n, p in self.pool.trace if n == "store_begin"]
        if [(p["h"], p["d"], p["b"]) for p in begins] != [
                (hashes[i], devs[i], out[i]) for i in new] or any(
                out[i] is not None for i in range(len(hashes)) if i not in new):
            raise RefinementError(f"prepare_store returned {out} for its trace {begins}")
        self.spec = post
        _agree(self.spec, self.pool.snapshot(), "prepare_store")
        self._note("prepare_store: ok")

    @rule(blocks=st.lists(BLOCKS, max_size=3), success=st.booleans())
    def complete_store(self, blocks: list[int], success: bool) -> None:
        name = "store_done" if success else "store_fail"
        self._expect("complete_store", lambda: self.pool.complete_store(blocks, success),
                     [(name, {"b": b}) for b in blocks], NoTransfer)

    @rule(hashes=st.lists(HASHES, max_size=3))
    def prepare_load(self, hashes: list[int]) -> None:
        self._expect("prepare_load", lambda: self.pool.prepare_load(hashes),
                     [("load_begin", {"b": self.spec.hmap[h]}) for h in hashes], HostMiss)

    @rule(blocks=st.lists(BLOCKS, max_size=3))
    def complete_load(self, blocks: list[int]) -> None:
        self._expect("complete_load", lambda: self.pool.complete_load(blocks),
                     [("load_done", {"b": b}) for b in blocks], NoTransfer)

    @rule(blocks=st.lists(BLOCKS, max_size=2))
    def discard(self, blocks: list[int]) -> None:
        self._expect("discard", lambda: self.pool.discard(blocks),
                     [("evict", {"b": b}) for b in blocks], HostGuardViolation)

    @rule()
    def lookup(self) -> None:
        """Every hash: a hit exactly where the spec's ``loadable`` holds (complete KV),
        never on a store in flight."""
        hits = 0
        for h in range(1, MAX_HASH + 1):
            b = self.spec.hmap[h]
            hit = b != NO_BLOCK and CONCRETE.is_true(loadable(CONCRETE, self.spec, b))
            got = self.pool.lookup(h)
            if got != (b if hit else None):
                raise RefinementError(f"lookup({h}) is {got}, the spec says "
                                      f"{b if hit else None}")
            hits += hit
        self._note(f"lookup: {'hits' if hits else 'no hit'}")

    @invariant()
    def invariants_hold(self) -> None:
        CAMPAIGN[STEPS] += 1
        bad = host_violations(self.spec, CONCRETE) + self.pool.check_all()
        if bad:
            raise RefinementError(f"host invariants violated: {bad}")
        free = sum(self.spec.state[b] == HOST_FREE for b in range(N))
        if self.pool.num_free() != free:
            raise RefinementError(f"num_free is {self.pool.num_free()}, the spec has {free}")


def run_host_campaign(target_steps: int, step_count: int = 40, examples: int = 100,
                      shrink: bool = True) -> dict:
    """The machine with fixed seeds 0, 1, ... until ``target_steps`` steps (a failure raises,
    shrunk to a short sequence unless ``shrink`` is False)."""
    from hypothesis import HealthCheck, Phase, settings
    from hypothesis import seed as fixed_seed
    from hypothesis.stateful import run_state_machine_as_test

    CAMPAIGN.clear()
    seeds: list[int] = []
    while CAMPAIGN[STEPS] < target_steps:
        seed = len(seeds)
        seeds.append(seed)

        @fixed_seed(seed)
        def machine() -> HostMachine:
            return HostMachine()

        run_state_machine_as_test(machine, settings=settings(
            max_examples=examples, stateful_step_count=step_count, database=None,
            deadline=None, suppress_health_check=list(HealthCheck),
            phases=[p for p in Phase if shrink or p not in (Phase.shrink, Phase.explain)]))
    counts = dict(CAMPAIGN)
    steps = counts.pop(STEPS, 0)
    return {"ok": steps >= target_steps, "steps": steps, "seeds": seeds,
            "rules": dict(sorted(counts.items()))}
