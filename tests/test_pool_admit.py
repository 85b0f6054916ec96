"""``admit`` and ``finish``: an admission's pool calls (open, prefix hits shared, blocks taken)
and a request's end (every block released, the holder closed), each as one call -- on
``BlockPool`` the composition of its single calls, on ``NativePool`` one native loop, held to
each other here and to the separate calls, refusals included."""
# ruff: noqa: B023 - each operation's lambdas are called at once by Pair.do

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("numba")

from pagedkv.allocator import BlockPool  # noqa: E402
from pagedkv.allocator.errors import (  # noqa: E402
    DoubleFree,
    GuardViolation,
    InvalidArgument,
    OutOfBlocks,
)
from pagedkv.allocator.native_pool import NativePool  # noqa: E402
from pagedkv.proofs.native_refinement import Pair, snapshot  # noqa: E402
from pagedkv.spec import CACHED, violations  # noqa: E402

B = 2
PROMPT = [2**255 + i for i in range(3)]


def _cached_prompt(pair: Pair, busy: bool = False, prompt: list[int] = PROMPT) -> list[int]:
    """Holder "w" writes and caches the prompt's blocks and ends: they stay CACHED (busy:
    released under a launch in flight, which stays so). Returns them."""
    ref, nat = pair.ref, pair.nat
    n = len(prompt)
    blocks, _ = pair.do("admit", lambda: ref.admit("w", [], n), lambda: nat.admit("w", [], n))
    pair.do("publish", lambda: ref.run_many("publish", [(b, "w") for b in blocks]),
            lambda: nat.publish_many("w", blocks))
    pair.do("write", lambda: ref.run_many("begin_write", [(b, "w", B) for b in blocks]),
            lambda: nat.begin_write_many("w", blocks, B))
    pair.do("end", lambda: ref.run_many("end_write", [(b,) for b in blocks]),
            lambda: nat.end_write_many(blocks))
    pair.do("cache", lambda: ref.cache_many("w", blocks, prompt),
            lambda: nat.cache_many("w", blocks, prompt))
    if busy:
        L = ref.clock[0]
        pair.do("launch", lambda: ref.launch(L), lambda: None if nat.launch() == L else L)
    pair.do("finish", lambda: ref.finish("w", blocks), lambda: nat.finish("w", blocks))
    assert all(ref.state[b] == CACHED for b in blocks)
    return blocks


@pytest.mark.parametrize("checked", [False, True])
def test_admit_shares_the_hits_and_takes_the_rest_as_the_separate_calls_do(checked):
    """On a pool whose LRU head is a cached block of another prompt, ``admit`` returns the
    hits then the blocks taken (an eviction on the way) and leaves the state that
    open_holder + share_prefix + take_many leave on a twin pool."""
    pair = Pair(6, B, checked)
    cached = _cached_prompt(pair)
    fused, separate = pair.nat, NativePool(6, B, checked=checked)
    separate.load(fused.storage())  # the twin
    hashes = PROMPT[:2] + [2**254]
    got = pair.do("admit", lambda: pair.ref.admit("a", hashes, 6),
                  lambda: fused.admit("a", hashes, 6))
    separate.open_holder("a")
    hits = separate.share_prefix("a", hashes)
    taken = separate.take_many("a", 6 - len(hits))
    assert got == ([*hits.tolist(), *taken.tolist()], 2)
    assert got[0][:2] == cached[:2] and cached[2] in got[0][2:]  # the LRU head, evicted
    assert snapshot(fused) == snapshot(separate)
    assert fused.structure_errors() == [] and violations(fused.abstract()) == []


@pytest.mark.parametrize("busy", [False, True])
def test_admit_counts_the_hits_it_revives_against_the_room(busy):
    """Room for the blocks to take is what ``usable()`` says less the idle cached hits the
    admission revives (a revived block cannot be taken too); a busy cached hit was not
    usable, so it costs nothing. At one block past that, ``OutOfBlocks`` with the figures,
    and neither pool changed."""
    pair = Pair(5, B, checked=True)
    _cached_prompt(pair, busy=busy)
    ref, nat = pair.ref, pair.nat
    room = ref.usable() - (0 if busy else 2)
    before = snapshot(nat)
    with pytest.raises(OutOfBlocks) as refused:
        nat.admit("a", PROMPT[:2], 2 + room + 1)
    assert (refused.value.needed, refused.value.available) == (room + 1, room)
    assert refused.value.waiting == ref.waiting()
    assert snapshot(nat) == before and "a" not in nat._slot  # nor left a holder slot
    pair.do("too many", lambda: ref.admit("a", PROMPT[:2], 2 + room + 1),
            lambda: nat.admit("a", PROMPT[:2], 2 + room + 1))
    blocks, k = pair.do("admit", lambda: ref.admit("a", PROMPT[:2], 2 + room),
                        lambda: nat.admit("a", PROMPT[:2], 2 + room))
    assert k == 2 and len(blocks) == 2 + room and ref.usable() == 0


