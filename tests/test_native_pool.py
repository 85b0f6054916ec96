"""NativePool: the spec's transitions compiled to native loops, side by side with BlockPool.

BlockPool is held to the spec by the refinement campaign; here the native pool is held to
BlockPool, op by op, on seeded random workloads (same results, same errors, same state, same
queue order, same retire queue), and its generated code to the interpreted spec
(``self_check``)."""
# ruff: noqa: B023 - each operation's lambdas are called at once by _Pair.do, inside the loop

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest

pytest.importorskip("numba")

from pagedkv.allocator import (  # noqa: E402
    BlockPool,
    DoubleFree,
    GuardViolation,
    InvalidArgument,
    InvariantViolation,
    PendingAccess,
    native_source,  # noqa: E402
)
from pagedkv.allocator import native_pool as native  # noqa: E402
from pagedkv.allocator.native_pool import NativePool, NativeUnavailable  # noqa: E402
from pagedkv.spec import (  # noqa: E402
    ALLOCATED,
    CACHED,
    PUBLISHED,
    REFERENCED,
    TRANSITIONS,
    violations,
)

STATE_FIELDS = ("state", "ref", "retire", "wpend", "filled", "gen", "init", "hash", "queued",
                "count", "clock", "hmap", "held", "inflight")


def _snapshot(pool) -> dict:
    storage = pool.storage() if isinstance(pool, NativePool) else pool
    out = {f: getattr(storage, f) for f in STATE_FIELDS}
    out = {f: (dict(v) if isinstance(v, dict) else set(v) if isinstance(v, set) else list(v))
           for f, v in out.items()}
    out["held"] = {r: set(bs) for r, bs in storage.held.items()}
    out["queue"] = (pool.queue_order() if isinstance(pool, NativePool)
                    else pool.queue.order())
    out["retire_queue"] = list(pool.retire_queue)
    out["cached_busy"] = pool.cached_busy
    return out


def _outcome(fn):
    try:
        result = fn()
    except Exception as exc:  # noqa: BLE001 - compared by type
        return type(exc)
    if result is None or isinstance(result, int):
        return result
    return [int(b) for b in result]


class _Pair:
    """The same operation on a BlockPool and a NativePool."""

    def __init__(self, n: int, block_size: int, checked: bool, spec=None) -> None:
        self.ref = BlockPool(n, block_size, checked=checked, spec=spec)
        self.nat = NativePool(n, block_size, checked=checked, spec=spec)
        self.B = block_size
        self.seen: list[tuple[str, object]] = []  # (op, its outcome: None, blocks or error)

    def do(self, name: str, ref_call, nat_call) -> object:
        want, got = _outcome(ref_call), _outcome(nat_call)
        assert got == want, f"{name}: native {got}, BlockPool {want}"
        assert _snapshot(self.nat) == _snapshot(self.ref), f"state differs after {name}"
        self.seen.append((name, want))
        return want


