"""KVCachePool: the K and V pool tensors of every layer, in NHD layout.

Layer ``i``'s caches are ``[num_blocks, block_size, num_kv_heads, head_dim]``. A block id names
the same slot range in every layer, so one block table (from the allocator) serves all layers.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .cache_ops import copy_blocks as _copy_blocks
from .errors import KernelInputError, KernelTypeError

_DTYPES = {
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
}


def _positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise KernelTypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 1:
        raise KernelInputError(f"{name} must be >= 1, got {value}")
    return int(value)


def _torch_dtype(dtype: Any) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        if dtype in (torch.float16, torch.bfloat16, torch.float32):
            return dtype
    elif isinstance(dtype, str) and dtype.lower() in _DTYPES:
        return _DTYPES[dtype.lower()]
    elif dtype in (np.float16, np.float32) or (
        isinstance(dtype, np.dtype) and dtype in (np.float16, np.float32)
    ):
        return torch.float16 if np.dtype(dtype) == np.float16 else torch.float32
    raise KernelTypeError(f"unsupported KV dtype {dtype!r}; use float16, bfloat16 or float32")


class KVCachePool:
    """Owns the K/V caches of all layers (one torch allocation), in NHD layout.

    ``reserved_bytes`` is the device memory held for the whole pool, whatever the allocator has
    handed out; ``bytes_per_block`` is what one block id costs across all layers, K and V.
    """

    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: Any = torch.float16,
        device: str | torch.device = "cpu",
    ) -> None:
        self.num_layers = _positive("num_layers", num_layers)
        self.num_blocks = _positive("num_blocks", num_blocks)
        self.block_size = _positive("block_size", block_size)
        self.num_kv_heads = _positive("num_kv_heads", num_kv_heads)
        self.head_dim = _positive("head_dim", head_dim)
        self.dtype = _torch_dtype(dtype)
        self.device = torch.device(device)
        shape = (self.num_layers, 2, self.num_blocks, self.block_size, self.num_kv_heads,
                 self.head_dim)
        self._storage = torch.empty(shape, dtype=self.dtype, device=self.device)

    @property
    def element_size(self) -> int:
        return self._storage.element_size()

    @property
    def block_shape(self) -> tuple[int, int, int]:
        """Shape of one block in one layer's K (or V) cache: (block_size, kv_heads, head_dim)."""
        return (self.block_size, self.num_kv_heads, self.head_dim)

    @property
    def bytes_per_block(self) -> int:
        """Bytes one block id occupies across every layer, K and V together."""
        per_cache = self.block_size * self.num_kv_heads * self.head_dim * self.element_size
        return 2 * self.num_layers * per_cache

    @property
    def reserved_bytes(self) -> int:
        """Device memory held for the whole pool (not the allocator's occupancy)."""
        return self._storage.numel() * self.element_size

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``i``'s ``(k_cache, v_cache)``, each ``[blocks, block_size, kv_heads, dim]``."""
        if isinstance(i, bool) or not isinstance(i, int | np.integer):
            raise KernelTypeError(f"layer index must be an int, got {type(i).__name__}")
        if not 0 <= i < self.num_layers:
            raise KernelInputError(f"layer {i} out of range [0, {self.num_layers})")
        return self._storage[i, 0], self._storage[i, 1]

    def layers(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [self.layer(i) for i in range(self.num_layers)]

    def fill_(self, value: float) -> KVCachePool:
        """Fill every slot of every layer with ``value`` (e.g. NaN to poison unused blocks)."""
        self._storage.fill_(value)
        return self

    def fill_blocks_(self, block_ids: Any, value: float) -> KVCachePool:
        """Fill the given blocks (all layers, K and V) with ``value``."""
        ids = torch.as_tensor(np.asarray(block_ids, dtype=np.int64)).to(self.device)
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.num_blocks):
            raise KernelInputError(f"block ids out of range [0, {self.num_blocks})")
        self._storage[:, :, ids] = value
        return self

    def copy_blocks(self, pairs: Any) -> None:
        """Execute copy-on-write pairs ``(src, dst)`` in every layer (see ``copy_blocks``)."""
        for k_cache, v_cache in self.layers():
            _copy_blocks(k_cache, v_cache, pairs)

    def __repr__(self) -> str:
        return (
            f"KVCachePool(layers={self.num_layers}, blocks={self.num_blocks}, "
            f"block_size={self.block_size}, kv_heads={self.num_kv_heads}, "
            f"head_dim={self.head_dim}, dtype={self.dtype}, device={self.device}, "
            f"reserved_bytes={self.reserved_bytes})"
        )
