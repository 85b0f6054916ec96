"""The host tier's spec: written in ops only, every invariant inductive, a broken effect caught."""

from __future__ import annotations

import ast
import inspect
import textwrap

import pytest

from pagedkv.proofs.host_induction import (
    PROVED,
    host_nonvacuity,
    prove_host,
    prove_host_obligation,
)
from pagedkv.proofs.nonvacuity import DEAD, ENABLED
from pagedkv.spec import host as host_spec
from pagedkv.spec.host import (
    HOST_FREE,
    HOST_LOADING,
    HOST_STORED,
    HOST_STORING,
    HOST_TRANSITIONS,
    HostState,
    initial_host_state,
)
from pagedkv.spec.host_invariants import HOST_INVARIANTS, host_violations
from pagedkv.spec.ops import CONCRETE
from pagedkv.spec.states import NO_BLOCK


def _python_connectives(func) -> list[str]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.BoolOp | ast.IfExp | ast.If | ast.While | ast.Assert):
            bad.append(f"{node.lineno}: {type(node).__name__}")
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            bad.append(f"{node.lineno}: not")
        elif isinstance(node, ast.Compare) and (
            len(node.ops) > 1
            or any(isinstance(op, ast.In | ast.NotIn | ast.Is | ast.IsNot) for op in node.ops)
        ):
            bad.append(f"{node.lineno}: compare")
    return bad


def _spec_functions():
    funcs = [host_spec.in_host_pool, host_spec.loadable, host_spec.evictable,
             host_spec.device_pinned, host_spec._move]
    for t in HOST_TRANSITIONS.values():
        funcs += [t.guard, t.effect]
    funcs += [inv.pred for inv in HOST_INVARIANTS.values()]
    return funcs


@pytest.mark.parametrize("func", _spec_functions(), ids=lambda f: f.__qualname__)
def test_host_spec_uses_ops_only(func) -> None:
    assert _python_connectives(func) == []


def test_host_invariants_hold_initially() -> None:
    assert host_violations(initial_host_state(4), CONCRETE) == []


def _run(s: HostState, name: str, **params) -> HostState:
    t = HOST_TRANSITIONS[name]
    assert CONCRETE.is_true(t.guard(CONCRETE, s, **params)), (name, params)
    s = t.effect(CONCRETE, s, **params)
    assert host_violations(s, CONCRETE) == [], name
    return s


def test_concrete_lifecycle() -> None:
    s = initial_host_state(2)
    s = _run(s, "store_begin", b=0, h=7, d=3)
    assert s.state[0] == HOST_STORING and s.dreader[3] == 0 and s.pins[0] == 1
    assert not CONCRETE.is_true(HOST_TRANSITIONS["load_begin"].guard(CONCRETE, s, b=0))
    assert not CONCRETE.is_true(HOST_TRANSITIONS["evict"].guard(CONCRETE, s, b=0))
    assert not CONCRETE.is_true(  # the device source is pinned by the store in flight
        HOST_TRANSITIONS["store_begin"].guard(CONCRETE, s, b=1, h=8, d=3))
    s = _run(s, "store_done", b=0)
    assert s.state[0] == HOST_STORED and s.dreader[3] == NO_BLOCK
    s = _run(s, "load_begin", b=0)
    s = _run(s, "load_begin", b=0)
    assert s.state[0] == HOST_LOADING and s.pins[0] == 2
    assert not CONCRETE.is_true(HOST_TRANSITIONS["evict"].guard(CONCRETE, s, b=0))
    s = _run(s, "load_done", b=0)
    s = _run(s, "load_done", b=0)
    s = _run(s, "evict", b=0)
    assert s.state[0] == HOST_FREE and s.hmap[7] == NO_BLOCK
    s = _run(s, "store_begin", b=1, h=8, d=3)
    s = _run(s, "store_fail", b=1)
    assert s.state[1] == HOST_FREE and s.hmap[8] == NO_BLOCK and s.dreader[3] == NO_BLOCK


def test_every_host_obligation_proved() -> None:
    results = prove_host()
    assert len(results) == len(HOST_INVARIANTS) * len(HOST_TRANSITIONS)
    assert {(o.invariant, o.transition, o.result) for o in results if o.result != PROVED} == set()


def _broken(name: str, effect) -> dict:
    t = HOST_TRANSITIONS[name]
    return {**HOST_TRANSITIONS, name: host_spec.HostTransition(t.name, t.params, t.guard,
                                                                effect, t.doc)}


def test_evict_keeping_the_hash_map_is_a_counterexample() -> None:
    def evict_keeps_hmap(ops, s, b):
        return s.replace(**host_spec._move(ops, s, b, HOST_FREE),
                         hash=ops.store(s.hash, b, 0))

    ts = _broken("evict", evict_keeps_hmap)
    ob = prove_host_obligation("host_one_block_per_hash", "evict", transitions=ts)
    assert ob.result == "counterexample"
    assert ob.counterexample["params"]["b"] >= 0


def test_store_done_keeping_the_device_pin_is_a_counterexample() -> None:
    def done_keeps_pin(ops, s, b):
        return s.replace(**host_spec._move(ops, s, b, HOST_STORED),
                         pins=ops.store(s.pins, b, 0), src=ops.store(s.src, b, NO_BLOCK))

    ts = _broken("store_done", done_keeps_pin)
    ob = prove_host_obligation("host_device_reader_is_storing", "store_done", transitions=ts)
    assert ob.result == "counterexample"


def test_touching_another_block_fails_the_frame_condition() -> None:
    def evict_also_frees_block_zero(ops, s, b):
        post = HOST_TRANSITIONS["evict"].effect(ops, s, b)
        return post.replace(pins=ops.store(post.pins, 0, 0))

    ts = _broken("evict", evict_also_frees_block_zero)
    ob = prove_host_obligation("host_conservation", "evict", transitions=ts)
    assert ob.result == "counterexample"
    assert "frame" in ob.detail


def test_evict_guard_without_pin_check_still_needs_stored() -> None:
    # dropping the state test from evict's guard lets it free a block a load pins
    def guard(ops, s, b):
        return host_spec.in_host_pool(ops, s, b)

    t = HOST_TRANSITIONS["evict"]
    ts = {**HOST_TRANSITIONS, "evict": host_spec.HostTransition(t.name, t.params, guard,
                                                                 t.effect, t.doc)}
    bad = [o for o in prove_host(transitions=ts) if o.result != PROVED]
    assert bad and all(o.transition == "evict" for o in bad)


def test_every_host_transition_is_enabled_and_a_dead_guard_is_reported() -> None:
    assert host_nonvacuity() == {name: ENABLED for name in HOST_TRANSITIONS}

    def never(ops, s, b):  # LOADING and STORED at once
        return ops.And(s.state[b] == HOST_LOADING, s.state[b] == HOST_STORED)

    t = HOST_TRANSITIONS["load_done"]
    ts = {**HOST_TRANSITIONS, "load_done": host_spec.HostTransition(t.name, t.params, never,
                                                                     t.effect, t.doc)}
    got = host_nonvacuity(transitions=ts)
    assert got["load_done"] == DEAD
    assert all(v == ENABLED for n, v in got.items() if n != "load_done")

