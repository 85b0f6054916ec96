"""vLLM's KVCacheManager and pagedkv's native step path timed step by step, side by side.

    python benchmarks/lockstep_bench.py [--requests 500] [--rounds 5] [--json out.json]

``step_bench.py`` runs each driver through the whole trace in turn; on a shared machine whose
speed drifts by tens of percent within a minute, a ratio of two runs made seconds apart carries
that drift. Here the drift is taken out of the ratio: the trace is first run once through
each driver (vLLM's through the anchor's ``traces.simulate``, pagedkv's through
``batched_loop.run``, the loops ``step_bench.py`` times), recording every timed driver call
with its arguments and result, step by step; then each round replays all the recordings on
fresh drivers in lockstep: step ``s`` of every driver, one after the other (the order rotated
each step), before step ``s + 1`` of any. (vLLM's run takes a few steps fewer than pagedkv's:
it admits some requests earlier, on hits whose KV is not written yet, which pagedkv refuses.
So the shorter runs are paced to the longest: after ``i`` of its ``n`` steps, each driver has
replayed the same share of its own.) Each call is timed alone (``perf_counter_ns``, the
method looked up before the clock starts) and its result checked equal to the recorded one,
so every round makes the decisions of the recorded runs. A round's ratio compares times
taken within the same few hundred microseconds, step after step.

What differs from ``step_bench.py``'s runs: each driver's step starts with the CPU caches
left by the other drivers' steps (in an engine, the scheduler's and the model runner's code
runs between two steps' allocator calls), so both run slower than in a loop of their own,
pagedkv's few large calls proportionally more than vLLM's many small ones. The recordings
are frozen out of the garbage collector's scans (``gc.freeze``); the collector stays on
(``--no-gc``: off while a round replays).

Prints each round's allocator seconds per driver and the ratios to vLLM's, then the median
and range of the per-round ratios and each driver's milliseconds per call name. Needs the
vLLM anchor (``../shared/anchors/vllm_kvcache``) and numba.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import statistics
import sys
from pathlib import Path
from time import perf_counter_ns
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import step_bench  # noqa: E402  (the anchor's loader, on this folder's path)

# The driver calls the two loops time (``traces.simulate``'s, ``batched_loop.run``'s).
TIMED = frozenset({"step", "add", "allocate", "allocate_running", "preempt", "commit",
                   "commit_many", "append", "append_many", "free"})
PAGEDKV = {"native step-level": "make", "native step-level checked": "make_checked"}

Call = tuple[str, tuple[Any, ...], Any]


class Recorder:
    """A driver whose timed calls are recorded, a list of ``(method, args, result)`` per
    step (a step starts at ``step()``); every other attribute is the driver's."""

    def __init__(self, driver: Any) -> None:
        self._driver = driver
        self.steps: list[list[Call]] = []

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self._driver, name)
        if name not in TIMED:
            return fn
        steps = self.steps

        def call(*args: Any) -> Any:
            if name == "step":
                steps.append([])
            kept = copy.deepcopy(args)
            out = fn(*args)
            steps[-1].append((name, kept, copy.deepcopy(out)))
            return out
        return call


def record(trace: list[dict], args: argparse.Namespace) -> dict[str, Any]:
    """Each driver's recording of the trace (vLLM's, then each pagedkv variant's)."""
    import batched_loop
    import traces
    import vllm_kv

    from pagedkv.engine import native_driver

    logs: dict[str, Any] = {}
    kv = Recorder(vllm_kv.make(args.blocks, args.block_size))
    traces.simulate(trace, kv, token_budget=args.budget, max_running=args.max_running)
    logs["vllm"] = kv.steps
    for name, factory in variants(args).items():
        kv = Recorder(getattr(native_driver, factory)(args.blocks, args.block_size))
        batched_loop.run(trace, kv, token_budget=args.budget, max_running=args.max_running)
        logs[name] = kv.steps
    return logs


def variants(args: argparse.Namespace) -> dict[str, str]:
    """The pagedkv drivers replayed beside vLLM's (by name: their factory in
    ``native_driver``)."""
    return {name: factory for name, factory in PAGEDKV.items()
            if not (args.no_checked and "checked" in name)}


