"""KV-cache events, shaped like vLLM 0.33.0's ``vllm.distributed.kv_events`` records.

``BlockStored``: blocks entered the prefix cache (in pagedkv: their writing launch completed
and they were committed); ``BlockRemoved``: a cached block was evicted; ``AllBlocksCleared``:
``reset_prefix_cache()`` dropped every cached hash. ``CachedHashSet`` replays a stream of them:
after replaying every event taken so far it holds exactly the hashes the cache holds.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

MEDIUM_GPU = "GPU"


@dataclass(frozen=True)
class KVCacheEvent:
    """Base class of the KV-cache events."""


@dataclass(frozen=True)
class BlockStored(KVCacheEvent):
    """Consecutive full blocks of one request entered the prefix cache.

    ``block_hashes[k]`` is the chain hash of the block holding
    ``token_ids[k * block_size : (k + 1) * block_size]``; ``parent_block_hash`` is the hash of
    the block before the first (None for a request's first block). ``extra_keys[k]`` lists the
    keys block k's hash covers besides its tokens (the cache salt on a request's first block,
    the LoRA name and the request's extra keys)."""

    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str = MEDIUM_GPU
    lora_name: str | None = None
    extra_keys: list[tuple[Any, ...]] | None = None
    group_idx: int = 0
    block_ids: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class BlockRemoved(KVCacheEvent):
    """Cached blocks were evicted: their hashes no longer hit."""

    block_hashes: list[int]
    medium: str = MEDIUM_GPU
    group_idx: int = 0


@dataclass(frozen=True)
class AllBlocksCleared(KVCacheEvent):
    """Every cached hash was dropped (``reset_prefix_cache``)."""


class CachedHashSet:
    """A consumer of KV events: the set of block hashes currently cached."""

    def __init__(self) -> None:
        self.hashes: set[int] = set()

    def apply(self, events: Iterable[KVCacheEvent]) -> CachedHashSet:
        for ev in events:
            if isinstance(ev, BlockStored):
                for h in ev.block_hashes:
                    if h in self.hashes:
                        raise ValueError(f"BlockStored for hash {h:#x} already stored")
                    self.hashes.add(h)
            elif isinstance(ev, BlockRemoved):
                for h in ev.block_hashes:
                    if h not in self.hashes:
                        raise ValueError(f"BlockRemoved for hash {h:#x} never stored")
                    self.hashes.remove(h)
            elif isinstance(ev, AllBlocksCleared):
                self.hashes.clear()
            else:
                raise TypeError(f"not a KV cache event: {ev!r}")
        return self


__all__ = [
    "MEDIUM_GPU", "AllBlocksCleared", "BlockRemoved", "BlockStored", "CachedHashSet",
    "KVCacheEvent",
]
