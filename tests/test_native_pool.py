"""NativePool: the spec's transitions compiled to native loops, side by side with BlockPool.

BlockPool is held to the spec by the refinement campaign; here the native pool is held to
BlockPool, op by op, on seeded random workloads (``proofs.native_refinement``: same results,
same errors, same state, same queue order, same retire queue), and its generated code to the
interpreted spec (``self_check``)."""
# ruff: noqa: B023 - each operation's lambdas are called at once by Pair.do

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest

pytest.importorskip("numba")

from pagedkv.allocator import (  # noqa: E402
    DoubleFree,
    GuardViolation,
    InvalidArgument,
    InvariantViolation,
    OutOfBlocks,
    PendingAccess,
    native_source,  # noqa: E402
)
from pagedkv.allocator import native_pool as native  # noqa: E402
from pagedkv.allocator.native_pool import NativePool, NativeUnavailable  # noqa: E402
from pagedkv.proofs.native_refinement import (  # noqa: E402
    Pair,
    random_workload,
    run_native_campaign,
    snapshot,
)
from pagedkv.spec import REFERENCED, TRANSITIONS, violations  # noqa: E402


@pytest.mark.parametrize("seed", range(12))
def test_the_native_pool_makes_blockpools_moves_op_by_op(seed):
    pair = random_workload(seed, checked=seed % 2 == 0)
    assert len(pair.seen) > 100


def test_the_campaign_reports_a_difference():
    """A native pool that answers differently (the blocks it took, in reverse order) fails
    the campaign, naming the seed and the operation."""
    ok = run_native_campaign(range(2), steps=60)
    assert ok["ok"] and ok["ops"] > 60
    real = NativePool.take_many

    def wrong(self, r, n):
        return real(self, r, n)[::-1]

    try:
        NativePool.take_many = wrong
        bad = run_native_campaign(range(2), steps=60)
    finally:
        NativePool.take_many = real
    assert not bad["ok"] and "seed 0" in bad["error"] and "take_many" in bad["error"]


def test_the_workloads_reach_what_they_compare():
    """Across the seeds every batch succeeds somewhere, some release is refused (DoubleFree),
    some cached block is evicted and some block waits for a launch: else the comparison
    above proves less than it says."""
    seen: list[tuple[str, object]] = []
    for seed in range(12):
        seen += random_workload(seed, checked=False).seen
    ok = {name for name, out in seen if not isinstance(out, type)}
    assert ok >= {"open_holder", "take", "take_many", "release", "release_many", "share_many",
                  "share_prefix", "publish_many",
                  "begin_write_many", "end_write_many", "commit_many", "cache_many", "launch",
                  "complete",
                  "advance_watermark", "close_holder", "rewind", "admit", "finish"}
    assert ("release_many", DoubleFree) in seen
    assert ("finish", DoubleFree) in seen and ("admit", OutOfBlocks) in seen
    assert ("finish", GuardViolation) in seen and ("admit", GuardViolation) in seen
    assert any(name == "admit" and isinstance(out, tuple) and out[1] for name, out in seen)
    assert any(name == "evicted" for name, _ in seen)
    assert any(name == "advance_watermark" and out for name, out in seen)
    assert any(name == "cache_skipped" and out for name, out in seen)


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