def _random_workload(seed: int, checked: bool, steps: int = 300) -> _Pair:
    rng = random.Random(seed)
    pair = _Pair(rng.choice((6, 12, 24)), 4, checked)
    ref, nat = pair.ref, pair.nat
    holders: list[str] = []
    serial = 0
    inflight: list[int] = []
    for _ in range(steps):
        op = rng.random()
        if op < 0.06 or not holders:
            r = f"r{serial}"
            serial += 1
            holders.append(r)
            pair.do("open_holder", lambda r=r: ref.open_holder(r),
                    lambda r=r: nat.open_holder(r))
            continue
        r = rng.choice(holders)
        held = sorted(ref.held.get(r, ()))
        if op < 0.26:
            n = rng.randrange(0, 4)
            if ref.usable() >= n:
                cached = len(ref.hmap)
                pair.do("take_many", lambda: ref.take_many(r, n), lambda: nat.take_many(r, n))
                if len(ref.hmap) < cached:
                    pair.seen.append(("evicted", cached - len(ref.hmap)))
        elif op < 0.38 and held:
            blocks = rng.sample(held, rng.randrange(1, len(held) + 1))
            if rng.random() < 0.1:  # a block r does not hold: DoubleFree after the others
                blocks.append(rng.randrange(ref.num_blocks))
            pair.do("release_many",
                    lambda: ref.run_many("release", [(b, r) for b in blocks]),
                    lambda: nat.release_many(r, blocks))
        elif op < 0.44:
            shareable = (REFERENCED, CACHED, PUBLISHED) if rng.random() < 0.2 else (REFERENCED,
                                                                                    CACHED)
            cands = [b for b in range(ref.num_blocks)
                     if ref.state[b] in shareable and b not in held]
            if cands:
                blocks = rng.sample(cands, rng.randrange(1, len(cands) + 1))
                pair.do("share_many", lambda: ref.run_many("share", [(b, r) for b in blocks]),
                        lambda: nat.share_many(r, blocks))
        elif op < 0.54:
            mine = [b for b in held if ref.state[b] == ALLOCATED]
            if mine:
                pair.do("publish_many", lambda: ref.run_many("publish", [(b, r) for b in mine]),
                        lambda: nat.publish_many(r, mine))
        elif op < 0.66:
            mine = [b for b in held if ref.state[b] == PUBLISHED and ref.ref[b] == 1
                    and ref.filled[b] < pair.B]
            if mine:
                w = [rng.randrange(1, pair.B - ref.filled[b] + 1) for b in mine]
                pair.do("begin_write_many",
                        lambda: ref.run_many("begin_write", [(b, r, k) for b, k in
                                                             zip(mine, w, strict=True)]),
                        lambda: nat.begin_write_many(r, mine, w))
        elif op < 0.74:
            pending = [b for b in range(ref.num_blocks) if ref.wpend[b] > 0]
            if pending:
                blocks = rng.sample(pending, rng.randrange(1, len(pending) + 1))
                pair.do("end_write_many",
                        lambda: ref.run_many("end_write", [(b,) for b in blocks]),
                        lambda: nat.end_write_many(blocks))
        elif op < 0.77:
            mine = [b for b in held if ref.state[b] == PUBLISHED and ref.ref[b] == 1
                    and ref.wpend[b] == 0]
            if mine:
                b = rng.choice(mine)
                k = rng.randrange(0, ref.filled[b] + 1) if rng.random() < 0.9 else pair.B + 1
                pair.do("rewind", lambda: ref.rewind(b, r, k), lambda: nat.rewind(b, r, k))
        elif op < 0.84:
            full = [b for b in held if ref.state[b] == PUBLISHED and ref.filled[b] == pair.B
                    and (ref.wpend[b] == 0 or rng.random() < 0.2)]
            if full:
                hashes = [rng.randrange(1, 6) if rng.random() < 0.5 else 2**255 + serial + i
                          for i, _ in enumerate(full)]
                serial += len(full)
                pair.do("commit_many",
                        lambda: ref.run_many("commit", [(b, r, h) for b, h in
                                                        zip(full, hashes, strict=True)]),
                        lambda: nat.commit_many(r, full, hashes))
        elif op < 0.9:
            L = ref.clock[0]
            pair.do("launch", lambda: ref.launch(L), lambda: None if nat.launch() == L else L)
            inflight.append(L)
        elif op < 0.96 and inflight:
            L = inflight.pop(rng.randrange(len(inflight)))
            pair.do("complete", lambda: ref.complete(L), lambda: nat.complete(L))
            pair.do("advance_watermark", ref.advance_watermark, nat.advance_watermark)
        elif not held:
            holders.remove(r)
            pair.do("close_holder", lambda: ref.close_holder(r), lambda: nat.close_holder(r))
    assert nat.structure_errors() == []
    assert violations(nat.abstract()) == []
    return pair


@pytest.mark.parametrize("seed", range(12))
def test_the_native_pool_makes_blockpools_moves_op_by_op(seed):
    pair = _random_workload(seed, checked=seed % 2 == 0)
    assert len(pair.seen) > 100


def test_the_workloads_reach_what_they_compare():
    """Across the seeds every batch succeeds somewhere, some release is refused (DoubleFree),
    some cached block is evicted and some block waits for a launch: else the comparison
    above proves less than it says."""
    seen: list[tuple[str, object]] = []
    for seed in range(12):
        seen += _random_workload(seed, checked=False).seen
    ok = {name for name, out in seen if not isinstance(out, type)}
    assert ok >= {"open_holder", "take_many", "release_many", "share_many", "publish_many",
                  "begin_write_many", "end_write_many", "commit_many", "launch", "complete",
                  "advance_watermark", "close_holder", "rewind"}
    assert ("release_many", DoubleFree) in seen
    assert any(name == "evicted" for name, _ in seen)
    assert any(name == "advance_watermark" and out for name, out in seen)


