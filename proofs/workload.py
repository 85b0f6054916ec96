"""A short serving workload through a checked BlockAllocator: continuous batching with shared
system prompts, chunked prefill, decode, parallel sampling (fork), late kernel completion,
preemption on OutOfBlocks and re-admission. Invariants are scanned every few steps."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from pagedkv.allocator import BlockAllocator, OutOfBlocks


@dataclass
class WorkloadReport:
    steps: int = 0
    requests_admitted: int = 0
    requests_finished: int = 0
    preemptions: int = 0
    forks: int = 0
    copy_on_write_copies: int = 0
    launches: int = 0
    prefix_hit_tokens: int = 0
    prompt_tokens: int = 0
    invariant_scans: int = 0
    seconds: float = 0.0
    ok: bool = False
    error: str = ""
    final_stats: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


class _Event:
    """Completes after a fixed number of engine steps (a kernel that finishes late)."""

    def __init__(self, clock: list[int], delay: int) -> None:
        self.clock, self.due = clock, clock[0] + delay

    def query(self) -> bool:
        return self.clock[0] >= self.due


def run_workload(
    *,
    steps: int = 400,
    num_blocks: int = 40,
    block_size: int = 8,
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
) -> WorkloadReport:
    rng = random.Random(seed)
    report = WorkloadReport()
    alloc = BlockAllocator(num_blocks, block_size, checked=True)
    system_prompts = [[rng.randrange(1000) for _ in range(rng.randint(10, 40))] for _ in range(3)]
    clock = [0]
    waiting: list[tuple[str, list[int], str | None]] = []
    running: dict[str, int] = {}  # rid -> tokens still to generate
    issued: dict[str, int] = {}  # rid -> positions its published launches cover
    next_id = 0
    chunk = 4 * block_size
    started = time.perf_counter()
    try:
        for step in range(steps):
            clock[0] = step
            # arrivals
            for _ in range(rng.choice([0, 0, 1, 1, 2])):
                prompt = rng.choice(system_prompts) + [rng.randrange(1000)
                                                       for _ in range(rng.randint(1, 20))]
                salt = rng.choice([None, None, "tenant-b"])
                waiting.append((f"q{next_id}", prompt, salt))
                next_id += 1
            # admission
            while waiting and len(running) < 12:
                rid, prompt, salt = waiting[0]
                if alloc.stats()["admission_headroom"] < 2 * len(prompt) // block_size + 2:
                    break
                waiting.pop(0)
                report.prefix_hit_tokens += alloc.add_request(rid, prompt, cache_salt=salt)
                report.prompt_tokens += len(prompt)
                running[rid] = rng.randint(1, 24)
                report.requests_admitted += 1
            # schedule: each running request covers its next chunk (prefill) or one token
            batch = []
            for rid in list(running):
                if rid not in running:  # preempted earlier in this loop
                    continue
                target = min(alloc.num_reserved(rid) + chunk, _known(alloc, rid))
                target = max(target, alloc.num_reserved(rid))
                try:
                    alloc.allocate(rid, max(target, 1))
                except OutOfBlocks:
                    victim = max(running, key=lambda r: alloc.num_reserved(r))
                    _preempt(alloc, victim, running, waiting, issued)
                    report.preemptions += 1
                    continue
                batch.append(rid)
            batch = [r for r in batch if r in running and alloc.num_reserved(r) > 0]
            if batch:
                try:
                    launch = alloc.publish(batch)
                except OutOfBlocks:
                    victim = batch[-1]
                    _preempt(alloc, victim, running, waiting, issued)
                    report.preemptions += 1
                    continue
                report.launches += 1
                issued.update((r, alloc.num_reserved(r)) for r in batch)
                report.copy_on_write_copies += len(launch.copies)
                launch.record(_Event(clock, rng.choice([0, 0, 1, 2])))
            alloc.reclaim()
            # commit what completed, sample tokens, finish, fork
            for rid in list(running):
                if any(rid in launch.rids for launch in alloc.inflight):
                    continue
                reserved = alloc.num_reserved(rid)
                if issued.get(rid, alloc.num_computed(rid)) < reserved:
                    continue  # allocated, but its launch was refused (no room to copy)
                if reserved < _known(alloc, rid):
                    alloc.commit(rid, reserved)
                    continue
                alloc.commit(rid, reserved)
                alloc.append_tokens(rid, [rng.randrange(1000)])
                running[rid] -= 1
                if running[rid] <= 0:
                    alloc.free(rid)
                    del running[rid]
                    issued.pop(rid, None)
                    report.requests_finished += 1
                elif rng.random() < 0.03 and len(running) < 12:
                    child = f"{rid}.f{step}"
                    try:
                        alloc.fork(rid, child)
                    except OutOfBlocks:
                        continue
                    running[child] = rng.randint(1, 8)
                    issued[child] = issued.get(rid, alloc.num_computed(rid))
                    report.forks += 1
            if step % 10 == 0:
                alloc.check_invariants()
                report.invariant_scans += 1
            report.steps = step + 1
            if progress is not None:
                progress(1)
        for launch in alloc.inflight:
            launch.complete()
        alloc.check_invariants()
        report.invariant_scans += 1
        report.ok = True
    except Exception as exc:  # noqa: BLE001 - the report names whatever broke
        report.error = f"{type(exc).__name__}: {exc}"
    report.seconds = round(time.perf_counter() - started, 3)
    report.final_stats = alloc.stats()
    return report


def _known(alloc: BlockAllocator, rid: str) -> int:
    return len(alloc._req(rid).tokens)  # noqa: SLF001 - the workload plays the engine


def _preempt(alloc: BlockAllocator, rid: str, running: dict, waiting: list,
             issued: dict) -> None:
    """Preemption = free + re-add later (the cached prefix is hit again)."""
    req = alloc._req(rid)  # noqa: SLF001
    tokens, salt = list(req.tokens), req.salt
    alloc.free(rid)  # blocks a pending launch still reads wait, RECLAIMED, until it completes
    del running[rid]
    issued.pop(rid, None)
    waiting.insert(0, (rid, tokens, salt))


if __name__ == "__main__":  # pragma: no cover
    print(run_workload().to_dict())