def _cached_under_a_launch(pair: Pair, n: int) -> tuple[list[int], int]:
    """Holder "a" takes n blocks, writes and commits them; a launch is numbered; "a" lets
    them go: n CACHED blocks retired above the watermark (busy), on both pools."""
    ref, nat = pair.ref, pair.nat
    pair.do("open", lambda: ref.open_holder("a"), lambda: nat.open_holder("a"))
    blocks = pair.do("take", lambda: ref.take_many("a", n), lambda: nat.take_many("a", n))
    pair.do("publish", lambda: ref.run_many("publish", [(b, "a") for b in blocks]),
            lambda: nat.publish_many("a", blocks))
    pair.do("write", lambda: ref.run_many("begin_write", [(b, "a", 2) for b in blocks]),
            lambda: nat.begin_write_many("a", blocks, 2))
    pair.do("end", lambda: ref.run_many("end_write", [(b,) for b in blocks]),
            lambda: nat.end_write_many(blocks))
    hashes = [100 + b for b in blocks]
    pair.do("commit", lambda: ref.run_many("commit", [(b, "a", h) for b, h in
                                                      zip(blocks, hashes, strict=True)]),
            lambda: nat.commit_many("a", blocks, hashes))
    L = ref.clock[0]
    pair.do("launch", lambda: ref.launch(L), lambda: None if nat.launch() == L else L)
    pair.do("release", lambda: ref.run_many("release", [(b, "a") for b in blocks]),
            lambda: nat.release_many("a", blocks))
    return blocks, L


@pytest.mark.parametrize("checked", [False, True])
def test_busy_cached_blocks_revived_released_again_and_evicted_as_blockpool_does(checked):
    """Cached blocks retired under a launch in flight: one revived by a share (the busy count
    drops), released again at the same clock (one retire-queue entry, not two), then a take
    that evicts the busy ones on its way (they wait, RECLAIMED) until the queue runs out; the
    launch's completion recycles them."""
    pair = Pair(6, 2, checked)
    ref, nat = pair.ref, pair.nat
    blocks, L = _cached_under_a_launch(pair, 4)
    assert nat.cached_busy == 4
    pair.do("open b", lambda: ref.open_holder("b"), lambda: nat.open_holder("b"))
    pair.do("revive", lambda: ref.run_many("share", [(blocks[0], "b")]),
            lambda: nat.share_many("b", [blocks[0]]))
    assert nat.cached_busy == 3
    pair.do("release again", lambda: ref.run_many("release", [(blocks[0], "b")]),
            lambda: nat.release_many("b", [blocks[0]]))
    assert len(nat.retire_queue) == 4 and nat.cached_busy == 4
    pair.do("open c", lambda: ref.open_holder("c"), lambda: nat.open_holder("c"))
    assert pair.do("take past the busy ones", lambda: ref.take_many("c", 3),
                   lambda: nat.take_many("c", 3)) is AssertionError  # the queue ran out
    assert nat.cached_busy == 0 and nat.waiting() == 4
    pair.do("complete", lambda: ref.complete(L), lambda: nat.complete(L))
    pair.do("advance", ref.advance_watermark, nat.advance_watermark)
    assert nat.usable() == 4 and nat.structure_errors() == []


def test_the_holder_set_is_rehashed_with_its_live_keys():
    """Takes in batches past half the holder set's first 1,024 cells, keys alive: the rehash
    carries them over (the holders' blocks read back from the set equal BlockPool's)."""
    pair = Pair(1500, 1, checked=False)
    ref, nat = pair.ref, pair.nat
    pair.do("open", lambda: ref.open_holder("a"), lambda: nat.open_holder("a"))
    blocks = []
    for _ in range(15):
        blocks += pair.do("take", lambda: ref.take_many("a", 100),
                          lambda: nat.take_many("a", 100))
    assert len(nat.K) > 1024 and len(nat.held_by("a")) == 1500
    for i in range(0, 1500, 100):  # each release's guard looks its key up in the new set
        part = blocks[i:i + 100]
        pair.do("release", lambda: ref.run_many("release", [(b, "a") for b in part]),
                lambda: nat.release_many("a", part))
    assert not nat.held_by("a") and nat.usable() == 1500


