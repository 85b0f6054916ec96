"""Paged-attention kernels (numba CUDA) over a paged KV cache, with torch references.

Public API: ``KVCachePool``, ``write_kv``, ``copy_blocks``, ``paged_attention_decode``,
``paged_attention_prefill``, ``step_inputs`` (a launch's metadata checked on the host and moved
to the device once per step), the ``*_reference`` functions, ``KernelConfig`` and the typed
errors. Runs on a GPU or in numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``).

Importing this package does not import torch (optional, the ``[kernels]`` extra): the launchers
take numpy arrays without it. ``KVCachePool`` and the torch references are loaded on first use
(they allocate and compute with torch tensors).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._attention_kernels import KernelConfig
from .attention import (
    choose_partition_size,
    default_config,
    paged_attention_decode,
    paged_attention_prefill,
)
from .cache_ops import copy_blocks, write_kv
from .errors import (
    KernelDeviceError,
    KernelError,
    KernelInputError,
    KernelTypeError,
    StaleTableError,
)
from .step import StepInputs, step_inputs

if TYPE_CHECKING:
    from .pool import KVCachePool
    from .reference import (
        attention_reference,
        copy_blocks_reference,
        gather_kv,
        paged_attention_decode_reference,
        paged_attention_prefill_reference,
        write_kv_reference,
    )

# name -> submodule: these need torch, so they are imported when first looked up
_LAZY = {
    "KVCachePool": "pool",
    "attention_reference": "reference",
    "copy_blocks_reference": "reference",
    "gather_kv": "reference",
    "paged_attention_decode_reference": "reference",
    "paged_attention_prefill_reference": "reference",
    "write_kv_reference": "reference",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))

__all__ = [
    "KVCachePool",
    "KernelConfig",
    "KernelDeviceError",
    "KernelError",
    "KernelInputError",
    "KernelTypeError",
    "StaleTableError",
    "StepInputs",
    "attention_reference",
    "choose_partition_size",
    "copy_blocks",
    "copy_blocks_reference",
    "default_config",
    "gather_kv",
    "paged_attention_decode",
    "paged_attention_decode_reference",
    "paged_attention_prefill",
    "paged_attention_prefill_reference",
    "step_inputs",
    "write_kv",
    "write_kv_reference",
]
