"""KVCachePool: the K and V pool tensors of every layer, in NHD layout.

Layer ``i``'s caches are ``[num_blocks, block_size, num_kv_heads, head_dim]``. A block id names
the same slot range in every layer, so one block table (from the allocator) serves all layers.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np
import torch

from ._validate import as_int
from .cache_ops import copy_blocks as _copy_blocks
from .errors import KernelDeviceError, KernelInputError, KernelTypeError

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


_MAX_BYTES = 1 << 62  # beyond any device; also keeps torch's size arithmetic in int64


def _positive(name: str, value: Any) -> int:
    return as_int(name, value, minimum=1)


def _device(device: Any) -> torch.device:
    if not isinstance(device, str | torch.device):
        raise KernelTypeError(f"device must be a str or torch.device, got {type(device).__name__}")
    try:
        return torch.device(device)
    except (RuntimeError, ValueError) as exc:
        raise KernelDeviceError(f"bad device {device!r}: {exc}") from None


def _fill_value(value: Any, dtype: torch.dtype) -> float:
    """A real number (NaN and inf allowed, e.g. to poison) that ``dtype`` can hold."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, numbers.Real):
        raise KernelTypeError(f"fill value must be a real number, got {type(value).__name__}")
    try:
        v = float(value)
    except OverflowError:  # an int beyond float range
        raise KernelInputError(f"fill value {value!r} does not fit {dtype}") from None
    if math.isfinite(v) and abs(v) > torch.finfo(dtype).max:
        raise KernelInputError(f"fill value {value!r} does not fit {dtype}")
    return v


def _block_ids(block_ids: Any, num_blocks: int) -> np.ndarray:
    """Block ids (an int, or a 1-D sequence / array of ints) as an int64 array, range-checked."""
    if isinstance(block_ids, torch.Tensor):
        block_ids = block_ids.detach().cpu().numpy()
    if isinstance(block_ids, str | bytes | bytearray) or block_ids is None:
        raise KernelTypeError(f"block ids must be ints, got {type(block_ids).__name__}")
    try:
        ids = np.asarray(block_ids)
    except (TypeError, ValueError) as exc:  # ragged nesting
        raise KernelTypeError(f"block ids must be ints: {exc}") from None
    if ids.size == 0:
        return np.zeros(0, dtype=np.int64)
    if ids.ndim > 1:
        raise KernelInputError(f"block ids must be 1-D, got shape {ids.shape}")
    if ids.dtype == object:  # Python ints beyond int64, or mixed objects
        vals = [as_int("block id", b) for b in ids.reshape(-1)]
        bad = [b for b in vals if not 0 <= b < num_blocks]
        if bad:
            raise KernelInputError(f"block ids {bad} out of range [0, {num_blocks})")
        ids = np.asarray(vals, dtype=np.int64)
    if not np.issubdtype(ids.dtype, np.integer):
        raise KernelTypeError(f"block ids must be ints, got dtype {ids.dtype}")
    ids = ids.reshape(-1)
    if ids.min() < 0 or ids.max() >= num_blocks:
        raise KernelInputError(f"block ids out of range [0, {num_blocks}): {ids.tolist()}")
    return ids.astype(np.int64)


