"""Block tables kept as rows of one persistent int32 array, and the launches' copies of them.

Each live request owns a row; an entry is written where a block is added or replaced and
cleared (-1) where one is dropped. Beside each block id the row keeps the block's generation
when it entered the table (a held block is never recycled, so that is its generation for as
long as the entry stays). Rows and columns grow by doubling, in place for everyone else: a row
index names the same row for the request's whole life.

A launch gets its tables (``take``) as a copy of its rows that is maintained incrementally:
a copy handed to an earlier launch of as many requests and the same width (a power of two, so
that it changes only when the longest table doubles), once nothing refers to it any more (that
launch and every view of its arrays are gone), is brought up to date by copying only the
entries appended since, and whole rows only where the launch has another request at that
position or an entry was replaced or dropped (copy-on-write, truncate, a row closed and
reopened). A steady decode batch then costs O(requests + entries added) per launch, not
O(requests x context). Launches smaller than ``incremental_from`` entries get a fresh copy (a
single ``np.take``), which up to that size costs less than the bookkeeping: either way the
per-launch cost is bounded independently of the context. The copies are handed out read-only:
a kernel input nobody may write, and an incremental copy no caller can have corrupted.

The request's Python list stays the allocator's working copy; ``BlockAllocator``
``check_invariants`` compares the two (``mismatches``).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import numpy as np

_EMPTY = -1
_KEPT_COPIES = 4  # launch copies remembered for reuse (in flight, held, or free)


def launch_width(longest: int) -> int:
    """A launch's table width: the smallest power of two not below its longest table."""
    return 1 << max(longest - 1, 0).bit_length()


class _LaunchCopy:
    """Rows ``rows`` (``row_ids`` as an array) as they stood at ``version``, ``lengths`` the
    tables' lengths then. ``both`` owns its memory: every view of it refers to it."""

    __slots__ = ("both", "rows", "row_ids", "lengths", "version")

    def __init__(self, both: np.ndarray, rows: tuple[int, ...], row_ids: np.ndarray,
                 lengths: np.ndarray, version: int) -> None:
        self.both, self.rows, self.row_ids = both, rows, row_ids
        self.lengths, self.version = lengths, version

    def unreferenced(self) -> bool:
        """Nothing but this record refers to the arrays: no launch, no view, no tensor (the
        caller's ``getrefcount`` argument and ``self.both`` are the two references)."""
        return sys.getrefcount(self.both) <= 2


