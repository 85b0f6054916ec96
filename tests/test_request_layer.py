"""Request-layer defects found by use: copy-on-write sources, prefix hits under chunked
prefill, forks that diverge. Each test fails on the code before its fix."""

from __future__ import annotations

import numpy as np
import pytest

from pagedkv.allocator import BlockAllocator, CommitError, InvalidArgument, OutOfBlocks
from pagedkv.kernels import copy_blocks
from pagedkv.spec import FREE, PUBLISHED, RECLAIMED


def run_step(a: BlockAllocator, rid, n: int) -> None:
    a.allocate(rid, n)
    a.publish([rid]).complete()
    a.commit(rid, n)


def _partial_parent(a: BlockAllocator, rid, tokens: list[int]) -> None:
    """A request whose last block is partial, written by a completed launch."""
    a.add_request(rid, tokens)
    run_step(a, rid, len(tokens))


def test_copy_on_write_source_waits_for_the_copying_launch():
    a = BlockAllocator(8, 4)
    _partial_parent(a, "A", [1, 2, 3, 4, 5, 6])  # second block holds 2 of 4 slots
    a.fork("A", "B")
    a.append_tokens("A", [7])
    a.allocate("A", 7)
    launch = a.publish(["A"])
    [[src, dst]] = launch.copies.tolist()
    assert a.block_table("B")[1] == src and a.block_table("A")[1] == dst
    a.free("B")  # the last holder of src goes away while the launch still copies it
    assert a.state(src) == RECLAIMED
    assert a.stats()["reclaimed_waiting"] == 1
    a.add_request("C", list(range(100, 100 + 4 * a.stats()["allocatable_now"])))
    table = a.allocate("C", 4 * a.stats()["allocatable_now"])
    assert src not in table  # never handed out while the launch reads it
    with pytest.raises(OutOfBlocks) as err:
        a.allocate("C", len(table) * 4 + 1)
    assert err.value.waiting == 1 and "1 more wait" in str(err.value)
    launch.complete()
    assert a.state(src) == FREE
    a.check_invariants()


def test_two_forks_in_one_launch_never_copy_into_a_source():
    a = BlockAllocator(12, 4)
    _partial_parent(a, "P1", [1, 2, 3, 4, 5, 6])
    _partial_parent(a, "P2", [9, 8, 7, 6, 5, 4])
    a.fork("P1", "C1")
    a.fork("P2", "C2")
    shared = {a.block_table("P1")[1], a.block_table("P2")[1]}
    for k, rid in enumerate(["P1", "C1", "P2", "C2"]):
        a.append_tokens(rid, [50 + k])
        a.allocate(rid, 7)
    launch = a.publish(["P1", "C1", "P2", "C2"])
    copies = launch.copies.tolist()
    src, dst = {s for s, _ in copies}, [d for _, d in copies]
    assert src == shared and len(set(dst)) == len(dst) and not src & set(dst)
    assert len(copies) == 2  # the last writer of each shared block writes it in place
    assert a.block_table("C1")[1] in shared and a.block_table("C2")[1] in shared
    assert a.state(a.block_table("C1")[1]) == PUBLISHED and a.ref_count(
        a.block_table("C1")[1]) == 1
    k = np.random.default_rng(0).standard_normal((12, 4, 1, 8)).astype(np.float32)
    v = np.random.default_rng(1).standard_normal((12, 4, 1, 8)).astype(np.float32)
    expect = k.copy()
    copy_blocks(k, v, launch.copies)  # the kernels accept every launch the allocator makes
    for s_, d_ in copies:
        np.testing.assert_array_equal(k[d_], expect[s_])
    launch.complete()
    a.check_invariants()


def test_prefix_hits_are_taken_in_full_whatever_the_first_chunk():
    a = BlockAllocator(16, 4)
    prompt = list(range(20))
    a.add_request("A", prompt)
    run_step(a, "A", 20)
    assert a.add_request("B", prompt) == 16
    table = a.allocate("B", 4)  # a chunked prefill admits only 4 positions
    assert table == a.block_table("A")[:4]
    assert a.num_computed("B") == 16 and a.num_reserved("B") == 16
    assert a.stats()["prefix_hit_tokens"] == 16
    table = a.allocate("B", 20)
    assert table[:4] == a.block_table("A")[:4] and len(table) == 5
    a.check_invariants()


def test_diverging_fork_keeps_its_own_hash_chain():
    a = BlockAllocator(16, 4)
    _partial_parent(a, "A", [1, 2, 3, 4, 5, 6])
    a.fork("A", "B")
    a.append_tokens("A", [7, 8])
    a.append_tokens("B", [70, 80])
    for rid in ("A", "B"):
        run_step(a, rid, 8)
    a.check_invariants()  # table_isolation: each hashed entry carries its own chain
    a.free("A")
    a.free("B")
    a.add_request("Cb", [1, 2, 3, 4, 5, 6, 70, 80, 0])
    a.add_request("Ca", [1, 2, 3, 4, 5, 6, 7, 8, 0])
    tb, ta = a.allocate("Cb", 9), a.allocate("Ca", 9)
    assert tb[0] == ta[0]  # the shared first block
    assert tb[1] != ta[1] and a.num_computed("Cb") == a.num_computed("Ca") == 8
    a.check_invariants()


def test_speculative_lookahead_is_truncated_and_rewritten():
    """Reserve draft positions, write them, reject some: the rejected slots are dropped,
    blocks past the new end are released, and the kept block can be written again."""
    a = BlockAllocator(8, 4)
    a.add_request("s", [1, 2, 3, 4, 5])
    run_step(a, "s", 5)
    a.append_tokens("s", [60, 61, 62, 63, 64])  # five draft tokens
    a.allocate("s", 10)
    a.publish(["s"]).complete()
    tail = a.block_table("s")[2]
    assert a.truncate("s", 7) == a.block_table("s")[:2]  # two drafts accepted
    assert a.state(tail) == FREE and a.num_reserved("s") == 7
    assert a.pool.filled[a.block_table("s")[1]] == 3  # slots 7 and 8 forgotten
    a.append_tokens("s", [70])
    a.allocate("s", 8)
    launch = a.publish(["s"])
    assert launch.slot_mapping.tolist() == [a.block_table("s")[1] * 4 + 3]
    launch.complete()
    a.commit("s", 8)
    a.check_invariants()
    a.add_request("t", [1, 2, 3, 4, 5, 60, 61, 70, 0])
    assert a.allocate("t", 9)[:2] == a.block_table("s")  # the accepted chain is cached


def test_truncate_refuses_and_changes_nothing():
    a = BlockAllocator(8, 4)
    a.add_request("s", [1, 2, 3, 4, 5, 6])
    a.allocate("s", 6)
    launch = a.publish(["s"])  # writes still in flight
    before = (a.stats(), a.block_table("s"), a.pool.filled[:])
    with pytest.raises(CommitError, match="pending writing launches"):
        a.truncate("s", 5)  # the kept block is being written
    with pytest.raises(InvalidArgument):
        a.truncate("s", 7)
    assert (a.stats(), a.block_table("s"), a.pool.filled[:]) == before
    launch.complete()
    a.commit("s", 4)
    with pytest.raises(CommitError, match="committed 4"):
        a.truncate("s", 3)
    a.fork("s", "f")  # the partial block is now shared
    with pytest.raises(CommitError, match="reference count"):
        a.truncate("s", 5)
    assert a.truncate("s", 6) == a.block_table("f")
