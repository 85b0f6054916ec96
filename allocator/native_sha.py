"""The native loop of ``native_hash``: a chain of block digests through libcrypto's SHA-256.

Imported on ``native_hash``'s first use (numba's import and the loop's cache load are paid by
a process that hashes, not by every import of the allocator). ``LOOPS`` are the entry points
of ``_chain`` (a chain's blocks), ``_blocks`` (one block each of several chains) and
``_append`` (a step's sampled tokens, each row's block hashed where one ends), or None where
libcrypto lacks the low-level calls.
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
def _put_block(message, at_tokens, data, base, width, tail):
    """A block's tokens (``data[base:base + width]``: little-endian int64s, written into the
    message big-endian) and then ``tail``, into ``message`` from ``at_tokens``: the message's
    length."""
    for k in range(width):  # each token's 8 bytes reversed: little- to big-endian
        message[at_tokens + k] = data[base + (k ^ 7)]
    end = at_tokens + width
    for k in range(len(tail)):
        message[end + k] = tail[k]
    return end + len(tail)


@numba.njit(cache=True)
def _digest(message, end, ctx, digest):
    """The sha256 of ``message[:end]`` into ``digest`` (0 is NO_HASH: a zero digest stands
    for 1)."""
    _sha_init(ctx.ctypes.data)
    _sha_update(ctx.ctypes.data, message.ctypes.data, end)
    _sha_final(digest.ctypes.data, ctx.ctypes.data)
    for k in range(32):
        if digest[k]:
            return
    digest[31] = 1


@numba.njit(cache=True)
def _chain(head, at_parent, data, width, count, tail, first_tail, out):
    """Digest ``count`` blocks into ``out`` (32 bytes each). A block's message is ``head``
    (the fixed prefix, its parent's 32 bytes at ``at_parent``, the tokens' header), its
    tokens (``data``, ``width`` bytes a block), then block 0's ``first_tail`` or a later
    block's ``tail``; each digest is the next block's parent. libcrypto's symbols are
    resolved by name when the code is linked (so numba caches it)."""
    at_tokens = len(head)
    message = np.empty(at_tokens + width + max(len(tail), len(first_tail)), np.uint8)
    for k in range(at_tokens):
        message[k] = head[k]
    ctx = np.empty(_CTX_BYTES, np.uint8)
    digest = np.empty(32, np.uint8)
    for i in range(count):
        end = _put_block(message, at_tokens, data, i * width, width,
                         first_tail if i == 0 else tail)
        _digest(message, end, ctx, digest)
        for k in range(32):
            message[at_parent + k] = out[32 * i + k] = digest[k]
    return count


@numba.njit(cache=True)
def _blocks(head, at_parent, parents, data, width, count, tail, out):
    """Digest ``count`` blocks of different chains into ``out`` (32 bytes each): ``_chain``'s
    message for block ``i`` with its own parent (``parents[32 * i:32 * i + 32]``) and
    ``tail``, none of them a chain's first block."""
    at_tokens = len(head)
    message = np.empty(at_tokens + width + len(tail), np.uint8)
    for k in range(at_tokens):
        message[k] = head[k]
    ctx = np.empty(_CTX_BYTES, np.uint8)
    digest = np.empty(32, np.uint8)
    for i in range(count):
        for k in range(32):
            message[at_parent + k] = parents[32 * i + k]
        end = _put_block(message, at_tokens, data, i * width, width, tail)
        _digest(message, end, ctx, digest)
        for k in range(32):
            out[32 * i + k] = digest[k]
    return count


@numba.njit(cache=True)
def _append(head, at_parent, tail, known, rows, n, tokens, opened, parents, chained, out,
            filled, hashed, digests, stored):
    """One token id more for each row ``rows[i]`` (``tokens[i]``), in the rows' open blocks:
    ``opened[r]`` holds the big-endian bytes of the tokens of row ``r``'s block in progress
    (positions ``known[r] // bs * bs ..``, ``bs = opened.shape[1] // 8``), ``known[r]``
    counts them all. A token that ends a block lists its index in ``filled`` and, where the
    row's chain is open (``chained[r]``: its digests cover every block before this one, the
    last in ``parents[r]``, with ``tail`` after each block's tokens), hashes the block as
    ``_blocks`` would, into ``out`` (32 bytes each, in ``filled``'s order; ``hashed[j]`` 1)
    and ``parents[r]`` and, where row ``r`` of ``digests`` (the rows' digests, 32 bytes an
    entry; ``stored[r]`` of them) has room for it, there as its entry ``known[r] // bs - 1``
    (``hashed[j]`` 2 where it has not); else ``hashed[j]`` is 0 (the caller hashes it).
    Returns how many blocks ended."""
    width = opened.shape[1]
    bs = width // 8
    room = digests.shape[1] // 32
    at_tokens = len(head)
    message = np.empty(at_tokens + width + len(tail), np.uint8)
    for k in range(at_tokens):
        message[k] = head[k]
    end = at_tokens + width
    for k in range(len(tail)):
        message[end + k] = tail[k]
    ctx = np.empty(_CTX_BYTES, np.uint8)
    digest = np.empty(32, np.uint8)
    nf = 0
    for i in range(n):
        r = rows[i]
        p = known[r]
        t = tokens[i]
        at = 8 * (p % bs)
        for k in range(8):
            opened[r, at + k] = (t >> (56 - 8 * k)) & 0xFF
        known[r] = p + 1
        if (p + 1) % bs:
            continue
        filled[nf] = i
        hashed[nf] = 0
        if chained[r]:
            for k in range(32):
                message[at_parent + k] = parents[r, k]
            for k in range(width):
                message[at_tokens + k] = opened[r, k]
            _digest(message, end + len(tail), ctx, digest)
            for k in range(32):
                parents[r, k] = out[32 * nf + k] = digest[k]
            e = (p + 1) // bs - 1
            if e < room:
                for k in range(32):
                    digests[r, 32 * e + k] = digest[k]
                stored[r] = e + 1
                hashed[nf] = 1
            else:
                hashed[nf] = 2
        nf += 1
    return nf


def _entries(library: str) -> tuple[Callable[..., Any], ...]:
    """``_chain``, ``_blocks`` and ``_append`` linked against ``library``, as their entry
    points for the types ``native_hash`` passes (past numba's type dispatch)."""
    llvm.load_library_permanently(library)
    i64 = types.int64
    raw = types.Bytes(types.uint8, 1, "C", readonly=True)
    out = types.ByteArray(types.uint8, 1, "C")
    vec = types.Array(types.int64, 1, "C")
    u8_mat = types.Array(types.uint8, 2, "C")
    u8_vec = types.Array(types.uint8, 1, "C")
    return (entry(_chain, raw, i64, raw, i64, i64, raw, raw, out),
            entry(_blocks, raw, i64, raw, raw, i64, i64, raw, out),
            entry(_append, raw, i64, raw, vec, types.Array(types.int64, 1, "A"), i64,
                  types.Array(types.int64, 1, "C", readonly=True), u8_mat, u8_mat, u8_vec,
                  out, vec, vec, u8_mat, vec))


_LIBRARY = _libcrypto()
LOOPS: tuple[Callable[..., Any], ...] | None = (
    _entries(_LIBRARY) if _LIBRARY is not None else None)