def test_an_idle_cached_block_revived_at_the_watermark_is_not_counted_busy():
    """A cached block let go with no launch in flight (retired at the watermark, after one
    launch completed) is revived by a share: it was not busy, so the busy count stays."""
    pair = Pair(4, 2, checked=True)
    ref, nat = pair.ref, pair.nat
    pair.do("launch", lambda: ref.launch(0), lambda: None if nat.launch() == 0 else 0)
    pair.do("complete", lambda: ref.complete(0), lambda: nat.complete(0))
    pair.do("advance", ref.advance_watermark, nat.advance_watermark)
    assert nat.M[native_source.CLOCK0 + 1] == 1  # the watermark
    blocks, L = _cached_under_a_launch(pair, 1)
    pair.do("complete", lambda: ref.complete(L), lambda: nat.complete(L))
    pair.do("advance", ref.advance_watermark, nat.advance_watermark)
    pair.do("open b", lambda: ref.open_holder("b"), lambda: nat.open_holder("b"))
    pair.do("revive", lambda: ref.run_many("share", [(blocks[0], "b")]),
            lambda: nat.share_many("b", blocks))
    pair.do("release", lambda: ref.run_many("release", [(blocks[0], "b")]),
            lambda: nat.release_many("b", blocks))
    pair.do("revive at the watermark", lambda: ref.run_many("share", [(blocks[0], "b")]),
            lambda: nat.share_many("b", blocks))
    assert nat.cached_busy == 0 and nat.structure_errors() == []


def test_checked_mode_checks_every_block_a_take_touched():
    """A take's touched blocks are checked, those it allocates and those it evicts on the way:
    a corrupted one raises InvariantViolation in checked mode (unchecked, the take goes on)."""
    for checked in (True, False):
        nat = NativePool(4, 2, checked=checked)
        nat.open_holder("a")
        nat.B[native_source.ROW["wpend"], 0] = 1  # the head, FREE: allocated with a write
        if checked:
            with pytest.raises(InvariantViolation, match="no_write_when_free"):
                nat.take_many("a", 1)
        else:
            assert nat.take_many("a", 1).tolist() == [0]
        pair = Pair(2, 2, checked)
        _cached_under_a_launch(pair, 1)  # block 0 CACHED and busy, the queue's head
        pair.nat.B[native_source.ROW["ref"], 0] = 1  # a cached block with a reference
        pair.nat.open_holder("c")
        with pytest.raises(InvariantViolation if checked else AssertionError):
            pair.nat.take_many("c", 2)  # takes 1, evicts 0 (it waits), then runs out


def test_structure_errors_find_a_wrong_busy_count_queue_link_and_holder_count():
    nat = NativePool(4, 2, checked=False)
    nat.open_holder("a")
    nat.take_many("a", 2)
    assert nat.structure_errors() == []
    for row, col, value, kind in ((None, native_source.CACHED_BUSY, 1, "conservation"),
                                  ("next", 4, 1, "queue_is_free_and_cached"),
                                  ("H", 1, 5, "holders_consistent")):
        saved = (nat.M.copy(), nat.B.copy(), nat.H.copy())
        if row is None:
            nat.M[col] = value
        elif row == "H":
            nat.H[col, nat._slot["a"]] = value
        else:
            nat.B[native_source.ROW[row], col] = value  # the sentinel's head skips block 2
        assert kind in {k for k, _ in nat.structure_errors()}
        nat.M[:], nat.B[:], nat.H[:] = saved


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
    with pytest.raises(GuardViolation, match="commit refused"):
        nat.commit_many("a", blocks[[1, 0]], [77, 78])  # block 0 is committed already
    assert nat.lookup(77) == blocks[1] and 78 not in nat._hslot  # the refused one's goes


