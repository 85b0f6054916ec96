"""Shared argument checks. Each raises a typed error before anything is written."""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

from ._backend import check_array, is_contiguous, is_int_array, kv_kind
from .errors import KernelInputError, KernelTypeError

_F32_MAX = float(np.finfo(np.float32).max)


def as_int(name: str, value: Any, *, minimum: int | None = None,
           maximum: int | None = None) -> int:
    """``value`` as a plain int: a Python or numpy integer (not a bool) in [minimum, maximum]."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | np.integer):
        raise KernelTypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    v = int(value)
    if minimum is not None and v < minimum:
        raise KernelInputError(f"{name} must be >= {minimum}, got {v}")
    if maximum is not None and v > maximum:
        raise KernelInputError(f"{name} must be <= {maximum}, got {v}")
    return v


def as_flag(name: str, value: Any) -> bool:
    """A bool (Python or numpy) flag."""
    if not isinstance(value, bool | np.bool_):
        raise KernelTypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")
    return bool(value)


def as_float32(name: str, value: Any) -> float:
    """A real number (not a bool) that is finite, also once rounded to float32."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, numbers.Real):
        raise KernelTypeError(f"{name} must be a real number, got {type(value).__name__} "
                              f"{value!r}")
    try:
        f = float(value)
    except OverflowError:  # an int beyond float range
        raise KernelInputError(f"{name} {value!r} does not fit a float32") from None
    if not math.isfinite(f) or abs(f) > _F32_MAX:
        raise KernelInputError(f"{name} must be finite in float32, got {value!r}")
    return f


def check_writable(name: str, x: Any) -> None:
    """A numpy array the launch writes must be writeable (torch tensors always are)."""
    if isinstance(x, np.ndarray) and not x.flags.writeable:
        raise KernelInputError(f"{name} is a read-only numpy array")


def shape_of(x: Any) -> tuple[int, ...]:
    return tuple(int(s) for s in x.shape)


def check_index_array(name: str, x: Any, ndim: int) -> None:
    check_array(name, x)
    if not is_int_array(x):
        raise KernelTypeError(f"{name} must be an integer array, got dtype {x.dtype}")
    if len(x.shape) != ndim:
        raise KernelInputError(f"{name} must be {ndim}-D, got shape {shape_of(x)}")


def check_caches(k_cache: Any, v_cache: Any) -> tuple[tuple[int, int, int, int], str]:
    """Both caches ``[num_blocks, block_size, kv_heads, head_dim]``, same dtype, contiguous."""
    check_array("k_cache", k_cache)
    check_array("v_cache", v_cache)
    kind = kv_kind("k_cache", k_cache)
    if kv_kind("v_cache", v_cache) != kind:
        raise KernelTypeError(f"k_cache ({k_cache.dtype}) and v_cache ({v_cache.dtype}) differ")
    if len(k_cache.shape) != 4:
        raise KernelInputError(
            f"k_cache must be [num_blocks, block_size, kv_heads, head_dim], got "
            f"{shape_of(k_cache)}"
        )
    if shape_of(k_cache) != shape_of(v_cache):
        raise KernelInputError(f"k_cache {shape_of(k_cache)} and v_cache {shape_of(v_cache)}")
    if not (is_contiguous(k_cache) and is_contiguous(v_cache)):
        raise KernelInputError("k_cache and v_cache must be contiguous")
    nb, bs, hkv, d = shape_of(k_cache)
    return (nb, bs, hkv, d), kind


def word_bytes(head_dim: int, elem_bytes: int) -> int:
    """The widest load (8, 4 or 2 bytes) that divides one head's row."""
    row = head_dim * elem_bytes
    for wb in (8, 4, 2):
        if row % wb == 0:
            return wb
    raise KernelInputError(f"head_dim {head_dim} gives a row of {row} bytes; need an even count")
