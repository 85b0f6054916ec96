"""Block tables kept as rows of one persistent int32 array, for launches.

Each live request owns a row; an entry is written where a block is added or replaced and
cleared (-1) where one is dropped, so a launch copies its rows out with one vectorized index
(``take``) instead of rebuilding them from Python lists. Beside each block id the row keeps the
block's generation when it entered the table (a held block is never recycled, so that is its
generation for as long as the entry stays). Rows and columns grow by doubling, in place for
everyone else: a row index names the same row for the request's whole life.

The request's Python list stays the allocator's working copy; ``BlockAllocator``
``check_invariants`` compares the two (``mismatches``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

_EMPTY = -1


class TableRows:
    """Rows of block ids and their generations, -1 past each table's end."""

    __slots__ = ("_both", "blocks", "gens", "_free")

    def __init__(self, rows: int = 16, width: int = 16) -> None:
        # Block ids and generations in one array, so that a launch copies both in one index.
        self._both = np.full((2, rows, width), _EMPTY, dtype=np.int32)
        self.blocks, self.gens = self._both
        self._free = list(range(rows - 1, -1, -1))

    @property
    def width(self) -> int:
        return self.blocks.shape[1]

    def open(self) -> int:
        """A fresh, empty row."""
        if not self._free:
            n = self.blocks.shape[0]
            self._resize(2 * n, self.width)
            self._free = list(range(2 * n - 1, n - 1, -1))
        return self._free.pop()

    def close(self, row: int, length: int) -> None:
        """The row's request is gone: clear its ``length`` entries and reuse the row."""
        self._both[:, row, :length] = _EMPTY
        self._free.append(row)

    def put(self, row: int, start: int, blocks: Sequence[int], gens: Sequence[int]) -> None:
        """Entries ``start .. start + len(blocks) - 1`` of the row."""
        stop = start + len(blocks)
        if stop > self.width:
            self._resize(self.blocks.shape[0], max(stop, 2 * self.width))
        self.blocks[row, start:stop] = blocks
        self.gens[row, start:stop] = gens

    def cut(self, row: int, keep: int, length: int) -> None:
        """Drop entries ``keep .. length - 1``."""
        self._both[:, row, keep:length] = _EMPTY

    def take(self, rows: Sequence[int], width: int) -> tuple[np.ndarray, np.ndarray]:
        """Copies of the rows' first ``width`` entries (block ids, generations)."""
        both = self._both[:, rows, :width]
        return both[0], both[1]

    def mismatches(self, row: int, table: Sequence[int], gens: Sequence[int]) -> bool:
        """Whether the row differs from ``table`` (with those generations), -1 after it."""
        n = len(table)
        if n > self.width:
            return True
        return (self.blocks[row, :n].tolist() != list(table)
                or self.gens[row, :n].tolist() != list(gens)
                or bool((self.blocks[row, n:] != _EMPTY).any()))

    def _resize(self, rows: int, width: int) -> None:
        old = self._both
        self._both = np.full((2, rows, width), _EMPTY, dtype=np.int32)
        self._both[:, : old.shape[1], : old.shape[2]] = old
        self.blocks, self.gens = self._both
