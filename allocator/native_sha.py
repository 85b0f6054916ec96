"""The native loop of ``native_hash``: a chain of block digests through libcrypto's SHA-256.

Imported on ``native_hash``'s first use (numba's import and the loop's cache load are paid by
a process that hashes, not by every import of the allocator). ``LOOP`` is the loop's entry
point, or None where libcrypto lacks the low-level calls.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable
from typing import Any

import llvmlite.binding as llvm
import numba
import numpy as np
from numba import types

from .native_entry import entry

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
    ``native_hash.chain_tokens`` passes (past numba's type dispatch)."""
    llvm.load_library_permanently(library)
    i64 = types.int64
    raw = types.Bytes(types.uint8, 1, "C", readonly=True)
    out = types.ByteArray(types.uint8, 1, "C")
    return entry(_chain, raw, i64, raw, i64, i64, raw, raw, out)


_LIBRARY = _libcrypto()
LOOP: Callable[..., Any] | None = _entry(_LIBRARY) if _LIBRARY is not None else None