@pytest.mark.parametrize("checked", [False, True])
def test_cache_many_commits_the_due_blocks_as_blockpool_does(checked):
    """A caching pass commits a PUBLISHED block whose hash no block holds yet and skips the
    rest -- a hash registered earlier, one an earlier block of the same pass just
    registered, a block committed already -- on both pools alike; a due block whose write
    is still in flight is refused after the commits before it, and its digest is not left
    interned."""
    pair = Pair(8, 2, checked=checked)
    ref, nat = pair.ref, pair.nat
    pair.do("open", lambda: ref.open_holder("a"), lambda: nat.open_holder("a"))
    b = pair.do("take", lambda: ref.take_many("a", 5), lambda: nat.take_many("a", 5))
    pair.do("publish", lambda: ref.run_many("publish", [(x, "a") for x in b]),
            lambda: nat.publish_many("a", b))
    pair.do("write", lambda: ref.run_many("begin_write", [(x, "a", 2) for x in b]),
            lambda: nat.begin_write_many("a", b, 2))
    pair.do("end", lambda: ref.run_many("end_write", [(x,) for x in b]),
            lambda: nat.end_write_many(b))
    pair.do("commit", lambda: ref.commit(b[0], "a", 7), lambda: nat.commit_many("a", b[:1], [7]))
    pair.do("cache", lambda: ref.cache_many("a", [b[1], b[2], b[3], b[0]], [7, 8, 8, 9]),
            lambda: nat.cache_many("a", [b[1], b[2], b[3], b[0]], [7, 8, 8, 9]))
    pair.do("rewind", lambda: ref.rewind(b[4], "a", 1), lambda: nat.rewind(b[4], "a", 1))
    pair.do("write", lambda: ref.begin_write(b[4], "a", 1),
            lambda: nat.begin_write_many("a", b[4:], 1))  # b[4]'s write is in flight
    refused = pair.do("refused", lambda: ref.cache_many("a", [b[3], b[4]], [10, 11]),
                      lambda: nat.cache_many("a", [b[3], b[4]], [10, 11]))
    assert refused is GuardViolation
    assert [nat.lookup(h) for h in (7, 8, 9, 10, 11)] == [b[0], b[2], None, b[3], None]
    assert 9 not in nat._hslot and 11 not in nat._hslot  # digests of commits not made go


@pytest.mark.parametrize("checked", [False, True])
def test_share_prefix_shares_the_leading_registered_blocks(checked):
    """``share_prefix`` shares the blocks of the leading registered hashes and stops at the
    first miss (a cached block is revived), as ``prefix_hits`` + ``share_many``; a refused
    share (a holder not open) raises after the shares before it, which here are none."""
    nat = NativePool(6, 2, checked=checked)
    nat.open_holder("a")
    blocks = nat.take_many("a", 3)
    nat.publish_many("a", blocks)
    nat.begin_write_many("a", blocks, 2)
    nat.end_write_many(blocks)
    nat.cache_many("a", blocks, [11, 12, 13])
    nat.release_many("a", blocks[2:])  # block 2 is cached now, at ref 0
    nat.open_holder("b")
    assert nat.share_prefix("b", [11, 12, 99, 13]).tolist() == blocks[:2].tolist()
    assert nat.share_prefix("c", [99, 11]).tolist() == []  # the first misses: nothing read
    got = nat.share_prefix("b", [13])
    assert got.tolist() == [blocks[2]] and nat.view.state[blocks[2]] == REFERENCED
    assert nat.held_by("b") == set(blocks.tolist())
    assert [nat.view.ref[b] for b in blocks] == [2, 2, 1]
    with pytest.raises(GuardViolation, match="share refused"):
        nat.share_prefix("c", [11, 12])
    assert [nat.view.ref[b] for b in blocks] == [2, 2, 1] and nat.structure_errors() == []


def _slot_accounting(nat: NativePool) -> tuple[int, int, int]:
    """(digests interned, free hash slots, slots in all but slot 0 of NO_HASH)."""
    assert sorted(nat._hslot.values()) == sorted(
        s for s, d in enumerate(nat._digest) if d != 0)
    return len(nat._hslot), len(nat._free_hslots), len(nat.X) - 1


@pytest.mark.parametrize("bad", [[12, "x"], [12, True], [12, 2**256], [12, -3], [12, [1]],
                                 [12, 12.0]])
