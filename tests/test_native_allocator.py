"""NativeAllocator: the request layer's step-level calls as native loops, held to BlockAllocator.

BlockAllocator is held to the spec's call programs by the refinement campaign; here the native
step path is held to BlockAllocator call by call on seeded random workloads
(``proofs.native_allocator_refinement``: the same values, errors, pool states and tables), and
its generated rules and clock transitions to the interpreted spec (the module's self-check)."""
# ruff: noqa: B023 - each call's lambdas are called at once by AllocatorPair.do

from __future__ import annotations

import random

import numpy as np
import pytest

pytest.importorskip("numba")

from pagedkv.allocator import (  # noqa: E402
    BlockAllocator,
    BlockPool,
    CommitError,
    GuardViolation,
    InvalidArgument,
    InvariantViolation,
    OutOfBlocks,
    TokensUnknown,
    native_source,
)
from pagedkv.allocator import native_pool as native  # noqa: E402
from pagedkv.allocator.allocator import RequestBook  # noqa: E402
from pagedkv.allocator.native_allocator import NativeAllocator  # noqa: E402
from pagedkv.allocator.native_pool import NativePool, NativeUnavailable  # noqa: E402
from pagedkv.allocator.native_steps import R_KNOWN, R_TLEN  # noqa: E402
from pagedkv.proofs.native_allocator_refinement import (  # noqa: E402
    AllocatorPair,
    random_workload,
    requests_of,
    run_native_allocator_campaign,
)
from pagedkv.proofs.native_refinement import snapshot  # noqa: E402
from pagedkv.spec import requests as spec_requests  # noqa: E402
from pagedkv.spec.request_spec import REQUEST_SPEC  # noqa: E402


@pytest.mark.parametrize("seed", range(10))
def test_the_native_step_path_makes_blockallocators_moves_call_by_call(seed):
    pair = random_workload(seed, checked=seed % 2 == 1)
    assert sum(pair.ops.values()) > 150
    assert {"allocate_many", "publish", "complete", "commit_many"} <= set(pair.ops)


def test_the_campaign_reports_a_difference(monkeypatch):
    """A native step path that answers differently (a launch's slot mapping one slot off)
    fails the campaign, naming the seed and the call."""
    ok = run_native_allocator_campaign(range(2), steps=80)
    assert ok["ok"] and ok["ops"] > 100
    real = NativeAllocator._launch

    def off_by_one(self, rids, rows):
        launch = real(self, rids, rows)
        launch.slot_mapping = launch.slot_mapping + 1
        return launch

    monkeypatch.setattr(NativeAllocator, "_launch", off_by_one)
    bad = run_native_allocator_campaign(range(2), steps=80)
    assert not bad["ok"] and "seed 0" in bad["error"] and "publish" in bad["error"]


def _world(checked: bool = True) -> AllocatorPair:
    """Both allocators with three requests mid-decode, sharing a cached prefix, and one
    launch in flight."""
    pair = AllocatorPair(32, 4, checked)
    shared = list(range(8))
    for i, rid in enumerate(("a", "b", "c")):
        prompt = shared + [100 + i] * (i + 1)
        pair.do("add", lambda a: a.add_request(rid, prompt))
        pair.do("allocate", lambda a: a.allocate(rid, len(prompt)))
        launch = pair.do("publish", lambda a: a.publish([rid]))
        pair.do("complete", lambda a: launch[a is pair.nat].complete())
        pair.do("commit", lambda a: a.commit(rid, len(prompt)))
    pair.do("append", lambda a: a.append_tokens_many([(r, [7]) for r in "abc"]))
    pair.do("grow", lambda a: a.allocate_many([(r, a.num_reserved(r) + 1) for r in "abc"]))
    pair.launches.append(pair.do("publish", lambda a: a.publish(["a", "b"])))
    return pair


def test_prefix_hits_are_taken_from_the_cache_in_both():
    pair = _world()
    hits = pair.do("add", lambda a: a.add_request("d", list(range(8)) + [5, 6]))
    assert hits[0] == hits[1] == 8
    entries = pair.do("allocate", lambda a: a.allocate("d", 10))
    assert entries[0] == entries[1] and entries[0][:2] == pair.ref.block_table("a")[:2]