def test_admit_refusals_change_nothing_or_keep_what_ran():
    """A bad count, fewer blocks than hashes, bad hashes and an open holder change nothing;
    a share refused part way (a block's hash twice: its second share) keeps the shares
    before it and the holder open, as BlockPool's composition does."""
    pair = Pair(6, B, checked=True)
    _cached_prompt(pair)
    ref, nat = pair.ref, pair.nat
    pair.do("open", lambda: ref.open_holder("o"), lambda: nat.open_holder("o"))
    for r, hashes, n, error in (("a", PROMPT, -1, InvalidArgument),
                                ("a", PROMPT, True, InvalidArgument),
                                ("a", PROMPT, 2, InvalidArgument),
                                ("a", [[1]], 1, InvalidArgument),
                                ("a", 5, 1, InvalidArgument),
                                ([], PROMPT, 3, InvalidArgument),
                                ("o", PROMPT, 3, GuardViolation)):
        before = snapshot(nat)
        with pytest.raises(error):
            nat.admit(r, hashes, n)
        assert snapshot(nat) == before
        pair.do("refused", lambda: ref.admit(r, hashes, n), lambda: nat.admit(r, hashes, n))
    twice = [PROMPT[0], PROMPT[1], PROMPT[1]]
    pair.do("share refused", lambda: ref.admit("t", twice, 4),
            lambda: nat.admit("t", twice, 4))
    assert ref.held["t"] == set(nat.held_by("t")) and len(ref.held["t"]) == 2


def test_finish_releases_then_closes_and_refuses_as_the_separate_calls():
    """``finish`` of every block a holder holds closes it; of a block it does not hold,
    ``DoubleFree`` after the releases before it (the holder stays open); of some of its
    blocks, the close is refused once they are released."""
    pair = Pair(6, B, checked=True)
    ref, nat = pair.ref, pair.nat
    blocks, _ = pair.do("admit", lambda: ref.admit("a", [], 4), lambda: nat.admit("a", [], 4))
    pair.do("double free", lambda: ref.finish("a", [blocks[0], 5]),
            lambda: nat.finish("a", [blocks[0], 5]))
    assert ref.held["a"] == set(blocks[1:])
    pair.do("close refused", lambda: ref.finish("a", blocks[1:2]),
            lambda: nat.finish("a", blocks[1:2]))
    assert ref.held["a"] == set(blocks[2:])
    pair.do("finish", lambda: ref.finish("a", blocks[2:]), lambda: nat.finish("a", blocks[2:]))
    assert "a" not in ref.held and "a" not in nat._slot
    pair.do("unknown", lambda: ref.finish("a", []), lambda: nat.finish("a", []))
    pair.do("bad ids", lambda: ref.finish("b", 3), lambda: nat.finish("b", 3))
    outcomes = [out for _, out in pair.seen[1:]]
    assert outcomes == [DoubleFree, GuardViolation, None, GuardViolation, InvalidArgument]


def test_blockpool_admit_is_its_single_calls():
    """``BlockPool.admit`` and ``finish`` are its own calls composed: the same state as
    open_holder, each share, take_many, then each release and close_holder."""
    a, b = BlockPool(5, B, checked=True), BlockPool(5, B, checked=True)
    got, k = a.admit("r", [], 3)
    b.open_holder("r")
    assert (got, k) == (b.take_many("r", 3), 0)
    a.finish("r", got[::-1])
    for blk in got[::-1]:
        b.release(blk, "r")
    b.close_holder("r")
    assert snapshot(a) == snapshot(b)


@pytest.mark.parametrize("checked", [False, True])
def test_an_admission_past_the_scratch_rows_takes_the_rest_once_they_grow(checked):
    """An admission whose takes and evictions touch more blocks than the native loop's
    scratch rows hold stops there, and the pool takes the rest after growing them: the same
    blocks, evictions and state as BlockPool's."""
    pair = Pair(200, B, checked)
    ref, nat = pair.ref, pair.nat
    hashes = [2**200 + i for i in range(150)]
    _cached_prompt(pair, prompt=hashes)
    nat._scratch = np.empty((3, 64), np.int64)  # (as a new pool's)
    got, hits = pair.do("admit", lambda: ref.admit("b", hashes[:3], 190),
                        lambda: nat.admit("b", hashes[:3], 190))
    assert hits == 3 and len(got) == 190 and len(ref.hmap) == 13  # 137 cached blocks evicted
    assert nat._scratch.shape[1] > 64 and nat.structure_errors() == []