def test_a_refused_digest_interns_none_of_its_batch(bad):
    nat = NativePool(4, 2)
    nat.open_holder("a")
    blocks = nat.take_many("a", 2)
    nat.publish_many("a", blocks)
    nat.begin_write_many("a", blocks, [2, 2])
    nat.end_write_many(blocks)
    before = _slot_accounting(nat)
    with pytest.raises(InvalidArgument, match="hash"):
        nat.commit_many("a", blocks, bad)
    assert _slot_accounting(nat) == before and nat._hslot == {}


def test_digests_are_interned_in_one_batch_one_slot_each():
    """New, repeated and already interned digests in one batch, more than the slots there
    are: equal digests share a slot, every slot is accounted for, released ones are free."""
    nat = NativePool(4, 2)
    interned, free, total = _slot_accounting(nat)
    assert interned == 0 and free == total
    kept = nat._hash_slots([5])
    digests = [5, *range(100, 100 + total + 10), 101, 5, 100]
    slots = nat._hash_slots(digests).tolist()
    assert slots[0] == kept[0] and len(set(slots)) == len(set(digests))
    assert [slots[digests.index(d)] for d in digests] == slots
    interned, free, total = _slot_accounting(nat)
    assert interned == len(set(digests)) and interned + free == total
    nat._release_hashes(np.array(slots, np.int64))  # none holds a block: all go
    assert _slot_accounting(nat) == (0, total, total)


def test_the_slot_tables_grow_past_their_first_size():
    """More holders than H's first 64 columns, more digests than X's 64 slots, more keys than
    the holds set's first 1024 cells: the same moves as BlockPool's."""
    pair = Pair(900, 1, checked=False)
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
    assert snapshot(nat) == snapshot(ref)
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
    (lambda p: p.release_many("a", [9]), InvalidArgument),
    (lambda p: p.release_many("a", [2**40]), InvalidArgument),
    (lambda p: p.share_many("a", [9]), InvalidArgument),
    (lambda p: p.end_write_many([9]), InvalidArgument),
    (lambda p: p.publish_many("a", [9]), InvalidArgument),
    (lambda p: p.release_many("a", [-1]), InvalidArgument),
    (lambda p: p.release_many("a", [0.0]), InvalidArgument),
    (lambda p: p.release_many("a", [True]), InvalidArgument),
    (lambda p: p.release_many("a", {0}), InvalidArgument),
    (lambda p: p.release_many("a", np.zeros((1, 1), np.int64)), InvalidArgument),
    (lambda p: p.release_many("a", np.array([0.5])), InvalidArgument),
    (lambda p: p.release_many("b", [0]), DoubleFree),
    (lambda p: p.release(0, "b"), DoubleFree),
    (lambda p: p.release(8, "a"), InvalidArgument),
    (lambda p: p.release(-1, "a"), InvalidArgument),
    (lambda p: p.release(2**70, "a"), InvalidArgument),
    (lambda p: p.release(0.0, "a"), InvalidArgument),
    (lambda p: p.release(True, "a"), InvalidArgument),
    (lambda p: p.release(0, ["unhashable"]), InvalidArgument),
    (lambda p: p.take(["unhashable"]), InvalidArgument),
    (lambda p: p.share_many("a", [0]), GuardViolation),
    (lambda p: p.publish_many("b", [0]), GuardViolation),
    (lambda p: p.begin_write_many("a", [0], 1), GuardViolation),
    (lambda p: p.begin_write_many("a", [0], [1, 1]), InvalidArgument),
    (lambda p: p.commit_many("a", [0], [0]), GuardViolation),
    (lambda p: p.commit_many("a", [0], []), InvalidArgument),
    (lambda p: p.commit_many("a", [0], [-5]), InvalidArgument),
    (lambda p: p.commit_many("a", [0, 1], [77, -5]), InvalidArgument),
    (lambda p: p.commit_many("a", [0], {77}), InvalidArgument),
    (lambda p: p.cache_many("a", [0], []), InvalidArgument),
    (lambda p: p.cache_many("a", [0], [-5]), InvalidArgument),
    (lambda p: p.cache_many("a", [0, 1], [77, -5]), InvalidArgument),
    (lambda p: p.cache_many("a", [0], {77}), InvalidArgument),
    (lambda p: p.cache_many("a", [9], [77]), InvalidArgument),
    (lambda p: p.cache_many("a", [8], [77]), InvalidArgument),  # the queue's sentinel column
    (lambda p: p.cache_many("a", [0.0], [77]), InvalidArgument),
    (lambda p: p.cache_many(["unhashable"], [0], [77]), InvalidArgument),
    (lambda p: p.share_prefix(["unhashable"], [77]), InvalidArgument),
    (lambda p: p.share_prefix("a", 77), InvalidArgument),
    (lambda p: p.share_prefix("a", [[77]]), InvalidArgument),
    (lambda p: p.end_write_many([0]), GuardViolation),
    (lambda p: p.close_holder("a"), GuardViolation),
    (lambda p: p.open_holder("a"), GuardViolation),
    (lambda p: p.complete(0), GuardViolation),
])
def test_bad_input_and_refusals_are_typed_and_change_nothing(pool, call, error):
    before, digests = snapshot(pool), dict(pool._hslot)
    with pytest.raises(error):
        call(pool)
    assert snapshot(pool) == before and pool._hslot == digests  # no digest left interned


