"""``hashing.chain_digests`` natively: a chain of block digests in one compiled loop.

In Python a block's sha256 costs about a microsecond and a half on one core, most of it
hashlib's per-object overhead (a new or copied OpenSSL context per block) rather than the
compression of its ~200 bytes. Here the loop calls libcrypto's low-level ``SHA256_Init`` /
``SHA256_Update`` / ``SHA256_Final`` (the library Python's ``_hashlib`` is linked against,
with its SHA extensions where the CPU has them) on one message buffer per block, and the
digests come back as one byte string, cut into ints by one ``struct`` call.

The message, the parent's chaining and the rule that a zero digest stands for 1 are
``hashing.chain_digests``' (``tests/test_native_hash.py`` compares them on random chains, with
keys and salts). Where libcrypto or its low-level symbols cannot be loaded, ``chain_tokens``
hashes through ``hashing.chain_digests`` (``NATIVE`` says which).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import struct
from collections.abc import Callable
from typing import Any

import numpy as np

from . import hashing
from .hashing import KIND_TOKENS, block_tails, pack_native, pack_tokens

try:
    import llvmlite.binding as llvm
    import numba
    from numba import types
except ImportError:  # (pagedkv[native] not installed: hashing.chain_digests serves)
    numba = None

_SYMBOLS = ("SHA256_Init", "SHA256_Update", "SHA256_Final")
_CTX_BYTES = 256  # >= sizeof(SHA256_CTX) (112 on every libcrypto)


def _libcrypto() -> str | None:
    """The libcrypto to link against, if it has the low-level SHA-256 calls: the one
    ``_hashlib`` loaded (found by name), else None."""
    name = ctypes.util.find_library("crypto")
    if name is None:
        return None
    try:
        lib = ctypes.CDLL(name)
    except OSError:
        return None
    return name if all(hasattr(lib, s) for s in _SYMBOLS) else None


if numba is not None:
    from .native_entry import entry

    _PTR = types.voidptr
    _sha_init = types.ExternalFunction("SHA256_Init", types.int32(_PTR))
    _sha_update = types.ExternalFunction("SHA256_Update", types.int32(_PTR, _PTR, types.uintp))
    _sha_final = types.ExternalFunction("SHA256_Final", types.int32(_PTR, _PTR))

    @numba.njit(cache=True)
    def _chain(head, at_parent, data, width, count, tail, first_tail, out):
        """Digest ``count`` blocks into ``out`` (32 bytes each). A block's message is ``head``
        (the fixed prefix, its parent's 32 bytes at ``at_parent``, the tokens' header), its
        tokens (``data``: little-endian int64s, ``width`` bytes a block, written into the
        message big-endian), then block 0's ``first_tail`` or a later block's ``tail``; each
        digest is the next block's parent. libcrypto's symbols are resolved by name when the
        code is linked (so numba caches it)."""
        at_tokens = len(head)
        message = np.empty(at_tokens + width + max(len(tail), len(first_tail)), np.uint8)
        for k in range(at_tokens):
            message[k] = head[k]
        ctx = np.empty(_CTX_BYTES, np.uint8)
        digest = np.empty(32, np.uint8)
        for i in range(count):
            t = first_tail if i == 0 else tail
            base = i * width
            for k in range(width):  # each token's 8 bytes reversed: little- to big-endian
                message[at_tokens + k] = data[base + (k ^ 7)]
            end = at_tokens + width
            for k in range(len(t)):
                message[end + k] = t[k]
            _sha_init(ctx.ctypes.data)
            _sha_update(ctx.ctypes.data, message.ctypes.data, end + len(t))
            _sha_final(digest.ctypes.data, ctx.ctypes.data)
            zero = True
            for k in range(32):
                if digest[k]:
                    zero = False
                    break
            if zero:  # 0 is NO_HASH: the digest stands for 1, as parent too
                digest[31] = 1
            for k in range(32):
                message[at_parent + k] = out[32 * i + k] = digest[k]
        return count

    def _entry(library: str) -> Callable[..., Any]:
        """``_chain`` linked against ``library``, as its entry point for the types
        ``chain_digests`` passes (past numba's type dispatch)."""
        llvm.load_library_permanently(library)
        i64 = types.int64
        raw = types.Bytes(types.uint8, 1, "C", readonly=True)
        out = types.ByteArray(types.uint8, 1, "C")
        return entry(_chain, raw, i64, raw, i64, i64, raw, raw, out)


_LIBRARY = _libcrypto()
_native = _entry(_LIBRARY) if _LIBRARY is not None and numba is not None else None
NATIVE: bool = _native is not None
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
    if _native is None:
        return hashing.chain_digests(parent, pack_tokens(tokens), width, count, keys, salt)
    tail, first_tail = block_tails(keys, salt)
    head = _PREFIX + parent.to_bytes(32, "big") + hashing._known_header(KIND_TOKENS, width)
    out = bytearray(32 * count)
    _native(head, len(_PREFIX), pack_native(tokens), width, count, tail, first_tail, out)
    if count == 1:
        return [int.from_bytes(out, "big")]
    return list(map(int.from_bytes, _cut(count)(out), ("big",) * count))

__all__ = ["NATIVE", "chain_tokens"]
