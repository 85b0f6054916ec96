"""Launch completion from another thread: engines run completion callbacks on their own thread,
so ``Launch.complete()`` (and ``reclaim()``'s polling) race with the owner's serving calls.

Checked mode compares each transition with the spec, so an interleaving that corrupts a
transition shows up as ``InvariantViolation('refines:...')``; the final scan and the stats catch
what it misses. A tiny switch interval makes the interpreter switch threads between almost any
two bytecodes.
"""

from __future__ import annotations

import queue
import random
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from pagedkv.allocator import BlockAllocator, LaunchAlreadyCompleted, OutOfBlocks
from pagedkv.proofs.soak import block_counts, stat_parts
from pagedkv.spec import FREE, RECLAIMED, state_name


@contextmanager
def _fast_switching() -> Iterator[None]:
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(old)


class _Req:
    __slots__ = ("tokens", "max_len", "reserved", "issued", "computed", "launch")

    def __init__(self, tokens: list[int], max_len: int) -> None:
        self.tokens, self.max_len = tokens, max_len
        self.reserved = self.issued = self.computed = 0
        self.launch = None  # the in-flight launch writing this request, if any


def _serve(seed: int, steps: int, num_blocks: int = 40, block_size: int = 4) -> BlockAllocator:
    """The owner thread serves; a worker thread completes every launch the owner hands it."""
    rng = random.Random(seed)
    alloc = BlockAllocator(num_blocks, block_size, checked=True)
    handoff: queue.Queue = queue.Queue()
    errors: list[BaseException] = []
    handed = []

    def worker() -> None:
        while True:
            launch = handoff.get()
            if launch is None:
                return
            try:
                launch.complete()
            except BaseException as exc:  # re-raised by the owner
                errors.append(exc)

    system = [rng.randrange(1, 1000) for _ in range(2 * block_size + 1)]
    live: dict[str, _Req] = {}
    next_id = 0
    thread = threading.Thread(target=worker, name="completer", daemon=True)
    thread.start()
    try:
        for _ in range(steps):
            if errors:
                break
            # land: completed launches let their requests commit and go on
            for rid, req in list(live.items()):
                if req.launch is not None and req.launch.completed:
                    req.launch = None
                    if req.issued > req.computed:
                        alloc.commit(rid, req.issued)
                        req.computed = req.issued
                    if len(req.tokens) >= req.max_len:
                        alloc.free(rid)
                        del live[rid]
            roll = rng.random()
            if roll < 0.15 and len(live) < 10:
                rid = f"r{next_id}"
                next_id += 1
                prompt = system + [rng.randrange(1, 1000) for _ in range(rng.randint(1, 9))]
                alloc.add_request(rid, prompt)
                live[rid] = _Req(prompt, len(prompt) + rng.randint(1, 12))
            elif roll < 0.6 and live:
                rid = rng.choice(list(live))
                req = live[rid]
                if req.launch is not None:
                    continue
                if req.reserved == len(req.tokens) < req.max_len and req.issued == req.reserved:
                    tok = rng.randrange(1, 1000)
                    alloc.append_tokens(rid, [tok])
                    req.tokens.append(tok)
                n = min(len(req.tokens), req.reserved + rng.randint(1, 2 * block_size))
                if n > req.reserved:
                    try:
                        alloc.allocate(rid, n)
                    except OutOfBlocks:
                        if not any(r.launch is not None for r in live.values()):
                            alloc.free(rid)  # preempt: free, re-add with the tokens so far
                            del live[rid]
                            alloc.add_request(rid, req.tokens)
                            live[rid] = _Req(list(req.tokens), req.max_len)
                        continue
                    if req.reserved == 0:  # the first call takes the prefix hits
                        req.issued = req.computed = alloc.num_computed(rid)
                    req.reserved = alloc.num_reserved(rid)
                    assert req.reserved == max(n, req.computed), (rid, n, req.reserved)
            elif roll < 0.9:
                batch = [r for r, q in live.items() if q.launch is None and q.issued < q.reserved]
                if not batch:
                    continue
                batch = rng.sample(batch, min(len(batch), rng.randint(1, 4)))
                try:
                    launch = alloc.publish(batch)
                except OutOfBlocks:
                    continue
                for rid in batch:
                    live[rid].launch = launch
                    live[rid].issued = live[rid].reserved
                handed.append(launch)
                handoff.put(launch)
            elif roll < 0.95 and live:
                rid = rng.choice(list(live))  # abort, possibly while its launch is in flight
                alloc.free(rid)
                del live[rid]
            else:
                alloc.reclaim()
                assert sum(stat_parts(alloc.stats()).values()) == num_blocks
    finally:
        handoff.put(None)
        thread.join(timeout=30)
    assert not thread.is_alive(), "the completing thread hung"
    if errors:
        raise errors[0]
    # how many launches the loop publishes depends on when the worker completes them
    assert len(handed) > steps // 40, "the loop published too few launches to race"
    assert all(launch.completed for launch in handed)
    alloc.check_invariants()
    assert alloc.stats()["inflight_launches"] == 0
    assert block_counts(alloc) is None
    assert stat_parts(alloc.stats())["reclaimed"] == 0
    for rid in list(live):
        alloc.free(rid)
    alloc.check_invariants()
    assert block_counts(alloc) is None
    parts = stat_parts(alloc.stats())
    assert parts["free"] + parts["cached"] == num_blocks, parts
    return alloc


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_completion_from_another_thread(seed):
    with _fast_switching():
        _serve(seed, steps=10_000)


