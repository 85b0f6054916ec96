"""The native digest table (``native_digests``): interning, finding and forgetting 256-bit
digests in hash slots, held to a dict (digest -> slot) through random operations with
growth; its use by the native allocator where a step needs it (a commit's filled blocks
interned from the rows' digests, a lookup's hits read from them)."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("numba")

from pagedkv.allocator.native_allocator import NativeAllocator  # noqa: E402
from pagedkv.allocator.native_digests import DigestTable, words_of  # noqa: E402
from pagedkv.allocator.native_pool import NativePool  # noqa: E402
from pagedkv.spec import NO_BLOCK  # noqa: E402

# digests that share their first word (the home cell) with others: long probe runs
_CROWDED = [(w << 192) | i for w in (5, 5 + 64, 5 + 128) for i in range(1, 6)]
DIGEST = st.one_of(st.integers(1, 2**256 - 1), st.sampled_from(_CROWDED))


def _intern(t: DigestTable, G: np.ndarray, digests: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Intern ``digests``, growing the table (and ``G``) where it fills; the slots and G."""
    words = words_of(digests)
    out = np.empty(len(digests), np.int64)
    while t.loops.intern_words(t.W, t.IX, t.FREE, t.DM, G, words, len(digests), out) < 0:
        t.grow()
        G = np.concatenate([G, np.zeros(len(t.W) - len(G), np.int64)])
    return out, G


@settings(max_examples=80, deadline=None)
@given(ops=st.lists(st.tuples(st.booleans(), st.lists(DIGEST, min_size=1, max_size=12)),
                    max_size=30))
def test_the_table_interns_finds_and_forgets_as_a_dict_would(ops):
    t = DigestTable(4)
    G = np.zeros(4, np.int64)
    model: dict[int, int] = {}
    stamps: dict[int, int] = {}
    for intern, digests in ops:
        if intern:
            slots, G = _intern(t, G, digests)
            for h, s in zip(digests, slots.tolist(), strict=True):
                assert model.setdefault(h, s) == s  # one slot per digest, kept while interned
                if h not in stamps:
                    stamps[h] = int(G[s])
                assert G[s] == stamps[h]  # found again: no new stamp
        else:
            X = np.full(len(t.W), NO_BLOCK, np.int64)  # none names a block: all may go
            gone = [model[h] for h in digests if h in model]
            out = np.empty(len(gone) + 1, np.int64)
            k = t.loops.forget(t.W, t.IX, t.FREE, t.DM, X, np.array(gone + [0], np.int64),
                               len(gone) + 1, out)
            assert sorted(out[:k].tolist()) == sorted(set(gone))
            for h in digests:
                model.pop(h, None)
                stamps.pop(h, None)
        assert dict(t.items()) == {h: s for h, s in model.items()}
        assert len(t) == len(model) and t.structure_errors() == []
        probe = list(model) + [h + 1 for h in model if h + 1 not in model and h + 1 < 2**256][:3]
        if probe:
            want = [model.get(h, 0) for h in probe]
            assert t.find(words_of(probe)).tolist() == want
    assert len(set(G[list(model.values())].tolist())) == len(model)  # stamps never repeat


def test_forget_keeps_a_digest_whose_slot_still_names_a_block():
    t = DigestTable(8)
    G = np.zeros(8, np.int64)
    slots, G = _intern(t, G, [11, 12])
    X = np.full(8, NO_BLOCK, np.int64)
    X[slots[0]] = 3
    gone = np.empty(2, np.int64)
    assert t.loops.forget(t.W, t.IX, t.FREE, t.DM, X, slots, 2, gone) == 1
    assert gone[0] == slots[1]
    assert dict(t.items()) == {11: int(slots[0])}


def test_structure_errors_name_a_slot_the_index_lost():
    t = DigestTable(8)
    G = np.zeros(8, np.int64)
    _intern(t, G, [101, 202, 303])
    assert t.structure_errors() == []
    t.IX[np.flatnonzero(t.IX)[0]] = 0
    assert any("not found" in why or "index" in why for _, why in t.structure_errors())


