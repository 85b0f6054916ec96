"""Kills weakened-invariant mutants of spec/invariants.py: every conjunct of every invariant
rejects a state corrupted in exactly that respect (and the uncorrupted state, reached by a
real allocator, has no violation)."""

from __future__ import annotations

import pytest

from pagedkv.allocator import BlockAllocator
from pagedkv.spec import (
    ALLOCATED,
    CACHED,
    CONCRETE,
    FREE,
    ISSUED,
    NO_BLOCK,
    NO_HASH,
    PUBLISHED,
    REFERENCED,
    WATERMARK,
    launch_ids,
    violations,
)
from pagedkv.spec.requests import tables


def _reached():
    """B = 2, 7 blocks: a's blocks 0, 1 REFERENCED, block 2 PUBLISHED with a write pending
    (all three read by a launch in flight); c's committed block CACHED, its other one
    RECLAIMED (retired after that launch was numbered: it waits for the watermark); d
    allocated only; one block never used (FREE)."""
    a = BlockAllocator(7, 2)
    a.add_request("a", [1, 2, 3, 4, 5])
    a.allocate("a", 5)
    a.publish(["a"]).complete()
    a.commit("a", 5)
    a.append_tokens("a", [6])
    a.allocate("a", 6)
    launch = a.publish(["a"])
    a.add_request("c", [9, 9, 9])
    a.allocate("c", 3)
    a.publish(["c"]).complete()
    a.commit("c", 3)
    a.free("c")
    a.add_request("d", [7])
    a.allocate("d", 1)
    abst = a.abstract()
    return a, launch, abst.pool, abst.requests


A, LAUNCH, S, REQ = _reached()
TABLES = tables(REQ)
B0, B1, B2 = TABLES["a"][0]
CACHED_B = next(b for b in range(7) if S.state[b] == CACHED)
FREE_B = next(b for b in range(7) if S.state[b] == FREE)
ALLOC_B = TABLES["d"][0][0]
H0 = S.hash[B0]


def st(s, **fields):
    """s with array entries overwritten: field=[(key, value), ...]."""
    out = {}
    for f, writes in fields.items():
        arr = getattr(s, f)
        for k, v in writes:
            arr = CONCRETE.store(arr, k, v)
        out[f] = arr
    return s.replace(**out)


def names(s, requests=None):
    return {n for n, _ in violations(s, requests if requests is not None else REQ.replace(pool=s))}


def test_the_reached_state_is_clean():
    assert S.state[B0] == S.state[B1] == REFERENCED and S.state[B2] == PUBLISHED
    assert S.wpend[B2] == 1
    in_flight = [L for L in launch_ids(S) if S.inflight[L]]
    assert in_flight and S.clock[WATERMARK] <= min(in_flight) < S.clock[ISSUED]
    assert S.state[ALLOC_B] == ALLOCATED and TABLES["d"][2] == 0
    assert names(S) == set()


