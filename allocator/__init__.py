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


def _package_version() -> str:
    """The installed distribution's version; in a source tree that is not installed, the
    version in its pyproject.toml."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("pagedkv")
    except PackageNotFoundError:
        import tomllib
        from pathlib import Path

        try:
            pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
            return tomllib.loads(pyproject.read_text())["project"]["version"]
        except (OSError, KeyError, tomllib.TOMLDecodeError):
            return "0+unknown"


__version__: str = _package_version()
