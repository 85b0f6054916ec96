"""Block-table arithmetic: the pure core that maps token positions to (block, offset)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .errors import InvalidArgument


class PositionOutOfRange(InvalidArgument, IndexError):
    """A token position past what the block table covers."""


def check_int(value: object, name: str) -> int:
    """Any integral value but a bool (a Python or NumPy integer), as a Python int."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | np.integer):
        raise InvalidArgument(f"{name} must be an integer, got {type(value).__name__}")
    return int(value)


MAX_COUNT = 2**63 - 1  # counts and positions are int64 on the device side


def check_count(value: object, name: str, maximum: int = MAX_COUNT) -> int:
    """An integer in [0, maximum] (Python or NumPy, bool excluded) as a Python int, or
    InvalidArgument."""
    if type(value) is int and 0 <= value <= maximum:  # the common case: nothing to convert
        return value
    value = check_int(value, name)
    if value < 0:
        raise InvalidArgument(f"{name} must be >= 0, got {value}")
    if value > maximum:
        raise InvalidArgument(f"{name} must be <= {maximum}, got {value}")
    return value


def check_block_size(block_size: object) -> int:
    block_size = check_count(block_size, "block_size")
    if block_size == 0:
        raise InvalidArgument("block_size must be >= 1")
    return block_size


def blocks_needed(num_tokens: int, block_size: int) -> int:
    """Blocks a table needs to cover ``num_tokens`` positions: ceil(num_tokens / block_size).

    pre: 0 <= num_tokens < 2**63 and 1 <= block_size < 2**63
    post: __return__ * block_size >= num_tokens
    post: (__return__ - 1) * block_size < num_tokens or __return__ == 0
    """
    num_tokens = check_count(num_tokens, "num_tokens")
    block_size = check_block_size(block_size)
    return -(-num_tokens // block_size)


def resolve(block_table: Sequence[int], block_size: int, position: int) -> tuple[int, int]:
    """(physical block id, offset in block) of logical token ``position``.

    pre: 1 <= block_size < 2**63 and 0 <= position < len(block_table) * block_size
    pre: position < 2**63
    post: __return__[0] == block_table[position // block_size]
    post: 0 <= __return__[1] < block_size
    post: (position // block_size) * block_size + __return__[1] == position
    """
    block_size = check_block_size(block_size)
    position = check_count(position, "position")
    index = position // block_size
    if index >= len(block_table):
        raise PositionOutOfRange(
            f"position {position} needs table entry {index}; the table has {len(block_table)}"
            f" (covers {len(block_table) * block_size} positions)"
        )
    return block_table[index], position - index * block_size


def slot(block_id: int, block_size: int, offset: int) -> int:
    """Flat slot index of (block, offset) in a pool of block_size-slot blocks.

    pre: block_id >= 0 and block_size >= 1 and 0 <= offset < block_size
    post: __return__ // block_size == block_id
    post: __return__ % block_size == offset
    """
    return block_id * block_size + offset


def slot_mapping(
    block_table: Sequence[int], block_size: int, start: int, stop: int
) -> list[int]:
    """Slots of positions [start, stop), which the table must cover.

    pre: block_size >= 1 and 0 <= start <= stop <= len(block_table) * block_size
    post: len(__return__) == stop - start
    """
    if not 0 <= start <= stop <= len(block_table) * block_size:
        raise PositionOutOfRange(
            f"positions [{start}, {stop}) are not covered by a {len(block_table)}-entry table"
        )
    return [block_table[p // block_size] * block_size + p % block_size for p in range(start, stop)]


def writes_per_block(block_size: int, start: int, stop: int) -> dict[int, int]:
    """How many of positions [start, stop) fall in each table index.

    pre: block_size >= 1 and 0 <= start <= stop
    post: sum(__return__.values()) == stop - start
    post: all(0 < n <= block_size for n in __return__.values())
    """
    out: dict[int, int] = {}
    p = start
    while p < stop:
        index = p // block_size
        end = min(stop, (index + 1) * block_size)
        out[index] = end - p
        p = end
    return out
