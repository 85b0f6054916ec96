"""Launch: the arrays handed to kernels for one forward step, and the pins they hold."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from .errors import AllocatorError, StaleTableError


class Event(Protocol):
    """Anything with ``query() -> bool`` that turns True when the launch's kernels are done."""

    def query(self) -> bool: ...


class LaunchAlreadyCompleted(AllocatorError):
    """``complete()`` on a launch that already completed: its pins were released once."""


@dataclass(eq=False)
class Launch:
    """One step's block tables, sequence lengths and slot mapping, pinned until completion.

    ``block_tables`` int32 [n, max_blocks] padded with -1; ``seq_lens`` int32 [n];
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
    accesses: Sequence[tuple[int, bool]] = field(repr=False)
    _on_complete: Callable[[Launch], None] = field(repr=False)
    _generation_of: Callable[[], Sequence[int]] = field(repr=False)
    event: Any = field(default=None, repr=False)
    completed: bool = False

    def record(self, event: Event) -> None:
        """Complete this launch automatically (at ``reclaim()``) once ``event.query()`` is True."""
        if not callable(getattr(event, "query", None)):
            raise TypeError("event must have a query() -> bool method (e.g. torch.cuda.Event)")
        self.event = event

    def poll(self) -> bool:
        """Complete the launch if its recorded event says the kernels are done."""
        if not self.completed and self.event is not None and self.event.query():
            self.complete()
        return self.completed

    def complete(self) -> None:
        """The kernels that used these tables are done: unpin (spec: end_access per block)."""
        if self.completed:
            raise LaunchAlreadyCompleted("launch already completed")
        self._on_complete(self)

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
