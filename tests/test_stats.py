"""stats(): every figure exact, on states where they differ; O(1), never a scan of requests."""

from __future__ import annotations

import pytest

from pagedkv.allocator import BlockAllocator, OutOfBlocks
from pagedkv.spec import CACHED, FREE, RECLAIMED


def _run(a: BlockAllocator, rid, n: int) -> None:
    a.allocate(rid, n)
    a.publish([rid]).complete()
    a.commit(rid, n)


def _busy_pool() -> tuple[BlockAllocator, dict]:
    """10 blocks of 2: every figure of stats() takes a different value."""
    a = BlockAllocator(10, 2)
    a.add_request("old", [1, 2, 3, 4, 5])
    _run(a, "old", 5)  # 3 blocks: two full (committed), one partial
    a.add_request("idle", [7, 8, 9])
    _run(a, "idle", 3)
    a.free("idle")  # block [7, 8] CACHED with no reader; its partial block FREE
    reader = a.publish(["old"])  # reads old's 3 blocks
    a.add_request("fork-src", [1, 2, 3, 4, 5])  # hits old's two full blocks
    a.allocate("fork-src", 5)
    a.free("old")  # old's partial block: RECLAIMED (read); its full blocks stay held
    a.add_request("gone", [20, 21, 22])
    _run(a, "gone", 3)
    busy = a.publish(["gone"])
    a.free("gone")  # block [20, 21] CACHED but read by `busy`; partial RECLAIMED (read)
    return a, {"reader": reader, "busy": busy}


def test_stats_figures_on_a_busy_pool():
    a, _ = _busy_pool()
    states = [a.state(b) for b in range(10)]
    s = a.stats()
    assert s["free"] == states.count(FREE) == 3  # idle's partial block was reused
    assert s["cached"] == states.count(CACHED) == 2
    assert s["evictable_now"] == 1 and s["evictable_after_launches"] == 1
    assert s["reclaimed_waiting"] == states.count(RECLAIMED) == 2
    assert s["waiting_on_launches"] == 3
    assert s["held"] == 10 - 3 - 2 - 2 == 3  # fork-src: the two shared full blocks + one new
    assert s["allocatable_now"] == 3 + 1
    assert s["admission_headroom"] == 10 - s["held"]
    assert s["occupancy_blocks"] == 3 and s["occupancy_tokens"] == 5
    assert s["tail_waste_slots"] == 3 * 2 - 5
    assert s["prefix_hit_tokens"] == 4
    assert s["inflight_launches"] == 2


def test_out_of_blocks_counts_what_waits_for_launches():
    a, launches = _busy_pool()
    a.add_request("big", list(range(100, 120)))
    with pytest.raises(OutOfBlocks) as err:
        a.allocate("big", 20)
    assert (err.value.needed, err.value.available, err.value.waiting) == (10, 4, 3)
    for launch in launches.values():
        launch.complete()
    s = a.stats()
    assert s["waiting_on_launches"] == s["inflight_launches"] == 0
    assert s["free"] == 3 + 2 and s["allocatable_now"] == 5 + 2  # + the two idle cached


def test_shared_blocks_count_once_in_held_and_per_table_in_occupancy():
    a = BlockAllocator(8, 2)
    a.add_request("p", [1, 2, 3, 4, 5])
    _run(a, "p", 5)
    a.fork("p", "c")
    s = a.stats()
    assert s["held"] == 3 and s["occupancy_blocks"] == 6 and s["occupancy_tokens"] == 10


def test_attached_pool_bytes():
    class Pool:
        num_blocks, block_size, bytes_per_block, reserved_bytes = 8, 2, 1024, 8192

    a = BlockAllocator(8, 2)
    a.attach_pool(Pool())
    a.add_request("p", [1, 2, 3])
    _run(a, "p", 3)
    a.free("p")
    s = a.stats()
    assert s["reserved_bytes"] == 8192 and s["in_use_bytes"] == 0
    assert s["cached_bytes"] == 1024 * s["cached"] == 1024


def test_stats_never_scans_the_requests():
    a, _ = _busy_pool()

    class NoScan(dict):
        def values(self):
            raise AssertionError("stats() iterated over the requests")

        __iter__ = values

    a._requests = NoScan(a._requests)
    assert a.stats()["occupancy_tokens"] == 5


def test_stats_keys_are_the_documented_ones():
    """The keys are exactly those the docstring and the README list (no per-block pin count:
    launches pin by their number, not block by block)."""
    import re
    from pathlib import Path

    a, _ = _busy_pool()
    keys = set(a.stats())
    doc = BlockAllocator.stats.__doc__ or ""
    assert keys == set(re.findall(r"^\s*- ``(\w+)``", doc, re.M))
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    para = readme[readme.index("`stats()` is exact"):]
    para = para[:para.index("and with an")]
    assert keys == set(re.findall(r"`(\w+)`", para)) - {"stats"}
