"""The spec's functions must evaluate on z3 terms: no Python connectives that silently break.

``and``/``or``/``not`` call ``bool()`` on a z3 term, ``x in xs`` compares with ``==`` and
truth-tests the result, a chained comparison ``a < b < c`` is ``a < b and b < c``, and ``if`` /
``x if c else y`` truth-test a term. All must go through ``ops``.
"""

from __future__ import annotations

import ast
import inspect
import textwrap

import pytest

from pagedkv.spec import INVARIANTS, TRANSITIONS, transitions
from pagedkv.spec import invariants as invariants_module


def lint(func) -> list[str]:
    """Python-connective uses in a function's source, as 'line: what' strings."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    problems: list[str] = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", "?")
        if isinstance(node, ast.BoolOp):
            problems.append(f"{line}: python '{type(node.op).__name__.lower()}'")
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            problems.append(f"{line}: python 'not'")
        elif isinstance(node, ast.Compare):
            if len(node.ops) > 1:
                problems.append(f"{line}: chained comparison")
            if any(isinstance(op, ast.In | ast.NotIn | ast.Is | ast.IsNot) for op in node.ops):
                problems.append(f"{line}: 'in'/'is' test")
        elif isinstance(node, ast.IfExp):
            problems.append(f"{line}: conditional expression (use ops.If)")
        elif isinstance(node, ast.If | ast.While | ast.Assert):
            problems.append(f"{line}: {type(node).__name__.lower()} statement on a term")
    return problems


def _spec_functions():
    funcs = {}
    for t in TRANSITIONS.values():
        funcs[f"{t.name}.guard"] = t.guard
        funcs[f"{t.name}.effect"] = t.effect
    for inv in INVARIANTS.values():
        funcs[f"{inv.name}.pred"] = inv.pred
    # the helpers they call
    for module in (transitions, invariants_module):
        for name, obj in vars(module).items():
            if inspect.isfunction(obj) and obj.__module__ == module.__name__:
                funcs.setdefault(f"{module.__name__}.{name}", obj)
    return funcs


@pytest.mark.parametrize("name", sorted(_spec_functions()))
def test_spec_function_uses_only_ops(name):
    assert lint(_spec_functions()[name]) == []


def test_the_linter_catches_each_pitfall():
    def bad(ops, s, b, xs):
        a = s.ref[b] > 0 and s.pending[b] == 0
        c = not s.init[b]
        d = b in xs
        e = 0 <= b < 3
        f = 1 if s.init[b] else 0
        if s.ref[b]:
            pass
        return a, c, d, e, f

    found = " ".join(lint(bad))
    for word in ("'and'", "'not'", "'in'", "chained", "conditional", "if statement"):
        assert word in found, word


def test_spec_evaluates_on_z3_terms():
    z3 = pytest.importorskip("z3")
    from pagedkv.spec import Z3Ops
    from pagedkv.spec.model import ARRAY_FIELDS, PoolState, initial_state

    ops, I, Bo = Z3Ops(), z3.IntSort(), z3.BoolSort()
    template = initial_state(1, 1)
    arrays = {f: z3.Array(f, I, Bo if isinstance(getattr(template, f).default, bool) else I)
              for f in ARRAY_FIELDS if f != "holds"}
    s = PoolState(**arrays, holds=z3.Array("holds", I, z3.ArraySort(I, Bo)),
                  block_size=z3.Int("B"), num_blocks=z3.Int("N"), block_ids=(0, 1),
                  holder_ids=(0, 1))
    b, r = z3.Int("b"), z3.Int("r")
    for t in TRANSITIONS.values():
        params = {p: z3.Int(p) for p in t.params}
        assert z3.is_bool(t.guard(ops, s, **params)), t.name
        post = t.effect(ops, s, **params)
        assert isinstance(post, PoolState)
    for inv in INVARIANTS.values():
        if inv.scope in ("block", "hash", "holder", "launch"):
            assert z3.is_bool(inv.pred(ops, s, b if inv.scope != "holder" else r)), inv.name
        elif inv.scope == "pool":
            assert z3.is_bool(inv.pred(ops, s)), inv.name


# Concrete-only helpers of the request layer (they build or read plain states, never terms),
# and ``run_steps``, whose one conditional tests a Python constant (``when is True``: a step
# that always runs), not a term.
_CONCRETE_HELPERS = {"count", "table_of", "request_state", "tables", "summary",
                     "initial_request_state", "request_step", "run_steps", "_passthrough",
                     "leading_hits", "hit_limit"}


def _request_functions():
    from pagedkv.spec import request_invariants, requests

    funcs = {}
    for module in (requests, request_invariants):
        for name, obj in vars(module).items():
            if (inspect.isfunction(obj) and obj.__module__ == module.__name__
                    and name not in _CONCRETE_HELPERS):
                funcs[f"{module.__name__}.{name}"] = obj
    return funcs


@pytest.mark.parametrize("name", sorted(_request_functions()))
def test_request_layer_function_uses_only_ops(name):
    assert lint(_request_functions()[name]) == []


def test_run_steps_is_the_only_exempt_term_function():
    from pagedkv.spec import requests

    problems = lint(requests.run_steps)
    assert problems and all("conditional" in p or "'in'/'is'" in p for p in problems)
