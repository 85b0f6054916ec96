"""Allocator metadata memory: bytes per block and per request, pagedkv beside vLLM 0.33.0.

Measured with ``tracemalloc`` (Python heap allocations, including numpy buffers), in one
process, for the same shapes on both sides:

- per block: build a manager over N blocks (no request) and divide the growth by N; two pool
  sizes, so a fixed cost shows as a difference between them (after a warm-up run, so imports
  and first-call caches are not counted);
- the pool layer alone (``BlockPool``, ``NativePool``): bytes per block of a fresh pool;
- per request: admit R requests of T prompt tokens each (distinct prompts, caching on, so every
  full block is hashed), allocate their tables, divide the growth by R; at two prompt lengths,
  so the cost per table entry (per block of context) can be read off.

The prompts are built before measuring: each side pays only for what it keeps. vLLM's side is
the anchor's driver (``../shared/anchors/vllm_kvcache/vllm_kv.py``: the real
``KVCacheManager`` and ``Request``); pagedkv's is ``pagedkv.engine.driver`` (its
``KVCacheManager``, ``EngineRequest`` and the ``BlockAllocator`` under it), and with numba
``pagedkv.engine.native_driver`` (``NativeAllocator``: the tables and positions in arrays, its
launch rows in ``TableRows``). vLLM is used at benchmark time only.

    python benchmarks/memory_bench.py [--blocks 4096,16384] [--requests 200]
                                      [--tokens 512,4096] [--json out.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

ANCHOR = Path(__file__).resolve().parents[1].parent / "shared" / "anchors" / "vllm_kvcache"
BLOCK_SIZE = 16


def _factories() -> dict[str, Callable[..., Any]]:
    from pagedkv.engine.driver import make as pagedkv_make

    out: dict[str, Callable[..., Any]] = {"pagedkv": pagedkv_make}
    try:  # the native step path (NativeDriver over NativeAllocator), with numba
        from pagedkv.engine.native_driver import make as native_make

        out["pagedkv native"] = native_make
    except ImportError:
        pass
    if (ANCHOR / "vllm_kv.py").is_file():
        sys.path.insert(0, str(ANCHOR))
        import vllm_kv

        out = {"vllm": vllm_kv.make, **out}
    else:
        print(f"memory_bench: the vLLM anchor is not at {ANCHOR}; pagedkv alone")
    return out


def _grown(build: Callable[[], Any]) -> tuple[int, Any]:
    """Bytes still allocated after ``build()`` (its result kept alive), and the result."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    kept = build()
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return after - before, kept


def per_block(make: Callable[..., Any], num_blocks: int) -> float:
    grown, _ = _grown(lambda: make(num_blocks, BLOCK_SIZE, enable_caching=True))
    return grown / num_blocks


def per_request(make: Callable[..., Any], requests: int, tokens: int) -> float:
    blocks = requests * (tokens // BLOCK_SIZE + 2) + 1
    kv = make(blocks, BLOCK_SIZE, enable_caching=True)
    prompts = [[(r * 7919 + j * 31) % 32000 for j in range(tokens)] for r in range(requests)]

    def admit() -> None:
        for r, prompt in enumerate(prompts):
            rid = f"r{r}"
            kv.add(rid, prompt)
            if kv.allocate(rid, tokens) is None:
                raise RuntimeError(f"request {rid} did not fit")

    grown, _ = _grown(admit)
    return grown / requests


def pool_per_block(num_blocks: int) -> dict[str, float | None]:
    """The pool layer alone, bytes per block: ``BlockPool`` (lists) and ``NativePool``
    (int64 arrays; None without numba), each built after a warm-up one."""
    from pagedkv.allocator import BlockPool
    from pagedkv.allocator.native_pool import NativePool, NativeUnavailable

    out: dict[str, float | None] = {}
    for name, cls in (("BlockPool", BlockPool), ("NativePool", NativePool)):
        try:
            cls(16, BLOCK_SIZE)
        except NativeUnavailable:
            out[name] = None
            continue
        grown, _ = _grown(lambda cls=cls: cls(num_blocks, BLOCK_SIZE))
        out[name] = grown / num_blocks
    return out


def run(blocks: list[int], requests: int, tokens: list[int]) -> dict[str, Any]:
    out: dict[str, Any] = {"block_size": BLOCK_SIZE, "requests": requests, "rows": [],
                           "pool_layer_bytes_per_block": {n: pool_per_block(n) for n in blocks}}
    for name, make in _factories().items():
        per_request(make, 2, 64)  # warm-up: imports and first-call caches are not per block
        row: dict[str, Any] = {"allocator": name}
        for n in blocks:
            row[f"bytes_per_block@{n}"] = per_block(make, n)
        for t in tokens:
            row[f"bytes_per_request@{t}"] = per_request(make, requests, t)
        lo, hi = tokens[0], tokens[-1]
        if hi > lo:  # what each further block of context costs a request
            row["bytes_per_table_entry"] = ((row[f"bytes_per_request@{hi}"]
                                             - row[f"bytes_per_request@{lo}"])
                                            / ((hi - lo) / BLOCK_SIZE))
        out["rows"].append(row)
    return out


def table(res: dict[str, Any]) -> str:
    rows = res["rows"]
    keys = [k for k in rows[0] if k != "allocator"]
    vllm = rows[0]["allocator"] == "vllm"
    lines = [f"block size {res['block_size']}, {res['requests']} requests per measurement "
             "(bytes, tracemalloc)",
             f"{'':26s}" + "".join(f"{r['allocator']:>16s}" for r in rows)
             + ("".join(f"{r['allocator'] + ' / vLLM':>24s}" for r in rows[1:]) if vllm else "")]
    for k in keys:
        vals = [r[k] for r in rows]
        line = f"{k:26s}" + "".join(f"{v:16.1f}" for v in vals)
        if vllm and vals[0]:
            line += "".join(f"{v / vals[0]:24.2f}" for v in vals[1:])
        lines.append(line)
    for n, pools in res.get("pool_layer_bytes_per_block", {}).items():
        lines.append(f"pool layer alone, bytes per block @{n}: " + ", ".join(
            f"{name} {'-' if v is None else f'{v:.1f}'}" for name, v in pools.items()))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--blocks", default="4096,16384")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--tokens", default="512,4096")
    ap.add_argument("--json", help="write the figures to this file")
    args = ap.parse_args(argv)
    res = run([int(b) for b in args.blocks.split(",")], args.requests,
              [int(t) for t in args.tokens.split(",")])
    print(table(res))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
