"""The compiled spec functions are the spec's functions: they agree with the interpreted ones,
and the block-hash memo never changes a hash."""

from __future__ import annotations

import itertools
import random

import pytest

from pagedkv.allocator import BlockAllocator
from pagedkv.allocator.compiled import predicate_agrees, predicate_code, scrambled_pool
from pagedkv.spec import CONCRETE, INVARIANTS, NO_HASH, TRANSITIONS

VALUES = {"b": range(5), "r": ("a", "b", "zz"), "w": (0, 1, 3, 4), "k": (0, 1, 3, 4),
          "L": (0, 1, 2, 3, 4), "h": (NO_HASH, 11, 13)}
_SCOPE_PARAMS = {"block": ("b",), "hash": ("h",), "launch": ("L",), "pool": ()}


SPEC_FUNCTIONS = [(f"guard {t.name}", t.guard, t.params) for t in TRANSITIONS.values()] + [
    (f"invariant {i.name}", i.pred, _SCOPE_PARAMS[i.scope])
    for i in INVARIANTS.values() if i.scope in ("block", "hash", "launch")
] + [(f"invariant {i.name}", i.pred, ()) for i in INVARIANTS.values()
     if i.scope == "pool" and i.name == "watermark_bounds"]


@pytest.mark.parametrize("label, fn, params", SPEC_FUNCTIONS, ids=[s[0] for s in SPEC_FUNCTIONS])
def test_compiled_predicate_agrees_with_the_spec(label, fn, params):
    code = predicate_code(fn, params, label)
    assert code is not None, f"{label} did not compile (it would run interpreted)"
    assert predicate_agrees(fn, params, code)
    for seed in range(100, 130):
        pool = scrambled_pool(seed, 5, negative=True)
        compiled = eval(code, pool.namespace())  # noqa: S307 - our own generated source
        for combo in itertools.product(*(VALUES[p] for p in params)):
            want = bool(fn(CONCRETE, pool.view, **dict(zip(params, combo, strict=True))))
            assert bool(compiled(*combo)) == want, (label, seed, combo)


def test_interpreted_and_compiled_allocators_agree():
    """The same workload through a compiled and an interpreted checked pool."""
    runs = []
    for compiled in (True, False):
        a = BlockAllocator(12, 4)
        a.pool.compile_spec = compiled
        a.pool.trace = []
        a.add_request("a", list(range(13)))
        a.allocate("a", 13)
        a.publish(["a"]).complete()
        a.commit("a", 13)
        a.fork("a", "b")
        a.append_tokens("b", [1])
        a.allocate("b", 14)
        launch = a.publish(["b"])
        a.free("a")
        launch.complete()
        a.free("b")
        a.check_invariants()
        runs.append((a.pool.trace, a.abstract().pool.flattened()))
    from pagedkv.spec import states_equal

    assert runs[0][0] == runs[1][0]
    assert states_equal(runs[0][1], runs[1][1]) == []


def test_weakened_guard_replaces_the_compiled_one():
    import dataclasses

    from pagedkv.allocator import DoubleFree

    spec = dict(TRANSITIONS)  # passed in: the module's spec is left alone
    a = BlockAllocator(4, 4, checked=False, spec=spec)
    a.add_request("a", list(range(4)))
    b0 = a.allocate("a", 4)[0]
    a.pool.release(b0, "a")  # legitimate, and binds the compiled guard
    t = TRANSITIONS["release"]
    spec["release"] = dataclasses.replace(t, guard=lambda ops, s, b, r: ops.And(b >= 0))
    a.pool.release(b0, "a")  # the weakened guard is what runs now: the double free goes through
    assert a.pool.ref[b0] == -1
    assert TRANSITIONS["release"] is t  # another pool still enforces the spec's own guard
    with pytest.raises(DoubleFree):
        BlockAllocator(4, 4).pool.release(0, "a")
    spec["release"] = t
    with pytest.raises(DoubleFree):
        a.pool.release(b0, "a")


def test_hash_memo_never_changes_a_hash():
    tokens = [random.Random(7).randrange(1000) for _ in range(64)]
    memo_on, memo_off = BlockAllocator(16, 4), BlockAllocator(16, 4)
    memo_off._hash_memo = None
    for a in (memo_on, memo_off):
        a.add_request("x", tokens, cache_salt="s", extra_keys=[3])
        a.add_request("y", tokens, cache_salt="s", extra_keys=[3])  # memo hits
    assert memo_on._req("y").hashes == memo_off._req("y").hashes == memo_off._req("x").hashes