def test_a_commit_of_many_filled_blocks_interns_them_all_natively():
    """A long prompt committed in one call: more digests than the kept slot buffer holds
    (it is widened and the call made again) and than the table has slots (it grows)."""
    B = 4
    a = NativeAllocator(512, B, checked=True)
    prompt = [random.Random(3).randrange(1000) for _ in range(300 * B + 2)]
    a.add_request("p", prompt)
    a.allocate("p", len(prompt))
    a.publish(["p"]).complete()
    a.commit("p", len(prompt))
    req = a._requests["p"]
    assert len(req.hashes) == 300
    assert a.pool.lookup_many(req.hashes).tolist() == a.block_table("p")[:300]
    a.check_invariants()
    a.add_request("q", prompt)
    assert a.add_request("r", prompt[:40 * B]) == 39 * B  # hits, read from r's digests
    assert a._hits(a._requests["q"]) == a.block_table("p")[:300]


def test_a_lookup_reads_its_hits_from_the_rows_digests():
    a = NativeAllocator(64, 2, checked=False)
    a.add_request("p", list(range(12)))
    a.allocate("p", 12)
    a.publish(["p"]).complete()
    a.commit("p", 12)
    a.add_request("q", list(range(8)) + [99, 98, 97])
    q = a._requests["q"]
    assert a._hits(q) == a.block_table("p")[:4]
    a.D[q.row, 1, 0] ^= 1  # q's second digest, corrupted in its row: the hits stop there
    q.hit_memo = None
    assert a._hits(q) == a.block_table("p")[:1]


def _cache_two(pool, r, digests):
    pool.open_holder(r)
    new = pool.take_many(r, 2)
    pool.publish_many(r, new)
    pool.begin_write_many(r, new, 1)
    pool.end_write_many(new)
    pool.cache_many(r, new, digests)
    pool.release_many(r, new[::-1])
    pool.close_holder(r)
    return new.tolist()


def test_the_digests_the_pool_api_met_are_forgotten_with_their_blocks():
    """``NativePool`` reads the digests its int API met from a dict (``_known``); a digest
    evicted with its block leaves it, so a slot interned again for another digest is not
    found under the old one."""
    pool = NativePool(2, 1, checked=True)
    first = _cache_two(pool, "a", [11, 12])
    assert pool.lookup(11) == first[0] and pool.lookup_many([11, 12]).tolist() == first
    assert set(pool._known) == {11, 12}
    again = _cache_two(pool, "b", [13, 14])  # both cached blocks evicted and reused
    assert sorted(again) == sorted(first)
    assert pool.lookup(11) is None and pool.lookup(12) is None
    assert pool.lookup_many([11, 13]).tolist() == [NO_BLOCK, again[0]]
    assert set(pool._known) <= {13, 14} and pool.prefix_hits([13, 14]).tolist() == again
    assert pool.structure_errors() == []


def test_a_loaded_allocator_pool_still_finds_the_digests_its_rows_intern():
    """An allocator's pool interns digests from the rows, past the int API's dict: loaded
    again, it keeps looking a digest up where the dict has not met it."""
    a = NativeAllocator(64, 2, checked=False)
    a.add_request("p", [1, 2, 3, 4])
    a.allocate("p", 4)
    a.publish(["p"]).complete()
    a.commit("p", 4)
    a.pool.load(a.pool.storage())
    assert not a.pool._known_complete
    a.add_request("q", [9, 8, 7, 6])
    a.allocate("q", 4)
    a.publish(["q"]).complete()
    a.commit("q", 4)
    q = a._requests["q"]
    assert a.pool.lookup_many(q.hashes).tolist() == a.block_table("q")
    assert a.pool.lookup(q.hashes[1]) == a.block_table("q")[1]
