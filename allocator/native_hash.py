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
from .hashing import KIND_TOKENS, block_tails, pack_native, pack_tokens

_LOOP: list[Callable[..., Any] | None] = []  # the native loop (or None), on first use


def _native() -> Callable[..., Any] | None:
    """``native_sha.LOOP``, imported on first use; None without numba."""
    if not _LOOP:
        try:
            from .native_sha import LOOP
        except ImportError:  # (pagedkv[native] not installed: hashing.chain_digests serves)
            LOOP = None
        _LOOP.append(LOOP)
    return _LOOP[0]


def native() -> bool:
    """Whether ``chain_tokens`` runs natively here (numba, and libcrypto's low-level calls)."""
    return _native() is not None


_PREFIX = hashing._DOMAIN + hashing._header(hashing.KIND_PARENT, 32)


@functools.lru_cache(maxsize=256)
def _cut(count: int) -> Callable[[bytes], tuple[bytes, ...]]:
    return struct.Struct("32s" * count).unpack


def chain_tokens(parent: int, tokens: list[int], block_size: int,
                 keys: tuple[str | int | bytes, ...], salt: bytes | None) -> list[int]:
    """``hashing.chain_digests(parent, pack_tokens(tokens), 8 * block_size, ...)`` of checked
    ``tokens`` (plain ints in int64 range, whole blocks of them): the same digests,
    natively. The tokens are packed little-endian (``pack_native``, a third of big-endian
    packing's time) and reversed into the messages natively."""
    width, count = 8 * block_size, len(tokens) // block_size
    loop = _LOOP[0] if _LOOP else _native()
    if loop is None:
        return hashing.chain_digests(parent, pack_tokens(tokens), width, count, keys, salt)
    tail, first_tail = block_tails(keys, salt)
    head = _PREFIX + parent.to_bytes(32, "big") + hashing._known_header(KIND_TOKENS, width)
    out = bytearray(32 * count)
    loop(head, len(_PREFIX), pack_native(tokens), width, count, tail, first_tail, out)
    if count == 1:
        return [int.from_bytes(out, "big")]
    return list(map(int.from_bytes, _cut(count)(out), ("big",) * count))


__all__ = ["chain_tokens", "native"]
