"""The request layer of the spec (spec/requests.py, spec/request_invariants.py): concrete runs,
the z3 induction proof, and weakened rules that the proof and the checks catch."""

from __future__ import annotations

import pytest

from pagedkv.proofs.explore import (
    ExploreConfig,
    _shift_launch,
    explore,
    request_param_values,
    walk_requests,
)
from pagedkv.proofs.request_induction import (
    COUNTEREXAMPLE,
    PROVED,
    prove_lemmas,
    prove_one,
    sum_free_invariants,
)
from pagedkv.spec import (
    FREE,
    INVARIANTS,
    RECLAIMED,
    REQUEST_INVARIANTS,
    REQUEST_TRANSITIONS,
    RequestState,
    initial_request_state,
    request_step,
    request_violations,
    violations,
)
from pagedkv.spec.model import initial_state
from pagedkv.spec.requests import (
    NO_HASH,
    RequestTransition,
    count,
    table_of,
)
from pagedkv.spec.states import WATERMARK

POOL_INVS = sum_free_invariants(INVARIANTS)


class Run:
    """Request transitions on a concrete state, every invariant checked after each."""

    def __init__(self, blocks: int = 6, block_size: int = 2) -> None:
        self.s = initial_request_state(initial_state(blocks, block_size, holder_ids=("a", "c")))

    def __call__(self, name: str, **params):
        nxt = request_step(self.s, name, **params)
        assert nxt is not None, (name, params)
        self.s = nxt
        bad = violations(self.s.pool, self.s)
        assert bad == [], (name, params, bad)
        return self

    def refused(self, name: str, **params) -> bool:
        return request_step(self.s, name, **params) is None


def _served_fork() -> Run:
    """a: 3 tokens known, 2 blocks written by launch 0 (block 0 sealed); c forked from it."""
    run = Run()
    run("admit", r="a")("learn", r="a")("learn_block", r="a", h=11)("learn", r="a")
    run("grow", r="a", b=0, k=2)("grow", r="a", b=1, k=1)
    run("publish_entry", r="a", b=0)("publish_entry", r="a", b=1)("launch", L=0)
    run("write_block", r="a", b=0)("write_block", r="a", b=1)
    run("seal", r="a", b=0)
    run("fork_open", r="c", p="a")("fork_share", r="c", p="a", b=0)
    run("fork_share", r="c", p="a", b=1)
    return run


def test_a_serving_sequence_keeps_every_invariant():
    run = _served_fork()
    assert table_of(run.s, "c") == table_of(run.s, "a") == [0, 1]
    assert count(run.s, "issued", "c") == 3 and run.s.pool.wpend[1] == 1  # forked in flight
    assert run.refused("commit_pos", r="c", k=2)  # launch 0 still writes block 0
    run("end_write", b=0)("end_write", b=1)("complete", L=0)("advance")
    run("commit_pos", r="a", k=2)("cache", r="a", b=0)
    assert run.s.pool.hash[0] == 11
    run("learn_block", r="c", h=22)("reserve", r="c", k=2)("launch", L=1)
    run("copy_write", r="c", b=1, d=2)  # the shared partial block is copied, then let go
    assert table_of(run.s, "c") == [0, 2] and run.s.pool.ref[1] == 1
    run("release_tail", r="a", b=1)("release_tail", r="a", b=0)("close", r="a")
    assert run.s.pool.state[1] == RECLAIMED  # launch 1 copies it: it waits
    assert run.refused("recycle", b=1)
    run("end_write", b=2)("complete", L=1)("advance")("recycle", b=1)
    assert run.s.pool.state[1] == FREE


