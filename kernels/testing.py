"""Test helpers: paged caches with NaN-poisoned unused blocks and tails, and error metrics.

``make_paged_case`` scatters random K/V of the given sequences over randomly permuted physical
blocks. Every slot no sequence owns (unused blocks, the tails of last blocks) is NaN, and the
last block id, which a stray read of a -1 padding entry would wrap to in numpy, is never used.
Tables carry extra -1 padding columns. A kernel that reads anything it should not returns NaN.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .reference import write_kv_reference


@dataclass
class PagedCase:
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_tables: np.ndarray  # int32 [n, max_blocks], padded with -1
    seq_lens: np.ndarray  # int32 [n]
    keys: list[torch.Tensor]  # per sequence, contiguous [len, kv_heads, head_dim]
    values: list[torch.Tensor]
    slot_mapping: np.ndarray  # int64: slot of every position, sequences concatenated

    @property
    def num_blocks(self) -> int:
        return int(self.k_cache.shape[0])


def random_tables(
    seq_lens: list[int], block_size: int, num_blocks: int, pad: int, gen: np.random.Generator
) -> np.ndarray:
    """Tables of distinct random blocks in ``[0, num_blocks - 1)``, padded with -1."""
    need = [-(-n // block_size) for n in seq_lens]
    if sum(need) > num_blocks - 1:
        raise ValueError(f"{sum(need)} blocks needed, only {num_blocks - 1} usable")
    perm = gen.permutation(num_blocks - 1)
    width = max(need, default=0) + pad
    tables = np.full((len(seq_lens), width), -1, dtype=np.int32)
    at = 0
    for i, k in enumerate(need):
        tables[i, :k] = perm[at : at + k]
        at += k
    return tables


def slots_of(tables: np.ndarray, seq_lens: list[int], block_size: int) -> np.ndarray:
    parts = []
    for i, n in enumerate(seq_lens):
        pos = np.arange(n)
        parts.append(tables[i, pos // block_size].astype(np.int64) * block_size + pos % block_size)
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def make_paged_case(
    seq_lens: list[int],
    *,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    device: str = "cpu",
    spare_blocks: int = 2,
    table_pad: int = 1,
    seed: int = 0,
) -> PagedCase:
    gen = np.random.default_rng(seed)
    torch_gen = torch.Generator().manual_seed(seed)
    used = sum(-(-n // block_size) for n in seq_lens)
    num_blocks = used + spare_blocks + 1
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.full(shape, float("nan"), dtype=dtype, device=device)
    v_cache = torch.full(shape, float("nan"), dtype=dtype, device=device)
    tables = random_tables(list(seq_lens), block_size, num_blocks, table_pad, gen)
    keys, values = [], []
    for n in seq_lens:
        keys.append(torch.randn(n, num_kv_heads, head_dim, generator=torch_gen).to(dtype))
        values.append(torch.randn(n, num_kv_heads, head_dim, generator=torch_gen).to(dtype))
    slots = slots_of(tables, list(seq_lens), block_size)
    if len(seq_lens):
        write_kv_reference(
            torch.cat(keys).to(device), torch.cat(values).to(device), k_cache, v_cache,
            torch.from_numpy(slots).to(device),
        )
    return PagedCase(
        k_cache, v_cache, tables, np.asarray(seq_lens, dtype=np.int32),
        [k.to(device) for k in keys], [v.to(device) for v in values], slots,
    )


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max |out - ref| / max |ref| in float64 (inf if ``out`` has a NaN)."""
    o = torch.as_tensor(out).double().cpu()
    r = torch.as_tensor(ref).double().cpu()
    if torch.isnan(o).any():
        return float("inf")
    return float((o - r).abs().max() / r.abs().max().clamp_min(1e-30))


def tolerance(dtype: torch.dtype) -> float:
    """Relative tolerance of an output stored in ``dtype`` (fp32 accumulation)."""
    return {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]


def device_for_tests() -> str:
    """'cuda' for the GPU test run (``PAGEDKV_GPU=1``), else 'cpu' (the CUDA simulator)."""
    import os

    return "cuda" if os.environ.get("PAGEDKV_GPU") == "1" else "cpu"
