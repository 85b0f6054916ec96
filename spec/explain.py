"""Which condition of a guard failed, in words: read from the guard's own source.

A guard returns ``ops.And(c1, c2, ...)``. ``failed_conditions`` evaluates each conjunct on a
concrete state and renders the false ones with the field glossary below, so a refused call says
"the state of block 3 must be FREE (it is CACHED)" instead of "guard does not hold". Nothing
here is a second copy of a rule: the conjuncts are the guard's, evaluated as written.
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
from collections.abc import Callable
from typing import Any

from .ops import CONCRETE
from .states import state_name

# What each field of PoolState means, for messages ({0}, {1}: its index expressions).
FIELD_WORDS = {
    "state": "the state of block {0}",
    "ref": "the reference count of block {0}",
    "retire": "the launch clock block {0} was retired at",
    "wpend": "the pending writing launches on block {0}",
    "filled": "the written slots of block {0}",
    "gen": "the generation of block {0}",
    "hash": "the prefix hash of block {0}",
    "hmap": "the block cached under hash {0}",
    "nheld": "the number of blocks holder {0} holds",
    "count": "the number of blocks in state {0}",
    "clock": "{0}",
}
CLOCK_WORDS = {0: "the number of launches issued", 1: "the watermark of completed launches"}
# Boolean fields: (required true, required false).
FLAG_WORDS = {
    "init": ("block {0} must have an initialized record",
             "block {0} must not have an initialized record"),
    "queued": ("block {0} must be in the eviction queue",
               "block {0} must not be in the eviction queue"),
    "alive": ("holder {0} must be open", "holder {0} must not be open"),
    "holds": ("holder {0} must hold block {1}", "holder {0} must not hold block {1}"),
    "inflight": ("launch {0} must be in flight", "launch {0} must not be in flight"),
}
_STATE_NAMES = {"FREE", "ALLOCATED", "PUBLISHED", "REFERENCED", "CACHED", "RECLAIMED"}
_CMP_WORDS = {ast.Eq: "must be", ast.NotEq: "must not be", ast.Lt: "must be <",
              ast.LtE: "must be <=", ast.Gt: "must be >", ast.GtE: "must be >="}


@functools.cache
def _conjuncts(guard: Callable[..., Any]) -> tuple[tuple[list[ast.stmt], list[ast.expr]], ...]:
    """(statements before the return, the top-level conjuncts of the returned ops.And)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(guard)))
    except (OSError, TypeError, SyntaxError):  # no source (e.g. a lambda built at run time)
        return ()
    fn = tree.body[0] if tree.body else None
    if not isinstance(fn, ast.FunctionDef):
        return ()
    ret = fn.body[-1]
    if not isinstance(ret, ast.Return) or ret.value is None:
        return ()
    value = ret.value
    is_and = (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute)
              and value.func.attr == "And")
    parts = list(value.args) if is_and else [value]
    return ((fn.body[:-1], parts),)


