"""Adapters for pagedkv's own allocators: ``BlockAllocator`` and the engine front door.

- ``BlockAllocatorAdapter``: ``pagedkv.allocator.BlockAllocator`` with every capability,
  including the spec view (``abstract()`` and the pool's transition trace), so the machine
  runs the full refinement check on top of the observable one.
- ``EngineAdapter``: ``pagedkv.engine.KVCacheManager`` through its vLLM-shaped calls
  (``get_computed_blocks`` + ``allocate_slots`` at admission, ``publish`` / ``complete``,
  ``free``), checked at the level of observable behaviour; ``spec_view=True`` adds the spec
  view of the allocator underneath. No fork (the manager has none); it caches full blocks when
  their launch completes, so ``commit`` does nothing.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

from pagedkv.allocator import BlockAllocator, Launch
from pagedkv.engine import EngineRequest, KVCacheManager, RequestStatus
from pagedkv.spec import PoolState, RequestState

from .adapter import AdapterFactory, Capabilities


class _PoolTrace:
    """The spec view of a BlockAllocator: abstract() and its pool's transition trace."""

    _traced: BlockAllocator

    def abstract(self) -> tuple[PoolState, RequestState]:
        a = self._traced.abstract()
        return a.pool, a.requests

    def transitions(self) -> list[tuple[str, dict[str, Any]]]:
        trace = self._traced.pool.trace
        if trace is None:
            return []
        out = list(trace)
        trace.clear()
        return out


class BlockAllocatorAdapter(_PoolTrace):
    """``pagedkv.allocator.BlockAllocator`` behind the adapter protocol (every capability)."""

    def __init__(self, alloc: BlockAllocator, *, spec_view: bool = True) -> None:
        self.alloc = alloc
        self._traced = alloc
        self.num_blocks = alloc.num_blocks
        self.block_size = alloc.block_size
        self.capabilities = Capabilities(
            launches=True, prefix_caching=alloc.prefix_caching, fork=True, spec_view=spec_view
        )
        if spec_view:
            alloc.pool.trace = []

    @classmethod
    def factory(
        cls,
        *,
        prefix_caching: bool = True,
        checked: bool = True,
        spec_view: bool = True,
        allocator_class: type[BlockAllocator] = BlockAllocator,
    ) -> AdapterFactory:
        """``factory(num_blocks, block_size)`` for the machine; ``allocator_class`` may be a
        subclass (a variant under test)."""

        def make(num_blocks: int, block_size: int) -> BlockAllocatorAdapter:
            alloc = allocator_class(num_blocks, block_size, prefix_caching=prefix_caching,
                                    checked=checked)
            return cls(alloc, spec_view=spec_view)

        make.__name__ = f"{allocator_class.__name__}Adapter"
        return make

    def add_request(self, rid: Hashable, tokens: Sequence[int], salt: str | None) -> int:
        return self.alloc.add_request(rid, tokens, cache_salt=salt)

    def allocate(self, rid: Hashable, num_tokens: int) -> list[int]:
        return self.alloc.allocate(rid, num_tokens)

    def append_tokens(self, rid: Hashable, tokens: Sequence[int]) -> None:
        self.alloc.append_tokens(rid, tokens)

    def launch(self, rids: Sequence[Hashable]) -> Launch:
        return self.alloc.publish(rids)

    def complete(self, handle: Launch) -> None:
        handle.complete()

    def commit(self, rid: Hashable, num_tokens: int) -> None:
        self.alloc.commit(rid, num_tokens)

    def fork(self, parent: Hashable, child: Hashable) -> list[int]:
        return self.alloc.fork(parent, child)

    def free(self, rid: Hashable) -> None:
        self.alloc.free(rid)

    def block_table(self, rid: Hashable) -> list[int]:
        return self.alloc.block_table(rid)

    def num_free_blocks(self) -> int:
        return self.num_blocks - self.alloc.stats()["held"]

    def num_cached_blocks(self) -> int:
        return self.alloc.stats()["cached"]


