"""The vLLM anchor's continuous-batching loop with each step's work batched, for pagedkv.

``traces.simulate`` (``../shared/anchors/vllm_kvcache``) drives an allocator one request at a
time: per step, ``allocate`` for each running request, ``add`` + ``allocate`` for each
admission, then ``commit``, ``append`` and ``free`` per request. An engine that batches its
step makes the same decisions with fewer calls. ``run`` here is that scheduler, over
``pagedkv.engine.driver.PagedKVDriver``'s step-level calls:

- the running pass is one ``allocate_running`` of every running request that gets tokens
  (each ``min(tokens left, budget left)``); when one does not fit, the last running request
  is preempted (``preempt``) and the pass goes on from the one that did not fit, or stops if
  that was the one preempted;
- admissions, only in a step without a preemption, are one ``add`` and one ``allocate`` per
  waiting request, from the front, until one does not fit (as in vLLM's scheduler);
- then one ``commit_many`` of every request scheduled, one ``append_many`` of the tokens
  sampled by those that reached their token count (each given as two sequences, the
  requests and their values), and a ``free`` of each that finished.

The decisions are those of ``traces.simulate`` (FCFS, chunked prefill, the same budget and
running cap): ``record_ops`` receives the same ``(step, op, rid, arg, result)`` tuples, in
an order that differs only within a step's commits, appends and frees, and
``tests/test_engine_step_level.py`` checks them equal on seeded traces. Only the driver calls
are timed, as in ``traces.simulate``.
"""

from __future__ import annotations

from collections import deque
from time import perf_counter_ns
from typing import Any

OPS = ("step", "allocate", "preempt", "add", "admit", "commit", "append", "free")


class _Timer:
    """Nanoseconds and calls per op name."""

    def __init__(self) -> None:
        self.ns = dict.fromkeys(OPS, 0)
        self.calls = dict.fromkeys(OPS, 0)

    def __call__(self, op: str, fn: Any, *args: Any) -> Any:
        t0 = perf_counter_ns()
        out = fn(*args)
        self.ns[op] += perf_counter_ns() - t0
        self.calls[op] += 1
        return out


def run(trace: list[dict], driver: Any, *, token_budget: int = 8192, max_running: int = 256,
        max_steps: int = 10_000_000, record_ops: list | None = None) -> dict[str, Any]:
    """Run ``trace`` (``traces.make_trace``) to completion on ``driver``; returns the totals
    (``steps``, ``alloc_ns``, ``op_ns``, ``op_calls``, admissions, preemptions, hit tokens)."""
    by_rid = {r["rid"]: r for r in trace}
    followups: dict[str, list[dict]] = {}
    arrivals: dict[int, list[str]] = {}
    for r in sorted((r for r in trace if not r["after"]), key=lambda r: r["arrival"]):
        arrivals.setdefault(r["arrival"], []).append(r["rid"])
    for r in trace:
        if r["after"]:
            followups.setdefault(r["after"], []).append(r)
    timer = _Timer()
    rec = record_ops.append if record_ops is not None else None
    waiting: deque[str] = deque()
    running: list[str] = []
    tokens_of: dict[str, int] = {}  # prompt + sampled
    computed: dict[str, int] = {}
    sampled: dict[str, int] = {}
    first_admitted: set[str] = set()
    totals = dict(admitted=0, preempted=0, failed_allocs=0, hit_tokens=0, lookups=0,
                  first_admission_tokens=0, first_admission_hits=0)
    left, step, steps = len(trace), 0, 0
    while left:
        if steps >= max_steps:
            raise RuntimeError(f"trace not done after {max_steps} steps")
        if not waiting and not running and step not in arrivals:
            step = min(arrivals)  # an idle engine waits for the next arrival
        waiting.extend(arrivals.pop(step, ()))
        timer("step", driver.step)
        budget = token_budget
        scheduled: dict[str, int] = {}
        preempted = False
        start = 0
        while start < len(running) and budget > 0:
            rids, counts, room = [], [], budget
            for rid in running[start:]:
                if room <= 0:
                    break
                n = min(tokens_of[rid] - computed[rid], room)
                if n > 0:
                    rids.append(rid)
                    counts.append(n)
                    room -= n
            if not rids:
                break
            got = timer("allocate", driver.allocate_running, rids, counts)
            for rid, n, new in zip(rids, counts, got, strict=False):
                scheduled[rid] = n
                budget -= n
                if rec:
                    rec((step, "allocate", rid, n, len(new)))
            if len(got) == len(rids):
                break
            refused = rids[len(got)]
            if rec:
                rec((step, "allocate", refused, counts[len(got)], None))
            totals["failed_allocs"] += 1
            victim = running.pop()
            timer("preempt", driver.preempt, victim)
            if rec:
                rec((step, "preempt", victim, None, None))
            computed[victim] = 0
            waiting.appendleft(victim)
            totals["preempted"] += 1
            preempted = True
            if victim == refused:
                break
            start = running.index(refused)
        while not preempted and budget > 0 and waiting and len(running) < max_running:
            rid = waiting[0]
            if rid in tokens_of:
                hits = timer("add", driver.add, rid)
            else:
                r = by_rid[rid]
                hits = timer("add", driver.add, rid, r["prompt"], r["cache_salt"])
                tokens_of[rid], sampled[rid] = len(r["prompt"]), 0
            if rec:
                rec((step, "add", rid, None, hits))
            totals["lookups"] += 1
            n = min(tokens_of[rid] - hits, budget)
            new = timer("admit", driver.allocate, rid, n)
            if rec:
                rec((step, "allocate", rid, n, None if new is None else len(new)))
            if new is None:
                totals["failed_allocs"] += 1
                if not running and not scheduled:
                    raise RuntimeError(f"{rid} cannot be admitted into an empty pool")
                break
            waiting.popleft()
            running.append(rid)
            computed[rid] = hits
            totals["admitted"] += 1
            totals["hit_tokens"] += hits
            if rid not in first_admitted:
                first_admitted.add(rid)
                totals["first_admission_tokens"] += tokens_of[rid]
                totals["first_admission_hits"] += hits
            scheduled[rid] = n
            budget -= n
        committed, counts = list(scheduled), []
        for rid, n in scheduled.items():
            computed[rid] += n
            counts.append(computed[rid])
        if committed:
            timer("commit", driver.commit_many, committed, counts)
        sampling, tokens, finished = [], [], []
        for rid, c in zip(committed, counts, strict=True):
            if rec:
                rec((step, "commit", rid, c, None))
            if c == tokens_of[rid]:
                r = by_rid[rid]
                sampling.append(rid)
                tokens.append(r["output"][sampled[rid]])
                sampled[rid] += 1
                tokens_of[rid] += 1
                if sampled[rid] == len(r["output"]):
                    finished.append(rid)
        if sampling:
            timer("append", driver.append_many, sampling, tokens)
            if rec:
                for rid, token in zip(sampling, tokens, strict=True):
                    rec((step, "append", rid, token, None))
        for rid in finished:
            timer("free", driver.free, rid)
            if rec:
                rec((step, "free", rid, None, None))
            running.remove(rid)
            left -= 1
            for child in followups.get(rid, ()):
                arrivals.setdefault(step + 1 + child["arrival"], []).append(child["rid"])
        step += 1
        steps += 1
    return {**totals, "steps": steps, "alloc_ns": sum(timer.ns.values()),
            "op_ns": timer.ns, "op_calls": timer.calls}
