"""The states of a physical block, and the names used for them everywhere."""

from __future__ import annotations

from enum import IntEnum


class BlockState(IntEnum):
    FREE = 0  # in the free list; no owner, no content, no pending accesses
    ALLOCATED = 1  # taken for one request, record initialized, not yet handed to a kernel
    PUBLISHED = 2  # in a table handed to kernels; they may write its slots
    REFERENCED = 3  # full, written, committed, in the prefix cache; may be shared
    CACHED = 4  # "zero-ref cached": a REFERENCED block with no holder left, evictable (LRU)
    RECLAIMED = 5  # content invalidated; FREE once every launch that may have seen it completed


FREE, ALLOCATED, PUBLISHED, REFERENCED, CACHED, RECLAIMED = (int(s) for s in BlockState)
ALL_STATES = tuple(int(s) for s in BlockState)
NO_HASH = 0  # hashes are non-zero integers; 0 means "no hash"
NO_BLOCK = -1  # the hash map's "no block" value; also a padding table entry
ISSUED = 0  # clock[ISSUED]: launches published so far, the next launch's number
WATERMARK = 1  # clock[WATERMARK]: every launch numbered below it has completed


def state_name(value: int) -> str:
    try:
        return BlockState(value).name
    except ValueError:
        return f"<invalid state {value}>"
