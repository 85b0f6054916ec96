"""A step's sampled tokens appended natively (``NativeAllocator.append_token_many``): each row's
block in progress takes its token and the blocks ended are hashed in the same loop, from a
mirror of the request's token and digest lists (``_open_row``). Held here to the chain the
lists give (``chain_hashes``) after any mix of native appends, Python appends (many tokens at
once), frees and registrations again, with salts, extra keys and prompts shorter than a
block; ``check_invariants`` finds a mirror that went wrong."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("numba")

from pagedkv.allocator import InvariantViolation, native_hash  # noqa: E402
from pagedkv.allocator.native_allocator import NativeAllocator  # noqa: E402

SALTS = st.sampled_from([None, "tenant-a", b"\x00salt"])
KEYS = st.sampled_from([(), ("lora-7",), (3, b"img")])
TOKEN = st.integers(-(2**63), 2**63 - 1)
REQUEST = st.tuples(st.lists(TOKEN, min_size=1, max_size=20), SALTS, KEYS)
OP = st.one_of(
    st.tuples(st.just("sampled"), st.lists(st.integers(0, 5), min_size=1, max_size=6,
                                           unique=True), st.lists(TOKEN, min_size=6,
                                                                  max_size=6)),
    st.tuples(st.just("many"), st.integers(0, 5), st.lists(TOKEN, min_size=0, max_size=9)),
    st.tuples(st.just("again"), st.integers(0, 5), st.just(None)),
)


def _chain_of(a: NativeAllocator, rid: str) -> list[int]:
    req = a._requests[rid]
    return a.chain_hashes(req.tokens, extra_keys=req.extra_keys, salt=req.salt)


def _natively_hashed() -> bool:
    return native_hash.native()


@settings(max_examples=60, deadline=None)
@given(block_size=st.sampled_from([1, 2, 3, 4, 16]), requests=st.lists(REQUEST, min_size=1,
                                                                         max_size=6),
       ops=st.lists(OP, max_size=25))
def test_sampled_tokens_hash_the_blocks_they_end_as_the_chain_says(block_size, requests, ops):
    a = NativeAllocator(64, block_size, checked=False)
    rids = []
    for i, (prompt, salt, keys) in enumerate(requests):
        rids.append(f"r{i}")
        a.add_request(f"r{i}", prompt, cache_salt=salt, extra_keys=keys)
    for kind, which, tokens in ops:
        if kind == "sampled":
            chosen = [rids[i % len(rids)] for i in which]
            chosen = list(dict.fromkeys(chosen))
            a.append_token_many([a._requests[rid] for rid in chosen], tokens[:len(chosen)])
        elif kind == "many":
            a.append_tokens(rids[which % len(rids)], tokens)
        else:  # freed, then registered again under a new id: a new row, the same lists
            rid = rids[which % len(rids)]
            req = a._requests[rid]
            a.free(rid)
            rids[which % len(rids)] = new = rid + "'"
            a.add_request(new, req.tokens, cache_salt=req.salt, extra_keys=req.extra_keys)
        for rid in rids:
            assert a._requests[rid].hashes == _chain_of(a, rid)
        assert a._mirror_mismatches() == []


@pytest.mark.skipif(not _natively_hashed(), reason="hashing is not native here")
def test_a_decode_step_hashes_every_block_it_ends_in_one_native_call(monkeypatch):
    """Rows whose chains are open are hashed by the native loop: no Python hashing runs."""
    a = NativeAllocator(64, 4, checked=False)
    for i in range(5):
        a.add_request(f"r{i}", list(range(10 * i, 10 * i + 7)))
    reqs = [a._requests[f"r{i}"] for i in range(5)]

    def python_hashing(*_args):
        raise AssertionError("a block was hashed in Python")

    monkeypatch.setattr(a, "_extend_hashes", python_hashing)
    a.append_token_many(reqs, [100, 101, 102, 103, 104])  # each ends its second block
    for req in reqs:
        assert len(req.hashes) == 2
        assert req.hashes == a.chain_hashes(req.tokens)


@pytest.mark.skipif(not _natively_hashed(), reason="hashing is not native here")
def test_a_chains_first_block_is_hashed_in_python_and_the_next_ones_natively(monkeypatch):
    """A prompt shorter than a block has no digest to chain from: the block its sampled
    tokens end is hashed in Python (with the salt), and the row's chain opens then."""
    a = NativeAllocator(64, 4, checked=False)
    a.add_request("p", [1, 2], cache_salt="tenant")
    req = a._requests["p"]
    in_python = []
    real = a._extend_hashes
    monkeypatch.setattr(a, "_extend_hashes", lambda r: (in_python.append(r.rid), real(r)))
    for t in range(10):
        a.append_token_many([req], [t])
    assert in_python == ["p"] and len(req.hashes) == 3
    assert req.hashes == a.chain_hashes(req.tokens, salt="tenant")
    assert a._mirror_mismatches() == []


def test_without_native_hashing_the_same_digests_come_from_python():
    a = NativeAllocator(64, 4, checked=False)
    b = NativeAllocator(64, 4, checked=False)
    b._appending = None  # as where libcrypto lacks the low-level calls
    for x in (a, b):
        x.add_request("p", [1, 2, 3, 4, 5, 6])
        x.add_request("q", [9], cache_salt="s")
    for t in range(11):
        for x in (a, b):
            x.append_token_many([x._requests["p"], x._requests["q"]], [t, 2 * t])
    for rid in "pq":
        assert a._requests[rid].hashes == b._requests[rid].hashes == _chain_of(a, rid)
        assert len(a._requests[rid].hashes) >= 3


@pytest.mark.skipif(not _natively_hashed(), reason="hashing is not native here")
@pytest.mark.parametrize("corrupt", ["open block", "chain head", "chain open"])
def test_check_invariants_finds_a_mirror_that_differs_from_the_lists(corrupt):
    a = NativeAllocator(64, 4, checked=True)
    a.add_request("p", [1, 2, 3, 4, 5, 6])
    a.check_invariants()
    row = a._requests["p"].row
    if corrupt == "open block":
        a._open[row, 15] ^= 1  # the last byte of the second token of the block in progress
    elif corrupt == "chain head":
        a._parent[row, 0] ^= 1
    else:
        a._chained[row] = 0
    with pytest.raises(InvariantViolation, match="table_isolation"):
        a.check_invariants()


def test_a_numpy_token_is_recorded_as_a_plain_int():
    a = NativeAllocator(64, 2, checked=False)
    a.add_request("p", [1])
    a.append_token_many([a._requests["p"]], [np.int64(7)])
    tokens = a._requests["p"].tokens
    assert tokens == [1, 7] and all(type(t) is int for t in tokens)
    assert a._requests["p"].hashes == a.chain_hashes([1, 7])


def test_the_mirror_grows_with_the_rows():
    a = NativeAllocator(512, 2, checked=False)
    rows = a.R.shape[1]
    for i in range(rows + 5):
        a.add_request(i, [i, i + 1, i + 2])
    assert a.R.shape[1] > rows and a._open.shape[0] == a._parent.shape[0] == a.R.shape[1]
    reqs = [a._requests[i] for i in range(rows + 5)]
    for t in range(3):
        a.append_token_many(reqs, [t] * len(reqs))
    assert all(req.hashes == a.chain_hashes(req.tokens) for req in reqs)
    assert a._mirror_mismatches() == []