def test_take_many_evicts_cached_blocks_in_lru_order_and_frees_their_hashes():
    nat = NativePool(4, 2, checked=True)
    nat.open_holder("a")
    blocks = nat.take_many("a", 4)
    nat.publish_many("a", blocks)
    nat.begin_write_many("a", blocks, 2)
    nat.end_write_many(blocks)
    nat.commit_many("a", blocks, [11, 12, 13, 14])
    nat.release_many("a", blocks[::-1])  # cached, the last block at the LRU head
    assert nat.queue_order() == blocks[::-1].tolist()
    assert nat.lookup(14) == blocks[3]
    nat.open_holder("b")
    taken = nat.take_many("b", 2)
    assert taken.tolist() == blocks[::-1][:2].tolist()
    assert nat.lookup(14) is None and nat.lookup(13) is None and nat.lookup(12) == blocks[1]
    assert 14 not in nat._hslot and 13 not in nat._hslot  # evicted digests' slots freed
    assert nat.structure_errors() == [] and violations(nat.abstract()) == []


def test_lookups_read_the_hash_map():
    nat = NativePool(4, 2, checked=True)
    nat.open_holder("a")
    blocks = nat.take_many("a", 3)
    nat.publish_many("a", blocks)
    nat.begin_write_many("a", blocks, [2, 2, 2])
    nat.end_write_many(blocks)
    nat.commit_many("a", blocks[[0, 2]], [11, 13])
    assert nat.lookup_many([11, 12, 13, 99]).tolist() == [blocks[0], -1, blocks[2], -1]
    assert nat.prefix_hits([11, 13]).tolist() == [blocks[0], blocks[2]]
    assert nat.prefix_hits([11, 12, 13]).tolist() == [blocks[0]]
    assert nat.prefix_hits([]).tolist() == []
    assert [nat.lookup(h) for h in (11, 12, 13)] == [blocks[0], None, blocks[2]]
    with pytest.raises(GuardViolation, match="commit refused"):
        nat.commit_many("a", blocks[1:2], [11])  # 11 is cached already
    assert 11 in nat._hslot and nat.lookup(11) == blocks[0]


def test_the_slot_tables_grow_past_their_first_size():
    """More holders than H's first 64 columns, more digests than X's 64 slots, more keys than
    the holds set's first 1024 cells: the same moves as BlockPool's."""
    pair = _Pair(900, 1, checked=False)
    ref, nat = pair.ref, pair.nat
    ref.open_holder("owner")
    nat.open_holder("owner")
    blocks = pair.do("take", lambda: ref.take_many("owner", 900),
                     lambda: nat.take_many("owner", 900))
    pair.do("publish", lambda: ref.run_many("publish", [(b, "owner") for b in blocks]),
            lambda: nat.publish_many("owner", blocks))
    pair.do("write", lambda: ref.run_many("begin_write", [(b, "owner", 1) for b in blocks]),
            lambda: nat.begin_write_many("owner", blocks, 1))
    pair.do("end", lambda: ref.run_many("end_write", [(b,) for b in blocks]),
            lambda: nat.end_write_many(blocks))
    hashes = [1000 + b for b in blocks]
    pair.do("commit", lambda: ref.run_many("commit", [(b, "owner", h) for b, h in
                                                      zip(blocks, hashes, strict=True)]),
            lambda: nat.commit_many("owner", blocks, hashes))
    for i in range(100):
        r = ("reader", i)
        ref.open_holder(r)
        nat.open_holder(r)
        part = blocks[i * 9:(i + 1) * 9]
        ref.run_many("share", [(b, r) for b in part])
        nat.share_many(r, part)
    assert len(nat.X) > 64 and nat.H.shape[1] > 64 and len(nat.K) > 1024
    assert _snapshot(nat) == _snapshot(ref)
    assert nat.structure_errors() == []


# ---- the generated code is the spec's --------------------------------------------------------
def test_the_generated_module_agrees_with_the_interpreted_spec():
    assert native.self_check(native.native_module(), TRANSITIONS) is None


def test_generated_code_that_differs_from_the_spec_is_refused(monkeypatch, tmp_path):
    """A generated module one slot off in begin_write's effect fails the self-check, and no
    pool is built on it."""
    real = native_source.module_source

    def wrong(spec, invariants):
        src = real(spec, invariants)
        assert "(B[4, b] + w)" in src
        return src.replace("(B[4, b] + w)", "(B[4, b] + w + 1)")

    monkeypatch.setenv("PAGEDKV_NATIVE_CACHE", str(tmp_path))
    monkeypatch.setattr(native_source, "module_source", wrong)
    monkeypatch.setattr(native, "_BY_SPEC", {})
    with pytest.raises(NativeUnavailable, match="begin_write"):
        NativePool(4, 4)


