"""Launch: the arrays handed to kernels for one forward step, and the blocks it pins."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from .errors import AllocatorError, EventError, StaleTableError


class Event(Protocol):
    """Anything with ``query() -> bool`` that turns True when the launch's kernels are done."""

    def query(self) -> bool: ...


class LaunchAlreadyCompleted(AllocatorError):
    """``complete()`` on a launch that already completed: it was completed once."""


@dataclass(eq=False, repr=False)
class Launch:
    """One step's block tables, sequence lengths and slot mapping, pinned until completion.

    ``seq`` is the spec's launch number ``L``: launches are numbered in publish order, per
    allocator, from 0 (``seq`` is ``pool.clock[ISSUED]`` when it is published). Every block
    its tables name stays unreusable until every launch numbered up to ``seq`` completed (the
    watermark passes it). ``writes`` are the blocks it writes (spec: begin_write each,
    end_write at completion), one entry per written block, copy-on-write destinations
    included.

    Concurrency: ``complete()`` (and ``reclaim()``'s polling of recorded events) may be called
    from any thread; the allocator serializes them with its own lock, so a launch completes
    exactly once however the calls race.

    ``block_tables`` int32 [n, width] padded with -1, ``width`` the smallest power of two not
    below the longest table (read-only, as every array here that comes from the allocator's
    persistent rows: the allocator updates a launch's copy in place for a later launch once
    nothing refers to it any more); ``seq_lens`` int32 [n];
    ``query_lens`` int32 [n] (positions this launch writes, the last ones of each sequence);
    ``slot_mapping`` int64 [sum(query_lens)] (``block * B + offset`` of each written position);
    ``table_generations`` int32 like ``block_tables`` (-1 in padding); ``copies`` int32 [k, 2]
    (src, dst) copy-on-write block copies to perform before the kernels run.
    """

    rids: tuple[Hashable, ...]
    block_tables: np.ndarray
    seq_lens: np.ndarray
    query_lens: np.ndarray
    slot_mapping: np.ndarray
    table_generations: np.ndarray
    copies: np.ndarray
    writes: Sequence[int] = field(repr=False)
    _on_complete: Callable[[Launch, bool], None] = field(repr=False)
    _generation_of: Callable[[], Sequence[int]] = field(repr=False)
    seq: int = 0
    block_size: int = 0
    event: Any = None
    completed: bool = False

    def __repr__(self) -> str:
        status = "completed" if self.completed else "in flight"
        return f"<Launch #{self.seq} of {list(self.rids)!r}, {status}>"

    def record(self, event: Event) -> None:
        """Complete this launch automatically (at ``reclaim()``) once ``event.query()`` is True."""
        if not callable(getattr(event, "query", None)):
            raise TypeError("event must have a query() -> bool method (e.g. torch.cuda.Event)")
        self.event = event

    def event_done(self) -> bool:
        """Whether the launch completed or its recorded event says the kernels are done.
        Changes nothing; an event whose ``query()`` raises is an ``EventError``."""
        if self.completed:
            return True
        if self.event is None:
            return False
        try:
            return bool(self.event.query())
        except Exception as exc:
            raise EventError(self, f"{type(exc).__name__}: {exc}") from exc

    def poll(self) -> bool:
        """Complete the launch if its recorded event says the kernels are done."""
        if self.event_done():
            self._on_complete(self, False)
        return self.completed

    def complete(self) -> None:
        """The kernels that used these tables are done (spec: end_write per written block,
        complete, then advance the watermark as far as it goes). ``LaunchAlreadyCompleted`` if
        it already completed."""
        self._on_complete(self, True)

    def to_flashinfer(self) -> Any:
        """This launch in FlashInfer's paged layout (``kv_indptr``, ``kv_indices``,
        ``kv_last_page_len``, ``qo_indptr``, ``positions``); see ``allocator/interop.py``."""
        from .interop import to_flashinfer

        return to_flashinfer(self.block_tables, self.seq_lens, self.query_lens, self.block_size)

    def check_current(self) -> None:
        """Raise StaleTableError if any table entry's block has been reclaimed since publish."""
        current = np.asarray(self._generation_of(), dtype=np.int64)
        used = self.block_tables >= 0
        blocks = self.block_tables[used]
        stale = current[blocks] != self.table_generations[used]
        if stale.any():
            bad = sorted(set(blocks[stale].tolist()))
            raise StaleTableError(
                f"block table entries {bad[:8]} were reclaimed after this launch was published"
            )
