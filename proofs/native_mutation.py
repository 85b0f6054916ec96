"""Mutation run of the native pool's own loops (``allocator/native_policy.py``).

``native_policy.py`` is not imported: its text is pasted into the module generated from the
spec (``native_source.module_source``), so the main mutation run (``proofs.mutation``, which
swaps imported modules) cannot reach it. Here each mutant of it (``proofs.mutation``'s
operators) becomes the policy text of a fresh generated module, in a child process with its
own cache folder, and ``tests/test_native_pool.py`` and ``tests/test_native_pool_stateful.py``
run against it (all but the tests that build modules of their own). A mutant is killed when
a test fails, a timeout when the run hangs (a probe loop that never ends), and survives
otherwise. numba checks every index in the children (``NUMBA_BOUNDSCHECK``), so reading past
an array is an error there, not a read of whatever memory lies beyond it.

    python -m pagedkv.proofs.native_mutation [--jobs 2] [--ids 3,17] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from .mutation import REPO, Mutant, Target, generate, mutated_source

TARGET = Target("allocator/native_policy.py", "pagedkv.allocator.native_policy", "allocator")
TESTS = ("tests/test_native_pool.py", "tests/test_native_pool_stateful.py")
# The tests that generate modules of their own (another spec, a corrupted module): each would
# compile again per mutant, and none of them exercises the policy more than the others do.
SKIP = ("spec_passed_in", "differs_from_the_spec", "verify_runs", "agrees_with_the_interpreted")
TIMEOUT_S = 60
_CHILD = ("import pathlib, sys, pytest\n"
          "import pagedkv.allocator.native_source as ns\n"
          "ns.POLICY = pathlib.Path(sys.argv[1])\n"
          "sys.exit(pytest.main(['-x', '-q', '-p', 'no:cacheprovider', *sys.argv[2].split(','),"
          " '-k', sys.argv[3]]))\n")


def run_one(m: Mutant, root: Path, work: Path) -> dict[str, Any]:
    policy = work / f"policy_{m.id}.py"
    policy.write_bytes(mutated_source(m, root))
    # Bounds-checked: a mutant that indexes past an array (a probe mask one too wide) raises
    # IndexError instead of reading whatever memory lies there.
    env = dict(os.environ, PAGEDKV_NATIVE_CACHE=str(work / "cache"), NUMBA_BOUNDSCHECK="1",
               NUMBA_ENABLE_CUDASIM="1", HYPOTHESIS_PROFILE="mutation")
    t0 = time.time()
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _CHILD, str(policy), ",".join(TESTS),
             " and ".join(f"not {s}" for s in SKIP)],
            cwd=root, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
        status = "survived" if proc.returncode == 0 else "killed"
    except subprocess.TimeoutExpired:
        status = "timeout"
    return {"id": m.id, "function": m.function, "line": m.line,
            "original": m.original.strip(), "mutated": m.mutated.strip(), "status": status,
            "seconds": round(time.time() - t0, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--ids", help="only these mutant ids (comma-separated)")
    ap.add_argument("--json", help="write every mutant's verdict to this file")
    args = ap.parse_args(argv)
    mutants = generate(TARGET, REPO)
    if args.ids:
        keep = {int(x) for x in args.ids.split(",")}
        mutants = [m for m in mutants if m.id in keep]
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(lambda m: run_one(m, REPO, Path(tmp)), mutants))
    counts = Counter(r["status"] for r in results)
    print(f"{len(results)} mutants of {TARGET.path}: " + ", ".join(
        f"{counts[s]} {s}" for s in ("killed", "timeout", "survived")))
    for r in results:
        if r["status"] == "survived":
            print(f"  survived #{r['id']} {r['function']}:{r['line']}: {r['original']} -> "
                  f"{r['mutated']}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