@pytest.mark.parametrize("bad", ["shrinks", "unknown", "twice", "not an int"])
def test_a_refused_allocate_many_changes_nothing(bad):
    pair = _world()
    grow = [("a", pair.ref.num_reserved("a") + 5), ("c", pair.ref.num_reserved("c") + 1)]
    grow.append({"shrinks": ("b", 1), "unknown": ("zz", 3), "twice": ("a", 40),
                 "not an int": ("b", 2.5)}[bad])
    before = snapshot(pair.nat.pool), requests_of(pair.nat)
    pair.do("refused", lambda a: a.allocate_many(grow))  # the same error type in both
    assert (snapshot(pair.nat.pool), requests_of(pair.nat)) == before


def test_a_running_pass_that_does_not_fit_is_refused_as_a_whole():
    pair = _world()
    with pytest.raises(OutOfBlocks):
        pair.nat.allocate_many([("a", 200), ("b", 50)])
    pair.do("the same", lambda a: a.allocate_many([("a", 200), ("b", 50)]))


@pytest.mark.parametrize("case", ["before its launch completed", "past the tokens",
                                  "below what it committed", "past the launch"])
def test_a_refused_commit_many_commits_none(case):
    pair = _world()
    n_a = pair.ref.num_reserved("a")
    ref_launch, nat_launch = pair.launches.pop()
    if case != "before its launch completed":
        pair.do("complete", lambda a: (nat_launch if a is pair.nat else ref_launch).complete())
    if case == "past the tokens":  # c's newest position launched, its token not known yet
        pair.do("grow", lambda a: a.allocate_many([("c", a.num_reserved("c") + 1)]))
        launch = pair.do("publish", lambda a: a.publish(["c"]))
        pair.do("complete", lambda a: launch[a is pair.nat].complete())
    bad = {"before its launch completed": ("b", pair.ref.num_reserved("b")),
           "past the tokens": ("c", pair.ref.num_reserved("c")),
           "below what it committed": ("c", 1),
           "past the launch": ("c", pair.ref.num_reserved("c"))}[case]
    before = snapshot(pair.nat.pool), requests_of(pair.nat)
    want = TokensUnknown if case == "past the tokens" else CommitError
    with pytest.raises(want):
        pair.nat.commit_many([("a", n_a), bad])
    assert (snapshot(pair.nat.pool), requests_of(pair.nat)) == before
    pair.do("the same refusal", lambda a: a.commit_many([("a", n_a), bad]))


@pytest.mark.parametrize("token", [1.5, None, 2**63, True])
def test_a_bad_token_appends_none(token):
    pair = _world()
    before = requests_of(pair.nat)
    with pytest.raises(InvalidArgument):
        pair.nat.append_tokens_many([("a", [3]), ("b", [token])])
    with pytest.raises(InvalidArgument):
        pair.nat.append_token_many([pair.nat._requests["a"], pair.nat._requests["b"]],
                                   [3, token])
    assert requests_of(pair.nat) == before


def test_a_token_count_that_differs_from_the_requests_appends_none():
    pair = _world()
    before = requests_of(pair.nat)
    reqs = [pair.nat._requests["a"], pair.nat._requests["b"]]
    for tokens in ([3], [3, 4, 5]):
        with pytest.raises(InvalidArgument, match="2 requests but"):
            pair.nat.append_token_many(reqs, tokens)
    assert requests_of(pair.nat) == before


def test_frees_under_a_launch_in_flight_wait_for_it():
    """A block freed while a launch that reads it is in flight is reclaimed only once the
    launch completed (epochs), in both."""
    pair = _world()
    table = pair.ref.block_table("b")
    pair.do("free", lambda a: a.free("b"))
    assert all(pair.nat.state(b) != 0 for b in table)  # none FREE yet
    ref_launch, nat_launch = pair.launches.pop()
    pair.do("complete", lambda a: (nat_launch if a is pair.nat else ref_launch).complete())
    assert pair.nat.pool.waiting() == 0


def test_many_launches_in_flight_complete_in_any_order():
    """More launches in flight than the launch set's first cells hold (it rehashes), each
    completed in a random order: the same clock, watermark and blocks as BlockPool's."""
    rng = random.Random(3)
    ref, nat = BlockPool(16, 4, checked=True), NativePool(16, 4, checked=True)
    launched = []
    for _ in range(70):
        assert ref.clock[0] == nat.launch()
        ref.launch(ref.clock[0])
        launched.append(ref.clock[0] - 1)
        if rng.random() < 0.3:
            L = launched.pop(rng.randrange(len(launched)))
            ref.complete(L)
            nat.complete(L)
            ref.advance_watermark()
            nat.advance_watermark()
    assert len(launched) > 40 and len(nat.M) > native_source.LAUNCHES0 + 16  # it grew
    rng.shuffle(launched)
    for L in launched:
        ref.complete(L)
        nat.complete(L)
        assert ref.advance_watermark() == nat.advance_watermark()
        assert snapshot(ref) == snapshot(nat)


