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
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Vocabulary:
    """How a layer's messages name its fields, flags, states and constants."""

    fields: dict[str, str]
    flags: dict[str, tuple[str, str]]
    state_name: Callable[[Any], str]
    constants: dict[str, str]  # a constant's identifier in the spec -> its name in messages
    owner: str  # "the pool's number of blocks"


POOL_WORDS = Vocabulary(FIELD_WORDS, FLAG_WORDS, state_name,
                        {**{n: n for n in _STATE_NAMES}, "NO_HASH": "none", "NO_BLOCK": "none"},
                        "pool")
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
                 local_defs: dict[str, ast.expr], vocab: Vocabulary = POOL_WORDS) -> None:
        self.env, self.params, self.local_defs, self.vocab = env, params, local_defs, vocab

    def value(self, node: ast.expr) -> Any:
        return eval(compile(ast.fix_missing_locations(ast.Expression(node)), "<guard>", "eval"),
                    self.env)

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
                keys = [self.vocab.state_name(self.value(chain[0]))]
            elif base.attr == "clock":
                keys = [CLOCK_WORDS.get(self.value(chain[0]), f"clock {keys[0]}")]
            return base.attr, keys
        return None

    def term(self, node: ast.expr) -> str:
        """A value in words; state reads carry their current value."""
        if isinstance(node, ast.Name) and node.id in self.local_defs:
            return self.term(self.local_defs[node.id])
        field = self._field(node)
        if field is not None and field[0] in self.vocab.fields:
            v = self.value(node)
            text = self.vocab.fields[field[0]].format(*field[1], "?", "?")
            shown = self.vocab.state_name(v) if field[0] == "state" else repr(v)
            return f"{text} (it is {shown})"
        if isinstance(node, ast.Attribute) and node.attr in ("block_size", "num_blocks"):
            return f"the {self.vocab.owner}'s {node.attr.replace('_', ' ')} ({self.value(node)})"
        if isinstance(node, ast.Name) and node.id in self.vocab.constants:
            return self.vocab.constants[node.id]
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

    def _predicate(self, node: ast.expr, negated: bool) -> str | None:
        """A call of a spec predicate ``pred(ops, s, x, ...)``, said as its own conditions
        (None when it is no such call, or its body cannot be read)."""
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
            return None
        fn = self.env.get(node.func.id)
        if not inspect.isfunction(fn):
            return None
        names = list(inspect.signature(fn).parameters)
        if names[:2] != ["ops", "s"] or len(node.args) != len(names):
            return None
        inner = {n: self.value(a) for n, a in zip(names[2:], node.args[2:], strict=True)}
        state = self.value(node.args[1])  # the state it reads: s, or s.pool in a table's plan
        if not negated:
            return "; ".join(failed_conditions(fn, state, vocab=self.vocab, **inner)) or None
        found = _conjuncts(fn)
        if not found or len(found[0][1]) != 1:  # "not (a and b)" has no single reason
            return None
        prelude, [part] = found[0]
        env, local_defs = _prelude_env(fn, prelude, state, inner)
        return _Words(env, inner, local_defs, self.vocab).say(part, negated=True)

    def say(self, node: ast.expr, negated: bool = False) -> str:
        predicate = self._predicate(node, negated)
        if predicate is not None:
            return predicate
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
        if field is not None and field[0] in self.vocab.flags:
            return self.vocab.flags[field[0]][negated].format(*field[1], "?", "?")
        return f"{self.term(node)} must be {not negated}"


def _prelude_env(fn: Callable[..., Any], prelude: list[ast.stmt], s: Any,
                 params: dict[str, Any]) -> tuple[dict[str, Any], dict[str, ast.expr]]:
    """The names a function's conditions read: its globals, the parameters, ``ops`` and ``s``,
    and what the statements before its conditions bind (each ``x = ...`` also as source)."""
    env: dict[str, Any] = dict(fn.__globals__)
    env.update(params, ops=CONCRETE, s=s)
    local_defs: dict[str, ast.expr] = {}
    for stmt in prelude:
        exec(compile(ast.Module([stmt], []), "<spec>", "exec"), env)
        if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                and isinstance(stmt.targets[0], ast.Name)):
            local_defs[stmt.targets[0].id] = stmt.value
    return env, local_defs


def failed_conditions(guard: Callable[..., Any], s: Any, vocab: Vocabulary = POOL_WORDS,
                      **params: Any) -> list[str]:
    """The conjuncts of ``guard`` that are false on concrete state ``s``, in words (``vocab``:
    the words of the layer ``s`` belongs to)."""
    out: list[str] = []
    for prelude, parts in _conjuncts(guard):
        env, local_defs = _prelude_env(guard, prelude, s, params)
        words = _Words(env, params, local_defs, vocab)
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


