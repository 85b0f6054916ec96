"""NativeDriver: vLLM's scheduler calls over the native step path, with PagedKVDriver's decisions.

The anchor's traces run through both drivers, by the per-request loop (``traces.simulate``)
and by the batched one (``benchmarks/batched_loop.py``): every recorded result (hits, new
blocks, refusals, preemptions) must be the same, step by step. The driver's own refusals of
bad calls change nothing."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
from anchor_paths import VLLM_KVCACHE_CANDIDATES, anchor_unavailable

pytest.importorskip("numba")

from pagedkv.allocator import InvalidArgument, native_allocator  # noqa: E402
from pagedkv.allocator.allocator import RequestBook  # noqa: E402
from pagedkv.engine import driver as pk_driver  # noqa: E402
from pagedkv.engine import native_driver  # noqa: E402
from pagedkv.proofs.native_refinement import snapshot  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
_CANDIDATES = [Path(p) for p in VLLM_KVCACHE_CANDIDATES]
ANCHOR = next((p for p in _CANDIDATES if (p / "traces.py").is_file()), None)


def _load(name: str, path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def loops() -> Any:
    if ANCHOR is None:
        anchor_unavailable("its traces.py is not on this machine; looked in "
                           + ", ".join(map(str, _CANDIDATES)))
    return _load("anchor_traces_native", ANCHOR / "traces.py"), _load(
        "batched_loop_native", ROOT / "benchmarks" / "batched_loop.py")


def _trace(traces: Any, seed: int) -> list[dict]:
    return traces.make_trace(seed, num_requests=40, prompt_len=(8, 120), output_len=(4, 40),
                             system_len=(8, 64), burst=24)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("blocks", [96, 160])
def test_the_batched_loop_makes_the_same_decisions_through_both_drivers(loops, seed, blocks):
    traces, batched = loops
    trace = _trace(traces, seed)
    want: list[tuple] = []
    got: list[tuple] = []
    ref = batched.run(trace, pk_driver.make(blocks, 8), token_budget=256, max_running=16,
                      record_ops=want)
    d = native_driver.make_checked(blocks, 8)
    out = batched.run(trace, d, token_budget=256, max_running=16, record_ops=got)
    assert got == want
    assert out["steps"] == ref["steps"] and out["hit_tokens"] == ref["hit_tokens"]
    assert {op for _, op, *_ in got} >= {"add", "allocate", "commit", "append", "free"}
    assert list(d.alloc.requests) == [native_driver._NULL]  # everything was freed
    assert d.alloc.pool.structure_errors() == []


@pytest.mark.parametrize("seed", range(2))
def test_every_lookup_resumed_from_the_last_finds_what_a_fresh_lookup_finds(loops, seed,
                                                                            monkeypatch):
    """``NativeAllocator._hits`` resumes a request's lookup past its last hits while they
    are current, and past those still current where some are not; on a pool small enough
    to evict, each answer is ``RequestBook._hits``'s (the spec's lookup from the first
    block), some were resumed, and some from a part of their last hits."""
    traces, batched = loops
    d = native_driver.make(96, 8)
    alloc, resumed, partly = d.alloc, [0], [0]
    resume, leading_part = alloc._hits, native_allocator._leading_part

    def both(req: Any) -> list[int]:
        resumed[0] += req.hit_memo is not None
        got = resume(req)
        assert got == RequestBook._hits(alloc, req)
        return got

    def part(memo: Any, k: int) -> Any:
        out = leading_part(memo, k)
        partly[0] += out is not None
        return out

    alloc._hits = both
    monkeypatch.setattr(native_allocator, "_leading_part", part)
    batched.run(_trace(traces, seed), d, token_budget=256, max_running=16)
    assert resumed[0] > 10 and partly[0] > 0


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("caching", [True, False])
def test_the_per_request_loop_makes_the_same_decisions_through_both_drivers(loops, seed,
                                                                             caching):
    traces, _ = loops
    trace = _trace(traces, seed)
    want: list[tuple] = []
    got: list[tuple] = []
    ref = traces.simulate(trace, pk_driver.make(64, 8, enable_caching=caching),
                          token_budget=256, max_running=16, record_ops=want)
    out = traces.simulate(trace, native_driver.make(64, 8, enable_caching=caching),
                          token_budget=256, max_running=16, record_ops=got)
    assert got == want
    assert out["totals"]["preempted"] == ref["totals"]["preempted"] > 0
    assert out["totals"]["hit_tokens"] == ref["totals"]["hit_tokens"]
    assert (ref["totals"]["hit_tokens"] > 0) == caching


def test_observations_match_the_manager_drivers():
    pk, nat = pk_driver.make(64, 4), native_driver.make(64, 4)
    for d in (pk, nat):
        assert d.add("a", list(range(10))) == 0
        assert d.allocate("a", 10) is not None
        d.commit("a", 10)
        d.append("a", 5)
        assert d.add("b", list(range(10))) == 8  # two full blocks cached, never the last
    for name in ("usage", "num_free", "num_evictable"):
        assert getattr(pk, name)() == getattr(nat, name)(), name
    for name in ("block_ids", "num_tokens", "num_computed", "status", "table_len"):
        assert getattr(pk, name)("a") == getattr(nat, name)("a"), name
    want, got = pk.prefix_stats(), nat.prefix_stats()
    for key in ("lookups", "requests", "queries", "hits", "hit_rate"):
        assert want[key] == got[key], key


def _running(n: int = 3) -> native_driver.NativeDriver:
    d = native_driver.make(64, 4)
    for i in range(n):
        d.add(f"r{i}", list(range(i, i + 6)))
        d.allocate(f"r{i}", 6)
    d.commit_many([(f"r{i}", 6) for i in range(n)])
    d.append_many([(f"r{i}", 9) for i in range(n)])
    return d


def _state(d: native_driver.NativeDriver) -> Any:
    return (snapshot(d.alloc.pool), {r: d.block_ids(r) for r in d.requests},
            {r: (d.num_computed(r), d.num_tokens(r), d.status(r)) for r in d.requests},
            dict(d._scheduled), set(d._launched))


@pytest.mark.parametrize("call,error", [
    (lambda d: d.allocate_running(["r0", "zz"], [1, 1]), KeyError),
    (lambda d: d.allocate_running(["r0", "r1"], [1, 0]), ValueError),
    (lambda d: d.allocate_running(["r0", "r1"], [1, -2]), ValueError),
    (lambda d: d.allocate_running(["r0", "r1"], [1, 2.5]), TypeError),
    (lambda d: d.allocate_running(["r0", "r1"], [1, True]), TypeError),
    (lambda d: d.allocate_running(["r0", "r0"], [1, 1]), ValueError),
    (lambda d: d.allocate_running(["r0", "r1"], [1]), ValueError),
    (lambda d: d.commit_many([("r0", 7), ("r1", 99)]), ValueError),
    (lambda d: d.commit_many([("r0", 7), ("r1", 3)]), ValueError),
    (lambda d: d.commit_many([("r0", 7), ("r1", 6.5)]), ValueError),
    (lambda d: d.commit_many([("r0", 7), ("r1", True)]), ValueError),
    (lambda d: d.append_many([("r0", 1), ("r0", 2)]), ValueError),
    (lambda d: d.append_many([("r0", 1), ("r1", "x")]), InvalidArgument),
    (lambda d: d.append_many([("r0", 1), ("r1", True)]), InvalidArgument),
    (lambda d: d.append_many([("r0", 1), ("r1", 2**63)]), InvalidArgument),
    (lambda d: d.append_many([("r0", 1), ("r1", -(2**63) - 1)]), InvalidArgument),
    (lambda d: d.commit_many(["r0", "r1"], [7, 99]), ValueError),
    (lambda d: d.commit_many(["r0", "r1"], [7, 2**64]), ValueError),  # (past int64)
    (lambda d: d.allocate_running(["r0", "r1"], [1, 2**64]), ValueError),
    (lambda d: d.allocate_running(["r0", "r1"], [1, 2**63]), ValueError),
    (lambda d: d.allocate("r1", 2**64), ValueError),  # (a running one: its growth)
    (lambda d: d.commit("r1", 2**64), ValueError),
    (lambda d: d.commit_many(["r0", "r1"], [7, True]), ValueError),
    (lambda d: d.commit_many(["r0", "r1"], [7]), ValueError),
    (lambda d: d.commit_many(["r0"], [7, 7]), ValueError),
    (lambda d: d.append_many(["r0", "r0"], [1, 2]), ValueError),
    (lambda d: d.append_many(["r0", "r1"], [1, 2.0]), InvalidArgument),
    (lambda d: d.append_many(["r0", "r1"], [1]), ValueError),
])
def test_a_refused_step_level_call_changes_nothing(call, error):
    d = _running()
    d.step()
    d.allocate_running(["r0"], [1])
    before = _state(d)
    with pytest.raises(error):
        call(d)
    assert _state(d) == before


@pytest.mark.parametrize("make", [pk_driver.make, native_driver.make])
def test_step_level_calls_take_pairs_or_two_sequences_alike(make):
    """``commit_many(rids, counts)`` and ``append_many(rids, tokens)`` (tuples too) do what
    the pairs do: each request's own count and token (prompts of different lengths), the
    same tables and positions, and the sampled tokens where they belong (a prompt of a
    request's whole sequence hits every full block of it)."""
    rids = ["r0", "r1", "r2"]
    sequences = {rid: list(range(10 * i, 10 * i + 6 + i)) for i, rid in enumerate(rids)}
    drivers = [make(64, 4), make(64, 4)]
    for d in drivers:
        for rid, prompt in sequences.items():
            d.add(rid, list(prompt))
            d.allocate(rid, len(prompt))
    for step in range(6):
        counts = [len(sequences[rid]) for rid in rids]
        tokens = [100 * step + i for i in range(3)]
        for k, d in enumerate(drivers):
            d.step()
            if step:
                d.allocate_running(rids, [1, 1, 1])
            if k == 0:
                d.commit_many(list(zip(rids, counts, strict=True)))
                d.append_many(list(zip(rids, tokens, strict=True)))
            else:
                d.commit_many(tuple(rids), counts)
                d.append_many(rids, tuple(tokens))
        for rid, token in zip(rids, tokens, strict=True):
            sequences[rid].append(token)
    a, b = drivers
    for rid in rids:
        assert a.block_ids(rid) == b.block_ids(rid)
        want = (len(sequences[rid]) - 1, len(sequences[rid]))
        assert (a.num_computed(rid), a.num_tokens(rid)) == want
        assert (b.num_computed(rid), b.num_tokens(rid)) == want
    for rid, seq in sequences.items():
        full = (len(seq) - 1) // 4 * 4  # (the last block a commit filled, never the last token)
        assert a.add(f"q{rid}", seq + [7]) == b.add(f"q{rid}", seq + [7]) == full


def test_a_waiting_request_refuses_step_level_calls():
    d = _running()
    d.add("w", list(range(30, 36)))
    with pytest.raises(ValueError, match="not running"):
        d.allocate_running(["r0", "w"], [1, 1])
    with pytest.raises(ValueError, match="not running"):
        d.commit_many([("w", 1)])
    d.append_many([("w", 5), ("r0", 6)])  # a waiting request takes its sampled tokens too
    assert d.num_tokens("w") == 7 and d.num_tokens("r0") == 8


def test_a_running_pass_stops_at_the_first_request_that_does_not_fit():
    d = native_driver.make(12, 4)  # 11 usable blocks
    rids = ["r0", "r1", "r2"]
    for i, rid in enumerate(rids):
        d.add(rid, list(range(i, i + 12)))
        d.allocate(rid, 4)
    d.commit_many([(rid, 4) for rid in rids])
    got = d.allocate_running(rids, [8, 8, 8])  # 2 blocks each: 2 left
    assert [len(g) for g in got] == [2, 2, 2]
    d.commit_many([(rid, 12) for rid in rids])
    got = d.allocate_running(rids, [4, 8, 4])  # 1 block, then 2 (only 1 left): stop
    assert [len(g) for g in got] == [1]
    assert [d.alloc.num_reserved(r) for r in rids] == [16, 12, 12]
    assert d.num_free() == 1


def test_preemption_keeps_the_tokens_and_their_hashes():
    d = _running(1)
    hashes = list(d.alloc._requests["r0"].hashes)
    d.preempt("r0")
    assert d.status("r0") == "PREEMPTED" and d.num_computed("r0") == 0
    d.append_many([("r0", 4)])  # sampled meanwhile (async): kept with its tokens
    assert d.add("r0") == 4  # its own first block was cached when its launch completed
    assert d.alloc._requests["r0"].hashes[:len(hashes)] == hashes
    assert d.num_tokens("r0") == 8


def test_a_step_runs_one_launch_however_its_commits_come():
    """The step's first commit launches every request allocated since ``step()`` (in the
    order allocated); later commits of those requests in the same step are covered by it."""
    d = _running()
    clock = d.alloc.pool.view.clock
    d.step()
    d.allocate_running(["r0", "r1", "r2"], [3, 3, 3])
    for rid in ("r0", "r1", "r2"):
        d.append(rid, 11)
    before = int(clock[0])
    d.commit_many([("r0", 7), ("r1", 7), ("r2", 7)])  # the step's launch, of all three
    assert int(clock[0]) == before + 1
    d.commit_many([("r0", 8), ("r1", 8)])
    d.commit("r2", 8)
    assert int(clock[0]) == before + 1
    assert [d.num_computed(r) for r in ("r0", "r1", "r2")] == [8, 8, 8]
