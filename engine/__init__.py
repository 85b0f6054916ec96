"""pagedkv.engine — the engine-facing front door (a KVCacheManager-shaped API).

``KVCacheManager`` has vLLM 0.33.0's KVCacheManager calls over one pagedkv ``BlockAllocator``,
plus the launch (``publish`` / ``complete``) that makes prefix hits safe; see
``pagedkv.engine.manager`` for every deliberate difference from vLLM.
"""

from .events import (
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    CachedHashSet,
    KVCacheEvent,
)
from .manager import KVCacheBlocks, KVCacheManager, PrefixCacheStats, TransferInFlight
from .request import EngineRequest, RequestStatus

__all__ = [
    "MEDIUM_GPU", "AllBlocksCleared", "BlockRemoved", "BlockStored", "CachedHashSet",
    "EngineRequest", "KVCacheBlocks", "KVCacheEvent", "KVCacheManager", "PrefixCacheStats",
    "RequestStatus", "TransferInFlight",
]