def refusal_detail(guard: Callable[..., Any], s: Any, name: str, params: dict[str, Any],
                   vocab: Vocabulary = POOL_WORDS) -> str:
    """A refused step's failed conditions in words, then the step with its arguments."""
    failed = failed_conditions(guard, s, vocab=vocab, **params) or ["its guard does not hold"]
    args = ", ".join(f"{k}={v!r}" for k, v in params.items())
    return "; ".join(failed) + f" ({name}({args}))"


def explain_refusal(transition: Any, s: Any, **params: Any) -> str:
    """One sentence: which conditions of the transition's guard failed."""
    failed = failed_conditions(transition.guard, s, **params)
    if not failed:
        return f"{transition.name} refused"
    return f"{transition.name} refused: " + "; ".join(failed)


# --- the request layer: a plan's table conditions, in words ---------------------------------
# What each request-layer field means ({0}: the request or block, {1}: the entry or block).
TABLE_WORDS = {
    "tlen": "the number of entries in the table of request {0}",
    "tab": "entry {1} of the table of request {0}",
    "slot": "the entry of block {1} in the table of request {0}",
    "chain": "the chain value of full block {1} of request {0}",
    "content": "the seal of block {0}",
    "known_q": "the full blocks of request {0} whose token ids are known",
    "computed_q": "the full blocks request {0} has committed",
}
_POS_CMP = {"pos_le": "must be at most", "pos_eq": "must be"}


class _TableWords(_Words):
    """Renders a request plan's conditions: table fields, positions as counts, and pool
    reads through ``s.pool`` (or a local bound to it) with the pool's glossary."""

    def __init__(self, env: dict[str, Any], params: dict[str, Any],
                 local_defs: dict[str, ast.expr], arg_terms: dict[str, str] | None = None
                 ) -> None:
        super().__init__(env, params, local_defs)
        self.block_size = int(env["s"].pool.block_size)
        env["_pool_s"] = env["s"].pool
        self.arg_terms = arg_terms or {}  # a helper's parameters, as its caller said them

    def arg_words(self, fn: Callable[..., Any], args: list[ast.expr]
                  ) -> tuple[dict[str, Any], dict[str, str]]:
        """A call's arguments by fn's parameter names (``ops`` left out): values and words."""
        names = list(inspect.signature(fn).parameters)
        pairs = [(n, a) for n, a in zip(names, args, strict=False) if n != "ops"]
        return ({n: self.value(a) for n, a in pairs},
                {n: self.term(a) for n, a in pairs if n != "s"})

    def _pool_read(self, node: ast.expr) -> ast.expr | None:
        """``s.pool.f[k]`` or ``P.f[k]`` (P = s.pool) rewritten as a pool read ``s.f[k]``."""
        chain, base = [], node
        while isinstance(base, ast.Subscript):
            chain.append(base.slice)
            base = base.value
        if not isinstance(base, ast.Attribute):
            return None
        owner = base.value
        is_pool = (isinstance(owner, ast.Attribute) and owner.attr == "pool"
                   and isinstance(owner.value, ast.Name) and owner.value.id == "s") or (
            isinstance(owner, ast.Name) and isinstance(self.local_defs.get(owner.id),
                                                     ast.Attribute)
            and ast.unparse(self.local_defs[owner.id]) == "s.pool")
        if not is_pool:
            return None
        # Keys evaluated here (they may read the table); the read itself, on the pool.
        new: ast.expr = ast.Attribute(ast.Name("s", ast.Load()), base.attr, ast.Load())
        for k in reversed(chain):
            new = ast.Subscript(new, ast.Constant(self.value(k)), ast.Load())
        return new

    def _count(self, node: ast.expr) -> int | None:
        v = self.value(node)
        if isinstance(v, tuple) and len(v) == 2:
            return int(v[0]) * self.block_size + int(v[1])
        return None

    def term(self, node: ast.expr) -> str:
        if isinstance(node, ast.Name) and node.id in self.arg_terms:
            return self.arg_terms[node.id]
        if isinstance(node, ast.Name) and node.id in self.local_defs:
            n = self._count(node)
            if n is not None:
                return f"position {n}"
            return self.term(self.local_defs[node.id])
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "position" and len(node.args) == 2):
            name, r = self.value(node.args[0]), self.value(node.args[1])
            return f"the {name} position of request {r!r} (it is {self._count(node)})"
        if isinstance(node, ast.Tuple) or (
                isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in ("pos_min", "end_of")):
            return f"position {self._count(node)}"
        pool_read = self._pool_read(node)
        if pool_read is not None:
            words = _Words(dict(self.env, s=self.env["_pool_s"]), self.params, {})
            return words.term(pool_read)
        chain, base = [], node
        while isinstance(base, ast.Subscript):
            chain.append(base.slice)
            base = base.value
        if (isinstance(base, ast.Attribute) and isinstance(base.value, ast.Name)
                and base.value.id == "s" and base.attr in TABLE_WORDS and chain):
            keys = [repr(self.value(k)) for k in reversed(chain)]
            v = self.value(node)
            shown = f"{v:#x}"[:12] + "..." if isinstance(v, int) and abs(v) > 10**12 else repr(v)
            return f"{TABLE_WORDS[base.attr].format(*keys, '?', '?')} (it is {shown})"
        if isinstance(node, ast.Name) and node.id == "B":
            return f"the pool's block size ({self.value(node)})"
        if (isinstance(node, ast.Name) and node.id not in self.params and node.id.islower()
                and isinstance(self.env.get(node.id), int)):
            return f"{node.id} ({self.env[node.id]})"
        return super().term(node)

    def _position_rule(self, node: ast.Call, negated: bool) -> str | None:
        """A call of a rule over positions, ``rule(ops, x, ...)`` (no state: such as
        ``spec.requests.may_hit``), said as its own failed conditions."""
        fn = self.env.get(node.func.id)  # type: ignore[attr-defined]
        if not inspect.isfunction(fn) or negated:
            return None
        names = list(inspect.signature(fn).parameters)
        if names[:1] != ["ops"] or "s" in names or len(node.args) != len(names):
            return None
        inner, terms = self.arg_words(fn, node.args)
        out = []
        for prelude, parts in _conjuncts(fn):
            env, local_defs = _prelude_env(fn, prelude, self.env["s"], inner)
            words = _TableWords(env, inner, local_defs, terms)
            out += [words.say(part) for part in parts if not words.value(part)]
        return "; ".join(out) or None

    def say(self, node: ast.expr, negated: bool = False) -> str:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            fn = node.func.id
            if fn in _POS_CMP and len(node.args) == 3:
                words = _POS_CMP[fn]
                if negated:
                    words = f"must not satisfy '{words}'"
                return f"{self.term(node.args[1])} {words} {self.term(node.args[2])}"
            if fn == "_alive" and len(node.args) == 2:
                r = self.value(node.args[1])
                return f"request {r!r} must {'not ' if negated else ''}be open"
            rule = self._position_rule(node, negated)
            if rule is not None:
                return rule
        pool_read = self._pool_read(node)
        if pool_read is not None:
            words = _Words(dict(self.env, s=self.env["_pool_s"]), self.params, {})
            return words.say(pool_read, negated)
        return super().say(node, negated)