def test_prefix_hit_and_truncation():
    run = Run()
    run("admit", r="a")
    for _ in range(2):
        run("learn", r="a")("learn_block", r="a", h=7 + _)
    run("learn", r="a")  # 5 tokens known
    for b in (0, 1):
        run("grow", r="a", b=b, k=2)
    run("publish_entry", r="a", b=0)("publish_entry", r="a", b=1)("launch", L=0)
    run("write_block", r="a", b=0)("write_block", r="a", b=1)
    run("end_write", b=0)("end_write", b=1)("complete", L=0)("advance")
    run("commit_pos", r="a", k=2)("commit_pos", r="a", k=1)  # 3 of 4 written positions
    run("seal", r="a", b=0)("cache", r="a", b=0)
    # a second request with the same first block's chain value hits it
    run("admit", r="c")("learn", r="c")("learn_block", r="c", h=7)("learn", r="c")
    run("hit", r="c", b=0)
    assert count(run.s, "computed", "c") == 2 and run.s.pool.ref[0] == 2
    # a drops its second block's last slot (a rejected speculative token): rewound, unsealed
    run("truncate_tail", r="a", k=1)
    assert run.s.pool.filled[1] == 1 and count(run.s, "known", "a") == 3
    assert run.refused("truncate_tail", r="a", k=1) is False  # idempotent, nothing dropped
    assert run.refused("hit", r="c", b=1)  # block 1 is not cached


def test_the_request_invariants_are_inductive_over_sample_transitions():
    assert prove_lemmas() == PROVED
    for inv, t in (("table_positions_written", "write_block"),
                   ("sealed_content_matches", "fork_share"),
                   ("table_holds_are_entries", "copy_write"),
                   ("table_isolation", "hit"),
                   ("table_covers_reserved", "truncate_tail")):
        ob = prove_one(REQUEST_INVARIANTS[inv], REQUEST_TRANSITIONS[t], POOL_INVS)
        assert ob.result == PROVED, ob


def _weakened(name: str, drop_cond: int | None = None, keep_content: bool = False
              ) -> RequestTransition:
    """``name`` with one table condition dropped, or its update of the seals undone."""
    orig = REQUEST_TRANSITIONS[name]

    def plan(ops, s, **p):
        conds, steps, finish = orig.plan(ops, s, **p)
        if drop_cond is not None:
            conds = conds[:drop_cond] + conds[drop_cond + 1:]
        if keep_content:
            return conds, steps, lambda pool: finish(pool).replace(content=s.content)
        return conds, steps, finish

    return RequestTransition(name, orig.params, plan, orig.doc)


@pytest.mark.parametrize("inv, transition, weakened", [
    # releasing the last holder of a sealed PUBLISHED block must break its seal
    ("sealed_blocks", "release_tail", {"keep_content": True}),
    # a rewound block holds fewer slots than a sealed one
    ("sealed_blocks", "truncate_tail", {"keep_content": True}),
    # a write must land in the entry of the issued position (conds[2]: tab[r][iq] == b)
    ("table_positions_written", "write_block", {"drop_cond": 2}),
    # a fork shares the parent's block at the same index (conds[9]: b == tab[p][i])
    ("table_positions_written", "fork_share", {"drop_cond": 9}),
    # a hit is taken only on the request's own chain value (conds[6]: hmap[chain] == b)
    ("table_isolation", "hit", {"drop_cond": 6}),
])
def test_a_weakened_rule_gives_a_counterexample(inv, transition, weakened):
    t = _weakened(transition, **weakened)
    ob = prove_one(REQUEST_INVARIANTS[inv], t, POOL_INVS)
    assert ob.result == COUNTEREXAMPLE, ob
    assert prove_one(REQUEST_INVARIANTS[inv], REQUEST_TRANSITIONS[transition],
                     POOL_INVS).result == PROVED


def test_the_dropped_conditions_are_the_ones_named():
    run = _served_fork()
    s = run.s
    from pagedkv.spec import CONCRETE

    conds, _, _ = REQUEST_TRANSITIONS["fork_share"].plan(CONCRETE, s, r="c", p="a", b=0)
    assert len(conds) == 11
    conds, _, _ = REQUEST_TRANSITIONS["write_block"].plan(CONCRETE, s, r="a", b=0)
    assert len(conds) == 4
    conds, _, _ = REQUEST_TRANSITIONS["hit"].plan(CONCRETE, s, r="a", b=0)
    assert len(conds) == 7