def test_a_refusal_names_the_failed_condition_in_words(pool):
    with pytest.raises(DoubleFree, match=r"release refused: .*holder 'b' must hold block 0"):
        pool.release_many("b", [0])


def test_the_launch_set_clears_its_deleted_cells_in_place():
    """Launches that complete one after another leave deleted cells; the set is rehashed in
    its own cells (the pool's M stays the same array) and still holds exactly the launches
    in flight, with some in flight across the rehashes."""
    nat = NativePool(4, 2, checked=True)
    M, pending = nat.M, []
    for i in range(200):
        pending.append(nat.launch())
        if i % 3 or len(pending) > 2:
            nat.complete(pending.pop(0))
            nat.advance_watermark()
        assert nat.launches() == set(pending)
    assert nat.M is M and len(M) == native_source.LAUNCHES0 + 16


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


def test_verify_runs_the_native_check_and_reports_it(monkeypatch, tmp_path):
    from pagedkv.proofs import cli as verify_cli

    part = verify_cli.run_native_part(quick=True)
    assert part["ok"] and part["ops"] > 500 and part["seeds"] == [0, 4]
    assert part["allocator"]["ok"] and part["allocator"]["ops"] > 500
    summary = verify_cli.render_summary({"native_pool": part})
    assert "differential campaign against BlockPool" in summary
    assert "differential campaign against BlockAllocator" in summary
    assert "native_pool" in verify_cli.code_check_jobs(quick=True, campaign_steps=10)
    real = native_source.module_source  # a generated module that disagrees: the part fails
    monkeypatch.setattr(native_source, "module_source",
                        lambda spec, invs: real(spec, invs).replace("(B[4, b] + w)",
                                                                     "(B[4, b] + w + 1)"))
    monkeypatch.setattr(native, "_BY_SPEC", {})
    monkeypatch.setenv("PAGEDKV_NATIVE_CACHE", str(tmp_path))
    failed = verify_cli.run_native_part(quick=True)
    assert not failed["ok"] and "disagrees with the spec" in failed["error"]