@functools.cache
def _plan_conditions(fn: Callable[..., Any]
                     ) -> tuple[list[ast.stmt], list[tuple[ast.expr, Any]]]:
    """(the statements before the conditions, the conditions, each with the helper it
    expands to when it is ``*helper(...)``, else None). The conditions are a plan's
    ``conds = [...]`` list, or a helper's ``return [...]``."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    body = tree.body[0].body if isinstance(tree.body[0], ast.FunctionDef) else []
    for k, stmt in enumerate(body):
        value = None
        if (isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Name)
                and stmt.targets[0].id == "conds" and isinstance(stmt.value, ast.List)):
            value = stmt.value
        elif isinstance(stmt, ast.Return) and isinstance(stmt.value, ast.List):
            value = stmt.value
        if value is None:
            continue
        out: list[tuple[ast.expr, Any]] = []
        for e in value.elts:
            helper = None
            if isinstance(e, ast.Starred) and isinstance(e.value, ast.Call):
                helper = fn.__globals__.get(ast.unparse(e.value.func))
            out.append((e, helper))
        return body[:k], out
    return [], []


def failed_table_conditions(plan: Callable[..., Any], s: Any,
                            arg_terms: dict[str, str] | None = None, **params: Any
                            ) -> list[str]:
    """The table conditions of a request transition's plan (or of a helper returning a list
    of them) that are false on concrete state ``s``, in words; its pool steps' guards are
    ``failed_conditions``'s. ``arg_terms``: a helper's parameters, as its caller said them."""
    prelude, conds = _plan_conditions(plan)
    env, local_defs = _prelude_env(plan, prelude, s, params)
    words = _TableWords(env, params, local_defs, arg_terms)
    out: list[str] = []
    for node, helper in conds:
        if helper is not None:
            assert isinstance(node, ast.Starred) and isinstance(node.value, ast.Call)
            hparams, terms = words.arg_words(helper, node.value.args)
            out += failed_table_conditions(helper, hparams.pop("s", s), terms, **hparams)
            continue
        try:
            holds = bool(words.value(node))
        except Exception:  # noqa: BLE001 - an unreadable term is reported as failing
            holds = False
        if not holds:
            out.append(words.say(node))
    return out
