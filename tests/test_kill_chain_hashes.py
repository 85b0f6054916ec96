"""``BlockAllocator.chain_hashes``: ``hashing.chain_hashes`` through the allocator's memo."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from pagedkv.allocator import BlockAllocator, InvalidArgument
from pagedkv.allocator.hashing import block_hash, chain_hashes

B = 4


def _tokens(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(-(1 << 63), 1 << 63) for _ in range(n)]


@pytest.mark.parametrize("seed", range(6))
def test_chain_hashes_are_hashings_from_any_block_on(seed: int) -> None:
    rng = random.Random(seed)
    tokens = _tokens(seed, rng.randrange(0, 6 * B))
    keys = rng.choice([(), ("",), ("lora", 7, b"\x00mm")])
    salt = rng.choice([None, "tenant", b"raw"])
    whole = chain_hashes(tokens, B, extra_keys=keys, salt=salt)
    a = BlockAllocator(8, B)
    for start in range(len(whole) + 1):
        parent = whole[start - 1] if start else 0
        assert a.chain_hashes(tokens, start=start, parent=parent, extra_keys=keys,
                              salt=salt) == whole[start:]
    # the same blocks one by one, through block_hash
    assert [a.block_hash(whole[i - 1] if i else 0, tokens[i * B:(i + 1) * B], keys,
                         salt if i == 0 else None) for i in range(len(whole))] == whole


def test_chain_hashes_fill_the_memo_that_add_request_reads() -> None:
    tokens = _tokens(9, 5 * B + 1)
    a = BlockAllocator(16, B)
    hashes = a.chain_hashes(tokens, extra_keys=("",), salt="s")
    assert a._hash_memo is not None and len(a._hash_memo) == 5
    a.add_request("r", tokens, cache_salt="s", extra_keys=("",))
    assert len(a._hash_memo) == 5  # every block found, none hashed again
    assert a._requests["r"].hashes == hashes
    # a numpy array of tokens is a sequence of ints: the same hashes
    assert a.chain_hashes(np.asarray(tokens), extra_keys=("",), salt="s") == hashes


def test_only_the_blocks_hashed_are_read() -> None:
    tokens: list[Any] = ["not a token"] * B + _tokens(3, 2 * B)
    a = BlockAllocator(8, B)
    parent = 12345
    first = block_hash(parent, tokens[B:2 * B])
    assert a.chain_hashes(tokens, start=1, parent=parent) == [
        first, block_hash(first, tokens[2 * B:3 * B])]


@pytest.mark.parametrize("call", [
    dict(tokens=[1, 2, True, 4]),
    dict(tokens=[1, 2, 3.0, 4]),
    dict(tokens=[1, 2, 3, 1 << 63]),
    dict(tokens="abcd"),
    dict(tokens={1, 2, 3, 4}),  # unordered
    dict(tokens=None),
    dict(tokens=[1, 2, 3, 4], start=-1),
    dict(tokens=[1, 2, 3, 4], start=True),
    dict(tokens=[1, 2, 3, 4], parent=-1),
    dict(tokens=[1, 2, 3, 4], parent=1 << 256),
    dict(tokens=[1, 2, 3, 4], parent=1.0),
    dict(tokens=[1, 2, 3, 4], extra_keys="lora"),
    dict(tokens=[1, 2, 3, 4], extra_keys=[1.5]),
    dict(tokens=[1, 2, 3, 4], salt=7),
    dict(tokens=[1, 2, 3, 4], salt="\ud800"),
    dict(tokens=[1, 2, 3, 4, 5, 6, 7, 8], start=1, parent=5, salt=7),  # block 0 not hashed
])
def test_a_bad_argument_is_refused_and_memoizes_nothing(call: dict[str, Any]) -> None:
    a = BlockAllocator(8, B)
    tokens = call.pop("tokens")
    with pytest.raises(InvalidArgument):
        a.chain_hashes(tokens, **call)
    assert a._hash_memo is not None and len(a._hash_memo) == 0
