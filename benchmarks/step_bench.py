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
                                    [--seed 0] [--json out.json]

The pagedkv driver models each step as one launch of every request the step scheduled,
published at the step's first ``commit`` and completed there, so ``commit`` includes the
launch (block tables copied from the persistent rows, slot mapping, writes) and its
completion (caching the full blocks it wrote); vLLM does that caching inside
``allocate_slots``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

ANCHOR = Path(__file__).resolve().parents[1].parent / "shared" / "anchors" / "vllm_kvcache"
DRIVERS = {"vllm": "vllm_kv:make", "pagedkv": "pagedkv.engine.driver:make",
           "pagedkv checked": "pagedkv.engine.driver:make_checked"}


def load_bench() -> Any:
    if not (ANCHOR / "bench_step.py").is_file():
        sys.exit(f"step_bench: the vLLM anchor is not at {ANCHOR}")
    spec = importlib.util.spec_from_file_location("bench_step", ANCHOR / "bench_step.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


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
    args = ap.parse_args(argv)
    bench = load_bench()
    out: dict[str, Any] = {}
    for name, driver in DRIVERS.items():
        ns = argparse.Namespace(**vars(args), no_gc=False, driver=driver)
        out[name] = bench.run(ns)
        print(f"== {name} ({driver})")
        print(bench.table(out[name]))
        print()
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
    for key in ("preemptions", "prefix_hit_tokens", "prefix_hit_rate_first_admissions"):
        print(f"{key[:28]:28s} " + " ".join(f"{o['run'][key]:>12.4g}" for o in (v, p, c)))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