def _fresh(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """The recorded arguments with each list copied (a driver may keep or extend a list it
    is given, such as a prompt)."""
    return tuple(list(a) if type(a) is list else a for a in args)


def replay(logs: dict[str, list[list[Call]]], args: argparse.Namespace) -> dict[str, Any]:
    """One lockstep round on fresh drivers: per driver, allocator ns in all and by method,
    and the calls replayed (every recorded one; ``SystemExit`` if a result differs from
    the recorded one)."""
    import vllm_kv

    from pagedkv.engine import native_driver

    drivers = {"vllm": vllm_kv.make(args.blocks, args.block_size)}
    for name, factory in variants(args).items():
        drivers[name] = getattr(native_driver, factory)(args.blocks, args.block_size)
    names = list(drivers)
    by_method: dict[str, dict[str, int]] = {name: {} for name in names}
    replayed = dict.fromkeys(names, 0)
    clock = perf_counter_ns
    longest = max(len(logs[name]) for name in names)
    done = dict.fromkeys(names, 0)  # steps replayed
    gc.collect()
    if args.no_gc:
        gc.disable()
    for s in range(longest):
        k = s % len(names)
        for name in names[k:] + names[:k]:
            driver, ns, log = drivers[name], by_method[name], logs[name]
            upto = (s + 1) * len(log) // longest  # (each driver at the same share of its run)
            calls = [c for step in log[done[name]:upto] for c in step]
            done[name] = upto
            replayed[name] += len(calls)
            for method, recorded, want in calls:
                fn, call_args = getattr(driver, method), _fresh(recorded)
                t0 = clock()
                got = fn(*call_args)
                dt = clock() - t0
                ns[method] = ns.get(method, 0) + dt
                if got != want:
                    raise SystemExit(f"lockstep_bench: {name}: {method}{recorded} -> "
                                     f"{got!r}, recorded {want!r}")
    gc.enable()
    return {name: {"total_ns": sum(ns.values()), "by_method_ns": ns, "calls": replayed[name]}
            for name, ns in by_method.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--requests", type=int, default=500)
    ap.add_argument("--blocks", type=int, default=2048)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--budget", type=int, default=8192)
    ap.add_argument("--max-running", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--no-checked", action="store_true",
                    help="replay vLLM's and the unchecked driver's recordings only")
    ap.add_argument("--no-gc", action="store_true",
                    help="the cyclic garbage collector off while a round replays")
    ap.add_argument("--json", help="write every round's figures to this file")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds must be >= 1")
    bench = step_bench.load_bench()
    sys.path.insert(0, str(step_bench.ANCHOR))
    trace = bench.make_trace(args.seed, num_requests=args.requests)
    logs = record(trace, args)
    gc.collect()
    gc.freeze()  # the recordings (every call's arguments) kept out of the collector's scans
    steps = len(logs["vllm"])
    calls = {name: sum(map(len, s)) for name, s in logs.items()}
    print(f"{args.requests} requests, {steps} steps; timed calls: "
          + ", ".join(f"{name} {n}" for name, n in calls.items()), flush=True)
    names = list(variants(args))
    rounds = []
    for r in range(args.rounds):
        got = replay(logs, args)
        rounds.append(got)
        v = got["vllm"]["total_ns"]
        print(f"round {r + 1}: allocator s vLLM {v / 1e9:.3f}; " + ", ".join(
            f"{name} {got[name]['total_ns'] / 1e9:.3f} ({got[name]['total_ns'] / v:.3f} of "
            f"vLLM's time)" for name in names), flush=True)
    summary = {}
    for name in names:
        ratios = [g[name]["total_ns"] / g["vllm"]["total_ns"] for g in rounds]
        summary[name] = {"median": statistics.median(ratios), "min": min(ratios),
                         "max": max(ratios), "ratios": ratios}
        print(f"{name}: median {summary[name]['median']:.3f} of vLLM's time per round "
              f"({1 / summary[name]['median']:.2f}x vLLM's speed), range "
              f"{min(ratios):.3f}-{max(ratios):.3f} over {len(ratios)} rounds")
    print("\nms by driver call (median over the rounds):")
    for name in ("vllm", *names):
        methods = sorted({m for g in rounds for m in g[name]["by_method_ns"]})
        print(f"  {name}: " + ", ".join(
            f"{m} {statistics.median(g[name]['by_method_ns'].get(m, 0) for g in rounds) / 1e6:.1f}"
            for m in methods))
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"args": vars(args), "steps": steps, "calls": calls, "rounds": rounds,
             "summary": summary}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
