"""Start-up cost: import time, and the first serving step against the next ones.

The guards, effects, batched transitions and invariants run compiled from the spec; each is
compiled on first use and checked against the interpreted spec on the probe states before it
is trusted (``allocator/compiled.py``). Those code caches live per process, so the first step
of the first allocator pays for them and later allocators do not. Each figure comes from fresh
Python processes (best of ``--repeat``):

- ``import pagedkv.allocator`` and ``import pagedkv.engine``;
- one serving step (add a request, allocate, publish, complete, commit, append, free) on a
  new allocator: the first in the process, then the same step on a second allocator;
- the native pool (``NativePool``, checked; with numba): its import, a pool and a step of
  batched calls in a process whose cache folder is cold (numba compiles the module generated
  from the spec, and the module is self-checked), then warm (numba's cache; the self-check
  runs again, once per process), and a second pool in the same process;
- the native step path (``NativeAllocator``, checked; with numba): the same, with a request's
  prefill and one decode step through its calls.

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


NATIVE_STEP = """
import time
t = time.perf_counter()
from pagedkv.allocator.native_pool import NativePool
imported = time.perf_counter() - t

def step():
    t = time.perf_counter()
    p = NativePool(64, 16)
    p.open_holder("r")
    b = p.take_many("r", 3)
    p.publish_many("r", b)
    p.begin_write_many("r", b, 16)
    p.end_write_many(b)
    p.commit_many("r", b, [11, 12, 13])
    p.open_holder("s")
    p.share_many("s", p.prefix_hits([11, 12, 13]))
    p.release_many("s", b[::-1])
    p.release_many("r", b[::-1])
    p.close_holder("s")
    p.close_holder("r")
    return time.perf_counter() - t

print(imported, step(), step())
"""


NATIVE_ALLOCATOR_STEP = """
import time
t = time.perf_counter()
from pagedkv.allocator.native_allocator import NativeAllocator
imported = time.perf_counter() - t

def step():
    t = time.perf_counter()
    a = NativeAllocator(64, 16)
    a.add_request("r", list(range(40)))
    a.allocate("r", 40)
    a.publish(["r"]).complete()
    a.commit("r", 40)
    a.append_tokens_many([("r", [7])])
    a.allocate_many([("r", 41)])
    a.publish(["r"]).complete()
    a.commit_many([("r", 41)])
    a.free("r")
    return time.perf_counter() - t

print(imported, step(), step())
"""


def _run(src: str, **env: str) -> list[float]:
    import os

    out = subprocess.run([sys.executable, "-c", src], capture_output=True, text=True,
                         check=True, env={**os.environ, **env}).stdout.split()
    return [float(x) for x in out]


def run_native(repeat: int) -> dict[str, float]:
    """The native pool (checked): its import, the first pool and step of a process with a
    cold cache folder (numba compiles the generated module), with a warm one (numba's cache),
    and a second pool in the same process."""
    import tempfile

    rows: dict[str, float] = {}
    cold, warm = [], []
    for _ in range(repeat):
        with tempfile.TemporaryDirectory() as cache:
            cold.append(_run(NATIVE_STEP, PAGEDKV_NATIVE_CACHE=cache))
            warm.append(_run(NATIVE_STEP, PAGEDKV_NATIVE_CACHE=cache))
    rows["import pagedkv.allocator.native_pool (ms)"] = min(r[0] for r in warm) * 1e3
    rows["first native pool + step, cold cache (ms)"] = min(r[1] for r in cold) * 1e3
    rows["first native pool + step, warm cache (ms)"] = min(r[1] for r in warm) * 1e3
    rows["next native pool + step (ms)"] = min(r[2] for r in warm) * 1e3
    cold, warm = [], []
    for _ in range(repeat):
        with tempfile.TemporaryDirectory() as cache:
            cold.append(_run(NATIVE_ALLOCATOR_STEP, PAGEDKV_NATIVE_CACHE=cache))
            warm.append(_run(NATIVE_ALLOCATOR_STEP, PAGEDKV_NATIVE_CACHE=cache))
    rows["import pagedkv.allocator.native_allocator (ms)"] = min(r[0] for r in warm) * 1e3
    rows["first native allocator + step, cold cache (ms)"] = min(r[1] for r in cold) * 1e3
    rows["first native allocator + step, warm cache (ms)"] = min(r[1] for r in warm) * 1e3
    rows["next native allocator + step (ms)"] = min(r[2] for r in warm) * 1e3
    return rows


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
    try:
        import numba  # noqa: F401
    except ImportError:
        pass
    else:
        rows.update(run_native(max(1, repeat // 2)))
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
