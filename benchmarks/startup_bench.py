"""Start-up cost: import time, and the first serving step against the next ones.

The guards, effects, batched transitions and invariants run compiled from the spec; each is
compiled on first use and checked against the interpreted spec on the probe states before it
is trusted (``allocator/compiled.py``). Those code caches live per process, so the first step
of the first allocator pays for them and later allocators do not. Each figure comes from fresh
Python processes (best of ``--repeat``):

- ``import pagedkv.allocator`` and ``import pagedkv.engine``;
- one serving step (add a request, allocate, publish, complete, commit, append, free) on a
  new allocator: the first in the process, then the same step on a second allocator.

    python benchmarks/startup_bench.py [--repeat 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

IMPORT = """
import time
t = time.perf_counter()
import {module}
print(time.perf_counter() - t)
"""

FIRST_STEP = """
import time
from pagedkv.allocator import BlockAllocator

def step(checked):
    t = time.perf_counter()
    a = BlockAllocator(64, 16, checked=checked)
    a.add_request("r", list(range(40)))
    a.allocate("r", 40)
    a.publish(["r"]).complete()
    a.commit("r", 40)
    a.append_tokens("r", [7])
    a.allocate("r", 41)
    a.publish(["r"]).complete()
    a.commit("r", 41)
    a.free("r")
    return time.perf_counter() - t

first = step({checked})
print(first, step({checked}))
"""


def _run(src: str) -> list[float]:
    out = subprocess.run([sys.executable, "-c", src], capture_output=True, text=True,
                         check=True).stdout.split()
    return [float(x) for x in out]


def run(repeat: int) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for module in ("pagedkv.allocator", "pagedkv.engine"):
        rows[f"import {module} (ms)"] = min(_run(IMPORT.format(module=module))[0]
                                            for _ in range(repeat)) * 1e3
    for checked in (False, True):
        runs = [_run(FIRST_STEP.format(checked=checked)) for _ in range(repeat)]
        mode = "checked" if checked else "unchecked"
        rows[f"first step, {mode} (ms)"] = min(r[0] for r in runs) * 1e3
        rows[f"next step, {mode} (ms)"] = min(r[1] for r in runs) * 1e3
    return {"repeat": repeat, "python": sys.version.split()[0], "rows": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", help="write the figures to this file")
    args = ap.parse_args(argv)
    res = run(args.repeat)
    width = max(len(k) for k in res["rows"])
    for k, v in res["rows"].items():
        print(f"{k:{width}s}  {v:8.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
