"""Paged-attention kernels (numba CUDA) over a paged KV cache, with torch references.

Public API: ``KVCachePool``, ``write_kv``, ``copy_blocks``, ``paged_attention_decode``,
``paged_attention_prefill``, the ``*_reference`` functions, ``KernelConfig`` and the typed
errors. Runs on a GPU or in numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``).
"""

from __future__ import annotations

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
from .pool import KVCachePool
from .reference import (
    attention_reference,
    copy_blocks_reference,
    gather_kv,
    paged_attention_decode_reference,
    paged_attention_prefill_reference,
    write_kv_reference,
)

__all__ = [
    "KVCachePool",
    "KernelConfig",
    "KernelDeviceError",
    "KernelError",
    "KernelInputError",
    "KernelTypeError",
    "StaleTableError",
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
    "write_kv",
    "write_kv_reference",
]
