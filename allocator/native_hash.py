"""``hashing.chain_digests`` natively: a chain of block digests in one compiled loop.

In Python a block's sha256 costs about a microsecond and a half on one core, most of it
hashlib's per-object overhead (a new or copied OpenSSL context per block) rather than the
compression of its ~200 bytes. Here the loop (``native_sha``, imported on first use) calls
libcrypto's low-level ``SHA256_Init`` / ``SHA256_Update`` / ``SHA256_Final`` (the library
Python's ``_hashlib`` is linked against, with its SHA extensions where the CPU has them) on one
message buffer per block, and the digests come back as one byte string, cut into ints by one
``struct`` call.

The message, the parent's chaining and the rule that a zero digest stands for 1 are
``hashing.chain_digests``' (``tests/test_native_hash.py`` compares them on random chains, with
keys and salts). Where libcrypto or its low-level symbols cannot be loaded, ``chain_tokens``
hashes through ``hashing.chain_digests`` (``native()`` says which).
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable
from typing import Any

from . import hashing
from .hashing import KIND_TOKENS, block_tails, digest_bytes, pack_native, pack_tokens

_Loops = tuple[Callable[..., Any], ...]
_LOOPS: list[_Loops | None] = []  # the native loops (or None), on first use


def _native() -> _Loops | None:
    """``native_sha.LOOPS``, imported on first use; None without numba."""
    if not _LOOPS:
        try:
            from .native_sha import LOOPS
        except ImportError:  # (pagedkv[native] not installed: hashing.chain_digests serves)
            LOOPS = None
        _LOOPS.append(LOOPS)
    return _LOOPS[0]


def native() -> bool:
    """Whether ``chain_tokens`` and ``next_blocks`` run natively here (numba, and
    libcrypto's low-level calls)."""
    return _native() is not None


_PREFIX = hashing._DOMAIN + hashing._header(hashing.KIND_PARENT, 32)
_NO_PARENT = bytes(32)  # (a placeholder: each block's parent is written into its message)


@functools.lru_cache(maxsize=256)
def _cut(count: int) -> Callable[[bytes], tuple[bytes, ...]]:
    return struct.Struct("32s" * count).unpack


def chain_tokens(parent: int, tokens: list[int], block_size: int,
                 keys: tuple[str | int | bytes, ...], salt: bytes | None) -> list[int]:
    """``hashing.chain_digests(parent, pack_tokens(tokens), 8 * block_size, ...)`` of checked
    ``tokens`` (plain ints in int64 range, whole blocks of them): the same digests,
    natively. The tokens are packed little-endian (``pack_native``, a third of big-endian
    packing's time) and reversed into the messages natively."""
    return chain_packed(parent, pack_native(tokens), len(tokens) // block_size, block_size,
                        keys, salt)


def chain_packed(parent: int, data: bytes, count: int, block_size: int,
                 keys: tuple[str | int | bytes, ...], salt: bytes | None) -> list[int]:
    """``chain_tokens`` of the first ``count`` blocks of tokens already packed
    (``pack_native``: ``data`` holds at least ``count`` blocks)."""
    return digests_of(chain_packed_bytes(parent, data, count, block_size, keys, salt), count)


def chain_packed_bytes(parent: int, data: bytes, count: int, block_size: int,
                       keys: tuple[str | int | bytes, ...], salt: bytes | None) -> bytearray:
    """``chain_packed``'s digests as their 32 big-endian bytes each, in one byte string."""
    width = 8 * block_size
    if len(data) < count * width:
        raise ValueError(f"{count} blocks need {count * width} bytes, got {len(data)}")
    loops = _LOOPS[0] if _LOOPS else _native()
    if loops is None:
        tokens = struct.unpack(f"<{count * block_size}q", data[:count * width])
        return bytearray(digest_bytes(hashing.chain_digests(
            parent, pack_tokens(tokens), width, count, keys, salt)))
    tail, first_tail = block_tails(keys, salt)
    out = bytearray(32 * count)
    loops[0](_PREFIX + parent.to_bytes(32, "big") + _tokens_header(width), len(_PREFIX),
             data, width, count, tail, first_tail, out)
    return out


def next_blocks(parents: list[int], tokens: list[int], block_size: int,
                keys: tuple[str | int | bytes, ...]) -> list[int]:
    """One block of each of several chains, none its chain's first (no salt), with the same
    ``keys``: digest ``i`` is ``chain_tokens(parents[i], tokens[i * block_size:(i + 1) *
    block_size], block_size, keys, None)[0]``, all in one native call (a step's sampled
    tokens that filled a block, one per request)."""
    width, count = 8 * block_size, len(parents)
    if len(tokens) != count * block_size:
        raise ValueError(f"{count} blocks need {count * block_size} tokens, got {len(tokens)}")
    loops = _LOOPS[0] if _LOOPS else _native()
    if loops is None:
        return [hashing.chain_digests(p, pack_tokens(tokens[i * block_size:(i + 1) * block_size]),
                                      width, 1, keys, None)[0]
                for i, p in enumerate(parents)]
    tail = block_tails(keys, None)[0]
    out = bytearray(32 * count)
    loops[1](_PREFIX + _NO_PARENT + _tokens_header(width), len(_PREFIX),
             digest_bytes(parents), pack_native(tokens), width,
             count, tail, out)
    return digests_of(out, count)


def appender(block_size: int) -> Callable[..., int] | None:
    """A step's sampled tokens appended natively to rows of open blocks, each block they end
    hashed where its row's chain is open (``native_sha._append``, with the messages of
    ``block_size``-token blocks without extra keys: a digest is ``next_blocks``' of the
    block's parent and tokens); None where hashing is not native. Called as ``loop(known,
    rows, n, tokens, opened, parents, chained, out, filled, hashed, digests, stored)``,
    returning how many blocks ended (see ``_append`` for the arrays)."""
    loops = _native()
    if loops is None:
        return None
    head = _PREFIX + _NO_PARENT + _tokens_header(8 * block_size)
    return functools.partial(loops[2], head, len(_PREFIX), block_tails((), None)[0])


def _tokens_header(width: int) -> bytes:
    return hashing._known_header(KIND_TOKENS, width)


def digests_of(out: bytes | bytearray, count: int) -> list[int]:
    """``count`` 32-byte big-endian digests as ints."""
    if count == 1:
        return [int.from_bytes(out, "big")]
    return list(map(int.from_bytes, _cut(count)(out), ("big",) * count))


__all__ = ["appender", "chain_packed", "chain_packed_bytes", "chain_tokens", "digests_of",
           "native", "next_blocks"]
