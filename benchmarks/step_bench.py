"""Continuous-batching step benchmark: pagedkv.engine against vLLM 0.33.0's real KVCacheManager.

Runs the vLLM anchor's ``bench_step.run`` (``../shared/anchors/vllm_kvcache``: the
``traces.make_trace`` workload through ``traces.simulate``, only the driver calls timed, then
the recorded op log replayed and checked) twice in one process, on the same trace and pool:
with the anchor's vLLM driver and with ``pagedkv.engine.driver:make``. Prints both and the
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
DRIVERS = {"vllm": "vllm_kv:make", "pagedkv": "pagedkv.engine.driver:make"}


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
    v, p = out["vllm"], out["pagedkv"]
    print(f"{'':28s} {'vLLM 0.33.0':>14s} {'pagedkv':>14s} {'ratio':>8s}")
    rows = [("allocator s", v["allocator"]["total_s"], p["allocator"]["total_s"]),
            ("us per driver call", v["allocator"]["us_per_op"], p["allocator"]["us_per_op"])]
    rows += [(f"  {op} us/call", v["op_breakdown"][op]["us_per_call"],
              p["op_breakdown"][op]["us_per_call"]) for op in v["op_breakdown"]]
    for label, a, b in rows:
        print(f"{label:28s} {a:14.2f} {b:14.2f} {b / a if a else float('nan'):8.2f}")
    for key in ("preemptions", "prefix_hit_tokens", "prefix_hit_rate_first_admissions"):
        a, b = v["run"][key], p["run"][key]
        print(f"{key[:28]:28s} {a:>14.4g} {b:>14.4g}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
