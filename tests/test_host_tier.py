"""HostPool: typed errors, atomicity, LRU eviction, and refinement of the host spec."""

from __future__ import annotations

import pytest
from hypothesis import settings

from pagedkv.allocator.errors import InvalidArgument, InvariantViolation, OutOfBlocks
from pagedkv.allocator.host import (
    DevicePinned,
    HostGuardViolation,
    HostMiss,
    HostPool,
    NoTransfer,
)
from pagedkv.proofs import host_refinement
from pagedkv.proofs.host_refinement import HostMachine
from pagedkv.spec.states import NO_BLOCK

_diff = host_refinement.state_diff


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


# --- refinement: HostPool agrees with the spec, in both directions (the verify campaign's
# machine, ``pagedkv.proofs.host_refinement``) ---------------------------------------------
TestHostRefinement = HostMachine.TestCase
TestHostRefinement.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


class _HitOnStoring(HostPool):
    """A planted bug: a store still in flight counts as a hit (KV not yet on the host)."""

    def lookup(self, h: int):
        b = self._arrays["hmap"][h]
        return None if b == NO_BLOCK else b


class _LoadKeepsPin(HostPool):
    """A planted bug: a completed load does not unpin its block."""

    def complete_load(self, blocks):
        self._block(blocks[0]) if blocks else None


@pytest.mark.parametrize("bug", [_HitOnStoring, _LoadKeepsPin])
def test_the_host_campaign_catches_a_planted_bug(monkeypatch, bug) -> None:
    assert host_refinement.run_host_campaign(500)["ok"]
    monkeypatch.setattr(host_refinement, "pool_factory", bug)
    with pytest.raises(host_refinement.RefinementError):
        host_refinement.run_host_campaign(3000, shrink=False)


def test_verify_reports_the_host_tier_rows_and_campaign() -> None:
    from pagedkv.proofs import cli as verify_cli
    from pagedkv.spec.host_invariants import HOST_INVARIANTS

    part = verify_cli.run_host_campaign_part(200)
    assert part["ok"] and part["steps"] >= 200
    parts = {"host_campaign": part}
    rows = {r["invariant"]: r for r in verify_cli.build_rows(parts)}
    assert all(rows[n]["stateful steps"] == f"{part['steps']:,} ok (host tier)"
               for n in HOST_INVARIANTS)
    assert "host tier campaign" in verify_cli.render_summary(parts)
    failed = {n: r for n, r in ((r["invariant"], r) for r in verify_cli.build_rows(
        {"host_campaign": {"ok": False}})) if n in HOST_INVARIANTS}
    assert all(r["stateful steps"] == "FAILED" for r in failed.values())


def _refusal(call) -> tuple[type, str]:
    with pytest.raises(HostGuardViolation) as err:
        call()
    return type(err.value), str(err.value)


def test_refusals_name_the_failed_conditions_in_host_words() -> None:
    pool = HostPool(3)
    [b] = pool.prepare_store([7], [4])  # b STORING, device block 4 pinned by it
    cases = [
        (lambda: pool.prepare_store([8], [4]), DevicePinned,
         ["the host block whose store reads device block 4 (it is 0) must be none"]),
        (lambda: pool.prepare_load([7]), HostMiss,
         ["the state of host block 0 (it is STORING) must be STORED",
          "the state of host block 0 (it is STORING) must be LOADING"]),
        (lambda: pool.prepare_load([9]), HostMiss, ["hash 9 is not on the host"]),
        (lambda: pool.complete_load([b]), NoTransfer,
         ["the state of host block 0 (it is STORING) must be LOADING"]),
        (lambda: pool.discard([b]), HostGuardViolation,
         ["the state of host block 0 (it is STORING) must be STORED"]),
        (lambda: pool.complete_store([1], True), NoTransfer,
         ["the state of host block 1 (it is FREE) must be STORING"]),
    ]
    before = pool.snapshot()
    for call, error, words in cases:
        kind, text = _refusal(call)
        assert kind is error, text
        assert "does not hold" not in text, text
        for w in words:
            assert w in text, text
    assert _diff(before, pool.snapshot()) == []
