"""benchmarks/lockstep_bench.py: its replay runs every recorded call of every driver, paced
to the longest run, and stops at a result that differs from the recording (so each round
makes the recorded decisions)."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest
from anchor_paths import VLLM_KVCACHE_CANDIDATES, anchor_unavailable

pytestmark = pytest.mark.vllm
pytest.importorskip("numba")

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
ANCHOR = next((c for c in VLLM_KVCACHE_CANDIDATES if (c / "vllm_kv.py").is_file()), None)


@pytest.fixture(scope="module")
def lockstep() -> Any:
    """(the benchmark module, the anchor's traces module), with the anchor on the path."""
    if ANCHOR is None:
        anchor_unavailable("its vllm_kv.py is not on this machine; looked in "
                           + ", ".join(map(str, VLLM_KVCACHE_CANDIDATES)))
    added = [str(ANCHOR), str(BENCHMARKS)]
    sys.path[:0] = added
    try:
        spec = importlib.util.spec_from_file_location("lockstep_bench_t",
                                                      BENCHMARKS / "lockstep_bench.py")
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        import traces
        yield mod, traces
    finally:
        for path in added:
            sys.path.remove(path)


def _args(**kw: Any) -> argparse.Namespace:
    base = {"blocks": 96, "block_size": 16, "budget": 512, "max_running": 32,
            "no_gc": False, "no_checked": False}
    return argparse.Namespace(**{**base, **kw})


@pytest.fixture(scope="module")
def recorded(lockstep: Any) -> tuple[Any, dict[str, Any]]:
    mod, traces = lockstep
    trace = traces.make_trace(3, num_requests=40, prompt_len=(8, 120), output_len=(4, 40),
                              system_len=(8, 64), burst=24)
    return mod, mod.record(trace, _args())


def test_a_round_replays_every_recorded_call_of_every_driver(recorded):
    mod, logs = recorded
    assert set(logs) == {"vllm", *mod.PAGEDKV}
    lengths = {name: len(steps) for name, steps in logs.items()}
    assert len(set(lengths.values())) > 1, "the runs' step counts differ: pacing is exercised"
    got = mod.replay(logs, _args())
    for name, steps in logs.items():
        calls = [c for step in steps for c in step]
        assert got[name]["calls"] == len(calls) > 0
        assert set(got[name]["by_method_ns"]) == {method for method, _, _ in calls}
        assert got[name]["total_ns"] == sum(got[name]["by_method_ns"].values()) > 0


@pytest.mark.parametrize("name", ["vllm", "native step-level"])
def test_a_result_that_differs_from_the_recording_stops_the_round(recorded, name):
    mod, logs = recorded
    steps = [list(step) for step in logs[name]]
    s, i = next((s, i) for s, step in enumerate(steps) for i, (method, _, out) in
                enumerate(step) if method == "add" and out == 0)
    method, call_args, _ = steps[s][i]
    steps[s][i] = (method, call_args, 16)  # a hit the recorded run did not find
    with pytest.raises(SystemExit, match=f"{name}: add"):
        mod.replay({**logs, name: steps}, _args())


def test_no_checked_replays_vllm_and_the_unchecked_driver_only(recorded):
    mod, logs = recorded
    args = _args(no_checked=True)
    assert list(mod.variants(args)) == ["native step-level"]
    got = mod.replay({k: v for k, v in logs.items() if k in ("vllm", "native step-level")}, args)
    assert set(got) == {"vllm", "native step-level"}
