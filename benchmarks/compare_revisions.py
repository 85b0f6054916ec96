"""The native step path of an earlier commit against this tree's, side by side.

    python benchmarks/compare_revisions.py --rev 2f182f9 --processes 6

Checks ``--rev`` out into a temporary git worktree and runs the shared trace through vLLM's
``KVCacheManager`` and through ``NativeDriver`` with the step-level calls (what
``step_bench.py``'s ``native step-level`` row times), ``--rounds`` alternating rounds per
process, in ``--processes`` child processes that alternate between the revision's code and
this tree's. Each round prints pagedkv's allocator time over vLLM's from the same process,
so machine drift between processes cancels out of the ratio; the medians are printed at the
end, and the best (least) pagedkv time over the best vLLM time of each side's rounds (the
statistic of the other benchmarks: the least disturbed run of each). Needs the vLLM
anchor (``../shared/anchors/vllm_kvcache``) and numba.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ANCHOR = ROOT.parent / "shared" / "anchors" / "vllm_kvcache"
PACKAGES = ("allocator", "spec", "engine", "proofs", "kernels")


def child(tree: Path, rounds: int, requests: int) -> list[tuple[int, int]]:
    """(pagedkv's, vLLM's) allocator nanoseconds, one pair per round, with ``pagedkv``
    imported from ``tree``."""
    if tree != ROOT:  # this process imports the revision's code: the editable install's
        sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
        sys.path_hooks[:] = [h for h in sys.path_hooks if "editable" not in repr(h).lower()]
        sys.path_importer_cache.clear()
        package = types.ModuleType("pagedkv")
        package.__path__ = [str(tree / "_pkg" / "pagedkv")]
        sys.modules["pagedkv"] = package
    sys.path[:0] = [str(tree / "benchmarks"), str(ANCHOR)]
    import batched_loop
    import traces
    import vllm_kv
    spec = importlib.util.spec_from_file_location("bench_step", ANCHOR / "bench_step.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    from pagedkv.engine import native_driver

    trace = bench.make_trace(0, num_requests=requests)

    def native() -> int:
        kv = native_driver.make(2048, 16)
        gc.collect()
        return batched_loop.run(trace, kv)["alloc_ns"]

    def vllm() -> int:
        kv = vllm_kv.make(2048, 16)
        gc.collect()
        return traces.simulate(trace, kv)["totals"]["alloc_ns"]

    native()  # numba's caches loaded, the trace's first pass
    out = []
    for i in range(rounds):
        if i % 2:
            v, p = vllm(), native()
        else:
            p, v = native(), vllm()
        out.append((p, v))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rev", required=True, help="the earlier commit")
    ap.add_argument("--processes", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=500)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(Path(args.child), args.rounds, args.requests)))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree),
                        args.rev], check=True, capture_output=True)
        try:
            (tree / "_pkg" / "pagedkv").mkdir(parents=True)
            for name in PACKAGES:
                (tree / "_pkg" / "pagedkv" / name).symlink_to(tree / name)
            times: dict[str, list[tuple[int, int]]] = {args.rev: [], "this tree": []}
            for i in range(args.processes):
                name, where = (args.rev, tree) if i % 2 == 0 else ("this tree", ROOT)
                got = json.loads(subprocess.run(
                    [sys.executable, __file__, "--rev", args.rev, "--child", str(where),
                     "--rounds", str(args.rounds), "--requests", str(args.requests)],
                    check=True, capture_output=True, text=True).stdout.splitlines()[-1])
                times[name] += [tuple(pv) for pv in got]
                print(f"{name:>12s}: {', '.join(f'{p / v:.3f}' for p, v in got)}", flush=True)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                            str(tree)], check=False, capture_output=True)
    for name, pvs in times.items():
        ratios = [p / v for p, v in pvs]
        best = min(p for p, _ in pvs) / min(v for _, v in pvs)
        print(f"{name:>12s}: median {statistics.median(ratios):.3f} of pagedkv's time over "
              f"vLLM's per round, {best:.3f} best over best ({len(pvs)} rounds)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