def test_a_spec_passed_in_is_the_one_that_runs():
    """A release guard weakened in the spec passed in (no holder check) lets a release of an
    unheld block through in both pools alike; the spec as written refuses it."""
    lax = dataclasses.replace(
        TRANSITIONS["release"],
        guard=lambda ops, s, b, r: ops.And(b >= 0, b < s.num_blocks, s.ref[b] > 0))
    spec = {**TRANSITIONS, "release": lax}
    for nat in (NativePool(4, 4, checked=False, spec=spec), NativePool(4, 4, checked=False)):
        nat.open_holder("a")
        nat.open_holder("b")
        nat.take_many("a", 1)
        if nat.spec is spec:
            nat.release_many("b", [0])  # allowed by the weakened guard
            assert nat.H[1, nat._slot["b"]] == -1  # the spec's effect, literally
        else:
            with pytest.raises(DoubleFree, match="holder 'b' must hold block 0"):
                nat.release_many("b", [0])


# ---- refusals and bad input -------------------------------------------------------------------
@pytest.fixture
def pool():
    nat = NativePool(8, 4, checked=True)
    nat.open_holder("a")
    nat.take_many("a", 3)
    return nat


@pytest.mark.parametrize("call, error", [
    (lambda p: p.take_many("a", -1), InvalidArgument),
    (lambda p: p.take_many("a", 1.0), InvalidArgument),
    (lambda p: p.take_many("a", True), InvalidArgument),
    (lambda p: p.take_many(["unhashable"], 1), InvalidArgument),
    (lambda p: p.release_many("a", [8]), InvalidArgument),
    (lambda p: p.release_many("a", [-1]), InvalidArgument),
    (lambda p: p.release_many("a", [0.0]), InvalidArgument),
    (lambda p: p.release_many("a", [True]), InvalidArgument),
    (lambda p: p.release_many("a", {0}), InvalidArgument),
    (lambda p: p.release_many("a", np.zeros((1, 1), np.int64)), InvalidArgument),
    (lambda p: p.release_many("a", np.array([0.5])), InvalidArgument),
    (lambda p: p.release_many("b", [0]), DoubleFree),
    (lambda p: p.share_many("a", [0]), GuardViolation),
    (lambda p: p.publish_many("b", [0]), GuardViolation),
    (lambda p: p.begin_write_many("a", [0], 1), GuardViolation),
    (lambda p: p.begin_write_many("a", [0], [1, 1]), InvalidArgument),
    (lambda p: p.commit_many("a", [0], [0]), GuardViolation),
    (lambda p: p.commit_many("a", [0], []), InvalidArgument),
    (lambda p: p.commit_many("a", [0], [-5]), InvalidArgument),
    (lambda p: p.end_write_many([0]), GuardViolation),
    (lambda p: p.close_holder("a"), GuardViolation),
    (lambda p: p.open_holder("a"), GuardViolation),
    (lambda p: p.complete(0), GuardViolation),
])
def test_bad_input_and_refusals_are_typed_and_change_nothing(pool, call, error):
    before = _snapshot(pool)
    with pytest.raises(error):
        call(pool)
    assert _snapshot(pool) == before


def test_a_refusal_names_the_failed_condition_in_words(pool):
    with pytest.raises(DoubleFree, match=r"release refused: .*holder 'b' must hold block 0"):
        pool.release_many("b", [0])


def test_a_recycle_under_a_launch_in_flight_waits_for_it():
    nat = NativePool(2, 4, checked=True)
    nat.open_holder("a")
    blocks = nat.take_many("a", 2)
    L = nat.launch()
    nat.release_many("a", blocks)
    assert nat.usable() == 0 and nat.waiting() == 2 and len(nat.retire_queue) == 2
    nat.complete(L)
    assert nat.advance_watermark() == 1
    assert nat.usable() == 2 and nat.waiting() == 0 and not nat.retire_queue


def test_allocate_refuses_a_block_a_launch_still_reads():
    """A FREE block retired above the watermark (corrupted on purpose) is refused by the
    spec's allocate guard, natively: PendingAccess, in words."""
    nat = NativePool(2, 4, checked=False)
    nat.open_holder("a")
    nat.launch()
    nat.B[native_source.ROW["retire"], 0] = 1
    with pytest.raises(PendingAccess, match="allocate refused"):
        nat.take_many("a", 1)


def test_checked_mode_rechecks_the_touched_blocks_invariants():
    """A block whose record is corrupted (an ALLOCATED block flagged queued) is caught by
    checked mode when a batch touches it; unchecked mode does not look (which is what the
    check adds)."""
    for checked in (True, False):
        nat = NativePool(4, 4, checked=checked)
        nat.open_holder("a")
        blocks = nat.take_many("a", 2)
        nat.B[native_source.ROW["queued"], blocks[0]] = 1
        if checked:
            with pytest.raises(InvariantViolation, match="queue_is_free_and_cached"):
                nat.publish_many("a", blocks)
        else:
            nat.publish_many("a", blocks)
