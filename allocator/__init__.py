"""pagedkv.allocator — the runtime allocator; its guards are the spec's functions."""

from .allocator import Abstraction, BlockAllocator
from .errors import (
    AllocatorError,
    CommitError,
    DoubleFree,
    DuplicateRequest,
    GuardViolation,
    InvalidArgument,
    InvariantViolation,
    OutOfBlocks,
    PendingAccess,
    PublishError,
    StaleTableError,
    TokensUnknown,
    UnknownRequest,
)
from .hashing import block_hash, chain_hashes
from .launch import Launch, LaunchAlreadyCompleted
from .pool import BlockPool
from .table import PositionOutOfRange, blocks_needed, resolve, slot_mapping

__all__ = [
    "Abstraction", "AllocatorError", "BlockAllocator", "BlockPool", "CommitError", "DoubleFree",
    "DuplicateRequest", "GuardViolation", "InvalidArgument", "InvariantViolation", "Launch",
    "LaunchAlreadyCompleted", "OutOfBlocks", "PendingAccess", "PositionOutOfRange",
    "PublishError", "StaleTableError", "TokensUnknown", "UnknownRequest", "block_hash",
    "blocks_needed", "chain_hashes", "resolve", "slot_mapping",
]
