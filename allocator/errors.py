"""Typed errors. Every refused call raises one of these and leaves the allocator unchanged."""

from __future__ import annotations


class AllocatorError(Exception):
    """Base class of every error pagedkv's allocator raises on a refused call."""


class InvalidArgument(AllocatorError, ValueError):
    """A size, count or id that is negative, not an integer, or out of range."""


class UnknownRequest(AllocatorError, KeyError):
    """The request id is not registered (never added, or already freed)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else "unknown request"


class DuplicateRequest(AllocatorError):
    """The request id is already registered."""


class OutOfBlocks(AllocatorError):
    """Not enough free or evictable blocks; nothing was changed.

    ``available`` is what the call could have taken (after reclaiming completed launches);
    ``waiting`` counts blocks that become usable only when in-flight launches complete.
    """

    def __init__(self, needed: int, available: int, waiting: int = 0) -> None:
        msg = f"need {needed} blocks, only {available} free or evictable"
        if waiting:
            msg += f" ({waiting} more wait for in-flight launches to complete)"
        super().__init__(msg)
        self.needed = needed
        self.available = available
        self.waiting = waiting


class EventError(AllocatorError):
    """A launch's completion event failed when queried (e.g. the device was lost).

    Nothing was changed: the launch stays in flight and its blocks stay pinned. ``launch`` is
    the launch whose event failed; the original exception is ``__cause__``.
    """

    def __init__(self, launch: object, detail: str) -> None:
        super().__init__(f"completion event of {launch!r} failed: {detail}")
        self.launch = launch


class GuardViolation(AllocatorError):
    """A spec transition was attempted whose guard does not hold; the message says, in words,
    which of its conditions failed."""

    def __init__(self, transition: str, detail: str = "") -> None:
        msg = f"{transition} refused"
        super().__init__(f"{msg}: {detail}" if detail else msg)
        self.transition = transition


class DoubleFree(GuardViolation):
    """A release of a block the holder does not hold (ref would go negative or be stolen)."""


class PendingAccess(GuardViolation):
    """A block would be reused (allocated or recycled) while a launch that may have seen it is
    still in flight: it was retired at a launch clock the watermark has not reached, or a
    write to it is pending."""


class PublishError(GuardViolation):
    """A block would be handed to a kernel before its record is initialized, or after release."""


class CommitError(AllocatorError):
    """Committing past what was allocated, or before the writing launch completed."""


class TokensUnknown(InvalidArgument, CommitError):
    """A commit or fork would hash, cache or share KV of positions whose token ids were never
    given (``append_tokens`` first)."""


class StaleTableError(AllocatorError):
    """A block table entry's generation no longer matches the block's: reading it is unsafe."""


class InvariantViolation(AllocatorError, AssertionError):
    """An invariant of the lifecycle spec does not hold; `.invariant` names it."""

    def __init__(self, invariant: str, detail: str = "") -> None:
        super().__init__(f"invariant {invariant!r} violated" + (f": {detail}" if detail else ""))
        self.invariant = invariant
