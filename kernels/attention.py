"""Paged attention launchers: decode (one query token per sequence) and prefill (varlen).

Both read K/V through a block table: key position ``t`` of sequence ``i`` lives in block
``block_tables[i, t // B]`` at offset ``t % B``. Only positions below ``seq_lens[i]`` and table
entries below ``ceil(seq_lens[i] / B)`` are read, so padding entries (-1) are never touched.
Accumulation is float32 whatever the KV dtype; the output has ``q``'s shape and dtype.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ._attention_kernels import (
    KernelConfig,
    attention_kernel,
    check_config,
    reduce_partitions,
)
from ._backend import (
    KV_KINDS,
    SIMULATOR,
    _torch,
    empty,
    host_copy,
    index_arg,
    is_float_array,
    is_torch,
    kernel_arg,
    launch,
    num_sms,
    same_device,
    stream_for,
    word_view,
)
from ._validate import (
    as_flag,
    as_float32,
    as_int,
    check_caches,
    check_index_array,
    check_writable,
    shape_of,
    word_bytes,
)
from .errors import KernelInputError, KernelTypeError, StaleTableError

MIN_PARTITION = 512  # tokens: below this a partition's launch overhead outweighs its work
_REDUCE_THREADS = 4 if SIMULATOR else 256


def default_config(head_dim: int, group: int, kind: str, *, prefill: bool) -> KernelConfig:
    """The thread layout used when the caller gives none (small blocks in the simulator)."""
    head_dim = as_int("head_dim", head_dim, minimum=1)
    group = as_int("group", group, minimum=1)
    if not isinstance(kind, str) or kind not in KV_KINDS:
        raise KernelTypeError(f"kind must be one of {sorted(KV_KINDS)}, got {kind!r}")
    prefill = as_flag("prefill", prefill)
    words = head_dim * KV_KINDS[kind] // word_bytes(head_dim, KV_KINDS[kind])
    if SIMULATOR:
        lanes = 2 if words % 2 == 0 else 1
        q_tile = 2 if prefill else 1
        return KernelConfig(lanes=lanes, slots=1 if group * q_tile >= 4 else 2, unroll=2,
                            q_tile=q_tile)
    # GPU: about 4 words (32 bytes) per lane per key; ~128 threads a block.
    lanes = max(1, words // 4)
    while words % lanes:
        lanes -= 1
    q_tile = max(1, 16 // group) if prefill else 1
    rows = q_tile * group
    slots = max(1, 128 // (rows * lanes))
    cfg = KernelConfig(lanes=lanes, slots=slots, unroll=2, q_tile=q_tile)
    while cfg.shared_bytes(group, head_dim) > 40 * 1024 and cfg.slots > 1:
        cfg = KernelConfig(lanes, cfg.slots // 2, cfg.unroll, cfg.q_tile)
    return cfg


def choose_partition_size(
    num_blocks_unsplit: int, max_seq_len: int, num_sms: int, block_size: int
) -> int | None:
    """Key-partition size for split-K, or None to run unsplit.

    Splits only when the unsplit grid (work items x KV heads) would not fill the GPU twice over
    and sequences are long enough that each partition keeps at least ``MIN_PARTITION`` keys.
    """
    num_blocks_unsplit = as_int("num_blocks_unsplit", num_blocks_unsplit, minimum=0)
    max_seq_len = as_int("max_seq_len", max_seq_len, minimum=0)
    num_sms = as_int("num_sms", num_sms, minimum=1)
    block_size = as_int("block_size", block_size, minimum=1)
    if max_seq_len < 2 * MIN_PARTITION or num_blocks_unsplit >= 2 * num_sms:
        return None
    parts = min(-(-2 * num_sms // max(num_blocks_unsplit, 1)), max_seq_len // MIN_PARTITION)
    if parts < 2:
        return None
    size = -(-max_seq_len // parts)
    return -(-size // block_size) * block_size


def _check_q(q: Any, hkv: int, d: int) -> tuple[int, int]:
    if not (isinstance(q, np.ndarray) or is_torch(q)) or not is_float_array(q):
        raise KernelTypeError("q must be a float numpy array or torch tensor")
    if len(q.shape) != 3:
        raise KernelInputError(f"q must be [tokens, num_heads, head_dim], got {shape_of(q)}")
    n, h, qd = shape_of(q)
    if qd != d:
        raise KernelInputError(f"q head_dim {qd} differs from the cache's {d}")
    if h % hkv:
        raise KernelInputError(f"num_heads {h} is not a multiple of num_kv_heads {hkv}")
    return n, h


def _check_tables(
    block_tables: Any,
    lens: np.ndarray,
    nb: int,
    bs: int,
    block_generations: Any,
    table_generations: Any,
) -> None:
    """Checked mode: every used entry in range and of the generation it was published with."""
    tables = host_copy(block_tables).astype(np.int64)
    used = np.arange(tables.shape[1])[None, :] < (-(-lens // bs))[:, None]
    entries = tables[used]
    bad = (entries < 0) | (entries >= nb)
    if bad.any():
        i, j = np.argwhere(used & ((tables < 0) | (tables >= nb)))[0]
        raise KernelInputError(
            f"block_tables[{i}, {j}] = {tables[i, j]} is not a block id in [0, {nb})"
        )
    if (block_generations is None) != (table_generations is None):
        raise KernelInputError("give both block_generations and table_generations, or neither")
    if block_generations is None:
        return
    gens = host_copy(block_generations).astype(np.int64)
    tgen = host_copy(table_generations).astype(np.int64)
    if gens.shape != (nb,):
        raise KernelInputError(f"block_generations must be [{nb}], got {gens.shape}")
    if tgen.shape != tables.shape:
        raise KernelInputError(
            f"table_generations {tgen.shape} must match block_tables {tables.shape}"
        )
    stale = used & (gens[np.where(used, tables, 0)] != tgen)
    if stale.any():
        i, j = np.argwhere(stale)[0]
        raise StaleTableError(
            f"block_tables[{i}, {j}] = block {tables[i, j]} was published at generation "
            f"{tgen[i, j]} but the block is now at generation {gens[tables[i, j]]}"
        )


def _attention(
    q: Any,
    k_cache: Any,
    v_cache: Any,
    block_tables: Any,
    seq_lens: Any,
    query_lens: Any | None,
    *,
    scale: float | None,
    out: Any | None,
    partition_size: int | None,
    check: bool,
    block_generations: Any,
    table_generations: Any,
    config: KernelConfig | None,
    max_seq_len: int | None,
) -> Any:
    (nb, bs, hkv, d), kind = check_caches(k_cache, v_cache)
    n_tok, n_heads = _check_q(q, hkv, d)
    group = n_heads // hkv
    check_index_array("block_tables", block_tables, 2)
    check_index_array("seq_lens", seq_lens, 1)
    n_seq = shape_of(seq_lens)[0]
    if shape_of(block_tables)[0] != n_seq:
        raise KernelInputError(
            f"block_tables has {shape_of(block_tables)[0]} rows for {n_seq} sequences"
        )
    decode = query_lens is None
    if decode and n_tok != n_seq:
        raise KernelInputError(f"decode q has {n_tok} tokens for {n_seq} sequences")
    same_device([("q", q), ("k_cache", k_cache), ("v_cache", v_cache)])
    if out is not None:
        if not (isinstance(out, np.ndarray) or is_torch(out)) or not is_float_array(out):
            raise KernelTypeError("out must be a float numpy array or torch tensor")
        if shape_of(out) != shape_of(q):
            raise KernelInputError(f"out {shape_of(out)} must have q's shape {shape_of(q)}")
        check_writable("out", out)
        same_device([("q", q), ("out", out)])
    # scalar arguments: all checked here, before anything is computed or written
    check = as_flag("check", check)
    scale = as_float32("scale", 1.0 / math.sqrt(d) if scale is None else scale)
    if partition_size is not None:
        partition_size = as_int("partition_size", partition_size, minimum=1)
    max_blocks = shape_of(block_tables)[1]
    if max_seq_len is not None:
        max_seq_len = as_int("max_seq_len", max_seq_len, minimum=0, maximum=max_blocks * bs)
    if config is not None and not isinstance(config, KernelConfig):
        raise KernelTypeError(f"config must be a KernelConfig, got {type(config).__name__}")
    for name, gen in (("block_generations", block_generations),
                      ("table_generations", table_generations)):
        if gen is not None:
            check_index_array(name, gen, 1 if name == "block_generations" else 2)

    # Host-side lengths: needed for the work list (prefill) and the partition count.
    if decode:
        qlens = np.ones(n_seq, dtype=np.int64)
    else:
        check_index_array("query_lens", query_lens, 1)
        if shape_of(query_lens)[0] != n_seq:
            raise KernelInputError(f"query_lens has {shape_of(query_lens)[0]} entries, "
                                   f"expected {n_seq}")
        qlens = host_copy(query_lens).astype(np.int64)
        if (qlens < 0).any():
            raise KernelInputError(f"negative query length in {qlens.tolist()}")
        if int(qlens.sum()) != n_tok:
            raise KernelInputError(f"sum(query_lens) = {int(qlens.sum())} but q has {n_tok}")
    lens = None
    if check or max_seq_len is None:
        lens = host_copy(seq_lens).astype(np.int64)
        low = 1 if decode else 0
        if (lens < low).any() or (lens > max_blocks * bs).any():
            raise KernelInputError(
                f"seq_lens must lie in [{low}, {max_blocks * bs}] (table width {max_blocks} x "
                f"block size {bs}), got {lens.tolist()}"
            )
        if (qlens > lens).any():
            raise KernelInputError(f"query_lens {qlens.tolist()} exceed seq_lens {lens.tolist()}")
        if max_seq_len is None:
            max_seq_len = int(lens.max()) if n_seq else 0
        elif n_seq and max_seq_len < int(lens.max()):
            raise KernelInputError(
                f"max_seq_len {max_seq_len} is below the longest sequence ({int(lens.max())})"
            )
    if check:
        _check_tables(block_tables, lens, nb, bs, block_generations, table_generations)

    cfg = config if config is not None else default_config(d, group, kind, prefill=not decode)
    wb = word_bytes(d, KV_KINDS[kind])
    cfg = check_config(cfg, group, d, d * KV_KINDS[kind] // wb)
    q_tile = 1 if decode else cfg.q_tile
    if decode and cfg.q_tile != 1:
        cfg = KernelConfig(cfg.lanes, cfg.slots, cfg.unroll, 1)

    # work items: (sequence, first query token of the tile)
    tiles = -(-qlens // q_tile)
    seq_idx = np.repeat(np.arange(n_seq), tiles)
    first = np.concatenate([np.arange(t) * q_tile for t in tiles]) if n_seq else np.zeros(0)
    work = np.stack([seq_idx, first], axis=1).astype(np.int32).reshape(-1, 2)
    q_starts = np.concatenate([[0], np.cumsum(qlens)[:-1]]).astype(np.int32)

    if out is None:
        out = q.new_empty(q.shape) if is_torch(q) else np.empty(q.shape, dtype=q.dtype)
    if len(work) == 0 or n_tok == 0:
        return out

    if partition_size is None:
        partition_size = choose_partition_size(len(work) * hkv, max_seq_len, num_sms(k_cache), bs)
    n_parts = 1 if partition_size is None else max(1, -(-max_seq_len // partition_size))
    split = n_parts > 1
    if not split:
        partition_size = max(max_seq_len, 1)

    q32 = q.detach().float().contiguous() if is_torch(q) else np.ascontiguousarray(q, np.float32)
    direct = _is_f32_contiguous(out)
    out32 = out if direct else empty(q32, (n_tok, n_heads, d))
    if split:
        part_out = empty(q32, (n_tok, n_heads, n_parts, d))
        part_lse = empty(q32, (n_tok, n_heads, n_parts))
    else:
        part_out = empty(q32, (1, 1, 1, 1))
        part_lse = empty(q32, (1, 1, 1))

    kern = attention_kernel(d, wb, kind, group, bs, cfg, split)
    stream = stream_for(k_cache)
    grid = (len(work), hkv, n_parts)
    launch(
        kern, grid, cfg.threads(group), stream,
        kernel_arg(q32),
        word_view(k_cache, wb),
        word_view(v_cache, wb),
        index_arg(block_tables, k_cache),
        index_arg(seq_lens, k_cache),
        index_arg(q_starts, k_cache),
        index_arg(qlens, k_cache),
        index_arg(work, k_cache),
        np.float32(scale),
        np.int32(partition_size),
        kernel_arg(out32),
        kernel_arg(part_out),
        kernel_arg(part_lse),
    )
    if split:
        total = n_tok * n_heads * d
        blocks = 1 if SIMULATOR else min(-(-total // _REDUCE_THREADS), 4096)
        launch(reduce_partitions, blocks, _REDUCE_THREADS, stream,
               kernel_arg(part_out), kernel_arg(part_lse), kernel_arg(out32))
    if not direct:
        if is_torch(out):
            out.copy_(out32)
        else:
            out[...] = out32
    return out


def _is_f32_contiguous(x: Any) -> bool:
    if is_torch(x):
        return x.dtype == _torch().float32 and x.is_contiguous()
    return x.dtype == np.float32 and bool(x.flags.c_contiguous)


def paged_attention_decode(
    q: Any,
    k_cache: Any,
    v_cache: Any,
    block_tables: Any,
    seq_lens: Any,
    *,
    scale: float | None = None,
    out: Any | None = None,
    partition_size: int | None = None,
    check: bool = False,
    block_generations: Any | None = None,
    table_generations: Any | None = None,
    config: KernelConfig | None = None,
    max_seq_len: int | None = None,
) -> Any:
    """Attention of one query token per sequence over its paged K/V.

    ``q``: ``[num_seqs, num_heads, head_dim]``; caches ``[num_blocks, block_size, kv_heads,
    head_dim]`` (fp16/bf16/fp32); ``block_tables`` int ``[num_seqs, max_blocks]`` (padded -1);
    ``seq_lens`` int ``[num_seqs]`` (>= 1). Query heads ``h`` uses KV head ``h // group``.

    ``partition_size``: split each sequence's keys into partitions of that many tokens (split-K)
    and merge them; None chooses automatically. ``check``: validate lengths and every used table
    entry first (with ``block_generations``/``table_generations`` also their generations, raising
    ``StaleTableError``). ``max_seq_len`` spares the host copy of ``seq_lens`` when unchecked.
    Returns ``out`` (allocated with ``q``'s dtype if not given).
    """
    return _attention(
        q, k_cache, v_cache, block_tables, seq_lens, None, scale=scale, out=out,
        partition_size=partition_size, check=check, block_generations=block_generations,
        table_generations=table_generations, config=config, max_seq_len=max_seq_len,
    )


def paged_attention_prefill(
    q: Any,
    k_cache: Any,
    v_cache: Any,
    block_tables: Any,
    seq_lens: Any,
    query_lens: Any,
    *,
    scale: float | None = None,
    out: Any | None = None,
    partition_size: int | None = None,
    check: bool = False,
    block_generations: Any | None = None,
    table_generations: Any | None = None,
    config: KernelConfig | None = None,
    max_seq_len: int | None = None,
) -> Any:
    """Causal attention of several query tokens per sequence (chunked prefill / extend).

    ``q`` is packed ``[sum(query_lens), num_heads, head_dim]``; query ``j`` of sequence ``i``
    sits at position ``seq_lens[i] - query_lens[i] + j`` and attends to positions up to its
    own. Its K/V must already be in the cache (``write_kv`` first). Other arguments as for
    ``paged_attention_decode``.
    """
    if query_lens is None:
        raise KernelTypeError("query_lens is required for prefill")
    return _attention(
        q, k_cache, v_cache, block_tables, seq_lens, query_lens, scale=scale, out=out,
        partition_size=partition_size, check=check, block_generations=block_generations,
        table_generations=table_generations, config=config, max_seq_len=max_seq_len,
    )