def test_the_public_memoized_hash_is_block_hash_and_checks_its_arguments():
    from pagedkv.allocator import InvalidArgument
    from pagedkv.allocator.hashing import block_hash

    a = BlockAllocator(16, 4)
    assert a.block_hash(0, [1, 2, 3, 4], ("",), "s") == block_hash(0, [1, 2, 3, 4], ("",), "s")
    assert a.block_hash(5, [1, 2, 3, 4]) == block_hash(5, [1, 2, 3, 4], (), None)
    a.block_hash(0, [1, 1, 1, 1])  # memoized under ints: equal-comparing bools are refused
    for bad in ((0, [True, 1, 1, 1]), (0, [1.0, 1, 1, 1]), (True, [1, 1, 1, 1]),
                (-1, [1, 1, 1, 1]), (0, "abcd")):
        with pytest.raises(InvalidArgument):
            a.block_hash(*bad)
    with pytest.raises(InvalidArgument):
        a.block_hash(0, [1, 1, 1, 1], (1.0,))
    with pytest.raises(InvalidArgument):
        a.block_hash(0, [1, 1, 1, 1], (), 7)


def test_every_transition_runs_compiled():
    """Each transition's guard and effect compile and pass their probes: none silently falls
    back to interpretation (the hot ones, and the clock's, included)."""
    from pagedkv.allocator.pool import BlockPool

    pool = BlockPool(4, 2)
    for name in TRANSITIONS:
        t, guard, predict, *_ = pool._entry(name)
        assert predict is not None, f"{name}'s effect runs interpreted"
        assert guard.__code__.co_filename.startswith("<spec guard"), (
            f"{name}'s guard runs interpreted")


def test_every_transition_has_probe_pools_on_which_its_guard_holds():
    """The witness table is current: each listed seed's pool satisfies the guard somewhere, so
    compiled effects are compared with the spec where they run. A spec change that breaks it
    prints the table to paste (``find_witness_seeds``)."""
    from pagedkv.allocator.compiled import WITNESS_SEEDS, find_witness_seeds, is_witness

    fresh = {n: find_witness_seeds(t) for n, t in TRANSITIONS.items()}
    stale = {n: seeds for n, seeds in WITNESS_SEEDS.items()
             if n not in TRANSITIONS or not all(is_witness(TRANSITIONS[n], s) for s in seeds)}
    assert set(WITNESS_SEEDS) == set(TRANSITIONS) and not stale, f"WITNESS_SEEDS = {fresh!r}"
    assert all(len(seeds) >= 3 for seeds in WITNESS_SEEDS.values())


def _local_bodies():
    from pagedkv.allocator.compiled import predicate_source
    from pagedkv.allocator.pool import local_invariants

    invs = local_invariants()
    return invs, [(i.scope, predicate_source(i.pred, _SCOPE_PARAMS[i.scope])) for i in invs]


def test_fused_local_invariants_agree_with_the_spec_on_fresh_probe_pools():
    """Checked mode's fused check of the touched blocks (one loop, each cell read once) names
    the first block where some local invariant fails, as the interpreted invariants do, on
    scrambled pools other than the start-up probes; and a checked pool uses it."""
    from pagedkv.allocator import BlockPool
    from pagedkv.allocator.compiled import fused_check_agrees, fused_check_source

    invs, bodies = _local_bodies()
    src = fused_check_source(bodies)
    assert fused_check_agrees(src, invs)
    failing_seen = holding_seen = 0
    for seed in range(200, 260):
        pool = scrambled_pool(seed, 5, negative=seed % 2 == 0)
        ns = pool.namespace()
        exec(src, ns)  # noqa: S102 - our own generated source
        for b in range(pool.num_blocks):
            want = all(i.pred(CONCRETE, pool.view, b if i.scope == "block" else pool.hash[b])
                       for i in invs)
            assert (ns["first_failing"]([b]) is None) == want, (seed, b)
            failing_seen += not want
            holding_seen += want
    assert failing_seen and holding_seen  # both answers were exercised
    p = BlockPool(6, 4, checked=True)
    p.open_holder("r")
    p.take("r")
    assert p._first_failing is not None


def test_a_fused_check_that_disagrees_with_the_spec_is_not_used():
    """The start-up self-check refuses a fused check that misses a failing block (one that
    never reports one, or one with any single invariant dropped), so checked mode falls back
    to the invariants one by one."""
    from pagedkv.allocator.compiled import fused_check_agrees, fused_check_source

    invs, bodies = _local_bodies()
    blind = fused_check_source(bodies).replace("return b\n", "return None\n")
    assert not fused_check_agrees(blind, invs)
    for i, inv in enumerate(invs):
        weakened = [*bodies[:i], (bodies[i][0], "True"), *bodies[i + 1:]]
        assert not fused_check_agrees(fused_check_source(weakened), invs), inv.name
