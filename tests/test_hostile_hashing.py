"""Hostile input to allocator/hashing.py: every bad argument raises InvalidArgument (never a raw
TypeError / OverflowError / AttributeError), valid numpy integers are accepted with the same
hash as plain ints, and differently-typed extra-key lists never collide."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from stable_ids import stable_id

from pagedkv.allocator import InvalidArgument
from pagedkv.allocator.errors import AllocatorError
from pagedkv.allocator.hashing import (
    KIND_BYTES,
    KIND_INT,
    KIND_STR,
    all_ints,
    all_ints_in_int64,
    block_hash,
    chain_hashes,
    decode_fields,
    encode_extra_key,
    encode_fields,
    encode_tokens,
    normalize_extra_keys,
    pack_native,
    pack_tokens,
)

TOKS = [1, 2, 3, 4]


def _refused(fn, *args, **kw):
    with pytest.raises(InvalidArgument) as info:
        fn(*args, **kw)
    assert isinstance(info.value, AllocatorError)
    assert str(info.value)  # a message, not an empty error
    return info.value


# ---- parent ----------------------------------------------------------------------------------

BAD_PARENTS = [-1, 2**256, 2**300, -(2**256), "0", 0.0, 1.5, float("nan"), None, True, False,
               np.bool_(True), b"\x00", [0], np.float64(3.0)]


@pytest.mark.parametrize("parent", BAD_PARENTS, ids=stable_id)
def test_block_hash_refuses_bad_parent(parent):
    _refused(block_hash, parent, TOKS)


@pytest.mark.parametrize("parent", BAD_PARENTS, ids=stable_id)
def test_chain_hashes_refuses_bad_parent(parent):
    _refused(chain_hashes, TOKS, 2, parent=parent)


@pytest.mark.parametrize("parent", [np.int64(7), np.uint64(7), np.int8(7), np.int32(7)],
                         ids=stable_id)
def test_numpy_integer_parent_is_accepted_as_its_int(parent):
    assert block_hash(parent, TOKS) == block_hash(7, TOKS)
    assert chain_hashes(TOKS, 2, parent=parent) == chain_hashes(TOKS, 2, parent=7)


def test_parent_range_edges_are_accepted():
    assert block_hash(0, TOKS) != block_hash(2**256 - 1, TOKS)
    assert chain_hashes(TOKS, 4, parent=2**256 - 1) == [block_hash(2**256 - 1, TOKS)]


# ---- token ids -------------------------------------------------------------------------------

BAD_TOKENS = [
    "abcd", b"abcd", bytearray(b"ab"), memoryview(b"ab"), None, 5, 1.5, {1, 2},
    [1, True], [False], [np.bool_(True)], [1.0], [float("nan")], [float("inf")],
    [np.float32(1.0)], ["1"], [None], [[1, 2]], [2**63], [-(2**63) - 1], [np.uint64(2**63)],
    np.array([1.0, 2.0]), np.array([True, False]), np.array(3), (t for t in [1, 2]),
]


@pytest.mark.parametrize("tokens", BAD_TOKENS, ids=stable_id)
def test_bad_token_ids_are_refused_everywhere(tokens):
    _refused(encode_tokens, tokens)
    _refused(block_hash, 0, tokens)
    _refused(chain_hashes, tokens, 1)


@pytest.mark.parametrize("tokens", [
    np.array([1, 2, 3, 4], dtype=np.int64), np.array([1, 2, 3, 4], dtype=np.int32),
    np.array([1, 2, 3, 4], dtype=np.uint16), [np.int64(1), 2, np.int8(3), np.uint32(4)],
    (1, 2, 3, 4), range(1, 5),
], ids=stable_id)
def test_numpy_and_other_integer_sequences_hash_like_plain_ints(tokens):
    assert encode_tokens(tokens) == encode_tokens(TOKS)
    assert block_hash(0, tokens) == block_hash(0, TOKS)
    assert chain_hashes(tokens, 2) == chain_hashes(TOKS, 2)


def test_int64_edges_are_accepted():
    edge = [2**63 - 1, -(2**63), np.uint64(2**63 - 1), np.int64(-(2**63))]
    assert encode_tokens(edge)[:16] == encode_tokens(edge)[16:]
    assert len(chain_hashes(edge, 2)) == 2


# ---- block_size / start ----------------------------------------------------------------------

@pytest.mark.parametrize("bs", [0, -1, -(2**70), True, False, 1.0, 2.5, float("nan"),
                                float("inf"), "2", None, np.float64(2.0), np.bool_(True)],
                         ids=stable_id)
def test_chain_hashes_refuses_bad_block_size(bs):
    _refused(chain_hashes, TOKS, bs)


@pytest.mark.parametrize("start", [-1, -(2**70), True, 1.0, float("nan"), "1", None,
                                   np.bool_(False)], ids=stable_id)
def test_chain_hashes_refuses_bad_start(start):
    _refused(chain_hashes, TOKS, 2, start=start)


def test_chain_hashes_accepts_numpy_ints_and_huge_sizes():
    assert chain_hashes(TOKS, np.int64(2), start=np.int32(1), parent=5) == \
        chain_hashes(TOKS, 2, start=1, parent=5)
    assert chain_hashes(TOKS, 2**63 - 1) == []
    assert chain_hashes(TOKS, 2, start=2**63 - 1) == []
    _refused(chain_hashes, TOKS, 2**63)  # sizes and block indices are int64
    _refused(chain_hashes, TOKS, 2, start=2**80)


def test_chain_hashes_checks_everything_even_with_no_full_block():
    # the refusal does not depend on there being a block to hash
    _refused(chain_hashes, [1], 4, parent=-1)
    _refused(chain_hashes, [1], 4, extra_keys="lora")
    _refused(chain_hashes, [1], 4, salt=5)
    _refused(chain_hashes, [True], 4)


# ---- salt ------------------------------------------------------------------------------------

@pytest.mark.parametrize("salt", [5, 0, True, 1.5, bytearray(b"s"), memoryview(b"s"), ["s"],
                                  ("s",), np.int64(3), "\ud800"], ids=stable_id)
def test_bad_salt_is_refused(salt):
    _refused(block_hash, 0, TOKS, salt=salt)
    _refused(chain_hashes, TOKS, 2, salt=salt)


def test_salt_int_is_not_zero_bytes():
    # bytes(5) would have made salt=5 the same as salt=b"\0" * 5
    _refused(block_hash, 0, TOKS, salt=5)
    assert block_hash(0, TOKS, salt=b"\0" * 5) != block_hash(0, TOKS)


# ---- extra keys ------------------------------------------------------------------------------

BAD_CONTAINERS = ["lora", "", b"lora", bytearray(b"lo"), memoryview(b"lo"), None, 5, 1.5, True,
                  {"a", "b"}, frozenset({"a"})]


@pytest.mark.parametrize("keys", BAD_CONTAINERS, ids=stable_id)
def test_bare_or_unordered_key_containers_are_refused(keys):
    _refused(normalize_extra_keys, keys)
    _refused(block_hash, 0, TOKS, keys)
    _refused(chain_hashes, TOKS, 2, extra_keys=keys)


BAD_KEYS = [True, False, np.bool_(True), 1.5, float("nan"), np.float64(1.0), None, ("a",),
            ["a"], bytearray(b"a"), object(), "\udc80"]


@pytest.mark.parametrize("key", BAD_KEYS, ids=stable_id)
def test_bad_keys_are_refused(key):
    _refused(encode_extra_key, key)
    _refused(normalize_extra_keys, ["ok", key])
    _refused(block_hash, 0, TOKS, ("ok", key))
    _refused(chain_hashes, TOKS, 2, extra_keys=[key])


def test_normalize_returns_canonical_tuples():
    class S(str):
        pass

    class B(bytes):
        pass

    out = normalize_extra_keys([np.int64(3), np.uint8(255), S("a"), B(b"x"), "y", 2**70])
    assert out == (3, 255, "a", b"x", "y", 2**70)
    assert [type(k) for k in out] == [int, int, str, bytes, str, int]
    assert normalize_extra_keys(()) == ()
    assert normalize_extra_keys([]) == ()
    assert normalize_extra_keys(iter(["a", 1])) == ("a", 1)
    _refused(normalize_extra_keys, {"a": 1, "b": 2})  # a mapping is not a list of keys
    t = ("a", 1, b"b")
    assert normalize_extra_keys(t) == t
    assert type(normalize_extra_keys(["a"])) is tuple


def test_numpy_int_keys_hash_like_plain_ints():
    assert block_hash(0, TOKS, [np.int64(7), "a"]) == block_hash(0, TOKS, (7, "a"))
    assert encode_extra_key(np.int16(-129)) == encode_extra_key(-129)


def test_iterator_keys_apply_to_every_block():
    toks = list(range(6))
    assert chain_hashes(toks, 2, extra_keys=iter(["k"])) == chain_hashes(toks, 2,
                                                                       extra_keys=("k",))


COLLIDING_BEFORE_FRAMING = [
    [("1",), (1,), (b"1",)],
    [("ab",), ("a", "b")],
    [("lora",), ("l", "o", "r", "a")],
    [(0,), (b"\x00",), ("\x00",), ("",), (b"",), ()],
    [(1,), (b"\x01",), ("\x01",)],
    [("a", "b"), ("a\x04b",), ("a", "", "b")],
    [(-1,), (255,), (b"\xff",)],
]


@pytest.mark.parametrize("group", COLLIDING_BEFORE_FRAMING, ids=stable_id)
def test_differently_typed_key_lists_never_collide(group):
    hashes = {block_hash(0, TOKS, keys) for keys in group}
    assert len(hashes) == len(group)
    chains = {tuple(chain_hashes(TOKS, 2, extra_keys=keys)) for keys in group}
    assert len(chains) == len(group)


def test_str_keys_are_not_split():
    # the old behaviour: extra_keys="lora" hashed as ("l", "o", "r", "a")
    _refused(block_hash, 0, TOKS, "lora")
    assert block_hash(0, TOKS, ("lora",)) != block_hash(0, TOKS, ("l", "o", "r", "a"))


# ---- injectivity of the key encoding ---------------------------------------------------------

_KEY = st.one_of(
    st.text(max_size=4),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.binary(max_size=4),
    st.integers(min_value=-(2**63), max_value=2**63 - 1).map(np.int64),
    st.sampled_from(["", b"", 0, "\x00", b"\x00", "1", 1, b"1", "\x04", "\x05", "\x06"]),
)
_KEYS = st.lists(_KEY, max_size=4)


def _typed(keys):
    return [(type(k), k) for k in keys]


def _decode_keys(data: bytes) -> tuple:
    out = []
    for kind, payload in decode_fields(data):
        if kind == KIND_STR:
            out.append(payload.decode("utf-8"))
        elif kind == KIND_INT:
            out.append(int.from_bytes(payload, "big", signed=True))
        else:
            assert kind == KIND_BYTES
            out.append(payload)
    return tuple(out)


def _encode_keys(keys) -> bytes:
    return encode_fields([encode_extra_key(k) for k in normalize_extra_keys(keys)])


@given(_KEYS)
def test_key_encoding_roundtrips(keys):
    norm = normalize_extra_keys(keys)
    assert _typed(_decode_keys(_encode_keys(keys))) == _typed(norm)


@given(_KEYS, _KEYS)
def test_distinct_key_tuples_never_encode_alike(a, b):
    na, nb = normalize_extra_keys(a), normalize_extra_keys(b)
    if _typed(na) != _typed(nb):
        assert _encode_keys(a) != _encode_keys(b)
        assert block_hash(0, TOKS, a) != block_hash(0, TOKS, b)
    else:
        assert block_hash(0, TOKS, a) == block_hash(0, TOKS, b)


@given(st.one_of(st.integers(), st.floats(), st.text(max_size=3), st.none(), st.booleans(),
                 st.binary(max_size=3)))
def test_any_parent_is_hashed_or_refused_typed(parent):
    ok = type(parent) is int and 0 <= parent < 2**256
    if ok:
        assert block_hash(parent, TOKS) > 0
    else:
        _refused(block_hash, parent, TOKS)


@given(st.lists(st.one_of(st.integers(min_value=-(2**64), max_value=2**64), st.booleans(),
                          st.floats(allow_nan=True), st.none()), max_size=6))
def test_any_token_list_is_hashed_or_refused_typed(tokens):
    ok = all(type(t) is int and -(2**63) <= t < 2**63 for t in tokens)
    if ok:
        assert len(encode_tokens(tokens)) == 8 * len(tokens)
        assert chain_hashes(tokens, 1) == chain_hashes(list(tokens), 1)
    else:
        _refused(encode_tokens, tokens)
        _refused(chain_hashes, tokens, 1)


def test_nan_and_inf_never_reach_struct():
    for v in (math.nan, math.inf, -math.inf):
        _refused(encode_tokens, [v])
        _refused(chain_hashes, TOKS, v)
        _refused(chain_hashes, TOKS, 2, start=v)


@pytest.mark.parametrize("values,ints,in_range", [
    ([], True, True),
    ([0, -1, 2**63 - 1, -(2**63)], True, True),
    ([3, 2**63], True, False),
    ([-(2**63) - 1, 3], True, False),
    ([3, True], False, False),
    ([np.int64(3), 4], False, False),
    ([3, 1.0], False, False),
    ([3, None], False, False),
])
def test_the_step_paths_token_checks(values: list, ints: bool, in_range: bool) -> None:
    """all_ints: every item exactly an int (bool and numpy integers are not); all_ints_in_int64:
    that and each in int64 range (the checks the native step path runs before taking a step's
    sampled tokens, and add_request's token check)."""
    assert all_ints(values) is ints
    assert all_ints_in_int64(values) is in_range


@given(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=40))
def test_native_packing_is_big_endian_packing_reversed(tokens: list[int]) -> None:
    """pack_native is pack_tokens with each token's 8 bytes reversed (what the native chain
    hashing undoes per token)."""
    big, little = pack_tokens(tokens), pack_native(tokens)
    assert [big[i:i + 8] for i in range(0, len(big), 8)] == [
        little[i:i + 8][::-1] for i in range(0, len(little), 8)]
