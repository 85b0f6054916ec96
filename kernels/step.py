"""A step's kernel inputs: the launch's host metadata checked once, then moved to the device.

An engine runs ``write_kv`` and the attention kernels once per layer with the same launch. Their
checked modes read index arrays on the host; for arrays already on a GPU that is a
device-to-host copy (a synchronisation) per call. ``step_inputs`` instead checks the launch's
host arrays (numpy, as ``BlockAllocator.publish`` makes them) once per step, with the same
checks, and moves them to the caches' device once; the per-layer calls then take the device
arrays unchecked (``write_kv``'s default skips its check for a mapping on a GPU) and
``max_seq_len`` from the host, so no call copies anything back.

    inp = step_inputs(launch, k_cache, block_generations=alloc.block_generations())
    copy_blocks(k_cache, v_cache, inp.copies)                 # host pairs: checked on the host
    write_kv(k, v, k_cache, v_cache, inp.slot_mapping)
    paged_attention_prefill(q, k_cache, v_cache, inp.block_tables, inp.seq_lens,
                            inp.query_lens, max_seq_len=inp.max_seq_len)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ._backend import check_array, index_arg
from ._validate import shape_of
from .attention import _check_tables
from .cache_ops import check_slots
from .errors import KernelInputError, KernelTypeError


@dataclass(frozen=True)
class StepInputs:
    """One launch's kernel inputs. On the caches' device: ``block_tables`` (int32),
    ``seq_lens`` (int32), ``slot_mapping`` (int64). On the host (the launchers read them
    there): ``query_lens`` (int32; prefill builds its work list from it), ``copies`` (int32
    ``[k, 2]``; ``copy_blocks`` checks them), ``max_seq_len``."""

    block_tables: Any
    seq_lens: Any
    slot_mapping: Any
    query_lens: np.ndarray
    copies: np.ndarray
    max_seq_len: int


def step_inputs(launch: Any, k_cache: Any, *, block_generations: Any = None) -> StepInputs:
    """Check ``launch``'s host arrays against the cache ``k_cache`` (``[num_blocks,
    block_size, kv_heads, head_dim]``, any layer's) and move them to its device once.

    Checked on the host, before any transfer: the block size; every slot below
    ``num_blocks * block_size`` and none given twice; the lengths within the tables; every
    used table entry a block id of the cache; with ``block_generations`` (the allocator's
    ``block_generations()``) every used entry of the generation it was published with
    (``StaleTableError`` otherwise). ``KernelInputError`` for the rest."""
    for name in ("block_tables", "seq_lens", "query_lens", "slot_mapping",
                 "table_generations", "copies"):
        if not isinstance(getattr(launch, name, None), np.ndarray):
            raise KernelTypeError(f"step_inputs takes a Launch (host arrays); {name} is missing")
    check_array("k_cache", k_cache)
    if len(shape_of(k_cache)) != 4:
        raise KernelInputError(f"k_cache must be [num_blocks, block_size, kv_heads, head_dim], "
                               f"got {shape_of(k_cache)}")
    nb, bs = shape_of(k_cache)[:2]
    if launch.block_size != bs:
        raise KernelInputError(f"the launch's block size is {launch.block_size}, the cache's {bs}")
    tables, lens, qlens = launch.block_tables, launch.seq_lens, launch.query_lens
    if (lens > tables.shape[1] * bs).any() or (qlens > lens).any() or (qlens < 0).any():
        raise KernelInputError(f"lengths outside the tables: seq_lens {lens.tolist()}, "
                               f"query_lens {qlens.tolist()}")
    check_slots(launch.slot_mapping, nb * bs)
    _check_tables(tables, lens.astype(np.int64), nb, bs,
                  None if block_generations is None else np.asarray(block_generations),
                  None if block_generations is None else launch.table_generations)
    return StepInputs(
        block_tables=index_arg(tables, k_cache, "int32"),
        seq_lens=index_arg(lens, k_cache, "int32"),
        slot_mapping=index_arg(launch.slot_mapping, k_cache, "int64"),
        query_lens=qlens,
        copies=launch.copies,
        max_seq_len=int(lens.max()) if len(lens) else 0,
    )


__all__ = ["StepInputs", "step_inputs"]