def test_the_holder_set_is_a_set():
    """The native holds relation (open addressing; a deleted key's cell closed up, later keys
    of its run moved back) against a Python set, on a table of 8 cells at most half full, so
    that keys collide, runs wrap around its end and deletions move keys; its key count
    (``KEYS_USED``) is the set's size."""
    mod = native.native_module()
    rng = random.Random(7)
    K, M = np.full(8, native_source.EMPTY_KEY, np.int64), np.zeros(native_source.META_SIZE,
                                                                    np.int64)
    model: set[tuple[int, int]] = set()
    displaced = moved = wrapped = False
    for _ in range(5000):
        r, b = rng.randrange(1, 5), rng.randrange(4)
        before = K.copy()
        if rng.random() < 0.5 and len(model) < 4:
            mod.add_key(K, M, r, b)
            model.add((r, b))
        else:
            mod.discard_key(K, M, r, b)
            moved |= bool(((K != before) & (K >= 0)).any())  # a later key moved back
            model.discard((r, b))
        for rr in range(1, 5):
            for bb in range(4):
                assert mod.has_key(K, rr, bb) == ((rr, bb) in model)
        assert {(int(k) >> 32, int(k) & 0xFFFFFFFF) for k in K if k >= 0} == model
        assert ((K >= 0) | (K == native_source.EMPTY_KEY)).all()  # no deleted markers
        assert M[native_source.KEYS_USED] == len(model)
        homes = [(i, mod._probe(K, int(k))) for i, k in enumerate(K) if k >= 0]
        displaced |= any(i != home for i, home in homes)
        wrapped |= any(i < home for i, home in homes)
    assert displaced and wrapped and moved


def _strided(ids):
    out = np.full(2 * len(ids), -7, np.int64)
    out[::2] = ids
    return out[::2]


def _read_only(ids):
    out = np.array(ids, np.int64)
    out.flags.writeable = False
    return out


@pytest.mark.parametrize("as_blocks", [
    list,
    lambda ids: np.array(ids, np.int64),
    lambda ids: np.array(ids[::-1], np.int64)[::-1],  # a reversed view
    _strided,
    _read_only,
    lambda ids: np.array(ids, np.int32),
    lambda ids: np.array(ids, np.uint16),
    lambda ids: np.array(ids, ">i8"),  # int64, not in the machine's byte order
], ids=["list", "int64", "reversed", "strided", "read-only", "int32", "uint16", "big-endian"])
def test_block_arrays_of_any_layout_and_integer_dtype_name_the_same_blocks(as_blocks):
    """The native loops are called through entry points that trust their argument types
    (``native_entry``): a caller's block array of any strides, dtype or byte order must
    reach them as the blocks it names."""
    nat = NativePool(8, 4, checked=True)
    nat.open_holder("a")
    nat.open_holder("b")
    taken = nat.take_many("a", 6).tolist()
    nat.publish_many("a", as_blocks([1, 3, 5]))
    nat.begin_write_many("a", as_blocks([1, 3, 5]), 4)
    nat.end_write_many(as_blocks([1, 3, 5]))
    nat.commit_many("a", as_blocks([1, 3, 5]), [11, 13, 15])
    nat.share_many("b", as_blocks([1, 5]))
    nat.release_many("a", as_blocks([4, 1, 0]))
    assert nat.held_by("a") == set(taken) - {0, 1, 4}
    assert nat.held_by("b") == {1, 5}
    assert nat.lookup_many([11, 13, 15]).tolist() == [1, 3, 5]
    nat.release_many("b", as_blocks([5, 1]))
    assert 1 in nat.queue_order() and 5 not in nat.queue_order()  # 1 cached, 5 still held


def test_without_numba_the_native_modules_import_and_say_what_is_missing():
    """numba is an optional dependency (``pagedkv[native]``): the native modules import
    without it (``pagedkv verify`` reports the native check as skipped) and a pool or an
    allocator says what to install."""
    import subprocess
    import sys

    code = """
import sys
class NoNumba:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "numba":
            raise ImportError("numba hidden")
sys.meta_path.insert(0, NoNumba())
from pagedkv.allocator.native_allocator import NativeAllocator
from pagedkv.allocator.native_pool import NativePool, NativeUnavailable
for make in (lambda: NativePool(4, 4), lambda: NativeAllocator(4, 4)):
    try:
        make()
    except NativeUnavailable as exc:
        print(exc)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.count("pip install pagedkv[native]") == 2
