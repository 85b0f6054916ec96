"""The prefix memos of ``NativePool`` (``allocator/prefix_memo.py``): lookups that read their
leading hash slots from the last prefix found give what the pool's dict gives, through
requests of a few tenants whose prompts share, diverge and get evicted (their slots reused
for other digests), held to ``BlockPool``."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("numba")

from pagedkv.allocator.errors import InvalidArgument, OutOfBlocks  # noqa: E402
from pagedkv.allocator.native_pool import NativePool  # noqa: E402
from pagedkv.allocator.prefix_memo import PrefixMemos, common_length  # noqa: E402
from pagedkv.proofs.native_refinement import (  # noqa: E402
    Pair,
    _share_prefix,
    snapshot,
)

B = 2
# Each tenant's prompt, as its blocks' digests: the first two share their first blocks, the
# third shares nothing; big digests, as sha256 chains give.
TENANTS = [[2**255 + i for i in range(6)],
           [2**255 + i for i in range(2)] + [2**254 + i for i in range(4)],
           [2**253 + i for i in range(5)]]


def _request(pair: Pair, r: str, hashes: list[int], fused: bool = False) -> None:
    """Request r on both pools: its prefix hits shared, its other blocks taken, written and
    cached (as far as the pool has room). ``fused``: the first three calls as one
    (``admit``) where the pool has room for every block."""
    ref, nat = pair.ref, pair.nat
    admitted = fused and pair.do("admit", lambda: ref.admit(r, hashes, len(hashes)),
                                 lambda: nat.admit(r, hashes, len(hashes)))
    if isinstance(admitted, tuple):
        blocks, k = admitted
        hits, new = blocks[:k], blocks[k:]
    else:  # (OutOfBlocks: nothing changed)
        pair.do("open_holder", lambda: ref.open_holder(r), lambda: nat.open_holder(r))
        hits = pair.do("share_prefix", lambda: _share_prefix(ref, r, hashes),
                       lambda: nat.share_prefix(r, hashes))
        n = min(len(hashes) - len(hits), ref.usable())
        new = pair.do("take_many", lambda: ref.take_many(r, n), lambda: nat.take_many(r, n))
    pair.do("publish_many", lambda: ref.run_many("publish", [(b, r) for b in new]),
            lambda: nat.publish_many(r, new))
    pair.do("begin_write_many", lambda: ref.run_many("begin_write", [(b, r, B) for b in new]),
            lambda: nat.begin_write_many(r, new, B))
    pair.do("end_write_many", lambda: ref.run_many("end_write", [(b,) for b in new]),
            lambda: nat.end_write_many(new))
    rest = hashes[len(hits):len(hits) + len(new)]
    pair.do("cache_many", lambda: ref.cache_many(r, new, rest),
            lambda: nat.cache_many(r, new, rest))


def _finish(pair: Pair, r: str, fused: bool = False) -> None:
    ref, nat = pair.ref, pair.nat
    held = sorted(ref.held.get(r, ()), reverse=True)
    if fused:
        pair.do("finish", lambda: ref.finish(r, held), lambda: nat.finish(r, held))
        return
    pair.do("release_many", lambda: ref.run_many("release", [(b, r) for b in held]),
            lambda: nat.release_many(r, held))
    pair.do("close_holder", lambda: ref.close_holder(r), lambda: nat.close_holder(r))


def _tenant_workload(seed: int, steps: int = 120, fused: bool = False
                     ) -> tuple[Pair, Counter[str]]:
    """Requests of the tenants, each its prompt (sometimes cut short) and blocks of its own,
    a few open at once in a pool too small to keep every prompt: memos are made, matched,
    truncated, extended and dropped with their evicted slots. ``fused``: each admission
    (where it has room) and each end one call (``admit``, ``finish``). Returns what the
    memos did."""
    rng = random.Random(seed)
    pair = Pair(rng.choice((10, 14, 20)), B, checked=seed % 2 == 0)
    nat = pair.nat
    seen: Counter[str] = Counter()
    memos = nat._memos
    slots, learn, forget = memos.slots, memos.learn, memos.forget

    def count_slots(hashes, rest):
        before = sum(len(m.digests) for m in memos.by_first.values())
        got = slots(hashes, rest)
        seen["memo read" if got else "no memo"] += 1
        seen["truncated"] += sum(len(m.digests) for m in memos.by_first.values()) < before
        return got

    def count_learn(hashes, found_slots, found, matched):
        before = {f: len(m.digests) for f, m in memos.by_first.items()}
        learn(hashes, found_slots, found, matched)
        after = {f: len(m.digests) for f, m in memos.by_first.items()}
        seen["made"] += len(after.keys() - before.keys())
        seen["extended"] += sum(after[f] > before[f] for f in after.keys() & before.keys())

    def count_forget(gone):
        before = len(memos.by_first)
        forget(gone)
        seen["dropped"] += before - len(memos.by_first)

    memos.slots, memos.learn, memos.forget = count_slots, count_learn, count_forget
    open_: list[str] = []
    for i in range(steps):
        if open_ and (len(open_) > 2 or rng.random() < 0.4):
            _finish(pair, open_.pop(rng.randrange(len(open_))), fused)
            continue
        prompt = rng.choice(TENANTS)
        prompt = prompt[:rng.randrange(1, len(prompt) + 1)] if rng.random() < 0.3 else prompt
        own = [7_000_000 + 10 * i + k for k in range(rng.randrange(0, 3))]
        hashes = prompt + own
        r = f"r{i}"
        _request(pair, r, hashes, fused)
        open_.append(r)
        if rng.random() < 0.3:  # the hits alone, looked up again
            pair.do("prefix_hits", lambda h=hashes: pair.ref.prefix_hits(h),
                    lambda h=hashes: nat.prefix_hits(h))
    errors = nat.structure_errors()
    if errors:
        raise AssertionError(f"seed {seed}: {errors[:3]}")
    return pair, seen


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("fused", [False, True], ids=["separate", "admit+finish"])
def test_lookups_through_memos_give_what_blockpool_gives(seed, fused):
    _tenant_workload(seed, fused=fused)


def test_the_fused_workloads_admit_with_hits_and_refuse_for_room():
    """Across the seeds, ``admit`` takes prefix hits, admits without any, and is refused for
    room (changing nothing, as BlockPool's): else the fused comparison proves less."""
    seen = Counter()
    for seed in range(8):
        for name, out in _tenant_workload(seed, fused=True)[0].seen:
            if name == "admit":
                seen["refused" if out is OutOfBlocks else "hits" if out[1] else "none"] += 1
    assert seen.keys() == {"refused", "hits", "none"}, seen


def test_the_tenant_workloads_reach_every_memo_move():
    """Across the seeds, memos are read, made, extended, truncated and dropped with evicted
    slots, and
    lookups run without one: else the comparison above proves less than it says."""
    seen: Counter[str] = Counter()
    for seed in range(8):
        seen += _tenant_workload(seed)[1]
    assert {"memo read", "no memo", "made", "extended", "truncated", "dropped"} <= {
        k for k, v in seen.items() if v}, seen


def _memo_then_evicted() -> tuple[NativePool, list[int], list[int]]:
    """A prompt of two blocks cached and looked up (a memo made), then evicted by blocks
    cached under other digests, which take its digests' slots."""
    pool = NativePool(2, 1, checked=True)
    prompt, other = [2**255 + 1, 2**255 + 2], [2**254 + 1, 2**254 + 2]
    for r, hashes in (("a", prompt), ("b", prompt), ("c", other)):
        _whole_request(pool, r, hashes)
    return pool, prompt, other


def _whole_request(pool: NativePool, r: str, hashes: list[int]) -> None:
    """Request r on a pool of one-slot blocks: its hits shared, its other blocks taken,
    written and cached, then every block released and its holder closed."""
    pool.open_holder(r)
    hits = pool.share_prefix(r, hashes)
    new = pool.take_many(r, len(hashes) - len(hits))
    pool.publish_many(r, new)
    pool.begin_write_many(r, new, 1)
    pool.end_write_many(new)
    pool.cache_many(r, new, hashes[len(hits):])
    pool.release_many(r, np.concatenate((hits, new))[::-1])
    pool.close_holder(r)


def test_an_evicted_prefix_is_not_found_through_its_memo():
    """The prompt's slots went to other digests: a lookup of the prompt misses (the memo went
    with the slots), the other digests are found."""
    pool, prompt, other = _memo_then_evicted()
    assert pool.prefix_hits(prompt).tolist() == []
    assert len(pool.prefix_hits(other)) == 2
    assert pool.structure_errors() == []


def test_a_memo_kept_past_its_slots_is_found_stale(monkeypatch):
    """The hand mutant: memos not dropped with their slots. The lookup of the evicted prompt
    then finds the other digests' blocks, and ``structure_errors`` names the stale memo."""
    monkeypatch.setattr(PrefixMemos, "forget", lambda self, gone: None)
    pool, prompt, _ = _memo_then_evicted()
    assert len(pool.prefix_hits(prompt)) == 2  # wrong: these blocks hold other digests
    assert any("prefix memo" in msg for _, msg in pool.structure_errors())


def test_a_bad_item_past_a_memo_is_refused_and_changes_nothing():
    pool = NativePool(8, 1, checked=True)
    prompt = [2**255 + 1, 2**255 + 2]
    pool.open_holder("a")
    new = pool.take_many("a", 2)
    pool.publish_many("a", new)
    pool.begin_write_many("a", new, 1)
    pool.end_write_many(new)
    pool.cache_many("a", new, prompt)
    assert pool.prefix_hits(prompt).tolist() == new.tolist() and pool._memos.by_first
    before = snapshot(pool)
    for bad in ([prompt[0], np.array([1, 2])], [prompt[0], [1]], [[1], prompt[0]]):
        with pytest.raises(InvalidArgument):
            pool.share_prefix("a", bad)
    assert snapshot(pool) == before and pool.structure_errors() == []


@settings(max_examples=200, deadline=None)
@given(a=st.lists(st.integers(0, 3), max_size=12), b=st.lists(st.integers(0, 3), max_size=12))
def test_common_length_is_the_longest_common_prefix(a, b):
    shorter = min(len(a), len(b))
    want = next((i for i in range(shorter) if a[i] != b[i]), shorter)
    assert common_length(a, b) == want


def test_a_memo_holds_the_prompt_its_lookups_agree_on():
    """Requests of one prompt, each with blocks of its own cached past it: the memo holds the
    prompt alone (a request's own blocks wait for a second lookup that finds them too); a
    request that shares only the prompt's first blocks truncates it to those; two that
    agree on more extend it again."""
    pool = NativePool(64, 1, checked=True)
    prompt = [2**255 + i for i in range(4)]

    for i in range(4):  # each request's own blocks cached, then looked up again by it
        own = [2**254 + 10 * i, 2**254 + 10 * i + 1]
        _whole_request(pool, f"a{i}", prompt + own)
        _whole_request(pool, f"b{i}", prompt + own)
    memo = pool._memos.by_first[prompt[0]]
    assert memo.digests == prompt
    _whole_request(pool, "short", prompt[:2] + [2**253])
    assert memo.digests == prompt[:2]
    _whole_request(pool, "c", prompt)
    _whole_request(pool, "d", prompt)
    assert memo.digests == prompt and pool.structure_errors() == []
