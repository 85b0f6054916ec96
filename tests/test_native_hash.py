"""native_hash.chain_tokens: hashing.chain_digests' digests, computed by libcrypto natively."""

from __future__ import annotations

import ctypes.util
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("numba")

from pagedkv.allocator import hashing, native_hash  # noqa: E402
from pagedkv.allocator.native_allocator import NativeAllocator  # noqa: E402

KEYS = st.lists(st.one_of(st.text(max_size=12), st.integers(-(2**80), 2**80),
                          st.binary(max_size=12)), max_size=3).map(tuple)


def test_native_where_libcrypto_is() -> None:
    """The native loop is used wherever a libcrypto is found (Python's hashlib needs one)."""
    if ctypes.util.find_library("crypto") is None:  # pragma: no cover - no libcrypto here
        pytest.skip("no libcrypto on this machine")
    assert native_hash.native()


@settings(max_examples=200, deadline=None)
@given(width_tokens=st.sampled_from([1, 2, 7, 16, 64]), count=st.integers(0, 9),
       parent=st.one_of(st.just(0), st.just(1), st.integers(0, 2**256 - 1)), keys=KEYS,
       salt=st.one_of(st.none(), st.binary(max_size=40)), seed=st.integers(0, 2**32))
def test_same_digests_as_hashing(width_tokens: int, count: int, parent: int,
                                 keys: tuple, salt: bytes | None, seed: int) -> None:
    """Every block's digest equals hashing.chain_digests' (its message, its parent chained,
    the salt in the first block only, the keys in every one), on fresh random tokens."""
    rng = random.Random(seed)
    tokens = [rng.randrange(-(2**63), 2**63) for _ in range(width_tokens * count)]
    keys = hashing.normalize_extra_keys(keys)
    expected = hashing.chain_digests(parent, hashing.pack_tokens(tokens), 8 * width_tokens,
                                     count, keys, salt)
    assert native_hash.chain_tokens(parent, tokens, width_tokens, keys, salt) == expected


def test_chain_hashes_of_a_request_agree() -> None:
    """The same request's block hashes in the native allocator and in hashing.chain_hashes,
    salted and keyed, and a prompt split across calls (a parent carried over)."""
    rng = random.Random(7)
    tokens = [rng.randrange(50_000) for _ in range(16 * 40 + 5)]
    a = NativeAllocator(64, 16, checked=False)
    a.add_request("r", tokens, cache_salt="tenant", extra_keys=("lora-3",))
    expected = hashing.chain_hashes(tokens, 16, salt="tenant", extra_keys=("lora-3",))
    assert a._requests["r"].hashes == expected
    head = native_hash.chain_tokens(0, tokens[:160], 16, ("lora-3",), b"tenant")
    rest = native_hash.chain_tokens(head[-1], tokens[160:640], 16, ("lora-3",), None)
    assert head + rest == expected


@settings(max_examples=100, deadline=None)
@given(width_tokens=st.sampled_from([1, 7, 16]), count=st.integers(1, 6), keys=KEYS,
       seed=st.integers(0, 2**32))
def test_next_blocks_hash_each_chain_on(width_tokens: int, count: int, keys: tuple,
                                        seed: int) -> None:
    """next_blocks' digest i is block i's chained to parents[i] (its own parent, no salt),
    as chain_tokens and hashing.chain_digests compute it, natively and in the fallback."""
    rng = random.Random(seed)
    parents = [rng.choice([1, rng.getrandbits(256), rng.getrandbits(64)]) for _ in range(count)]
    tokens = [rng.randrange(-(2**63), 2**63) for _ in range(width_tokens * count)]
    keys = hashing.normalize_extra_keys(keys)
    expected = [hashing.chain_digests(p, hashing.pack_tokens(
        tokens[i * width_tokens:(i + 1) * width_tokens]), 8 * width_tokens, 1, keys, None)[0]
        for i, p in enumerate(parents)]
    assert native_hash.next_blocks(parents, tokens, width_tokens, keys) == expected
    native_hash._native()
    saved = native_hash._LOOPS[:]
    native_hash._LOOPS[:] = [None]  # as without numba or libcrypto's low-level calls
    try:
        assert native_hash.next_blocks(parents, tokens, width_tokens, keys) == expected
    finally:
        native_hash._LOOPS[:] = saved


def test_next_blocks_refuses_a_token_count_that_is_not_one_block_each() -> None:
    with pytest.raises(ValueError, match="3 blocks need 48 tokens"):
        native_hash.next_blocks([5, 6, 7], list(range(47)), 16, ())


def test_a_step_of_appends_hashes_each_filled_block_as_the_chain_does() -> None:
    """Sampled tokens that fill blocks of several requests in one step (keyed, salted, a
    request whose first block they fill) give each request chain_hashes' digests."""
    rng = random.Random(11)
    a = NativeAllocator(256, 16, checked=False)
    prompts = {"a": 16 * 3 + 15, "b": 16 * 5 + 15, "keyed": 16 + 15, "first": 15, "c": 40}
    for rid, n in prompts.items():
        keys = ("lora-1",) if rid == "keyed" else ()
        a.add_request(rid, [rng.randrange(50_000) for _ in range(n)], cache_salt="s",
                      extra_keys=keys)
        a.allocate(rid, n + 20)
    reqs = [a._requests[rid] for rid in prompts]
    for _ in range(20):
        a.append_token_many(reqs, [rng.randrange(50_000) for _ in reqs])
    for rid, req in zip(prompts, reqs, strict=True):
        keys = ("lora-1",) if rid == "keyed" else ()
        assert req.hashes == hashing.chain_hashes(req.tokens, 16, salt="s", extra_keys=keys)
        assert len(req.hashes) == len(req.tokens) // 16


def test_chain_packed_hashes_the_blocks_the_check_packed() -> None:
    """A registration hashes the bytes its token check packed: chain_packed of those bytes
    (a partial block at the end not hashed) equals chain_tokens, natively and in the
    fallback; too few bytes for the blocks asked is refused."""
    from pagedkv.allocator.allocator import _check_and_pack_tokens

    rng = random.Random(5)
    tokens = [rng.randrange(-(2**63), 2**63) for _ in range(16 * 9 + 7)]
    checked, packed = _check_and_pack_tokens(tokens)
    assert checked == tokens and packed == hashing.pack_native(tokens)
    expected = native_hash.chain_tokens(3, tokens[:16 * 9], 16, ("k",), b"salt")
    assert native_hash.chain_packed(3, packed, 9, 16, ("k",), b"salt") == expected
    native_hash._native()
    saved = native_hash._LOOPS[:]
    native_hash._LOOPS[:] = [None]
    try:
        assert native_hash.chain_packed(3, packed, 9, 16, ("k",), b"salt") == expected
    finally:
        native_hash._LOOPS[:] = saved
    with pytest.raises(ValueError, match="10 blocks need 1280 bytes"):
        native_hash.chain_packed(3, packed, 10, 16, (), None)
