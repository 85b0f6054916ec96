"""The adapter protocol: what the reusable state machine needs from an allocator.

The vocabulary is that of a paged KV cache, not pagedkv's: requests (ids), token ids, a block
table per request (block ids, entry ``i`` covering positions ``[i*B, (i+1)*B)``), launches
(one forward step's kernels, which read every block of the tables they were given until they
complete), commits (positions whose KV is written may enter a prefix cache) and forks.

An adapter is any object with the attributes and methods of ``AllocatorAdapter``;
``BaseAdapter`` gives the optional ones a default. Refusal: ``allocate``, ``fork`` and
``launch`` refuse by returning ``None`` or by raising an exception (not an ``AssertionError``:
those are failures). A refused call must change nothing observable.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from pagedkv.spec import PoolState, RequestState


@dataclass(frozen=True)
class Capabilities:
    """What an allocator can do; the machine skips the rules of what it cannot.

    - ``launches``: ``launch`` / ``complete`` exist, and blocks a launch reads stay pinned
      until it completes. Without them the machine treats allocated positions as written at
      once (``serve`` commits them) and never pins.
    - ``prefix_caching``: ``add_request`` may report cached prefix tokens, and committed full
      blocks may be reused by later requests of the same salt and tokens.
    - ``fork``: ``fork(parent, child)`` exists (parallel sampling: the child shares blocks).
    - ``spec_view``: the adapter also implements ``SpecView`` (``abstract()`` and
      ``transitions()``): it maps itself to pagedkv's spec state, and the machine adds the
      full refinement check (transition replay, the spec's invariants, launch pins).
    - ``exact_capacity``: an allocation, fork or launch is refused only when too few blocks
      are in no live table and pinned by no in-flight launch. Set it to False for an
      allocator that keeps headroom (a watermark) or refuses for reasons of its own: refusals
      are then only checked to change nothing.
    """

    launches: bool = True
    prefix_caching: bool = False
    fork: bool = False
    spec_view: bool = False
    exact_capacity: bool = True


@runtime_checkable
class AllocatorAdapter(Protocol):
    """The calls the machine makes. ``num_blocks`` is the number of blocks requests can be
    given (the capacity: a reserved null block does not count); ``block_size`` is B."""

    capabilities: Capabilities
    num_blocks: int
    block_size: int

    def add_request(self, rid: Hashable, tokens: Sequence[int], salt: str | None) -> int:
        """Register a request with its prompt; return the prompt tokens its first ``allocate``
        takes from the prefix cache (whole blocks, fewer than ``len(tokens)``; 0 without
        prefix caching). The machine calls ``allocate`` right after (admission). Must raise
        for an id that is live."""
        ...

    def allocate(self, rid: Hashable, num_tokens: int) -> Sequence[int] | None:
        """Grow the request's table to cover ``num_tokens`` positions (the machine only grows
        it, and never past the token ids it knows); return the whole table, or ``None`` (or
        raise) to refuse, changing nothing. The first call takes the prefix hits."""
        ...

    def append_tokens(self, rid: Hashable, tokens: Sequence[int]) -> None:
        """Token ids sampled for the request (they fill the positions allocated next)."""
        ...

    def launch(self, rids: Sequence[Hashable]) -> Any:
        """Hand the requests' tables to one step's kernels: they write each request's positions
        allocated since its last launch and read every block of its table. Return a handle for
        ``complete``; ``None`` or an exception refuses (only when a copy-on-write copy of a
        shared block does not fit)."""
        ...

    def complete(self, handle: Any) -> None:
        """The launch's kernels are done: its blocks are no longer pinned."""
        ...

    def commit(self, rid: Hashable, num_tokens: int) -> None:
        """Positions below ``num_tokens`` are written by completed launches: their full blocks
        may enter the prefix cache. (An allocator that caches at completion does nothing.)"""
        ...

    def fork(self, parent: Hashable, child: Hashable) -> Sequence[int] | None:
        """A new request ``child`` with the parent's tokens and KV (capability ``fork``):
        return its table, or ``None`` (or raise) to refuse."""
        ...

    def free(self, rid: Hashable) -> None:
        """The request is done (or preempted): its blocks are no longer its own. Blocks an
        in-flight launch still reads must not be handed out until it completes. Freeing an id
        that is not live must raise or do nothing."""
        ...

    def block_table(self, rid: Hashable) -> Sequence[int]:
        """The live request's current table."""
        ...

    def num_free_blocks(self) -> int:
        """Blocks no live request's table holds (free, cached, or waiting for a launch)."""
        ...

    def num_cached_blocks(self) -> int:
        """Blocks no live table holds that keep reusable prefix KV (0 without caching)."""
        ...


@runtime_checkable
class SpecView(Protocol):
    """Optional: an allocator that maps itself to pagedkv's spec state (capability
    ``spec_view``). ``abstract()`` is its state as a ``pagedkv.spec.PoolState`` plus the
    request layer's ``pagedkv.spec.RequestState`` (its requests' tables and positions);
    ``transitions()`` returns, and forgets, the spec
    transitions (``(name, params)``, as in ``pagedkv.spec.TRANSITIONS``) it performed since
    the last call."""

    def abstract(self) -> tuple[PoolState, RequestState]: ...

    def transitions(self) -> list[tuple[str, dict[str, Any]]]: ...


class BaseAdapter:
    """Defaults for the optional parts of ``AllocatorAdapter``: no launches, no prefix
    caching, no fork. Subclass it and override what your allocator has."""

    capabilities: Capabilities = Capabilities(launches=False)
    num_blocks: int
    block_size: int

    def append_tokens(self, rid: Hashable, tokens: Sequence[int]) -> None:
        return None

    def launch(self, rids: Sequence[Hashable]) -> Any:
        raise NotImplementedError("this allocator has no launches")

    def complete(self, handle: Any) -> None:
        raise NotImplementedError("this allocator has no launches")

    def commit(self, rid: Hashable, num_tokens: int) -> None:
        return None

    def fork(self, parent: Hashable, child: Hashable) -> Sequence[int] | None:
        raise NotImplementedError("this allocator cannot fork")

    def num_cached_blocks(self) -> int:
        return 0


AdapterFactory = Callable[[int, int], AllocatorAdapter]
"""``factory(num_blocks, block_size)``: a fresh allocator (behind its adapter) for one run."""


__all__ = ["AdapterFactory", "AllocatorAdapter", "BaseAdapter", "Capabilities", "SpecView"]