class _Words:
    """Render a conjunct in words, with the values of what it reads."""

    def __init__(self, env: dict[str, Any], params: dict[str, Any],
                 local_defs: dict[str, ast.expr]) -> None:
        self.env, self.params, self.local_defs = env, params, local_defs

    def value(self, node: ast.expr) -> Any:
        return eval(compile(ast.Expression(node), "<guard>", "eval"), self.env)

    def _field(self, node: ast.expr) -> tuple[str, list[str]] | None:
        """(field name, rendered index keys) of a read ``s.field[k]...``, else None."""
        if isinstance(node, ast.Name) and node.id in self.local_defs:
            return self._field(self.local_defs[node.id])
        chain: list[ast.expr] = []
        base = node
        while isinstance(base, ast.Subscript):
            chain.append(base.slice)
            base = base.value
        if (isinstance(base, ast.Attribute) and isinstance(base.value, ast.Name)
                and base.value.id == "s" and chain):
            keys = [repr(self.value(k)) for k in reversed(chain)]
            if base.attr == "count":
                keys = [state_name(self.value(chain[0]))]
            elif base.attr == "clock":
                keys = [CLOCK_WORDS.get(self.value(chain[0]), f"clock {keys[0]}")]
            return base.attr, keys
        return None

    def term(self, node: ast.expr) -> str:
        """A value in words; state reads carry their current value."""
        if isinstance(node, ast.Name) and node.id in self.local_defs:
            return self.term(self.local_defs[node.id])
        field = self._field(node)
        if field is not None and field[0] in FIELD_WORDS:
            v = self.value(node)
            text = FIELD_WORDS[field[0]].format(*field[1], "?", "?")
            shown = state_name(v) if field[0] == "state" else repr(v)
            return f"{text} (it is {shown})"
        if isinstance(node, ast.Attribute) and node.attr in ("block_size", "num_blocks"):
            return f"the pool's {node.attr.replace('_', ' ')} ({self.value(node)})"
        if isinstance(node, ast.Name) and node.id in _STATE_NAMES:
            return node.id
        if isinstance(node, ast.Name) and node.id in ("NO_HASH", "NO_BLOCK"):
            return "none"
        if isinstance(node, ast.Name) and node.id in self.params:
            return f"{node.id} ({self.params[node.id]!r})"
        if isinstance(node, ast.BinOp):
            op = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*"}.get(type(node.op), "?")
            return f"{self.term(node.left)} {op} {self.term(node.right)}"
        return ast.unparse(node)

    def _holds(self, node: ast.expr) -> bool:
        if isinstance(node, ast.Starred):
            return all(bool(x) for x in self.value(node.value))
        return bool(self.value(node))

    def condition(self, node: ast.expr) -> str:
        """A condition that holds, stated (an implication's premise)."""
        if isinstance(node, ast.Compare) and len(node.ops) == 1:
            op = {ast.Eq: "=", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">",
                  ast.GtE: ">="}.get(type(node.ops[0]), "?")
            return f"{self.term(node.left)} {op} {self.term(node.comparators[0])}"
        return ast.unparse(node)

    def say(self, node: ast.expr, negated: bool = False) -> str:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            op, args = node.func.attr, node.args
            if op == "Not":
                return self.say(args[0], not negated)
            if op == "And" and not negated:
                return " and ".join(self.say(a) for a in args if not self._holds(a))
            if op == "Or" and not negated:
                return "either " + " or ".join(self.say(a) for a in args)
            if op == "Implies" and not negated:
                return f"as {self.condition(args[0])}, {self.say(args[1])}"
            if op == "If" and not negated:
                branch = args[1] if bool(self.value(args[0])) else args[2]
                return self.say(branch)
        if isinstance(node, ast.Compare) and len(node.ops) == 1:
            left, right = node.left, node.comparators[0]
            words = _CMP_WORDS.get(type(node.ops[0]), ast.unparse(node.ops[0]))
            if negated:
                words = {"must be": "must not be", "must not be": "must be"}.get(
                    words, f"must not satisfy '{words}'")
            return f"{self.term(left)} {words} {self.term(right)}"
        field = self._field(node)
        if field is not None and field[0] in FLAG_WORDS:
            return FLAG_WORDS[field[0]][negated].format(*field[1], "?", "?")
        return f"{self.term(node)} must be {not negated}"


def failed_conditions(guard: Callable[..., Any], s: Any, **params: Any) -> list[str]:
    """The conjuncts of ``guard`` that are false on concrete state ``s``, in words."""
    out: list[str] = []
    for prelude, parts in _conjuncts(guard):
        env: dict[str, Any] = dict(guard.__globals__)
        env.update(params, ops=CONCRETE, s=s)
        local_defs: dict[str, ast.expr] = {}
        for stmt in prelude:
            exec(compile(ast.Module([stmt], []), "<guard>", "exec"), env)
            if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                    and isinstance(stmt.targets[0], ast.Name)):
                local_defs[stmt.targets[0].id] = stmt.value
        words = _Words(env, params, local_defs)
        for part in parts:
            if isinstance(part, ast.Starred):
                items = list(words.value(part.value))
                if not all(bool(x) for x in items):  # nothing else can be read of the block
                    return [f"block id {params.get('b')!r} must name a block of this pool"]
                continue
            try:
                holds = bool(words.value(part))
            except Exception:  # noqa: BLE001 - an unreadable term is reported as failing
                holds = False
            if not holds:
                out.append(words.say(part))
    return out


def explain_refusal(transition: Any, s: Any, **params: Any) -> str:
    """One sentence: which conditions of the transition's guard failed."""
    failed = failed_conditions(transition.guard, s, **params)
    if not failed:
        return f"{transition.name} refused"
    return f"{transition.name} refused: " + "; ".join(failed)
