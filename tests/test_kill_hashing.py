"""Kills mutants of allocator/hashing.py: the block-hash encoding is a versioned format
(``pagedkv.block.v1``), so it is pinned against an independent construction of its bytes."""

from __future__ import annotations

import hashlib

import pytest

from pagedkv.allocator import InvalidArgument
from pagedkv.allocator.hashing import (
    KIND_BYTES,
    KIND_INT,
    KIND_PARENT,
    KIND_SALT,
    KIND_STR,
    KIND_TOKENS,
    block_hash,
    chain_hashes,
    decode_fields,
    encode_extra_key,
    encode_fields,
    encode_tokens,
    frame,
)


def _field(tag: int, payload: bytes) -> bytes:
    return bytes([tag]) + len(payload).to_bytes(8, "big") + payload


def _expected(parent, tokens, extra=(), salt=None) -> int:
    data = _field(1, parent.to_bytes(32, "big"))
    data += _field(2, b"".join(t.to_bytes(8, "big", signed=True) for t in tokens))
    if salt is not None:
        data += _field(3, salt.encode() if isinstance(salt, str) else salt)
    for k in extra:
        if isinstance(k, str):
            data += _field(4, k.encode())
        elif isinstance(k, int):
            data += _field(5, k.to_bytes((k.bit_length() + 8) // 8 + 1, "big", signed=True))
        else:
            data += _field(6, bytes(k))
    return int.from_bytes(hashlib.sha256(b"pagedkv.block.v1" + data).digest(), "big") or 1


def test_block_hash_matches_the_format_at_every_token_count():
    """The tokens field's header is looked up per payload length (a bounded cache): every
    count, cached or not, frames its own length."""
    import random

    rng = random.Random(5)
    for n in list(range(0, 80)) * 2:  # more counts than the cache keeps, each twice
        tokens = [rng.randrange(-(2**63), 2**63) for _ in range(n)]
        extra = rng.choice([(), ("",), ("a", 3, b"z")])
        salt = rng.choice([None, "s", b""])
        parent = rng.randrange(2**256)
        assert block_hash(parent, tokens, extra, salt) == _expected(parent, tokens, extra, salt)


def test_kinds_are_the_documented_tags():
    assert (KIND_PARENT, KIND_TOKENS, KIND_SALT, KIND_STR, KIND_INT, KIND_BYTES) == (
        1, 2, 3, 4, 5, 6)


@pytest.mark.parametrize("args", [
    (0, [1, 2, 3], (), None),
    (5, [-1, 2**63 - 1, -(2**63)], ("adapter", 7, -129, 255, b"\x00mm"), "tenant"),
    (2**255, [0], (0, -1, 128, -128), b"salt"),
])
def test_block_hash_matches_the_format(args):
    parent, tokens, extra, salt = args
    assert block_hash(parent, tokens, extra, salt) == _expected(parent, tokens, extra, salt)


def test_frame_layout_and_roundtrip():
    assert frame(7, b"ab") == b"\x07" + (2).to_bytes(8, "big") + b"ab"
    assert frame(0, b"") == b"\x00" * 9
    assert frame(255, b"x")[0] == 255
    with pytest.raises(AssertionError):
        frame(256, b"")
    fields = [(4, b"a"), (0, b""), (2, b"\x00" * 17), (255, b"z" * 300)]
    assert encode_fields(fields) == b"".join(_field(k, p) for k, p in fields)
    assert decode_fields(encode_fields(fields)) == fields
    assert decode_fields(b"") == []


def test_decode_rejects_truncation_exactly():
    good = encode_fields([(4, b"abc"), (5, b"")])
    assert decode_fields(good) == [(4, b"abc"), (5, b"")]
    for cut in range(1, len(good)):
        if cut in (12,):  # a whole first field
            assert decode_fields(good[:cut]) == [(4, b"abc")]
            continue
        with pytest.raises(ValueError):
            decode_fields(good[:cut])
    with pytest.raises(ValueError, match="header"):
        decode_fields(good[:8])
    with pytest.raises(ValueError, match="payload"):
        decode_fields(good[:11])


def test_tokens_are_signed_8_byte_and_range_checked():
    assert encode_tokens([1, -1]) == (1).to_bytes(8, "big") + b"\xff" * 8
    assert encode_tokens([]) == b""
    encode_tokens([2**63 - 1, -(2**63)])
    for bad in (2**63, -(2**63) - 1):
        with pytest.raises(InvalidArgument):
            encode_tokens([bad])


def test_extra_keys_kinds_and_refusals():
    assert encode_extra_key("é") == (KIND_STR, "é".encode())
    assert encode_extra_key(b"x") == (KIND_BYTES, b"x")
    for k in (0, 1, -1, 127, 128, -128, -129, 2**70):
        kind, payload = encode_extra_key(k)
        assert kind == KIND_INT
        assert int.from_bytes(payload, "big", signed=True) == k
        assert len(payload) == (k.bit_length() + 8) // 8 + 1
    for bad in (True, False, 1.5, None, ("a",)):
        with pytest.raises(InvalidArgument):
            encode_extra_key(bad)


def test_no_collisions_across_kinds_and_salt():
    h = block_hash
    assert h(0, [1], ["a", "b"]) != h(0, [1], ["a\x04b"])
    assert h(0, [1], [1]) != h(0, [1], ["\x01"])
    assert h(0, [1], [b"a"]) != h(0, [1], ["a"])
    assert h(0, [1], salt="s") != h(0, [1], ["s"])
    assert h(0, [1], salt="") != h(0, [1])
    assert h(0, [1, 2]) != h(0, [1]) != h(1, [1])
    assert h(0, []) != 0


def test_chain_hashes_salt_only_on_first_block_and_start():
    toks = list(range(10))
    full = chain_hashes(toks, 4, salt="s", extra_keys=("k",))
    assert len(full) == 2
    h0 = block_hash(0, toks[0:4], ("k",), "s")
    h1 = block_hash(h0, toks[4:8], ("k",), None)
    assert full == [h0, h1]
    assert chain_hashes(toks, 4, start=1, parent=h0, extra_keys=("k",)) == [h1]
    assert chain_hashes(toks[:3], 4) == []
    assert chain_hashes(toks[:4], 4) == [block_hash(0, toks[:4])]
    assert chain_hashes(toks, 5, parent=9) == [block_hash(9, toks[:5]),
                                               block_hash(block_hash(9, toks[:5]), toks[5:])]


def test_chain_digests_equal_the_chain_of_block_hashes():
    """``chain_digests`` (one sha256 per block, the parent carried as bytes) equals the chain
    of independently encoded blocks: the salt in the first block only, the keys in each."""
    import random

    from pagedkv.allocator.hashing import chain_digests

    rng = random.Random(11)
    for _ in range(40):
        B = rng.choice([1, 2, 16])
        count = rng.randrange(0, 6)
        tokens = [rng.randrange(-(2**63), 2**63) for _ in range(B * count)]
        keys = rng.choice([(), ("k",), (7, b"\x00", "x")])
        salt = rng.choice([None, b"s", b""])
        parent = rng.randrange(2**256)
        want, h = [], parent
        for i in range(count):
            h = _expected(h, tokens[i * B:(i + 1) * B], keys, salt if i == 0 else None)
            want.append(h)
        assert chain_digests(parent, encode_tokens(tokens), 8 * B, count, keys, salt) == want


def test_an_all_zero_digest_stands_for_1_as_value_and_as_parent(monkeypatch):
    """0 means "no hash": a digest of all zero bytes (no input is known to give one) is 1,
    and the next block chains on 1's bytes."""
    from pagedkv.allocator import hashing

    fed: list[bytes] = []

    class ZeroSha:  # the prefix state's copy, giving zero digests and recording its input
        def copy(self):
            return self

        def update(self, data: bytes) -> None:
            fed.append(data)

        def digest(self) -> bytes:
            return bytes(32)

    monkeypatch.setattr(hashing, "_PREFIX_STATE", ZeroSha())
    data = encode_tokens([5, 6])
    assert hashing.chain_digests(0, data, 8, 2, (), None) == [1, 1]
    assert fed[1][:32] == (1).to_bytes(32, "big")
    assert hashing.digest(9, data, (), None) == 1
