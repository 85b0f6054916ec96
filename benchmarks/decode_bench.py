"""Decode steps through the scheduler's calls: pagedkv.engine beside vLLM 0.33.0's KVCacheManager.

    python benchmarks/decode_bench.py [--requests 1,8,27,64,128] [--steps 200] [--repeat 5]
                                      [--prompt 300] [--block-size 16] [--json out.json]

``step_bench.py`` runs a whole trace once per driver, so the machine's drift between the
drivers' runs is as large as a 10 % change. This benchmark holds the workload to the part that
repeats every step, and interleaves the drivers: for each batch size N, ``--repeat`` rounds, each
running vLLM's driver (the anchor's ``vllm_kv.make``, ``../shared/anchors/vllm_kvcache``), then
``pagedkv.engine.driver:make`` (unchecked), then ``make_checked`` (checked mode), each on a
fresh pool. A round admits N requests of ``--prompt`` random tokens (no prefix hits), untimed,
then times ``--steps`` decode steps, each as the anchor's ``traces.simulate`` calls the driver:
``step()``, ``allocate(rid, 1)`` for every request, ``commit`` of each (the pagedkv driver's
first commit of a step publishes and completes the step's launch), ``append`` of each sampled
token. Prints the median over the rounds of each call's time per request and step, the totals
beside vLLM's, and, fitted over the batch sizes, each driver's cost per step as
``fixed + per_request * N`` (least squares).

Two more rows, in the same rounds, run the same decode steps through ``BlockAllocator``'s
step-level calls, as an engine that batches its step would make them (``step-level`` unchecked
and checked): ``allocate_many`` of one more position each (the allocate column), one
``publish`` of the batch, its completion and ``commit_many`` (commit), ``append_tokens_many``
of the sampled tokens (append). No per-request call crosses the engine front door there: the
difference from the ``pagedkv`` rows is what the per-request, vLLM-shaped calls cost.

The native rows: ``native step-level`` makes the same step-level calls on ``NativeAllocator``
(each one native loop over the batch); ``native driver`` makes the vLLM-shaped per-request
calls on ``pagedkv.engine.native_driver`` (the native step path behind the anchor's calls).
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

ANCHOR = Path(__file__).resolve().parents[1].parent / "shared" / "anchors" / "vllm_kvcache"
CALLS = ("step", "allocate", "commit", "append")


def runners() -> dict[str, Callable[..., dict[str, float]]]:
    """Each row's round: ``run(n, steps, prompt, block_size, seed)``, seconds per request and
    step of each call."""
    from pagedkv.engine import native_driver
    from pagedkv.engine.driver import make, make_checked

    if not (ANCHOR / "vllm_kv.py").is_file():
        sys.exit(f"decode_bench: the vLLM anchor is not at {ANCHOR}")
    sys.path.insert(0, str(ANCHOR))
    import vllm_kv  # the anchor's driver over vLLM's real KVCacheManager

    return {"vllm": partial(one_round, vllm_kv.make), "pagedkv": partial(one_round, make),
            "pagedkv checked": partial(one_round, make_checked),
            "step-level": partial(one_round_step_level, False),
            "step-level checked": partial(one_round_step_level, True),
            "native step-level": partial(one_round_step_level, False, native=True),
            "native step-level checked": partial(one_round_step_level, True, native=True),
            "native driver": partial(one_round, native_driver.make),
            "native driver checked": partial(one_round, native_driver.make_checked)}


def pool_blocks(n: int, steps: int, prompt: int, block_size: int) -> int:
    return n * (-(-(prompt + steps + block_size) // block_size)) + 64


def one_round(factory: Callable[..., Any], n: int, steps: int, prompt: int, block_size: int,
              seed: int) -> dict[str, float]:
    """Seconds per request and step of each call, over ``steps`` decode steps of n requests."""
    num_blocks = pool_blocks(n, steps, prompt, block_size)
    kv = factory(num_blocks, block_size, enable_caching=True)
    rng = random.Random(seed)
    rids = [f"r{i}" for i in range(n)]
    computed = dict.fromkeys(rids, prompt)
    kv.step()
    for r in rids:
        kv.add(r, [rng.randrange(32000) for _ in range(prompt)])
        if kv.allocate(r, prompt) is None:
            raise RuntimeError(f"admission of {r} failed on a pool of {num_blocks} blocks")
    for r in rids:
        kv.commit(r, prompt)
    for r in rids:
        kv.append(r, rng.randrange(32000))
    tokens = [rng.randrange(32000) for _ in range(steps)]
    spent = dict.fromkeys(CALLS, 0.0)
    clock = time.perf_counter
    gc.collect()
    for s in range(steps):
        t0 = clock()
        kv.step()
        t1 = clock()
        for r in rids:
            if kv.allocate(r, 1) is None:
                raise RuntimeError(f"decode allocation of {r} failed")
        t2 = clock()
        for r in rids:
            computed[r] += 1
            kv.commit(r, computed[r])
        t3 = clock()
        token = tokens[s]
        for r in rids:
            kv.append(r, token)
        t4 = clock()
        spent["step"] += t1 - t0
        spent["allocate"] += t2 - t1
        spent["commit"] += t3 - t2
        spent["append"] += t4 - t3
    return {call: t / (steps * n) for call, t in spent.items()}


def one_round_step_level(checked: bool, n: int, steps: int, prompt: int, block_size: int,
                         seed: int, *, native: bool = False) -> dict[str, float]:
    """``one_round``'s prompts and decode steps through ``BlockAllocator``'s step-level calls
    (see the module docstring), or with ``native`` through ``NativeAllocator``'s (the same
    calls, as native loops); ``step`` has no call there."""
    from pagedkv.allocator import BlockAllocator
    from pagedkv.allocator.native_allocator import NativeAllocator

    alloc = (NativeAllocator if native else BlockAllocator)(
        pool_blocks(n, steps, prompt, block_size), block_size, prefix_caching=True,
        checked=checked)
    rng = random.Random(seed)
    rids = [f"r{i}" for i in range(n)]
    for r in rids:
        alloc.add_request(r, [rng.randrange(32000) for _ in range(prompt)])
        alloc.allocate(r, prompt)
    alloc.publish(rids).complete()
    alloc.commit_many([(r, prompt) for r in rids])
    alloc.append_tokens_many([(r, [rng.randrange(32000)]) for r in rids])
    tokens = [rng.randrange(32000) for _ in range(steps)]
    spent = dict.fromkeys(CALLS, 0.0)
    computed = prompt
    clock = time.perf_counter
    gc.collect()
    for s in range(steps):
        t1 = clock()
        alloc.allocate_many([(r, computed + 1) for r in rids])
        t2 = clock()
        computed += 1
        alloc.publish(rids).complete()
        alloc.commit_many([(r, computed) for r in rids])
        t3 = clock()
        token = tokens[s]
        alloc.append_tokens_many([(r, [token]) for r in rids])
        t4 = clock()
        spent["allocate"] += t2 - t1
        spent["commit"] += t3 - t2
        spent["append"] += t4 - t3
    return {call: t / (steps * n) for call, t in spent.items()}


def fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least-squares ``(fixed, per_request)`` of ``us_per_step = fixed + per_request * n``."""
    ns = [n for n, _ in points]
    ys = [y for _, y in points]
    mean_n, mean_y = statistics.fmean(ns), statistics.fmean(ys)
    var = sum((n - mean_n) ** 2 for n in ns)
    slope = sum((n - mean_n) * (y - mean_y) for n, y in points) / var if var else 0.0
    return mean_y - slope * mean_n, slope


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", default="1,8,27,64,128",
                    help="comma-separated batch sizes (requests decoding each step)")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--prompt", type=int, default=300)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the figures to this file")
    args = ap.parse_args(argv)
    sizes = [int(x) for x in args.requests.split(",") if x.strip()]
    if not sizes or min(sizes) < 1 or args.steps < 1 or args.repeat < 1 or args.prompt < 1:
        ap.error("--requests, --steps, --repeat and --prompt need positive values")
    makers = runners()
    figures: dict[str, dict[int, dict[str, float]]] = {name: {} for name in makers}
    for n in sizes:
        rounds: dict[str, list[dict[str, float]]] = {name: [] for name in makers}
        for k in range(args.repeat):
            for name, run in makers.items():
                rounds[name].append(run(n, args.steps, args.prompt, args.block_size,
                                        args.seed + k))
        for name, runs in rounds.items():
            med = {call: statistics.median(r[call] for r in runs) * 1e6 for call in CALLS}
            med["total"] = statistics.median(sum(r.values()) for r in runs) * 1e6
            figures[name][n] = med
    header = f"{'requests':>8s} {'driver':18s} " + " ".join(f"{c:>9s}" for c in CALLS) + (
        f" {'total':>9s} {'/ vLLM':>7s} {'/ unchecked':>11s}")
    print("us per request and step (median of the rounds)")
    print(header)
    for n in sizes:
        for name in makers:
            f = figures[name][n]
            ratio = f["total"] / figures["vllm"][n]["total"]
            unchecked = name.removesuffix(" checked")
            vs_unchecked = (f"{f['total'] / figures[unchecked][n]['total']:11.2f}"
                            if name != unchecked else f"{'':11s}")
            print(f"{n:8d} {name:18s} " + " ".join(f"{f[c]:9.2f}" for c in CALLS)
                  + f" {f['total']:9.2f} {ratio:7.2f} {vs_unchecked}")
    fits: dict[str, dict[str, float]] = {}
    if len(sizes) > 1:
        print("\ncost per step = fixed + per_request x N (least squares over the batch sizes)")
        for name in makers:
            fixed, per = fit([(n, figures[name][n]["total"] * n) for n in sizes])
            fits[name] = {"fixed_us": fixed, "per_request_us": per}
            print(f"{name:18s} fixed {fixed:8.1f} us   per request {per:6.2f} us")
    if args.json:
        out = {"config": vars(args), "us_per_request_step": figures, "fit": fits}
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