def test_growth_makes_room_in_the_holds_set_first():
    """A running pass and an ``allocate_many`` that add more holds than half the holds set's
    first 1,024 cells: it is rehashed wider before the native loop inserts them (a full set
    would make the insert loop forever), and stays at most half full."""
    a = NativeAllocator(4096, 1, prefix_caching=False, checked=False)
    for rid in ("x", "y"):
        a.add_request(rid, [1])
        a.allocate(rid, 1)
    row = np.array([a._requests["x"].row], np.int64)
    got = a.grow_running(row, np.zeros(row[0] + 1, np.int64), np.array([700], np.int64),
                         ["x"])
    assert len(got[0]) == 699 and a.pool.structure_errors() == []
    assert len(a.allocate_many([("y", 1500)])[0]) == 1499
    assert a.pool.structure_errors() == [] and len(a.pool.K) >= 4 * 2200
    assert len(a.pool.held_by("x")) == 700 and len(a.pool.held_by("y")) == 1500


# ---- the generated code is the spec's ----------------------------------------------------------
@pytest.mark.parametrize("wrong", [
    ("rule_commit_bounds", "(new_q < issued_q)", "(new_q <= issued_q)"),
    ("g_takeable", "<= M[", "< M["),
    ("g_cache_due", "(X[h] == -1)", "(X[h] != -2)"),
    ("one_close_holder", "    return True", "    return False"),
    ("e_complete", "discard_launch(M, ", "add_launch(M, "),
    ("clock_each", "(L < M[6 + 0])", "(L <= M[6 + 0])"),
])
def test_generated_rules_and_clock_that_differ_from_the_spec_are_refused(
        monkeypatch, tmp_path, wrong):
    """A generated module whose commit rule, takeable, cache_due, complete, clock invariants
    or one-call close differ from the spec fails the self-check: no pool (and no native
    allocator) is built on it."""
    name, old, new = wrong
    real = native_source.module_source

    def changed(spec, invariants, *rules):
        src = real(spec, invariants, *rules)
        head, _, rest = src.partition(f"def {name}(")
        body, sep, tail = rest.partition("\n\n\n")
        assert old in body
        return head + f"def {name}(" + body.replace(old, new, 1) + sep + tail

    monkeypatch.setenv("PAGEDKV_NATIVE_CACHE", str(tmp_path))
    monkeypatch.setattr(native_source, "module_source", changed)
    monkeypatch.setattr(native, "_BY_SPEC", {})
    with pytest.raises(NativeUnavailable, match="disagrees with the spec"):
        NativeAllocator(8, 4)


def test_a_request_spec_passed_in_is_the_one_that_runs():
    """A commit rule weakened in the spec passed in (commits past the known tokens) lets a
    commit through in both allocators alike; the spec as written refuses it."""
    def lax_bounds(ops, new, issued, known):  # the known-tokens condition dropped
        return [spec_requests.pos_le(ops, new, issued), True]

    lax = REQUEST_SPEC.replace(commit_bounds=lax_bounds)

    def world(cls, spec):
        a = cls(16, 4, spec=spec)
        a.add_request("a", [1, 2, 3, 4, 5])
        a.allocate("a", 6)  # one position past the known tokens (in a block not full)
        a.publish(["a"]).complete()
        return a

    for cls in (BlockAllocator, NativeAllocator):
        with pytest.raises(TokensUnknown):
            world(cls, None).commit("a", 6)
        a = world(cls, lax)
        a.commit("a", 6)
        assert a.num_computed("a") == 6
    assert NativeAllocator(16, 4, spec=lax).mod is not NativeAllocator(16, 4).mod


def test_step_loops_are_loaded_at_construction():
    """A new allocator has called each step loop once (on copies): none compiles or loads
    inside a step, and the pool it builds is untouched."""
    a = NativeAllocator(8, 4)
    for name in ("grow_running", "launch_rows", "complete_and_commit", "count_known"):
        assert getattr(a.mod, name).signatures, name
    assert snapshot(a.pool) == snapshot(NativePool(8, 4))
    assert a.pool.launches() == set()


