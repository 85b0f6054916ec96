"""pagedkv.testing: the reusable state machine passes on pagedkv's allocators and a third-party
one, and catches planted bugs with a message naming what broke."""

from __future__ import annotations

import importlib.util
import sys
import unittest
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings

from pagedkv.allocator import BlockAllocator, Launch
from pagedkv.spec import FREE, RECLAIMED
from pagedkv.testing import (
    CHECKS,
    AllocatorAdapter,
    BlockAllocatorAdapter,
    CheckFailed,
    EngineAdapter,
    SpecView,
    make_test_case,
    run,
)

QUICK = settings(max_examples=40, stateful_step_count=30, derandomize=True, database=None,
                 deadline=None, suppress_health_check=[HealthCheck.too_slow],
                 phases=[Phase.explicit, Phase.generate, Phase.shrink])  # no explain phase
# Shorter programs shrink faster; the search stops at the first failure.
CAUGHT = settings(QUICK, max_examples=300, stateful_step_count=20)


def _example() -> Any:
    path = Path(__file__).resolve().parent.parent / "examples" / "third_party_allocator.py"
    spec = importlib.util.spec_from_file_location("third_party_allocator", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("third_party_allocator", module)
    spec.loader.exec_module(module)
    return module


third_party = _example()


# ---- planted bugs in BlockAllocator ---------------------------------------------------------
class LeakyFree(BlockAllocator):
    """Planted bug: free() never releases the request's first block."""

    def free(self, rid: Hashable) -> None:
        req = self._req(rid)
        for b in reversed(req.table[1:]):
            self.pool.release(b, rid)
        del self._requests[rid]
        self._reserved_total -= req.reserved
        self._entries_total -= len(req.table)


class UnpinnedLaunch(BlockAllocator):
    """Planted bug: a launch does not pin its blocks (it is completed as it is published)."""

    def publish(self, rids: Any) -> Launch:
        launch = super().publish(rids)
        launch.complete()
        return launch


class StaleGenerations(BlockAllocator):
    """Planted bug: free() winds back the generation of the blocks it invalidates, so a stale
    table would pass the kernels' generation check. Nothing the adapter observes changes."""

    def free(self, rid: Hashable) -> None:
        table = self.block_table(rid)
        super().free(rid)
        for b in table:
            if self.pool.state[b] in (FREE, RECLAIMED) and self.pool.gen[b] > 0:
                self.pool.gen[b] -= 1


class SaltBlind(BlockAllocator):
    """Planted bug: the cache salt is dropped, so one tenant's requests hit another's KV."""

    def add_request(self, rid: Hashable, token_ids: Any, *, cache_salt: Any = None,
                    extra_keys: Any = ()) -> int:
        return super().add_request(rid, token_ids, extra_keys=extra_keys)


def _caught(factory: Any, **kw: Any) -> CheckFailed:
    with pytest.raises(CheckFailed) as info:
        run(factory, settings=CAUGHT, **kw)
    return info.value


def _variant(allocator_class: type[BlockAllocator], **kw: Any) -> Any:
    """A BlockAllocator subclass under test (unchecked: the machine does the checking)."""
    return BlockAllocatorAdapter.factory(allocator_class=allocator_class, checked=False, **kw)


# ---- passing -------------------------------------------------------------------------------
def test_block_allocator_refines_the_spec() -> None:
    outcomes = run(BlockAllocatorAdapter.factory(), settings=QUICK)
    # The run reached what the checks are about (else it would pass vacuously).
    for label in ("admit: ok with prefix hits", "launch: ok with copy-on-write",
                  "fork: ok, shares written blocks", "freed while a launch is in flight",
                  "allocate: refused", "misuse: add_live"):
        assert outcomes[label] > 0, (label, dict(outcomes))


def test_block_allocator_without_prefix_caching() -> None:
    outcomes = run(BlockAllocatorAdapter.factory(prefix_caching=False, checked=False),
                   settings=QUICK)
    assert outcomes["admit: ok"] > 0 and outcomes["admit: ok with prefix hits"] == 0


def test_engine_front_door_observably() -> None:
    outcomes = run(EngineAdapter.factory(), settings=QUICK)
    assert outcomes["admit: ok with prefix hits"] > 0, dict(outcomes)
    assert outcomes["freed while a launch is in flight"] > 0, dict(outcomes)
    assert outcomes["fork: ok"] == 0  # no fork capability: the rule is never drawn


def test_engine_front_door_with_its_spec_view() -> None:
    outcomes = run(EngineAdapter.factory(spec_view=True), settings=QUICK)
    assert outcomes["admit: ok with prefix hits"] > 0, dict(outcomes)


def test_third_party_free_list_allocator() -> None:
    outcomes = run(third_party.FreeListAdapter, settings=QUICK)
    assert outcomes["freed while a launch is in flight"] > 0, dict(outcomes)
    assert outcomes["admit: refused"] > 0, dict(outcomes)


def test_adapters_satisfy_the_protocol() -> None:
    for adapter in (BlockAllocatorAdapter.factory()(4, 2), EngineAdapter.factory()(4, 2),
                    third_party.FreeListAdapter(4, 2)):
        assert isinstance(adapter, AllocatorAdapter)
    assert isinstance(BlockAllocatorAdapter.factory()(4, 2), SpecView)
    assert not third_party.FreeListAdapter.capabilities.spec_view


# ---- planted bugs: caught, and the message says what broke ----------------------------------
def test_third_party_eager_free_is_caught() -> None:
    err = _caught(third_party.EagerFreeAdapter)
    assert err.check == "no_reuse_while_in_flight"
    text = str(err)
    assert "still reads" in text and CHECKS["no_reuse_while_in_flight"] in text
    assert "free('req_0')" in text  # the calls that led there
    program = "\n".join(getattr(err, "__notes__", []))
    assert "state.launch(rids=[req_0])" in program  # hypothesis's shrunk program
    assert "# launch_0 = launch(['req_0'])" in program  # and the adapter calls each step made


def test_block_allocator_leaky_free_is_caught() -> None:
    err = _caught(_variant(LeakyFree))
    assert err.check == "free_block_accounting", str(err)
    assert "num_free_blocks() is" in str(err) and "in no live table" in str(err)


def test_block_allocator_unpinned_launch_is_caught_by_the_spec_view() -> None:
    err = _caught(_variant(UnpinnedLaunch))
    assert err.check == "launch_pins", str(err)
    assert "the spec state has launch" in str(err) and "launch(['req_0'])" in str(err)


def test_block_allocator_unpinned_launch_is_caught_observably() -> None:
    err = _caught(_variant(UnpinnedLaunch, spec_view=False))
    assert err.check in ("no_reuse_while_in_flight", "calls_succeed"), str(err)


def test_block_allocator_stale_generations_need_the_spec_view() -> None:
    err = _caught(_variant(StaleGenerations))
    assert err.check == "spec_refinement", str(err)
    assert "gen[" in str(err)
    run(_variant(StaleGenerations, spec_view=False),
        settings=QUICK)  # invisible to the observable checks alone


def test_block_allocator_salt_blind_hits_are_caught() -> None:
    with pytest.raises(CheckFailed) as info:  # one block size and short programs: fast shrink
        run(_variant(SaltBlind, spec_view=False), block_sizes=(1,),
            settings=settings(CAUGHT, stateful_step_count=12))
    err = info.value
    assert err.check == "hits_on_committed_kv", str(err)
    assert "salt" in str(err)


# ---- make_test_case ------------------------------------------------------------------------
def _run_case(case: type[unittest.TestCase]) -> unittest.TestResult:
    suite = unittest.defaultTestLoader.loadTestsFromTestCase(case)
    result = unittest.TestResult()
    suite.run(result)
    return result


def test_make_test_case_passes_and_fails() -> None:
    good = make_test_case(third_party.FreeListAdapter, settings=QUICK, name="FreeList")
    assert issubclass(good, unittest.TestCase) and good.__name__ == "TestFreeList"
    result = _run_case(good)
    assert result.wasSuccessful(), result.failures + result.errors
    bad = make_test_case(third_party.EagerFreeAdapter, settings=QUICK)
    result = _run_case(bad)
    assert len(result.failures) == 1
    assert "[no_reuse_while_in_flight]" in result.failures[0][1]
