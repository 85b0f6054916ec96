"""The engine's step-level calls (``KVCacheManager.allocate_slots_many`` /
``append_token_many``, the driver's ``allocate_running`` / ``commit_many`` / ``append_many``):
each is its single call repeated, a refusal of bad input changes nothing, and a scheduler
that batches its steps through them (``benchmarks/batched_loop.py``) makes the same
decisions as the anchor's per-request loop (``traces.simulate``)."""

from __future__ import annotations

import importlib.util
import random
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from anchor_paths import VLLM_KVCACHE_CANDIDATES, anchor_unavailable

from pagedkv.allocator import InvalidArgument
from pagedkv.engine import EngineRequest, KVCacheManager, RequestStatus
from pagedkv.engine import driver as pk_driver

B = 4
ROOT = Path(__file__).resolve().parents[1]


def _admit(m: KVCacheManager, req: EngineRequest) -> None:
    blocks, hits, _ = m.get_computed_blocks(req)
    assert m.allocate_slots(req, req.num_tokens - hits, hits, blocks) is not None
    req.status = RequestStatus.RUNNING
    req.num_computed_tokens = hits


def _world(seed: int, num_blocks: int = 24) -> tuple[KVCacheManager, list[EngineRequest]]:
    """A manager with a few running requests whose last launch completed, at varied
    positions within and at the end of their tables (decode and prefill chunks)."""
    rng = random.Random(seed)
    m = KVCacheManager(num_blocks, B, checked=True)
    shared = [rng.randrange(50) for _ in range(2 * B)]
    reqs = []
    for i in range(5):
        prompt = shared[: rng.randrange(2 * B + 1)] + [rng.randrange(50)
                                                       for _ in range(rng.randrange(1, 7))]
        req = EngineRequest(f"r{i}", prompt)
        _admit(m, req)
        reqs.append(req)
    launch = m.publish(reqs)
    for req in reqs:
        req.num_computed_tokens = req.num_tokens
    m.complete(launch)
    for req in reqs:
        m.append_token(req, rng.randrange(50))
    return m, reqs


def _state(m: KVCacheManager, reqs: list[EngineRequest]) -> Any:
    a = m.allocator
    pool = a.pool
    return (a.stats(), list(pool.state), list(pool.ref), dict(pool.hmap), pool.queue.order(),
            [(m.get_block_ids(r.request_id),
              a.num_reserved(r.request_id) if r.request_id in a.requests else None,
              list(r._all), list(r.block_hashes)) for r in reqs])


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("lookahead", [0, 3])
def test_allocate_slots_many_is_allocate_slots_of_each_until_one_does_not_fit(
        seed: int, lookahead: int):
    rng = random.Random(1000 + seed)
    m1, reqs1 = _world(seed)
    m2, reqs2 = _world(seed)
    counts = [rng.choice((1, 1, 2, 3, 5, 9, 17)) for _ in reqs1]
    got = m1.allocate_slots_many(reqs1, counts, num_lookahead_tokens=lookahead)
    expected = []
    for req, n in zip(reqs2, counts, strict=True):
        new = m2.allocate_slots(req, n, num_lookahead_tokens=lookahead)
        if new is None:
            break
        expected.append(new)
    assert [b.block_ids for b in got] == [b.block_ids for b in expected]
    assert _state(m1, reqs1) == _state(m2, reqs2)
    m1.allocator.check_invariants()


def test_allocate_slots_many_takes_numpy_counts_as_ints():
    m1, reqs1 = _world(4)
    m2, reqs2 = _world(4)
    counts = [1, 2, 9, 1, 5]
    got = m1.allocate_slots_many(reqs1, [np.int64(n) for n in counts])
    assert [b.block_ids for b in got] == [
        b.block_ids for b in m2.allocate_slots_many(reqs2, counts)]
    assert _state(m1, reqs1) == _state(m2, reqs2)
    assert all(type(m1.allocator.num_reserved(r.request_id)) is int for r in reqs1)


def test_allocate_slots_many_stops_at_the_first_request_that_does_not_fit():
    m, reqs = _world(3)
    twin, twin_reqs = _world(3)
    free = m.allocator.pool.usable()
    # the second request asks for more blocks than are free: the first grows, the rest not
    counts = [B, (free + 2) * B, 1, 1, 1]
    got = m.allocate_slots_many(reqs, counts)
    assert len(got) == 1
    assert twin.allocate_slots(twin_reqs[0], B) is not None
    assert _state(m, reqs) == _state(twin, twin_reqs)
    assert m.allocator.num_reserved("r0") == reqs[0].num_computed_tokens + B


@pytest.mark.parametrize("bad", ["zero", "float", "stranger", "twice", "lengths", "waiting",
                                 "lookahead"])
