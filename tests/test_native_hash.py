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
