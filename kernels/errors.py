"""Typed errors raised by the kernels' launchers. A refused call changes nothing.

A stale table entry (its generation no longer matches the block's) raises the allocator's
`StaleTableError`, re-exported here so callers can catch it from either package.
"""

from __future__ import annotations

from pagedkv.allocator.errors import StaleTableError


class KernelError(Exception):
    """Base class of every error raised by `pagedkv.kernels` on a refused call."""


class KernelInputError(KernelError, ValueError):
    """A shape, size, index or table entry that does not fit the launch."""


class KernelTypeError(KernelError, TypeError):
    """An argument of the wrong kind or dtype (e.g. a list, int8 cache, mixed dtypes)."""


class KernelDeviceError(KernelError, ValueError):
    """Arguments that live on different devices, or a CUDA tensor without a usable GPU."""


__all__ = [
    "KernelDeviceError",
    "KernelError",
    "KernelInputError",
    "KernelTypeError",
    "StaleTableError",
]