def _torch_dtype(dtype: Any) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        if dtype in (torch.float16, torch.bfloat16, torch.float32):
            return dtype
    elif isinstance(dtype, str):
        if dtype.lower() in _DTYPES:
            return _DTYPES[dtype.lower()]
    elif dtype is not None:  # numpy dtypes and scalar types (np.dtype(None) would be float64)
        try:
            nd = np.dtype(dtype)
        except (TypeError, ValueError):
            nd = None
        if nd == np.float16:
            return torch.float16
        if nd == np.float32:
            return torch.float32
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
        pin_memory: bool = False,
    ) -> None:
        self.num_layers = _positive("num_layers", num_layers)
        self.num_blocks = _positive("num_blocks", num_blocks)
        self.block_size = _positive("block_size", block_size)
        self.num_kv_heads = _positive("num_kv_heads", num_kv_heads)
        self.head_dim = _positive("head_dim", head_dim)
        self.dtype = _torch_dtype(dtype)
        self.device = _device(device)
        shape = (self.num_layers, 2, self.num_blocks, self.block_size, self.num_kv_heads,
                 self.head_dim)
        nbytes = math.prod(shape) * torch.empty((), dtype=self.dtype).element_size()
        if nbytes > _MAX_BYTES:
            raise KernelInputError(f"a pool of shape {shape} needs {nbytes} bytes")
        if not isinstance(pin_memory, bool):
            raise KernelTypeError(f"pin_memory must be a bool, got {type(pin_memory).__name__}")
        if pin_memory and (self.device.type != "cpu" or not torch.cuda.is_available()):
            raise KernelDeviceError("pin_memory: page-locked memory is a host (cpu) pool's, "
                                    "and needs CUDA")
        self.pin_memory = pin_memory
        try:
            self._storage = torch.empty(shape, dtype=self.dtype, device=self.device,
                                        pin_memory=pin_memory)
        except (RuntimeError, AssertionError) as exc:  # out of memory, no such device
            cls = KernelInputError if self.device.type == "cpu" else KernelDeviceError
            raise cls(f"cannot allocate {nbytes} bytes on {self.device}: {exc}") from None

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
        i = as_int("layer index", i)
        if not 0 <= i < self.num_layers:
            raise KernelInputError(f"layer {i} out of range [0, {self.num_layers})")
        return self._storage[i, 0], self._storage[i, 1]

    def layers(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [self.layer(i) for i in range(self.num_layers)]

    def fill_(self, value: float) -> KVCachePool:
        """Fill every slot of every layer with ``value`` (e.g. NaN to poison unused blocks)."""
        self._storage.fill_(_fill_value(value, self.dtype))
        return self

    def fill_blocks_(self, block_ids: Any, value: float) -> KVCachePool:
        """Fill the given blocks (all layers, K and V) with ``value``."""
        ids = torch.as_tensor(_block_ids(block_ids, self.num_blocks)).to(self.device)
        self._storage[:, :, ids] = _fill_value(value, self.dtype)
        return self

    def copy_blocks(self, pairs: Any) -> None:
        """Execute copy-on-write pairs ``(src, dst)`` in every layer (see ``copy_blocks``)."""
        for k_cache, v_cache in self.layers():
            _copy_blocks(k_cache, v_cache, pairs)

    def like(self, num_blocks: int, device: str | torch.device = "cpu",
             pin_memory: bool | None = None) -> KVCachePool:
        """A pool of ``num_blocks`` blocks shaped like this one's (layers, block size, heads,
        dim, dtype) on ``device``: e.g. the host tier of a device pool. ``pin_memory`` None:
        page-locked where the new pool is on the host and CUDA is available."""
        if pin_memory is None:
            pin_memory = _device(device).type == "cpu" and torch.cuda.is_available()
        return KVCachePool(self.num_layers, num_blocks, self.block_size, self.num_kv_heads,
                           self.head_dim, self.dtype, device, pin_memory)

    def transfer_blocks(self, dst: KVCachePool, src_ids: Any, dst_ids: Any,
                        non_blocking: bool = False) -> None:
        """Copy blocks ``src_ids[i]`` of this pool into blocks ``dst_ids[i]`` of ``dst`` (every
        layer, K and V), across devices too (device -> host offload and swap, and back). The
        pools must have the same layers and block shape and dtype; ids are range-checked and
        destinations distinct. ``non_blocking``: asynchronous on a CUDA stream (pinned host
        memory); the caller synchronizes before reading or reusing the blocks."""
        if not isinstance(dst, KVCachePool):
            raise KernelTypeError(f"transfer_blocks: dst must be a KVCachePool, got "
                                  f"{type(dst).__name__}")
        if not isinstance(non_blocking, bool):
            raise KernelTypeError("transfer_blocks: non_blocking must be a bool")
        if (dst.num_layers, dst.block_shape, dst.dtype) != (
                self.num_layers, self.block_shape, self.dtype):
            raise KernelInputError(
                f"transfer_blocks: pools differ: {self.num_layers} layers x {self.block_shape} "
                f"{self.dtype} vs {dst.num_layers} layers x {dst.block_shape} {dst.dtype}")
        si = _block_ids(src_ids, self.num_blocks)
        di = _block_ids(dst_ids, dst.num_blocks)
        if si.size != di.size:
            raise KernelInputError(f"transfer_blocks: {si.size} source blocks, {di.size} "
                                   "destinations")
        if np.unique(di).size != di.size:
            raise KernelInputError(f"transfer_blocks: a destination block appears twice: "
                                   f"{di.tolist()}")
        if si.size == 0:
            return
        blocks = self._storage[:, :, torch.as_tensor(si, device=self.device)]
        dst._storage[:, :, torch.as_tensor(di, device=dst.device)] = blocks.to(
            dst.device, non_blocking=non_blocking)

    def __repr__(self) -> str:
        return (
            f"KVCachePool(layers={self.num_layers}, blocks={self.num_blocks}, "
            f"block_size={self.block_size}, kv_heads={self.num_kv_heads}, "
            f"head_dim={self.head_dim}, dtype={self.dtype}, device={self.device}, "
            f"reserved_bytes={self.reserved_bytes})"
        )