class _DoneEvent:
    def query(self) -> bool:
        return True


def _callback(start: threading.Barrier, launch, outcome: list, errors: list) -> None:
    """The engine's completion callback."""
    start.wait()
    try:
        launch.complete()
        outcome.append("complete")
    except LaunchAlreadyCompleted:  # reclaim() was first: fine for an explicit complete()
        outcome.append("already")
    except BaseException as exc:
        errors.append(exc)


def _reclaimer(start: threading.Barrier, alloc: BlockAllocator, errors: list) -> None:
    """The owner's reclaim(), polling the same launch's done event."""
    start.wait()
    try:
        alloc.reclaim()
    except LaunchAlreadyCompleted as exc:
        errors.append(AssertionError(f"reclaim() raised LaunchAlreadyCompleted: {exc}"))
    except BaseException as exc:
        errors.append(exc)


def test_complete_racing_reclaim_completes_once():
    """An event that is done, and both the engine's callback (complete()) and the owner's
    reclaim() try to complete the launch: it completes once; reclaim never raises."""
    lost, won = 0, 0
    with _fast_switching():
        for i in range(1000):
            alloc = BlockAllocator(8, 4, checked=bool(i % 2))
            alloc.add_request("x", [1, 2, 3, 4, 5, 6])
            alloc.allocate("x", 6)
            first = alloc.publish(["x"])  # writes positions 0..5
            second = alloc.publish(["x"])  # reads them: a second pin on the same blocks
            blocks = alloc.block_table("x")
            first.record(_DoneEvent())
            alloc.free("x")  # the blocks are RECLAIMED, pinned by both launches
            start = threading.Barrier(2)
            errors: list[BaseException] = []
            outcome: list[str] = []
            threads = [
                threading.Thread(target=_callback, args=(start, first, outcome, errors)),
                threading.Thread(target=_reclaimer, args=(start, alloc, errors)),
            ]
            for t in threads[:: 1 if i % 4 < 2 else -1]:
                t.start()
            for t in threads:
                t.join(timeout=10)
            assert not any(t.is_alive() for t in threads)
            if errors:
                raise errors[0]
            assert first.completed and not second.completed
            # completed once: the second launch's pins are still there
            assert [alloc.state(b) for b in blocks] == [RECLAIMED] * len(blocks), (
                f"iteration {i}: blocks {blocks} are "
                f"{[state_name(alloc.state(b)) for b in blocks]} while a launch still reads them"
            )
            won += outcome == ["complete"]
            lost += outcome == ["already"]
            second.complete()
            assert [alloc.state(b) for b in blocks] == [FREE] * len(blocks)
            alloc.check_invariants()
            assert alloc.stats()["inflight_launches"] == 0
    assert won + lost == 1000, (won, lost)