def test_launch_tables_and_generations_are_blockallocators():
    pair = _world()
    ref_launch, nat_launch = pair.launches[0]
    for field in ("block_tables", "table_generations", "seq_lens", "query_lens",
                  "slot_mapping"):
        assert np.array_equal(getattr(ref_launch, field), getattr(nat_launch, field)), field
        assert getattr(nat_launch, field).dtype == getattr(ref_launch, field).dtype, field
    assert not nat_launch.block_tables.flags.writeable
    nat_launch.check_current()


def test_checked_mode_evaluates_the_clock_invariants_natively():
    """A watermark moved past the clock by hand is found by checked mode at the next clock
    transition (the native ``clock_each``); unchecked mode does not look."""
    for checked in (True, False):
        pool = NativePool(8, 4, checked=checked)
        pool.M[native_source.CLOCK0 + 1] = 5  # watermark 5 > issued 0
        if checked:
            with pytest.raises(InvariantViolation, match="watermark_bounds"):
                pool.launch()
        else:
            pool.launch()


@pytest.mark.parametrize("corrupt", ["a table entry", "a known count"])
def test_check_invariants_scans_the_spec_state_of_the_native_arrays(corrupt):
    """``abstract()`` is BlockAllocator's (the spec's state, the same mapping) and
    ``check_invariants`` finds a table entry naming a block its request does not hold, or a
    known-token count that differs from the tokens."""
    pair = _world()
    assert pair.ref.abstract() == pair.nat.abstract()
    nat = pair.nat
    nat.check_invariants()
    row = nat._requests["c"].row
    if corrupt == "a table entry":
        nat.T[row, nat.R[R_TLEN, row] - 1] = nat.T[nat._requests["a"].row, 2]
    else:
        nat.R[R_KNOWN, row] += 1
    with pytest.raises(InvariantViolation):
        nat.check_invariants()


def test_small_launches_copy_the_rows_natively_and_large_ones_incrementally():
    """Below ``incremental_from`` entries a launch's tables are a fresh native copy of the
    launch rows, above it ``TableRows.take``'s incremental copy: the same arrays."""
    launches = []
    for incremental_from in (1 << 30, 0):
        a = NativeAllocator(64, 4)
        a._rows.incremental_from = incremental_from
        got = []
        for i, rid in enumerate("abc"):
            a.add_request(rid, list(range(i, i + 9)))
            a.allocate(rid, 9)
        for step in range(6):
            a.append_tokens_many([(r, [step]) for r in "abc"])
            a.allocate_many([(r, 10 + step) for r in "abc"])
            launch = a.publish(list("abc") if step % 3 else ["c", "a"])
            got.append((launch.block_tables.tolist(), launch.table_generations.tolist()))
            launch.complete()
            del launch  # (an incremental copy is reused once nothing refers to it)
        launches.append(got)
    assert launches[0] == launches[1]


@pytest.mark.parametrize("bad", [-1, "3", 2.5])
def test_commit_pairs_are_refused_in_order(bad):
    """A bad count after a pair that may not commit: that earlier pair's refusal is the one
    raised, as BlockAllocator checks its pairs in order (found by the state machine)."""
    pair = _world()
    below = ("c", 1)  # c committed more than that
    pair.do("refused in order", lambda a: a.commit_many([below, ("a", bad)]))
    with pytest.raises(CommitError):
        pair.nat.commit_many([below, ("a", bad)])
    with pytest.raises(InvalidArgument):
        pair.nat.commit_many([("a", bad), below])


class _RefusingCompletion:
    """The allocator's step loops with ``complete_and_commit`` refusing the first write's
    ``end_write`` (what a launch whose writes were ended behind its back meets)."""

    def __init__(self, loops, ok):
        self._loops, self._ok = loops, ok

    def __getattr__(self, name):
        return getattr(self._loops, name)

    def complete_and_commit(self, *args):
        return 0, False, 0, -1, self._ok, -1, 0

    def launch_complete_commit(self, B, M, H, K, X, R, T, rows, n, slots, starts, lens,
                               written, news, filled):
        """The fused call (unchecked mode): issued as it issues, its completion refused."""
        loops = self._loops
        plan = loops.launch_plan(B, M, H, K, X, R, T, rows, n)
        issue = loops.launch_rows(B, M, H, K, X, R, T, rows, n, slots, starts, lens, written)
        return 0, plan, issue, self.complete_and_commit()