CASES = {
    "conservation: counts sum to the pool size": (
        lambda: S.replace(num_blocks=8), "conservation"),
    "conservation: exact per-state counts": (
        lambda: st(S, count=[(FREE, S.count[FREE] + 1), (CACHED, S.count[CACHED] - 1)]),
        "conservation"),
    "ref > 0 iff held": (lambda: st(S, ref=[(CACHED_B, 1)]), "ref_positive_iff_held"),
    "ALLOCATED has ref 1": (lambda: st(S, ref=[(ALLOC_B, 2)]), "ref_positive_iff_held"),
    "no write when FREE": (lambda: st(S, wpend=[(FREE_B, 1)]), "no_write_when_free"),
    "no write when ALLOCATED": (lambda: st(S, wpend=[(ALLOC_B, 1)]), "no_write_when_free"),
    "writing >= 0": (lambda: st(S, wpend=[(FREE_B, -1)]), "no_write_when_free"),
    "retire >= 0": (lambda: st(S, retire=[(B0, -1)]), "reused_after_its_readers"),
    "retire <= issued": (lambda: st(S, retire=[(B0, S.clock[ISSUED] + 1)]),
                         "reused_after_its_readers"),
    "FREE only past the watermark": (lambda: st(S, retire=[(FREE_B, S.clock[ISSUED])]),
                                     "reused_after_its_readers"),
    "ALLOCATED only past the watermark": (lambda: st(S, retire=[(ALLOC_B, S.clock[ISSUED])]),
                                          "reused_after_its_readers"),
    "PUBLISHED only past the watermark": (lambda: st(S, retire=[(B2, S.clock[ISSUED])]),
                                          "reused_after_its_readers"),
    "watermark >= 0": (lambda: st(S, clock=[(WATERMARK, -1)]), "watermark_bounds"),
    "watermark <= issued": (lambda: st(S, clock=[(WATERMARK, S.clock[ISSUED] + 1)]),
                            "watermark_bounds"),
    "in flight only below issued": (lambda: st(S, inflight=[(S.clock[ISSUED], True)]),
                                    "launch_window"),
    "in flight only from the watermark": (
        lambda: st(S, inflight=[(S.clock[WATERMARK] - 1, True)]), "launch_window"),
    "hash iff REFERENCED/CACHED": (
        lambda: st(S, hash=[(FREE_B, 99)], hmap=[(99, FREE_B)]), "hash_map_agrees"),
    "the map points back": (lambda: st(S, hmap=[(H0, NO_BLOCK)]), "hash_map_agrees"),
    "no entry for NO_HASH": (lambda: st(S, hmap=[(NO_HASH, FREE_B)]), "one_block_per_hash"),
    "map target >= 0": (lambda: st(S, hmap=[(77, -5)], hash=[(-5, 77)]),
                        "one_block_per_hash"),
    "map target < num_blocks": (lambda: st(S, hmap=[(77, 7)], hash=[(7, 77)]),
                                "one_block_per_hash"),
    "map target carries the hash": (lambda: st(S, hmap=[(77, FREE_B)]), "one_block_per_hash"),
    "cached blocks are full": (lambda: st(S, filled=[(B0, 1)]), "cached_blocks_written"),
    "cached blocks have no write pending": (
        lambda: st(S, wpend=[(B0, 1)]), "cached_blocks_written"),
    "filled >= 0": (lambda: st(S, filled=[(B2, -1)]), "exclusive_writes"),
    "filled <= B": (lambda: st(S, filled=[(B2, 3)]), "exclusive_writes"),
    "FREE blocks are empty": (lambda: st(S, filled=[(FREE_B, 1)]), "exclusive_writes"),
    "a write is pending only on PUBLISHED or RECLAIMED blocks": (
        lambda: st(S, wpend=[(B0, 1)]), "exclusive_writes"),
    "nheld counts what is held": (
        lambda: st(S, nheld=[("a", 4)]), "holders_consistent"),
    "dead holders hold nothing": (
        lambda: st(S, nheld=[("zz", 1)], holds=[("zz", CONCRETE.store(S.holds["zz"],
                                                                      FREE_B, True))]
                   ).replace(holder_ids=tuple(S.holder_ids) + ("zz",)),
        "holders_consistent"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_conjunct_catches_its_corruption(case):
    make, inv = CASES[case]
    assert inv in names(make()), case


def _r(**fields):
    """The reached request state with entries overwritten: field=[(key, value), ...], or
    (key, inner key, value) for the per-request arrays of arrays."""
    out = {}
    for f, writes in fields.items():
        arr = getattr(REQ, f)
        for w in writes:
            if len(w) == 3:
                arr = CONCRETE.store(arr, w[0], CONCRETE.store(arr[w[0]], w[1], w[2]))
            else:
                arr = CONCRETE.store(arr, w[0], w[1])
        out[f] = arr
    return REQ.replace(**out)


TABLE_CASES = {
    "covers reserved": (_r(reserved_q=[("a", 3)], reserved_o=[("a", 1)]),
                        "table_covers_reserved"),
    "no spare block": (_r(reserved_q=[("a", 2)], reserved_o=[("a", 0)],
                          issued_q=[("a", 2)], issued_o=[("a", 0)],
                          computed_q=[("a", 2)], computed_o=[("a", 0)]),
                       "table_covers_reserved"),
    "computed <= issued": (_r(computed_q=[("a", 3)]), "table_covers_reserved"),
    "computed <= known": (_r(known_q=[("a", 1)], known_o=[("a", 0)]),
                          "table_covers_reserved"),
    "entry count = nheld": (_r(tlen=[("d", 2)], reserved_q=[("d", 1)], reserved_o=[("d", 1)]),
                            "table_covers_reserved"),
    "offset below B": (_r(issued_o=[("a", 2)]), "table_covers_reserved"),
    "entries distinct": (_r(tab=[("a", 2, B0)]), "table_entries_held"),
    "entries held": (_r(tab=[("a", 2, FREE_B)]), "table_entries_held"),
    "held blocks are entries": (_r(slot=[("a", B2, 0)]), "table_holds_are_entries"),
    "written slots = issued": (_r(issued_q=[("a", 2)], issued_o=[("a", 1)]),
                               "table_positions_written"),
    "own chain hash": (_r(chain=[("a", 0, H0 + 1)]), "table_isolation"),
    "hashed within known": (_r(known_q=[("a", 0)], known_o=[("a", 1)],
                               computed_q=[("a", 0)], computed_o=[("a", 0)]), "table_isolation"),
    "sealed content matches": (_r(content=[(B0, H0 + 1)]), "sealed_blocks"),
    "no seal on a FREE block": (_r(content=[(FREE_B, H0)]), "sealed_blocks"),
}


@pytest.mark.parametrize("case", sorted(TABLE_CASES))
def test_each_table_conjunct_catches_its_corruption(case):
    req, inv = TABLE_CASES[case]
    assert inv in names(S, req), case
    assert names(S, REQ) == set()


def test_teardown_launch():
    LAUNCH.complete()
    A.check_invariants()
