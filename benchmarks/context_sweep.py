"""Per-step allocator cost against context length, the batch held fixed.

    python benchmarks/context_sweep.py [--batch 64] [--steps 50] [--repeat 3] [--warmup 1]
                                       [--contexts 256,1024,4096,16384] [--json out.json]

Each of ``--batch`` requests is prefilled to the context length (untimed), then ``--steps``
decode steps are timed, each as an engine's step calls the allocator, through the step-level
calls: ``append_tokens_many`` (each request's token sampled last step), ``allocate_many``
(one more position each), one ``publish`` of the whole batch (the launch: block tables, slot
mapping, writes), its ``complete``, and ``commit_many``. (``allocate`` returns the whole
table, O(context) per call: engines use ``extend`` / ``allocate_many``, which return what they
added.) Prints the per-step time (best of ``--repeat``) for
checked and unchecked mode, per request and per table entry, and each context's time over the
shortest one's: flat means the step costs O(requests + blocks the step changes), not
O(context). ``--native`` makes the same calls on ``NativeAllocator`` (the native step path).
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from pathlib import Path

from pagedkv.allocator import BlockAllocator

B = 16


def prefill(checked: bool, batch: int, context: int,
            native: bool = False) -> tuple[BlockAllocator, list[str]]:
    blocks = batch * (context // B + 8) + 16
    if native:
        from pagedkv.allocator.native_allocator import NativeAllocator

        alloc = NativeAllocator(blocks, B, checked=checked)
    else:
        alloc = BlockAllocator(blocks, B, checked=checked)
    rids = [f"r{k}" for k in range(batch)]
    for k, rid in enumerate(rids):
        alloc.add_request(rid, [(k * 7919 + i) % 32000 for i in range(context)])
        alloc.allocate(rid, context)
    alloc.publish(rids).complete()
    for rid in rids:
        alloc.commit(rid, context)
    return alloc, rids


def decode_steps(alloc: BlockAllocator, rids: list[str], steps: int,
                 warmup: int = 0) -> float:
    """Seconds for ``steps`` decode steps of every request, after ``warmup`` untimed ones."""
    n = alloc.num_computed(rids[0])
    t0 = 0.0
    for s in range(warmup + steps):
        if s == warmup:
            gc.collect()
            t0 = time.perf_counter()
        n += 1
        alloc.append_tokens_many([(rid, [(n * 31 + s) % 32000]) for rid in rids])
        alloc.allocate_many([(rid, n) for rid in rids])
        alloc.publish(rids).complete()
        alloc.commit_many([(rid, n) for rid in rids])
    return time.perf_counter() - t0


def sweep(contexts: list[int], batch: int, steps: int, repeat: int, warmup: int = 1,
          native: bool = False) -> dict:
    out: dict = {"batch": batch, "steps": steps, "warmup": warmup, "block_size": B,
                 "allocator": "NativeAllocator" if native else "BlockAllocator", "rows": []}
    for checked in (False, True):
        for context in contexts:
            best = min(decode_steps(*prefill(checked, batch, context, native), steps, warmup)
                       for _ in range(repeat))
            per_step = best / steps
            out["rows"].append({"checked": checked, "context": context,
                                "us_per_step": per_step * 1e6,
                                "us_per_request": per_step * 1e6 / batch,
                                "ns_per_table_entry": per_step * 1e9 / (batch * context / B)})
    return out


def table(res: dict) -> str:
    lines = [f"{res.get('allocator', 'BlockAllocator')}: "
             f"batch {res['batch']} requests, {res['steps']} decode steps after "
             f"{res.get('warmup', 0)} untimed, block size {res['block_size']} (best of the "
             "repeats)",
             f"{'mode':10s} {'context':>8s} {'us/step':>10s} {'us/request':>11s} "
             f"{'ns/entry':>9s} {'vs shortest':>12s}"]
    for checked in (False, True):
        rows = [r for r in res["rows"] if r["checked"] == checked]
        base = rows[0]["us_per_step"]
        for r in rows:
            lines.append(f"{'checked' if checked else 'unchecked':10s} {r['context']:8d} "
                         f"{r['us_per_step']:10.1f} {r['us_per_request']:11.2f} "
                         f"{r['ns_per_table_entry']:9.2f} {r['us_per_step'] / base:12.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1,
                    help="untimed decode steps first: the first step after the prefill pays "
                         "one-time costs (the pool's compiled calls on first use, the table "
                         "rows and the launch's table copy growing past a power of two)")
    ap.add_argument("--contexts", default="256,1024,4096,16384")
    ap.add_argument("--native", action="store_true",
                    help="the native step path (NativeAllocator; needs numba)")
    ap.add_argument("--json", help="write the figures to this file")
    args = ap.parse_args(argv)
    res = sweep([int(c) for c in args.contexts.split(",")], args.batch, args.steps,
                args.repeat, args.warmup, args.native)
    print(table(res))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