@pytest.mark.parametrize("checked", [True, False])
def test_a_launch_run_and_completed_at_once_stays_in_flight_if_its_completion_is_refused(
        checked):
    """``_launch_and_commit`` (a driver's step that already ran) makes no ``Launch``; one
    whose completion is refused is handed out in ``inflight`` like any other, and completes
    later (unchecked, from the fused call's scratch vectors: copies of them)."""
    a = NativeAllocator(16, 4, checked=checked)
    a.add_request("a", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    a.allocate("a", 9)
    rows = a._rows_of([a._req("a")])
    real, a._steps = a._steps, _RefusingCompletion(a._steps, a.mod.STEP_OK)
    with pytest.raises(GuardViolation, match="end_write"):
        a._launch_and_commit(("a",), rows)
    a._steps = real
    a.add_request("b", [7] * 9)
    a.allocate("b", 9)
    a._launch_and_commit(("b",), a._rows_of([a._req("b")]))  # (the scratch vectors again)
    assert a.num_computed("b") == 9
    (launch,) = a.inflight
    assert launch.rids == ("a",) and launch.slot_mapping.tolist() == [
        b * 4 + k for b in a.block_table("a") for k in range(4)][:9]
    assert a.num_computed("a") == 0
    launch.complete()
    a.commit("a", 9)
    assert a.inflight == () and a.num_computed("a") == 9


def test_a_resumed_lookup_drops_a_hit_whose_slot_was_interned_again():
    """A hit's hash slot freed and interned for another digest, registered to the same
    block id: the slot's stamp changed, so the lookup starts over (a resumption that read
    only the block would keep a hit on a digest no longer cached)."""
    a = NativeAllocator(16, 4)
    a.add_request("a", list(range(9)))
    a.allocate("a", 9)
    a.publish(["a"]).complete()
    a.commit("a", 8)
    a.add_request("w", list(range(8)) + [50, 51])
    w = a._req("w")
    b0, b1 = a._hits(w)
    pool = a.pool
    slot = pool._hslot[w.hashes[1]]
    pool.X[slot] = -1  # block b1's digest evicted, its slot freed ...
    pool._release_hashes(np.array([slot], np.int64))
    pool._chain_slots([12345])  # ... and interned for another digest, naming b1 again
    assert pool._hslot[12345] == slot
    pool.X[slot] = b1
    assert a._hits(w) == [b0] == RequestBook._hits(a, w)


@pytest.mark.parametrize("bad", [
    lambda rows, computed, counts: (rows.astype(np.int32), computed, counts),
    lambda rows, computed, counts: (rows, computed.astype(np.float64), counts),
    lambda rows, computed, counts: (rows, computed, counts[:0]),
    lambda rows, computed, counts: (rows, computed, np.stack([counts, counts])),
    lambda rows, computed, counts: (rows, computed[:rows[0]], counts),
    lambda rows, computed, counts: (rows, np.repeat(computed, 2)[::2], counts),
    lambda rows, computed, counts: (rows - rows[0] - 1, computed, counts),
], ids=["int32 rows", "float computed", "short counts", "2-d counts", "rows past computed",
        "strided computed", "negative row"])
def test_grow_running_refuses_vectors_its_native_loop_would_misread(bad):
    """``grow_running``'s loop is called through an entry point that trusts its argument
    types: a vector of another dtype, length or shape, computed positions that do not
    cover the rows or are not contiguous, are refused before it runs."""
    a = NativeAllocator(16, 4)
    a.add_request("a", list(range(9)))
    a.allocate("a", 9)
    rows = a._rows_of([a._req("a")])
    computed = np.full(rows[0] + 2, 9, np.int64)  # (two: a strided view is not contiguous)
    before = (a.R.copy(), a.T.copy(), a.pool.B.copy())
    with pytest.raises(InvalidArgument, match="int64 vectors"):
        a.grow_running(*bad(rows, computed, np.array([4], np.int64)), ("a",))
    assert all(np.array_equal(x, y) for x, y in zip(before, (a.R, a.T, a.pool.B), strict=True))
    assert a.grow_running(rows, computed, np.array([4], np.int64), ("a",)) \
        == [a.block_table("a")[3:]]