class EngineAdapter(_PoolTrace):
    """``pagedkv.engine.KVCacheManager`` behind the adapter protocol, driven the way a
    scheduler drives it: admission is ``get_computed_blocks`` then ``allocate_slots`` with the
    hit; a launch sets each request's ``num_computed_tokens`` to what it covers."""

    def __init__(self, manager: KVCacheManager, *, spec_view: bool = False) -> None:
        self.manager = manager
        self._traced = manager.allocator
        self.num_blocks = manager.num_usable_blocks
        self.block_size = manager.block_size
        self.capabilities = Capabilities(
            launches=True, prefix_caching=manager.enable_caching, fork=False,
            spec_view=spec_view, exact_capacity=manager.watermark_blocks == 0,
        )
        if spec_view:
            if manager.enable_kv_cache_events:
                raise ValueError("spec_view needs enable_kv_cache_events=False (the events "
                                 "read the same transition trace)")
            manager.allocator.pool.trace = []
        self._live: dict[Hashable, EngineRequest] = {}
        self._admitting: dict[Hashable, tuple[EngineRequest, Any, int]] = {}

    @classmethod
    def factory(
        cls,
        *,
        enable_caching: bool = True,
        checked: bool = True,
        null_block: bool = True,
        spec_view: bool = False,
    ) -> AdapterFactory:
        """``factory(num_blocks, block_size)``: a manager with ``num_blocks`` usable blocks
        (plus the null block)."""

        def make(num_blocks: int, block_size: int) -> EngineAdapter:
            manager = KVCacheManager(num_blocks + null_block, block_size, enable_caching,
                                     checked, null_block=null_block)
            return cls(manager, spec_view=spec_view)

        make.__name__ = "KVCacheManagerAdapter"
        return make

    def add_request(self, rid: Hashable, tokens: Sequence[int], salt: str | None) -> int:
        req = EngineRequest(rid, tokens, cache_salt=salt)
        blocks, hits, _ = self.manager.get_computed_blocks(req)  # refuses a live id
        if rid in self._admitting:
            raise ValueError(f"request {rid!r} is being admitted already")
        self._admitting[rid] = (req, blocks, hits)
        return hits

    def allocate(self, rid: Hashable, num_tokens: int) -> list[int] | None:
        m = self.manager
        if rid in self._admitting:
            req, blocks, hits = self._admitting[rid]
            if m.allocate_slots(req, num_tokens - hits, hits, blocks) is None:
                return None
            del self._admitting[rid]
            req.status = RequestStatus.RUNNING
            req.num_computed_tokens = hits
            self._live[rid] = req
        else:
            req = self._live[rid]
            if m.allocate_slots(req, num_tokens - req.num_computed_tokens) is None:
                return None
        return m.get_block_ids(rid)[0]

    def append_tokens(self, rid: Hashable, tokens: Sequence[int]) -> None:
        req = self._live[rid]
        for t in tokens:
            self.manager.append_token(req, t)

    def launch(self, rids: Sequence[Hashable]) -> Launch:
        reqs = [self._live[r] for r in rids]
        launch = self.manager.publish(reqs)
        for r in reqs:
            r.num_computed_tokens = self.manager.allocator.num_reserved(r.request_id)
        return launch

    def complete(self, handle: Launch) -> None:
        self.manager.complete(handle)

    def commit(self, rid: Hashable, num_tokens: int) -> None:
        """Nothing to do: the manager caches full blocks when their launch completes."""

    def fork(self, parent: Hashable, child: Hashable) -> None:
        raise NotImplementedError("KVCacheManager has no fork")

    def free(self, rid: Hashable) -> None:
        if self._admitting.pop(rid, None) is not None:
            return  # looked up, never allocated: the manager holds nothing for it
        req = self._live.pop(rid, None)
        # An id the manager does not know is ignored, as in vLLM.
        self.manager.free(req if req is not None else EngineRequest(rid, [0]))

    def block_table(self, rid: Hashable) -> list[int]:
        return self.manager.get_block_ids(rid)[0]

    def num_free_blocks(self) -> int:
        return self.manager.get_num_free_blocks()

    def num_cached_blocks(self) -> int:
        return self.manager.stats()["cached"]


__all__ = ["BlockAllocatorAdapter", "EngineAdapter"]