def test_allocate_slots_many_refuses_bad_input_and_changes_nothing(bad: str):
    m, reqs = _world(5)
    counts = [1] * len(reqs)
    if bad == "zero":
        counts[3] = 0
    elif bad == "float":
        counts[3] = 1.0
    elif bad == "stranger":
        reqs = [*reqs[:3], EngineRequest("r1", [1, 2, 3]), *reqs[4:]]
    elif bad == "twice":
        reqs = [*reqs, reqs[0]]
        counts.append(1)
    elif bad == "lengths":
        counts.pop()
    elif bad == "waiting":
        m.preempt(reqs[3])
    before = _state(m, reqs)
    with pytest.raises((ValueError, TypeError)):
        m.allocate_slots_many(reqs, counts, num_lookahead_tokens=-1 if bad == "lookahead" else 0)
    assert _state(m, reqs) == before


@pytest.mark.parametrize("seed", range(6))
def test_append_token_many_is_append_token_of_each(seed: int):
    rng = random.Random(seed)
    m1, reqs1 = _world(seed)
    m2, reqs2 = _world(seed)
    for _ in range(2 * B + 1):  # fill blocks: they are hashed on both sides
        tokens = [rng.randrange(50) for _ in reqs1]
        m1.append_token_many(reqs1, tokens)
        for req, t in zip(reqs2, tokens, strict=True):
            m2.append_token(req, t)
        assert _state(m1, reqs1) == _state(m2, reqs2)


@pytest.mark.parametrize("bad", ["range", "type", "twice", "lengths"])
def test_append_token_many_is_all_or_nothing(bad: str):
    m, reqs = _world(7)
    tokens: list[Any] = [7] * len(reqs)
    error: type[Exception] = ValueError
    if bad == "range":
        tokens[3], error = 2**63, InvalidArgument  # refused by the allocator's token check
    elif bad == "type":
        tokens[3], error = "7", TypeError
    elif bad == "twice":
        reqs, tokens = [*reqs, reqs[0]], [*tokens, 7]
    else:
        tokens.pop()
    before = _state(m, reqs)
    with pytest.raises(error):
        m.append_token_many(reqs, tokens)
    assert _state(m, reqs) == before


def test_driver_commit_many_checks_every_pair_first():
    d = pk_driver.make(32, B, checked=True)
    for i in range(3):
        d.add(f"r{i}", list(range(i, i + 6)))
        assert d.allocate(f"r{i}", 6) is not None
    pairs = [("r0", 6), ("r1", 6), ("r2", 7)]  # r2 has 6 tokens: 7 is refused
    with pytest.raises(ValueError):
        d.commit_many(pairs)
    assert [d.num_computed(f"r{i}") for i in range(3)] == [0, 0, 0]
    assert d.manager.allocator.inflight == ()  # nothing was launched
    d.commit_many(pairs[:2])
    assert [d.num_computed(f"r{i}") for i in range(3)] == [6, 6, 0]


# ---- the batched scheduler loop against the anchor's per-request loop ---------------------
_CANDIDATES = VLLM_KVCACHE_CANDIDATES
ANCHOR = next((c for c in _CANDIDATES if (c / "traces.py").is_file()), None)


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
    return _load("anchor_traces", ANCHOR / "traces.py"), _load(
        "batched_loop", ROOT / "benchmarks" / "batched_loop.py")


def _small_trace(traces: Any, seed: int) -> list[dict]:
    return traces.make_trace(seed, num_requests=40, prompt_len=(8, 120), output_len=(4, 40),
                             system_len=(8, 64), burst=24)


def _by_step(ops: list[tuple]) -> dict[int, list[tuple]]:
    """A step's ops as a multiset: the batched loop orders commits, appends and frees by
    kind, the per-request loop by request."""
    steps: dict[int, list[tuple]] = defaultdict(list)
    for op in ops:
        steps[op[0]].append(op)
    return {s: sorted(v, key=repr) for s, v in steps.items()}


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("blocks", [96, 160])
def test_batched_loop_makes_the_per_request_loops_decisions(loops: Any, seed: int,
                                                            blocks: int):
    traces, batched = loops
    trace = _small_trace(traces, seed)
    single_ops: list[tuple] = []
    batched_ops: list[tuple] = []
    single = traces.simulate(trace, pk_driver.make(blocks, 8), token_budget=256,
                             max_running=16, record_ops=single_ops)
    d = pk_driver.make_checked(blocks, 8)
    out = batched.run(trace, d, token_budget=256, max_running=16, record_ops=batched_ops)
    assert out["steps"] == single["totals"]["steps"]
    assert out["preempted"] == single["totals"]["preempted"]
    assert _by_step(batched_ops) == _by_step(single_ops)
    ops = {op for _, op, *_ in single_ops}
    assert {"allocate", "add", "commit", "append", "free"} <= ops
    d.manager.allocator.check_invariants()
    assert d.manager.allocator.requests == (d.manager._null,)  # everything was freed


def test_batched_loop_preempts_under_pressure(loops: Any):
    """The comparison above covers preemptions (the pass restarts from the refused one)."""
    traces, batched = loops
    trace = _small_trace(traces, 1)
    ops: list[tuple] = []
    batched.run(trace, pk_driver.make(96, 8), token_budget=256, max_running=16,
                record_ops=ops)
    assert any(op == "preempt" for _, op, *_ in ops)
