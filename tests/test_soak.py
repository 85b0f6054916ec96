"""Blocks a launch still reads are never handed out again: copy-on-write sources, forks, and a
seeded serving soak with the in-flight-launch oracle of ``pagedkv.proofs.soak``."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from pagedkv.allocator import BlockAllocator, OutOfBlocks
from pagedkv.proofs.soak import Soak, SoakFailure, block_counts, run_soak, stat_parts
from pagedkv.spec import ALLOCATED, FREE, RECLAIMED, state_name


def _forked(checked: bool) -> BlockAllocator:
    """4 blocks of 4: A holds [full committed block, partial block of 2 tokens]; B = fork(A)."""
    a = BlockAllocator(4, 4, checked=checked)
    a.add_request("A", [1, 2, 3, 4, 5, 6])
    a.allocate("A", 6)
    a.publish(["A"]).complete()
    a.commit("A", 6)
    a.fork("A", "B")
    assert a.block_table("A") == a.block_table("B")
    return a


# ---- (a) the copy source of a copy-on-write stays pinned while the launch is in flight ---------
@pytest.mark.parametrize("checked", [True, False])
@pytest.mark.parametrize("writer", ["A", "B"])
def test_copy_source_is_not_recycled_while_the_launch_copies_it(writer, checked):
    a = _forked(checked)
    other = "B" if writer == "A" else "A"
    a.append_tokens("A", [7])
    a.append_tokens("B", [8])
    a.allocate(writer, 7)
    launch = a.publish([writer])
    assert launch.copies.shape == (1, 2)
    src, dst = (int(x) for x in launch.copies[0])
    assert src == a.block_table(other)[1] and dst == int(launch.block_tables[0, 1])
    a.free(other)  # the last table holding src goes; the launch's copy still reads src
    assert a.state(src) != FREE, (
        f"copy source {src} is {state_name(a.state(src))} while the launch of {launch.rids} still "
        f"copies it to {dst}"
    )
    a.check_invariants()
    # Only one block is usable: the writer holds two, src waits for the launch.
    a.add_request("C", [9] * 9)
    with pytest.raises(OutOfBlocks):
        a.allocate("C", 5)
    table = a.allocate("C", 4)
    assert src not in table, f"copy source {src} handed to C while the launch is in flight"
    assert a.state(src) not in (FREE, ALLOCATED)
    a.check_invariants()
    launch.complete()
    assert a.state(src) == FREE, f"after completion src is {state_name(a.state(src))}"
    assert src in a.allocate("C", 8)  # reusable once the launch completed
    a.check_invariants()
    assert block_counts(a) is None
    assert a.stats()["inflight_launches"] == 0 and stat_parts(a.stats())["reclaimed"] == 0


@pytest.mark.parametrize("checked", [True, False])
def test_copy_source_pinned_with_recorded_event_until_reclaim(checked):
    a = _forked(checked)
    a.append_tokens("A", [7])
    a.append_tokens("B", [8])
    a.allocate("A", 7)
    launch = a.publish(["A"])
    src = int(launch.copies[0, 0])

    class Event:
        done = False

        def query(self):
            return self.done

    ev = Event()
    launch.record(ev)
    a.free("B")
    assert a.reclaim() == 0 and not launch.completed
    assert a.state(src) == RECLAIMED, state_name(a.state(src))
    ev.done = True
    assert a.reclaim() >= 1 and launch.completed
    assert a.state(src) == FREE
    a.check_invariants()


# ---- (b) two forks of two parents in one launch ------------------------------------------------
@pytest.mark.parametrize("checked", [True, False])
def test_two_forked_pairs_in_one_launch_copy_soundly(checked):
    a = BlockAllocator(16, 4, checked=checked)
    for p, base in (("P1", 100), ("P2", 200)):
        a.add_request(p, [base + i for i in range(6)])
        a.allocate(p, 6)
    a.publish(["P1", "P2"]).complete()
    a.commit("P1", 6)
    a.commit("P2", 6)
    a.fork("P1", "C1")
    a.fork("P2", "C2")
    rids = ["P1", "C1", "P2", "C2"]
    for k, r in enumerate(rids):
        a.append_tokens(r, [1000 + k])  # four different tokens at position 6
        a.allocate(r, 7)
    shared = {a.block_table("P1")[1], a.block_table("P2")[1]}  # the partial blocks
    before = set().union(*(a.block_table(r) for r in rids))
    launch = a.publish(rids)
    copies = launch.copies.tolist()
    srcs = [s for s, _ in copies]
    dsts = [d for _, d in copies]
    both = sorted(set(srcs) & set(dsts))
    assert not both, f"blocks {both} are both copy sources and destinations: copies {copies}"
    assert len(set(dsts)) == len(dsts), f"a destination appears twice: copies {copies}"
    assert set(srcs) <= shared and not set(dsts) & before, copies
    assert len(copies) >= 2  # each pair shares its partial block: one of the two must copy
    # Position 6 of each request is written to table entry 1: four different blocks.
    written = launch.block_tables[:, 1].tolist()
    assert len(set(written)) == 4, f"requests write position 6 into blocks {written}"
    for d in dsts:
        assert int(np.count_nonzero(launch.block_tables == d)) == 1, (d, launch.block_tables)
    for s in srcs:
        assert a.state(s) not in (FREE, ALLOCATED), f"copy source {s}: {state_name(a.state(s))}"
    a.check_invariants()
    for r in rids:
        a.free(r)
    for s in srcs:
        assert a.state(s) != FREE, f"copy source {s} recycled while the launch is in flight"
    launch.complete()
    a.check_invariants()
    assert block_counts(a) is None
    parts = stat_parts(a.stats())
    assert parts["free"] + parts["cached"] == 16, parts


# ---- (c) the seeded soak -----------------------------------------------------------------------
@pytest.mark.parametrize("checked", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_soak_oracle_holds(seed, checked):
    ops = 30_000 if not checked else 15_000
    f = run_soak(ops, seed, checked=checked, check_every=250)
    assert f["ops"] >= ops
    # the mix did what it is for: every kind of event happened, many times
    for key in ("launches", "forks", "copies", "truncations", "completed_out_of_order",
                "completed_by_reclaim", "preemptions", "prefix_hit_tokens", "commits",
                "requests_finished", "already_completed_refusals"):
        assert f[key] > 10, (key, f)
    assert f["refusals"].get("OutOfBlocks", 0) > 0, f
    assert f["max_inflight_seen"] >= 4
    assert f["final_stats"]["inflight_launches"] == 0


def test_soak_small_pool_large_blocks():
    f = run_soak(8_000, 7, num_blocks=24, block_size=8, checked=True, check_every=100)
    assert f["copies"] > 0 and f["preemptions"] > 0


# ---- the oracle itself catches what it is meant to catch ---------------------------------------
def _soak_with_launch_in_flight() -> Soak:
    soak = Soak(3, num_blocks=64, block_size=4, checked=False, check_every=10**9,
                max_requests=16, max_inflight=6, make_allocator=BlockAllocator)
    while not soak.prot:
        soak.step()
    return soak


@pytest.mark.parametrize("how", ["free", "allocated", "gen+2", "gen+1 not reclaimed"])
def test_oracle_flags_a_recycled_block(how):
    soak = _soak_with_launch_in_flight()
    b, (g, _) = next(iter(soak.prot.items()))
    state, gen = list(soak._states()[0]), list(soak._states()[1])
    if how == "free":
        state[b] = FREE
    elif how == "allocated":
        state[b] = ALLOCATED
    elif how == "gen+2":
        state[b], gen[b] = RECLAIMED, g + 2
    else:
        gen[b] = g + 1
    soak._state, soak._gen = state, gen
    with pytest.raises(SoakFailure, match=rf"block {b} is in the read/write set of in-flight "
                                          r"launch #\d+ .*handed out again"):
        soak.after()


def test_oracle_allows_a_reclaimed_block_that_waits():
    soak = _soak_with_launch_in_flight()
    b, (g, _) = next(iter(soak.prot.items()))
    state, gen = list(soak._states()[0]), list(soak._states()[1])
    state[b], gen[b] = RECLAIMED, g + 1
    soak._state, soak._gen = state, gen
    soak.after()  # invalidated while pinned, not reused: fine


def test_oracle_flags_a_block_reused_by_a_newer_launch():
    soak = _soak_with_launch_in_flight()
    b, (g, _) = next(iter(soak.prot.items()))
    fake = SimpleNamespace(no=10**6, launch=SimpleNamespace(rids=("x",)), op=0,
                           blocks={b: g + 1}, name=lambda: "launch #new")
    with pytest.raises(SoakFailure, match=rf"block {b} appears in launch #new with generation "
                                          rf"{g + 1}, but in-flight .* saw generation {g}"):
        soak._protect(fake)


def _fake_launch(rows, copies):
    bt = np.array(rows, dtype=np.int32)
    return SimpleNamespace(
        rids=("x", "y"), block_tables=bt, table_generations=np.where(bt >= 0, 0, -1),
        copies=np.array(copies, dtype=np.int32).reshape(-1, 2),
        seq_lens=np.array([5, 5], dtype=np.int32), query_lens=np.array([1, 1], dtype=np.int32),
    )


@pytest.mark.parametrize("rows, copies, message", [
    ([[0, 4], [2, 5]], [[1, 4], [4, 5]], "both a copy source and a copy destination"),
    ([[0, 4], [2, 4]], [[1, 4], [3, 4]], "copy destination 4 appears twice"),
    ([[0, 4], [2, 3]], [[9, 4]], "copy source 9 was in no table"),
    ([[0, 4], [2, 3]], [[1, 3]], "copy destination 3 is not a fresh block"),
])
def test_oracle_flags_unsound_copies(rows, copies, message):
    soak = Soak(0, num_blocks=16, block_size=4, checked=False, check_every=10**9,
                max_requests=4, max_inflight=2, make_allocator=BlockAllocator)
    from pagedkv.proofs.soak import _Req

    batch = []
    for rid in ("x", "y"):
        r = _Req(rid, [1] * 5, 9)
        r.reserved, r.issued = 5, 4
        batch.append(r)
    with pytest.raises(SoakFailure, match=message):
        soak.validate(1, _fake_launch(rows, copies), batch, [0] * 16, [{0, 1}, {2, 3}])
    soak.validate(1, _fake_launch([[0, 4], [2, 5]], [[1, 4], [3, 5]]), batch, [0] * 16,
                  [{0, 1}, {2, 3}])  # the sound version of the same launch passes