def test_walks_and_bounded_search_fire_every_request_transition_without_violation():
    cfg = ExploreConfig(blocks=3, holders=2, block_size=2, max_window=3, layer="request",
                        max_tokens=6, hashes=(1, 2))
    walks = walk_requests(cfg, walks=60, steps=150)
    assert walks.violations == {}
    res = explore(ExploreConfig(blocks=2, holders=2, block_size=2, max_inflight=2,
                                max_window=2, layer="request", max_tokens=3, hashes=(1,),
                                max_depth=6))
    assert res.complete and res.violations == {} and res.frontier > 0
    fired = {n for n, k in walks.fired.items() if k} | {n for n, k in res.fired.items() if k}
    assert fired == set(REQUEST_TRANSITIONS)


def test_request_violations_names_a_corrupted_table():
    run = _served_fork()
    s = run.s
    from pagedkv.spec import CONCRETE

    bad = s.replace(tab=CONCRETE.store(s.tab, "c", CONCRETE.store(s.tab["c"], 1, 0)))
    names = {n for n, _ in request_violations(bad)}
    assert "table_entries_held" in names
    assert request_violations(s) == []
    assert s.content[0] != NO_HASH and s.content[1] == NO_HASH


def test_every_field_declares_its_index_kinds():
    """The spec declares, once, what each field is indexed by; readers derive from it."""
    import dataclasses

    from pagedkv.spec.model import ARRAY_FIELDS, FIELD_DEFAULT, INDEX_KIND
    from pagedkv.spec.requests import REQUEST_INDEX_KIND, TABLE_FIELDS

    assert set(INDEX_KIND) == set(ARRAY_FIELDS) == set(FIELD_DEFAULT)
    assert set(REQUEST_INDEX_KIND) == set(TABLE_FIELDS) == {
        f.name for f in dataclasses.fields(RequestState)} - {"pool"}
    fresh = initial_request_state(initial_state(2, 2))
    for f, kinds in REQUEST_INDEX_KIND.items():  # nesting depth matches the declaration
        depth, v = 0, getattr(fresh, f)
        while hasattr(v, "default"):
            depth, v = depth + 1, v.default
        assert depth == len(kinds), f


@pytest.mark.parametrize("seed", range(4))
def test_fire_is_the_guard_then_the_effect(seed):
    """``fire`` (the explorer's and the call programs' lazy evaluation) agrees with ``guard``
    and ``effect`` on every move of every state of seeded walks through the request layer."""
    import random

    from pagedkv.spec import CONCRETE

    rng = random.Random(seed)
    cfg = ExploreConfig(blocks=3, holders=2, block_size=2, max_window=3, layer="request",
                        max_tokens=5, hashes=(1, 2))
    moves = [(t, p) for t in REQUEST_TRANSITIONS.values() for p in request_param_values(t, cfg)]
    s = initial_request_state(initial_state(cfg.blocks, cfg.block_size, range(cfg.holders)))
    fired = refused = 0
    for _ in range(40):
        enabled = []
        for t, p in moves:
            p = _shift_launch(p, s.pool.clock[WATERMARK])
            post = t.fire(s, **p)
            assert (post is not None) == bool(t.guard(CONCRETE, s, **p)), (t.name, p)
            if post is None:
                refused += 1
                continue
            fired += 1
            assert post.flattened() == t.effect(CONCRETE, s, **p).flattened(), (t.name, p)
            if count(post, "known", 0) <= cfg.max_tokens >= count(post, "known", 1):
                enabled.append(post.flattened())
        if not enabled:
            break
        s = rng.choice(enabled)
    assert fired > 40 and refused > fired