class TableRows:
    """Rows of block ids and their generations, -1 past each table's end."""

    __slots__ = ("_both", "blocks", "gens", "_free", "_lengths", "_rewritten", "_version",
                 "_copies", "incremental_from")

    def __init__(self, rows: int = 16, width: int = 16, incremental_from: int = 32768) -> None:
        """``incremental_from``: launches of at least that many table entries (requests x
        width) get a copy maintained incrementally; smaller ones a fresh copy, which costs
        less than the bookkeeping (a few numpy calls) up to about that size."""
        # Block ids and generations in one array, so that a launch copies both in one index.
        self._both = np.full((2, rows, width), _EMPTY, dtype=np.int32)
        self.blocks, self.gens = self._both
        self._free = list(range(rows - 1, -1, -1))
        # Per row: its table's length, and the version at which an entry below that length
        # last changed (replaced or dropped); ``_version`` counts such changes.
        self._lengths = np.zeros(rows, dtype=np.int64)
        self._rewritten = np.zeros(rows, dtype=np.int64)
        self._version = 0
        self._copies: list[_LaunchCopy] = []  # most recently used last
        self.incremental_from = incremental_from

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
        self._rewrite(row, 0)
        self._free.append(row)

    def reserve(self, width: int) -> None:
        """Rows at least ``width`` entries wide (doubling), so that a caller may append to
        ``blocks`` / ``gens`` and ``lengths`` in place (as ``put`` appends)."""
        if width > self.width:
            self._resize(self.blocks.shape[0], max(width, 2 * self.width))

    @property
    def lengths(self) -> np.ndarray:
        """Each row's table length (a caller that appends in place updates it)."""
        return self._lengths

    def put(self, row: int, start: int, blocks: Sequence[int], gens: Sequence[int]) -> None:
        """Entries ``start .. start + len(blocks) - 1`` of the row."""
        stop = start + len(blocks)
        if stop > self.width:
            self._resize(self.blocks.shape[0], max(stop, 2 * self.width))
        self.blocks[row, start:stop] = blocks
        self.gens[row, start:stop] = gens
        length = int(self._lengths[row])
        if start != length:  # not an append: entries a launch copy holds changed
            self._rewrite(row, max(length, stop))
        elif stop > length:
            self._lengths[row] = stop

    def cut(self, row: int, keep: int, length: int) -> None:
        """Drop entries ``keep .. length - 1``."""
        self._both[:, row, keep:length] = _EMPTY
        self._rewrite(row, keep)

    def _rewrite(self, row: int, length: int) -> None:
        self._version += 1
        self._rewritten[row] = self._version
        self._lengths[row] = length

    def take(self, rows: Sequence[int], longest: int) -> tuple[np.ndarray, np.ndarray]:
        """The rows' entries (block ids, generations), read-only: a launch's tables, as wide as
        the smallest power of two not below ``longest`` (at least every row's table length),
        padded with -1. Rounding the width keeps a copy in use while the tables grow."""
        key = tuple(rows)
        width = launch_width(longest)
        if len(key) * width < self.incremental_from:  # a copy costs less than its upkeep
            both = self._copy_rows(key, width)
            return both[0], both[1]
        copy = self._reusable(key, width)
        if copy is None:
            both = self._copy_rows(key, width)
            idx = np.asarray(key, dtype=np.int64)
            copy = _LaunchCopy(both, key, idx, self._lengths[idx], self._version)
            self._copies.append(copy)
            if len(self._copies) > _KEPT_COPIES:
                del self._copies[0]
        else:
            self._update(copy, key)
        return copy.both[0], copy.both[1]

    def _copy_rows(self, key: tuple[int, ...], width: int) -> np.ndarray:
        """A fresh read-only copy of the rows, ``width`` wide, owning its memory (the result of
        ``np.take`` does; that of an index may be a view of a hidden array)."""
        if width <= self.width:
            both = np.take(self._both[:, :, :width], key, axis=1)
        else:
            both = np.full((2, len(key), width), _EMPTY, dtype=np.int32)
            both[:, :, :self.width] = np.take(self._both, key, axis=1)
        both.flags.writeable = False
        return both

    def _reusable(self, key: tuple[int, ...], width: int) -> _LaunchCopy | None:
        """A remembered copy of as many rows (these first) and this width that nothing refers
        to any more (moved to the most recently used end), or None."""
        copies, found = self._copies, -1
        for i in range(len(copies) - 1, -1, -1):
            copy = copies[i]
            if (len(copy.rows) == len(key) and copy.both.shape[2] == width
                    and copy.unreferenced()):
                found = i
                if copy.rows == key:
                    break
        if found < 0:
            return None
        copies.append(copies.pop(found))
        return copies[-1]

    def _update(self, copy: _LaunchCopy, key: tuple[int, ...]) -> None:
        """Bring an unreferenced copy up to these rows: at each position the entries appended
        since, the whole row where the row differs or an entry was replaced or dropped."""
        idx = copy.row_ids if copy.rows == key else np.asarray(key, dtype=np.int64)
        lengths = self._lengths[idx]
        whole = (idx != copy.row_ids) | (self._rewritten[idx] > copy.version)
        stale = whole | (lengths != copy.lengths)
        if stale.any():
            both, src, old = copy.both, self._both, copy.lengths
            width = both.shape[2]
            w = min(width, self.width)
            at = np.flatnonzero(stale)
            rows_at, appended = at[whole[at]], at[~whole[at]]
            both.flags.writeable = True
            try:
                if len(rows_at):  # (past the rows' width every copy holds -1 only)
                    both[:, rows_at, :w] = src[:, idx[rows_at], :w]
                if len(appended):  # entries old .. length - 1 of each, in one index
                    first, count = old[appended], lengths[appended] - old[appended]
                    pos = np.repeat(appended, count)
                    col = np.repeat(first - (np.cumsum(count) - count), count) + np.arange(
                        int(count.sum()))
                    both[:, pos, col] = src[:, idx[pos], col]
            finally:
                both.flags.writeable = False
        copy.rows, copy.row_ids, copy.lengths = key, idx, lengths
        copy.version = self._version

    def mismatches(self, row: int, table: Sequence[int], gens: Sequence[int]) -> bool:
        """Whether the row differs from ``table`` (with those generations), -1 after it."""
        n = len(table)
        if n > self.width:
            return True
        return (self.blocks[row, :n].tolist() != list(table)
                or self.gens[row, :n].tolist() != list(gens)
                or bool((self.blocks[row, n:] != _EMPTY).any())
                or int(self._lengths[row]) != n)

    def _resize(self, rows: int, width: int) -> None:
        old = self._both
        self._both = np.full((2, rows, width), _EMPTY, dtype=np.int32)
        self._both[:, : old.shape[1], : old.shape[2]] = old
        self.blocks, self.gens = self._both
        if rows > len(self._lengths):
            grow = rows - len(self._lengths)
            self._lengths = np.concatenate([self._lengths, np.zeros(grow, dtype=np.int64)])
            self._rewritten = np.concatenate([self._rewritten,
                                              np.zeros(grow, dtype=np.int64)])
