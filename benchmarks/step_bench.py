"""Continuous-batching step benchmark: pagedkv.engine against vLLM 0.33.0's real KVCacheManager.

Runs the vLLM anchor's ``bench_step.run`` (``../shared/anchors/vllm_kvcache``: the
``traces.make_trace`` workload through ``traces.simulate``, only the driver calls timed, then
the recorded op log replayed and checked) three times in one process, on the same trace and
pool: with the anchor's vLLM driver, with ``pagedkv.engine.driver:make`` (unchecked) and with
``pagedkv.engine.driver:make_checked`` (checked mode, the library's default). Prints both and the
ratios per driver call; ``--json`` writes them. vLLM is used at benchmark time only (its wheel
is unpacked by the anchor's ``setup.sh`` under /tmp).

    python benchmarks/step_bench.py [--requests 300] [--blocks 2048] [--block-size 16]
                                    [--budget 8192] [--max-running 256] [--no-caching]
                                    [--seed 0] [--json out.json] [--rounds 1]

On a shared machine the speed drifts, between the drivers' runs of one process, by as much as
the differences measured. ``--rounds N`` runs the three drivers N times, interleaved, prints
each round's ratios and reports each driver's fastest run.

The pagedkv driver models each step as one launch of every request the step scheduled,
published at the step's first ``commit`` and completed there, so ``commit`` includes the
launch (block tables copied from the persistent rows, slot mapping, writes) and its
completion (caching the full blocks it wrote); vLLM does that caching inside
``allocate_slots``.

vLLM's KVCacheManager builds no launch: its model runner turns the block ids into block
tables and slot mappings, outside the calls timed here. So the pagedkv runs also time the
launch itself, inside those calls: the allocator's ``publish`` (tables, slot mapping, the
write marks of the spec's ``begin_write``) and the launch's completion (``end_write``, the
watermark), not the token sync or the caching that follow. The table prints it per step and
pagedkv's time without it beside vLLM's.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import importlib.util
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ANCHOR = Path(__file__).resolve().parents[1].parent / "shared" / "anchors" / "vllm_kvcache"
DRIVERS = {"vllm": "vllm_kv:make", "pagedkv": "pagedkv.engine.driver:make",
           "pagedkv checked": "pagedkv.engine.driver:make_checked"}
# The same trace through pagedkv's step-level calls (benchmarks/batched_loop.py).
STEP_LEVEL = {"step-level": "pagedkv.engine.driver:make",
              "step-level checked": "pagedkv.engine.driver:make_checked"}
# The native step path (pagedkv.engine.native_driver over NativeAllocator), both loops; with
# --native (needs numba).
NATIVE_DRIVERS = {"native": "pagedkv.engine.native_driver:make",
                  "native checked": "pagedkv.engine.native_driver:make_checked"}
NATIVE_STEP_LEVEL = {"native step-level": "pagedkv.engine.native_driver:make",
                     "native step-level checked": "pagedkv.engine.native_driver:make_checked"}


def load_bench() -> Any:
    if not (ANCHOR / "bench_step.py").is_file():
        sys.exit(f"step_bench: the vLLM anchor is not at {ANCHOR}")
    spec = importlib.util.spec_from_file_location("bench_step", ANCHOR / "bench_step.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@contextlib.contextmanager
def timing_launches(driver: str) -> Iterator[list[int]]:
    """While the block runs, the driver factory ``driver`` (``module:function``) times the
    launches of the first driver it makes (the simulated run's; the replay makes a second):
    its allocator's ``publish`` and each launch's completion, summed into the yielded
    ``[ns]``. The methods are wrapped on that allocator instance only."""
    module_name, _, fn = driver.partition(":")
    module = importlib.import_module(module_name)
    factory = getattr(module, fn)
    total = [0]
    made: list[Any] = []

    def timed(method: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter_ns()
            try:
                return method(*args, **kwargs)
            finally:
                total[0] += time.perf_counter_ns() - t0
        return run

    def make(*args: Any, **kwargs: Any) -> Any:
        kv = factory(*args, **kwargs)
        if not made:
            if hasattr(kv, "manager"):
                alloc = kv.manager.allocator
                # set before any launch exists: each Launch keeps the completion it is given
                alloc.publish = timed(alloc.publish)
                alloc._complete = timed(alloc._complete)
            else:  # the native driver: its launch, completed at once with the commits
                alloc = kv.alloc
                alloc._launch_and_commit = timed(alloc._launch_and_commit)
        made.append(kv)
        return kv

    setattr(module, fn, make)
    try:
        yield total
    finally:
        setattr(module, fn, factory)


def launch_figures(o: dict, launch_ns: int) -> dict[str, float]:
    total = o["allocator"]["total_s"]
    launch_s = launch_ns / 1e9
    return {"total_s": launch_s, "us_per_step": launch_ns / 1e3 / o["run"]["steps"],
            "share": launch_s / total, "rest_s": total - launch_s}


def run_step_level(bench: Any, args: argparse.Namespace, driver: str) -> dict[str, Any]:
    """The trace through ``batched_loop.run`` on a fresh driver from the factory ``driver``:
    the figures ``bench.run`` reports for the same run that ``main`` prints (allocator
    seconds, per-op milliseconds, the run's decisions) and the launch's share."""
    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    import batched_loop

    trace = bench.make_trace(args.seed, num_requests=args.requests)
    module_name, _, fn = driver.partition(":")
    with timing_launches(driver) as launch_ns:
        kv = getattr(importlib.import_module(module_name), fn)(
            args.blocks, args.block_size, enable_caching=not args.no_caching)
        gc.collect()
        res = batched_loop.run(trace, kv, token_budget=args.budget,
                               max_running=args.max_running)
    o = {"allocator": {"total_s": res["alloc_ns"] / 1e9},
         "op_breakdown": {op: {"calls": res["op_calls"][op],
                               "total_ms": res["op_ns"][op] / 1e6} for op in res["op_ns"]},
         "run": {"steps": res["steps"], "preemptions": res["preempted"],
                 "prefix_hit_tokens": res["hit_tokens"],
                 "prefix_hit_rate_first_admissions": res["first_admission_hits"] / max(
                     1, res["first_admission_tokens"])}}
    o["launch"] = launch_figures(o, launch_ns[0])
    return o


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--blocks", type=int, default=2048)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--budget", type=int, default=8192)
    ap.add_argument("--max-running", type=int, default=256)
    ap.add_argument("--no-caching", action="store_true")
    ap.add_argument("--json", help="write both runs' figures to this file")
    ap.add_argument("--native", action="store_true",
                    help="also run the native step path (NativeDriver), both loops")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run the three drivers this many times, interleaved, and report each "
                         "driver's fastest run (the least disturbed by the machine's drift)")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds must be >= 1")
    bench = load_bench()
    out: dict[str, Any] = {}
    drivers = {**DRIVERS, **(NATIVE_DRIVERS if args.native else {})}
    step_level = {**STEP_LEVEL, **(NATIVE_STEP_LEVEL if args.native else {})}
    totals: dict[str, list[float]] = {name: [] for name in (*drivers, *step_level)}
    for r in range(args.rounds):
        for name, driver in drivers.items():
            ns = argparse.Namespace(**{k: v for k, v in vars(args).items() if k != "rounds"},
                                    no_gc=False, driver=driver)
            if name == "vllm":
                o = bench.run(ns)
            else:
                with timing_launches(driver) as launch_ns:
                    o = bench.run(ns)
                o["launch"] = launch_figures(o, launch_ns[0])
            totals[name].append(o["allocator"]["total_s"])
            if name not in out or o["allocator"]["total_s"] < out[name]["allocator"]["total_s"]:
                out[name] = o
            if args.rounds == 1:
                print(f"== {name} ({driver})")
                print(bench.table(o))
                print()
        for name, driver in step_level.items():
            o = run_step_level(bench, args, driver)
            totals[name].append(o["allocator"]["total_s"])
            if name not in out or o["allocator"]["total_s"] < out[name]["allocator"]["total_s"]:
                out[name] = o
        if args.rounds > 1:
            v_s = totals["vllm"][-1]
            print(f"round {r + 1}: allocator s vLLM {v_s:.3f}; "
                  + ", ".join(f"{name} {t[-1]:.3f} ({t[-1] / v_s:.2f}x)"
                              for name, t in totals.items() if name != "vllm"), flush=True)
    if args.rounds > 1:
        print(f"\nthe fastest of {args.rounds} runs of each driver:\n")
        for name in out:
            out[name]["round_totals_s"] = totals[name]
    v, p, c = out["vllm"], out["pagedkv"], out["pagedkv checked"]
    print(f"{'':28s} {'vLLM 0.33.0':>12s} {'pagedkv':>12s} {'checked':>12s} "
          f"{'pagedkv/vLLM':>13s} {'checked/vLLM':>13s} {'checked/pagedkv':>16s}")

    def figures(o: dict) -> list[float]:
        return [o["allocator"]["total_s"], o["allocator"]["us_per_op"]] + [
            o["op_breakdown"][op]["us_per_call"] for op in v["op_breakdown"]]

    labels = ["allocator s", "us per driver call"] + [f"  {op} us/call"
                                                      for op in v["op_breakdown"]]
    for label, a, b, d in zip(labels, figures(v), figures(p), figures(c), strict=True):
        print(f"{label:28s} {a:12.2f} {b:12.2f} {d:12.2f} {b / a if a else float('nan'):13.2f} "
              f"{d / a if a else float('nan'):13.2f} {d / b if b else float('nan'):16.2f}")
    a_s = v["allocator"]["total_s"]
    print(f"{'  launch us/step':28s} {'-':>12s} {p['launch']['us_per_step']:12.2f} "
          f"{c['launch']['us_per_step']:12.2f}")
    print(f"{'allocator s without launch':28s} {a_s:12.2f} {p['launch']['rest_s']:12.2f} "
          f"{c['launch']['rest_s']:12.2f} {p['launch']['rest_s'] / a_s:13.2f} "
          f"{c['launch']['rest_s'] / a_s:13.2f} "
          f"{c['launch']['rest_s'] / p['launch']['rest_s']:16.2f}")
    for key in ("preemptions", "prefix_hit_tokens", "prefix_hit_rate_first_admissions"):
        print(f"{key[:28]:28s} " + " ".join(f"{o['run'][key]:>12.4g}" for o in (v, p, c)))
    print_step_level(out)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=str) + "\n")
    return 0


def print_step_level(out: dict[str, Any]) -> None:
    """Milliseconds per op and in all, per-request calls beside the step-level ones (same
    decisions: the steps, preemptions and prefix hits must agree with the per-request run)."""
    p = out["pagedkv"]["run"]
    for name in (*STEP_LEVEL, *NATIVE_DRIVERS, *NATIVE_STEP_LEVEL):
        if name not in out:
            continue
        s = out[name]["run"]
        same = all(s[k] == p[k] for k in ("steps", "preemptions", "prefix_hit_tokens"))
        if not same:
            raise SystemExit(f"step_bench: the {name} run decided otherwise than the "
                             f"per-request one: {s} vs {p}")
    names = [n for n in ("vllm", "pagedkv", "step-level", "pagedkv checked",
                         "step-level checked", *NATIVE_DRIVERS, *NATIVE_STEP_LEVEL)
             if n in out]
    print("\nallocator ms by op (step-level: one call per step for allocate, commit and "
          "append; same decisions as the per-request run)")
    print(f"{'':22s}" + "".join(f"{n:>27s}" for n in names))
    for op in out["vllm"]["op_breakdown"]:
        print(f"  {op:20s}" + "".join(
            f"{out[n]['op_breakdown'][op]['total_ms']:27.1f}" for n in names))
    print(f"  {'launch (in commit)':20s}{'-':>27s}" + "".join(
        f"{out[n]['launch']['total_s'] * 1e3:27.1f}" for n in names[1:]))
    v = out["vllm"]["allocator"]["total_s"]
    print(f"{'allocator s':22s}" + "".join(
        f"{out[n]['allocator']['total_s']:27.3f}" for n in names))
    print(f"{'/ vLLM':22s}" + "".join(
        f"{out[n]['allocator']['total_s'] / v:27.2f}" for n in names))
    print(f"{'speed x vLLM':22s}" + "".join(
        f"{v / out[n]['allocator']['total_s']:27.2f}" for n in names))


if __name__ == "__main__":
    raise SystemExit(main())
