"""The spec's guards, effects and invariants, compiled for a pool's arrays.

Each spec function is evaluated once with a symbolic ``ops`` and a symbolic view whose reads
build Python source over the pool's arrays (``s.state[b] == FREE`` builds ``state[b] == 0``,
``ops.And(x, y)`` builds ``(x and y)``); the source is compiled into a function over this
pool's arrays. What runs is the spec's own guard, compiled: replacing a spec function (e.g.
a weakened guard) is picked up at the next call. A compiled function is checked against the
interpreted one on a few concrete probe states before use; anything the symbolic evaluation
cannot express (Python truth tests on terms, unknown constants) falls back to interpretation.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from pagedkv.spec import ALL_STATES, CONCRETE, NO_HASH, PARAM_KINDS, Overlay
from pagedkv.spec.model import FIELD_DEFAULT, INDEX_KIND

from .storage import ALIVE, ATTRIBUTES, DICT, FIELDS, HOLDS, NHELD, PoolStorage, read_source


class _Unsupported(Exception):
    pass


def _lit(x: Any) -> str:
    if isinstance(x, _Sym):
        return f"bool({x.src})" if x.boolish else x.src
    if x is None or isinstance(x, bool):
        return repr(x)
    if isinstance(x, int):
        return repr(int(x))
    raise _Unsupported(f"constant {x!r}")


def _truth(x: Any) -> str:
    return x.src if isinstance(x, _Sym) else _lit(x)


class _Sym:
    """A term of a spec function, as Python source."""

    __slots__ = ("src", "boolish")

    def __init__(self, src: str, boolish: bool = False) -> None:
        self.src = src
        self.boolish = boolish  # truthy-valued (from and/or): compared as bool(...)

    def _op(self, op: str, other: Any, rev: bool = False) -> _Sym:
        a, b = _lit(self), _lit(other)
        return _Sym(f"({b} {op} {a})" if rev else f"({a} {op} {b})")

    def __eq__(self, o: Any) -> _Sym:  # type: ignore[override]
        return self._op("==", o)

    def __ne__(self, o: Any) -> _Sym:  # type: ignore[override]
        return self._op("!=", o)

    def __lt__(self, o: Any) -> _Sym:
        return self._op("<", o)

    def __le__(self, o: Any) -> _Sym:
        return self._op("<=", o)

    def __gt__(self, o: Any) -> _Sym:
        return self._op(">", o)

    def __ge__(self, o: Any) -> _Sym:
        return self._op(">=", o)

    def __add__(self, o: Any) -> _Sym:
        return self._op("+", o)

    def __radd__(self, o: Any) -> _Sym:
        return self._op("+", o, True)

    def __sub__(self, o: Any) -> _Sym:
        return self._op("-", o)

    def __rsub__(self, o: Any) -> _Sym:
        return self._op("-", o, True)

    def __mul__(self, o: Any) -> _Sym:
        return self._op("*", o)

    def __rmul__(self, o: Any) -> _Sym:
        return self._op("*", o, True)

    def __neg__(self) -> _Sym:
        return _Sym(f"(-{_lit(self)})")

    __hash__ = None  # type: ignore[assignment]

    def __bool__(self) -> bool:
        raise _Unsupported("truth value of a symbolic term")

    def __iter__(self) -> Any:
        raise _Unsupported("iteration over a symbolic term")

    def __getitem__(self, k: Any) -> Any:
        raise _Unsupported("indexing a scalar term")


class _SymArr:
    """A spec array read through a source template over the pool's representation."""

    __slots__ = ("read",)

    def __init__(self, read: Any) -> None:
        self.read = read

    def __getitem__(self, k: Any) -> Any:
        return self.read(_lit(k))


class _SymStore:
    """``ops.store(base, key, value)``: reads through it pick the stored value when keys agree."""

    __slots__ = ("base", "key", "value")

    def __init__(self, base: Any, key: Any, value: Any) -> None:
        self.base, self.key, self.value = base, key, value

    def __getitem__(self, k: Any) -> Any:
        ks, mine = _lit(k), _lit(self.key)
        if ks == mine:
            return self.value
        if not isinstance(self.value, _Sym | bool | int):
            raise _Unsupported("conditional read of a nested array")
        return _Sym(f"({_lit(self.value)} if {ks} == {mine} else {_lit(self.base[k])})")

    def entries(self) -> list[tuple[str, str]]:
        """(key, value) sources, oldest store first."""
        out: list[tuple[str, str]] = []
        node: Any = self
        while isinstance(node, _SymStore):
            out.append((_lit(node.key), _lit(node.value)))
            node = node.base
        return out[::-1]


class _SymIds:
    """``s.block_ids`` / ``s.holder_ids``: a comprehension over them yields one loop variable,
    which ``ops.Sum`` turns into a generator expression."""

    __slots__ = ("src",)
    counter = [0]

    def __init__(self, src: str) -> None:
        self.src = src

    def __iter__(self) -> Any:
        _SymIds.counter[0] += 1
        var = f"_v{_SymIds.counter[0]}"
        _LOOPS[var] = self.src
        yield _Sym(var)


_LOOPS: dict[str, str] = {}


class _SymOps:
    name = "source"

    @staticmethod
    def And(*args: Any) -> Any:
        return _Sym("(" + " and ".join(_truth(a) for a in args) + ")", True) if args else True

    @staticmethod
    def Or(*args: Any) -> Any:
        return _Sym("(" + " or ".join(_truth(a) for a in args) + ")", True) if args else False

    @staticmethod
    def Not(a: Any) -> _Sym:
        return _Sym(f"(not {_truth(a)})")

    @staticmethod
    def Implies(a: Any, b: Any) -> _Sym:
        return _Sym(f"((not {_truth(a)}) or {_truth(b)})", True)

    @staticmethod
    def If(c: Any, a: Any, b: Any) -> _Sym:
        return _Sym(f"({_lit(a)} if {_truth(c)} else {_lit(b)})")

    @staticmethod
    def store(arr: Any, key: Any, value: Any) -> _SymStore:
        return _SymStore(arr, key, value)

    @staticmethod
    def Sum(terms: Any) -> _Sym:
        parts = []
        for t in list(terms):
            src = _lit(t)
            loops = [v for v in _LOOPS if v in src]
            if len(loops) > 1:
                raise _Unsupported("nested sums")
            if loops:
                parts.append(f"sum(int({src}) for {loops[0]} in {_LOOPS[loops[0]]})")
            else:
                parts.append(f"int({src})")
        return _Sym("(" + (" + ".join(parts) or "0") + ")")

    @staticmethod
    def is_true(value: Any) -> bool:
        raise _Unsupported("is_true")


class _SymPost:
    __slots__ = ("fields",)

    def __init__(self, fields: dict[str, Any]) -> None:
        self.fields = fields


def _sym_field(field: str, read: Callable[..., str] = read_source) -> _SymArr:
    """A symbolic spec array whose reads are the storage's own (``storage.read_source``, or
    another storage's ``read``)."""
    if FIELDS[field][1] == HOLDS:
        return _SymArr(lambda r: _SymArr(lambda b: _Sym(read(field, r, b))))
    return _SymArr(lambda k: _Sym(read(field, k)))


class _SymView:
    """The pool's arrays as the spec sees them; reads build source over the storage (``read``:
    the source of ``field[keys...]``, by default ``storage.read_source``)."""

    def __init__(self, read: Callable[..., str] = read_source) -> None:
        for f in FIELDS:
            setattr(self, f, _sym_field(f, read))
        self.block_size = _Sym("block_size")
        self.num_blocks = _Sym("num_blocks")
        self.block_ids = _SymIds("range(num_blocks)")
        self.holder_ids = _SymIds("held")

    def replace(self, **changes: Any) -> _SymPost:
        return _SymPost(changes)


# The fields whose writes are compared one by one (holders' sets are checked as holds/nheld),
# and those keyed by something else than a block id (not "touched blocks").
_VERIFIED_FIELDS = tuple(f for f, (_, rep) in FIELDS.items() if rep not in (ALIVE, NHELD, HOLDS))
_NOT_BLOCK_KEYED = tuple(f for f in _VERIFIED_FIELDS if INDEX_KIND[f] != "block")
_CODE_CACHE: dict[Any, Any] = {}


def _source_of(fn: Any, params: tuple[str, ...],
               read: Callable[..., str] = read_source, ops: Any = _SymOps) -> Any:
    """Evaluate a spec function symbolically: a term, a post-state, or None if unsupported."""
    _LOOPS.clear()
    try:
        return fn(ops, _SymView(read), **{p: _Sym(p) for p in params})
    except (_Unsupported, TypeError, AttributeError):
        return None


def predicate_source(fn: Any, params: tuple[str, ...]) -> str | None:
    """The Python expression (over ``params`` and the pool's arrays) a predicate compiles to."""
    key = ("src", fn, params)
    if key not in _CODE_CACHE:
        term = _source_of(fn, params)
        _CODE_CACHE[key] = None if term is None else _truth(term)
    return _CODE_CACHE[key]


def predicate_code(fn: Any, params: tuple[str, ...], label: str) -> Any:
    """Code of ``lambda *params: <the predicate>`` (truthiness), or None."""
    key = ("pred", fn, params)
    if key not in _CODE_CACHE:
        body = predicate_source(fn, params)
        code = None
        if body is not None:
            code = compile(f"lambda {', '.join(params)}: {body}",
                           f"<spec {label}, compiled>", "eval")
        _CODE_CACHE[key] = code
    return _CODE_CACHE[key]


def predicate_many_code(fn: Any, params: tuple[str, ...], label: str) -> Any:
    """Code of ``def many(items)``: the index of the first parameter tuple of ``items`` on
    which the predicate is false (or cannot be evaluated: a ``TypeError``), or -1; or None."""
    key = ("pred_many", fn, params)
    if key not in _CODE_CACHE:
        body = predicate_source(fn, params)
        code = None
        if body is not None:
            code = compile(f"def many(items):\n"
                           f"    for _i, ({', '.join(params)},) in enumerate(items):\n"
                           f"        try:\n"
                           f"            if not ({body}):\n"
                           f"                return _i\n"
                           f"        except TypeError:\n"
                           f"            return _i\n"
                           f"    return -1\n", f"<spec {label}, batched>", "exec")
        _CODE_CACHE[key] = code
    return _CODE_CACHE[key]


def predicate_many_agrees(fn: Any, params: tuple[str, ...], code: Any) -> bool:
    """The batched predicate agrees with the interpreted one on the probe states: on each
    parameter tuple alone, and on all of them in one call."""
    import itertools

    key = ("many", fn, params)
    if key not in _PROBE_CHECKED:
        ok = True
        try:
            for p in _probe_pools():
                ns = p.namespace()
                exec(code, ns)
                many = ns["many"]
                combos = list(itertools.product(*(_PROBE_VALUES[x] for x in params)))
                wants = [bool(fn(CONCRETE, p.view, **dict(zip(params, c, strict=True))))
                         for c in combos]
                if (any(many([c]) != (-1 if w else 0) for c, w in zip(combos, wants,
                                                                     strict=True))
                        or many(combos) != next((i for i, w in enumerate(wants) if not w), -1)):
                    ok = False
                    break
        except Exception:  # noqa: BLE001 - any disagreement (even a crash) means: interpret
            ok = False
        _PROBE_CHECKED[key] = ok
    return _PROBE_CHECKED[key]


def effect_code(fn: Any, params: tuple[str, ...], label: str) -> Any:
    """Code of two functions: ``predict(*params)`` evaluated on the pre-state returns the keys
    and values the spec's effect writes (and r's predicted holds/nheld); ``check(P)`` on the
    post-state returns None or the first (field, key, expected, real) that differs."""
    key = ("effect", fn, params)
    if key in _CODE_CACHE:
        return _CODE_CACHE[key]
    post = _source_of(fn, params)
    code = None
    if isinstance(post, _SymPost):
        try:
            values: list[str] = []
            checks: list[str] = []
            touched: list[str] = []
            for f in _VERIFIED_FIELDS:
                arr = post.fields.get(f)
                if arr is None:
                    continue
                if not isinstance(arr, _SymStore):
                    raise _Unsupported(f"{f} is not a store chain")
                entries = arr.entries()
                slots = []
                for k, v in entries:
                    slots.append(len(values))
                    values += [k, v]
                for n, i in enumerate(slots):
                    later = [f"P[{j}]" for j in slots[n + 1:]]
                    read = read_source(f, f"P[{i}]")
                    cond = f"{read} != P[{i + 1}]"
                    if later:
                        cond = f"P[{i}] not in ({', '.join(later)},) and {cond}"
                    checks.append(
                        f"    if {cond}: return ({f!r}, P[{i}], P[{i + 1}], {read})")
                    if f not in _NOT_BLOCK_KEYED:
                        touched.append(f"P[{i}]")
            extra = []
            if "r" in params:
                nheld = post.fields.get("nheld", _SymView().nheld)[_Sym("r")]
                extra.append(f"{_lit(nheld)}")
                i = len(values)
                values.append(extra[-1])
                checks.append(f"    if len(held.get(r, ())) != P[{i}]: "
                              f"return ('nheld', r, P[{i}], len(held.get(r, ())))")
                if "b" in params:
                    holds = post.fields.get("holds", _SymView().holds)[_Sym("r")][_Sym("b")]
                    i = len(values)
                    values.append(f"bool({_truth(holds)})")
                    checks.append(f"    if (b in held.get(r, ())) != P[{i}]: "
                                  f"return ('holds', (r, b), P[{i}], not P[{i}])")
            args = ", ".join(params)
            src = (f"def predict({args}):\n    return ({', '.join(values)},)\n"
                   f"def check({', '.join(('P', *params))}):\n" + "\n".join(checks)
                   + "\n    return None\n"
                   f"def touched(P):\n    return {{{', '.join(touched)}}}\n")
            code = (compile(src, f"<spec {label}, compiled>", "exec"),
                    frozenset(f for f in _VERIFIED_FIELDS if f in post.fields))
        except _Unsupported:
            code = None
    _CODE_CACHE[key] = code
    return code


_PROBE_CHECKED: dict[Any, bool] = {}


def batch_code(t: Any, label: str) -> Any:
    """Code of ``run_many(items)`` and ``run_where(items)``.

    ``run_many``: transition t on each parameter tuple of ``items`` in turn,
    its guard and its effect both the spec's own, compiled. Each guard is evaluated on the
    state the previous elements left; the effect's stores are computed on that state (as the
    spec's effect reads its pre-state: every key and value that reads the pool is evaluated
    into a local before the first store, each pool cell and each repeated subexpression
    once (``_hoisted``); constants and parameters are written as they are) and written
    straight into the pool's lists and holders' sets. Returns the index of the
    first element whose guard fails or cannot be evaluated (a ``TypeError``: an unhashable
    holder; the caller's single transition then says why), it and the rest not applied; or
    -1. ``run_where``: the same loop applying t to each element whose guard holds then (and
    can be evaluated), skipping the others; returns the elements applied, in order.

    Only for transitions whose effect stores into list fields and holders' sets (no hash
    map, no launch set): None otherwise, and the caller runs the single transitions."""
    key = ("batch", t.effect, t.guard, t.params)
    if key in _CODE_CACHE:
        return _CODE_CACHE[key]
    src = batch_source(t)
    code = None if src is None else compile(src, f"<spec {label}, batched>", "exec")
    _CODE_CACHE[key] = code
    return code


def batch_source(t: Any) -> str | None:
    """The Python source ``batch_code`` compiles, or None (see there)."""
    src = None
    guard = predicate_source(t.guard, t.params)
    post = _source_of(t.effect, t.params)
    if t.params and guard is not None and isinstance(post, _SymPost) and post.fields:
        try:
            reads: list[str] = []  # "_t{i} = <source>", evaluated on the pre-state
            stores: list[str] = []

            def pure(src: str) -> str:
                """src itself if it reads nothing of the pool, else a local holding it."""
                if src in t.params or _CONSTANT.fullmatch(src):
                    return src
                reads.append(f"        _t{len(reads)} = {src}")
                return f"_t{len(reads) - 1}"

            for f, arr in post.fields.items():
                attr, rep = FIELDS[f]
                if rep == NHELD:
                    continue  # the size of the holder's set: follows from the holds stores
                if rep == HOLDS:
                    for r, b, v in _holds_entries(arr):
                        r, b = pure(r), pure(b)
                        if v in ("True", "False"):
                            op = "add" if v == "True" else "discard"
                            stores.append(f"        {attr}[{r}].{op}({b})")
                        else:
                            v = pure(f"bool({v})")
                            stores.append(f"        ({attr}[{r}].add if {v} else "
                                          f"{attr}[{r}].discard)({b})")
                    continue
                if rep == DICT and isinstance(arr, _SymStore):  # the hash map: a store of
                    # the field's default removes the key (as ``PoolStorage.write`` does)
                    default = _lit(FIELD_DEFAULT[f])
                    for k, v in arr.entries():
                        k, v = pure(k), pure(v)
                        if v == default:
                            stores.append(f"        {attr}.pop({k}, None)")
                        elif _CONSTANT.fullmatch(v):
                            stores.append(f"        {attr}[{k}] = {v}")
                        else:
                            stores.append(f"        if {v} == {default}:\n"
                                          f"            {attr}.pop({k}, None)\n"
                                          f"        else:\n"
                                          f"            {attr}[{k}] = {v}")
                    continue
                if rep != "list" or not isinstance(arr, _SymStore):
                    raise _Unsupported(f"{f} is not a list store chain")
                for k, v in arr.entries():  # oldest first: a later store to a key wins
                    k, v = pure(k), pure(v)
                    stores.append(f"        {attr}[{k}] = {v}")
            params = ", ".join(t.params)
            body = "\n".join(_hoisted(reads, guard, t.params) + stores)
            src = (f"def run_many(items):\n"
                   f"    for _i, ({params},) in enumerate(items):\n"
                   f"        try:\n"
                   f"            if not ({guard}):\n"
                   f"                return _i\n"
                   f"        except TypeError:\n"  # an unhashable holder: refused, unapplied
                   f"            return _i\n" + body + "\n    return -1\n"
                   f"\n\n"
                   f"def run_where(items):\n"
                   f"    _done = []\n"
                   f"    for _item in items:\n"
                   f"        ({params},) = _item\n"
                   f"        try:\n"
                   f"            if not ({guard}):\n"
                   f"                continue\n"
                   f"        except TypeError:\n"
                   f"            continue\n" + body + "\n        _done.append(_item)\n"
                   "    return _done\n")
        except _Unsupported:
            src = None
    return src


# A literal the symbolic evaluation writes (``_lit``): an int, a bool or None.
_CONSTANT = re.compile(r"-?[0-9]+|True|False|None")

# A read of one list field at a block parameter or at a constant index: ``state[b]``.
_CELL = re.compile(r"\b(" + "|".join(f for f, (_, rep) in FIELDS.items() if rep == "list")
                   + r")\[([a-z]|[0-9]+)\]")


def _wrapped(expr: str) -> bool:
    """expr is one parenthesized expression: its first ``(`` closes at its last character."""
    if not expr.startswith("("):
        return False
    depth = 0
    for i, ch in enumerate(expr):
        depth += (ch == "(") - (ch == ")")
        if depth == 0:
            return i == len(expr) - 1
    return False


def _cell_locals(cells: dict[str, str], keys: set[str]) -> Callable[[re.Match[str]], str]:
    """A ``_CELL.sub`` replacement: a list cell read at one of ``keys`` or at a constant index
    of ``clock`` becomes a local, named once in ``cells`` (cell source -> local name); any
    other read stays as it is."""

    def local(m: re.Match[str]) -> str:
        field, key = m.group(1), m.group(2)
        if not (key in keys or (field == "clock" and key.isdigit())):
            return m.group(0)
        return cells.setdefault(m.group(0), f"_c{len(cells)}")

    return local


def _hoisted(reads: list[str], guard: str, params: tuple[str, ...]) -> list[str]:
    """``reads`` with every list cell they read (``state[b]``, ``clock[0]``) read once into a
    local first: the spec's effect expressions repeat them many times. Only cells that are
    safe to read whatever branch the expressions take: at a block parameter the guard has
    already range-checked (``_in_pool``), or at a constant index of ``clock``. The reads all
    see the pre-state (no store comes before them), so reading a cell once is the same."""
    checked = {p for p in params
               if f"({p} >= 0) and ({p} < num_blocks)" in guard}
    cells: dict[str, str] = {}
    local = _cell_locals(cells, checked)
    body: list[str] = []
    done: list[tuple[str, str]] = []  # (an earlier local, its expression), longest first
    for line in reads:
        name, expr = _CELL.sub(local, line).strip().split(" = ", 1)
        for prev, prev_expr in done:  # pure expressions of the same pre-state: reuse
            expr = prev if expr == prev_expr else expr.replace(prev_expr, prev)
        body.append(f"        {name} = {expr}")
        if _wrapped(expr):  # a whole subexpression wherever its text appears
            done.append((name, expr))
            done.sort(key=lambda pair: -len(pair[1]))
    return [f"        {v} = {cell}" for cell, v in cells.items()] + body


def fused_check_source(bodies: list[tuple[str, str]]) -> str:
    """``def first_failing(blocks)``: the first block of ``blocks`` on which one of the
    predicate sources ``bodies`` is false, or None; and ``def each(b)``: the value of every
    body at block b, in order (what ``fused_check_agrees`` compares with the spec). Each body
    is ``(scope, source)``: over a block ``b`` (scope ``"block"``) or over the block's hash
    ``h`` (``"hash"``), and the pool's arrays. Each list cell the bodies read at ``b``, or at a
    constant index of ``clock``, is read once per block into a local: the conjunction of the
    local invariants reads ``state[b]`` about thirty times. Only for blocks of the pool (every
    read at ``b`` is in range)."""
    cells: dict[str, str] = {}
    if any(scope == "hash" for scope, _ in bodies):
        cells["hash[b]"] = "h"
    local = _cell_locals(cells, {"b"})
    terms = [f"({_CELL.sub(local, body)})" for _, body in bodies]

    def reads(indent: str) -> str:
        return "".join(f"{indent}{name} = {cell}\n" for cell, name in cells.items())

    return ("def first_failing(blocks):\n"
            "    for b in blocks:\n" + reads("        ")
            + f"        if not ({' and '.join(terms)}):\n"
            "            return b\n"
            "    return None\n"
            "\n\n"
            "def each(b):\n" + reads("    ")
            + f"    return ({', '.join(f'bool{t}' for t in terms)},)\n")


def _invalid_state_pool() -> PoolStorage:
    """A fresh pool whose block 0 has no state of the spec's (the probes' states are all
    valid)."""
    p = PoolStorage(4, 4)
    p.state[0] = max(ALL_STATES) + 1
    return p


def fused_check_agrees(src: str, invariants: list[Any]) -> bool:
    """``fused_check_source``'s functions agree with the interpreted invariants (block- or
    hash-scoped, the hash being the block's) on the probe states, on a fresh pool (where they
    all hold) and on one with a block in no state of the spec's (the probes' states are all
    valid): ``each`` gives every invariant's value at every block, and ``first_failing``
    of each block alone returns None exactly where they all hold, of all the blocks at once
    the first block where one does not."""
    key = ("fused", src, tuple(inv.pred for inv in invariants))
    if key not in _PROBE_CHECKED:
        ok = True
        try:
            code = compile(src, "<spec local invariants, fused>", "exec")
            for p in [*_probe_pools(), PoolStorage(4, 4), _invalid_state_pool()]:
                ns = p.namespace()
                exec(code, ns)
                first_failing, each = ns["first_failing"], ns["each"]
                blocks = list(range(p.num_blocks))
                values = [tuple(bool(inv.pred(CONCRETE, p.view,
                                              b if inv.scope == "block" else p.hash[b]))
                                for inv in invariants) for b in blocks]
                if (any(each(b) != v for b, v in zip(blocks, values, strict=True))
                        or any((first_failing([b]) is None) != all(v)
                               for b, v in zip(blocks, values, strict=True))
                        or first_failing(blocks) != next(
                            (b for b, v in zip(blocks, values, strict=True) if not all(v)),
                            None)):
                    ok = False
                    break
        except Exception:  # noqa: BLE001 - any disagreement (even a crash) means: one by one
            ok = False
        _PROBE_CHECKED[key] = ok
    return _PROBE_CHECKED[key]


def _holds_entries(arr: Any) -> list[tuple[str, str, str]]:
    """(holder, block, value) sources of ``holds`` stores (``store(holds, r, store(holds[r],
    b, v))``), oldest first; each inner chain must start from that holder's own set."""
    out: list[tuple[str, str, str]] = []
    outer: list[tuple[Any, Any]] = []
    node = arr
    while isinstance(node, _SymStore):
        outer.append((node.key, node.value))
        node = node.base
    if not isinstance(node, _SymArr):
        raise _Unsupported("holds is not a store chain over the pool's sets")
    for r, inner in reversed(outer):
        chain: list[tuple[Any, Any]] = []
        while isinstance(inner, _SymStore):
            chain.append((inner.key, inner.value))
            inner = inner.base
        if not isinstance(inner, _SymArr):
            raise _Unsupported("a holder's set is not a store chain over its own set")
        out += [(_lit(r), _lit(b), _truth(v)) for b, v in reversed(chain)]
    return out


def batch_agrees(t: Any, code: Any, fn: str = "run_many") -> bool:
    """On the probe states, for every parameter tuple: ``run_many`` of it alone refuses
    exactly where the interpreted guard fails (changing nothing) and otherwise leaves the
    pool exactly where the interpreted effect puts it; and a batch of two equals the two
    applied one after the other by the interpreted spec. ``fn="run_where"`` checks
    ``run_where`` likewise (skipping each element whose interpreted guard fails), and on a
    batch of every probe tuple too."""
    import itertools

    key = ("batch", t.effect, t.guard, t.params, code, fn)
    if key in _PROBE_CHECKED:
        return _PROBE_CHECKED[key]
    ok, where = True, fn == "run_where"
    try:
        combos = list(itertools.product(*(_PROBE_VALUES[x] for x in t.params)))
        for seed, pre in enumerate(_effect_probe_pools(t)):
            mine, spec = PoolStorage(pre.num_blocks, 4), PoolStorage(pre.num_blocks, 4)
            ns = mine.namespace()  # bound to mine's lists, which copy_from fills in place
            exec(code, ns)
            pairs = [(c, d) for c in combos[seed::7] for d in combos[::11]]
            batches = [[c] for c in combos] + [list(pair) for pair in pairs]
            for batch in (batches + [combos]) if where else batches:
                mine.copy_from(pre)
                spec.copy_from(pre)
                got = ns[fn](batch)
                want: Any = [] if where else -1
                for i, combo in enumerate(batch):
                    kw = dict(zip(t.params, combo, strict=True))
                    if not t.guard(CONCRETE, spec.view, **kw):
                        if where:
                            continue
                        want = i
                        break
                    spec.write(t.effect(CONCRETE, spec.view, **kw), kw.get("r"), kw.get("b"))
                    if where:
                        want.append(combo)
                if got != want or any(getattr(mine, a) != getattr(spec, a)
                                      for a in ATTRIBUTES):
                    ok = False
                    break
            if not ok:
                break
    except Exception:  # noqa: BLE001 - any disagreement (even a crash) means: run the singles
        ok = False
    _PROBE_CHECKED[key] = ok
    return ok


def scrambled_pool(seed: int, num_blocks: int = 6, *, negative: bool = False) -> PoolStorage:
    """A small pool with arbitrary array contents (not necessarily a reachable state), for
    comparing compiled and interpreted spec functions. ``negative`` allows -1 counters."""
    import random

    rnd = random.Random(seed)
    p = PoolStorage(num_blocks, 4)
    n = p.num_blocks
    p.state[:] = [rnd.randrange(6) for _ in range(n)]
    for arr, hi in ((p.ref, 3), (p.retire, 4), (p.wpend, 3), (p.filled, 5), (p.gen, 3)):
        arr[:] = [rnd.randrange(-1 if negative else 0, hi) for _ in range(n)]
    p.clock[:] = [rnd.randrange(-1 if negative else 0, 4) for _ in p.clock]
    p.inflight.update(L for L in range(4) if rnd.random() < 0.5)
    p.init[:] = [rnd.random() < 0.5 for _ in range(n)]
    p.hash[:] = [rnd.choice((NO_HASH, 11, 12)) for _ in range(n)]
    p.queued[:] = [rnd.random() < 0.5 for _ in range(n)]
    p.hmap.update({11: rnd.randrange(n), 12: rnd.randrange(-1, n)})
    p.held.update({"a": {b for b in range(n) if rnd.random() < 0.5}, "b": set()})
    p.count[:] = [rnd.randrange(4) for _ in p.count]
    return p


def _probe_pools() -> list[PoolStorage]:
    """The pools every compiled function is checked on before use."""
    return [scrambled_pool(seed, negative=seed == 3) for seed in range(4)]


# Seeds of scrambled pools on which each transition's guard holds for some parameters. A random
# pool rarely satisfies a guard such as recycle's or commit's, so without these a compiled
# effect would be compared with the spec almost only where it refuses. Found once by
# ``find_witness_seeds`` (a search too slow for every start-up); tests keep the table current.
WITNESS_SEEDS: dict[str, tuple[int, ...]] = {
    "allocate": (101, 105, 106),
    "publish": (100, 103, 107),
    "begin_write": (116, 123, 146),
    "end_write": (100, 101, 102),
    "launch": (100, 101, 102),
    "complete": (100, 101, 102),
    "advance": (103, 113, 115),
    "rewind": (113, 123, 178),
    "commit": (131, 182, 183),
    "share": (100, 101, 102),
    "release": (100, 102, 103),
    "evict": (101, 102, 105),
    "recycle": (100, 102, 103),
    "open_holder": (100, 101, 102),
    "close_holder": (100, 101, 102),
}


def _param_combos(t: Any) -> list[dict[str, Any]]:
    import itertools

    return [dict(zip(t.params, combo, strict=True))
            for combo in itertools.product(*(_PROBE_VALUES[x] for x in t.params))]


def is_witness(t: Any, seed: int) -> bool:
    """Transition t's guard holds for some probe parameters on ``scrambled_pool(seed)``."""
    view = scrambled_pool(seed).view
    return any(t.guard(CONCRETE, view, **kw) for kw in _param_combos(t))


def find_witness_seeds(t: Any, want: int = 3, seeds: Any = range(100, 2000)) -> tuple[int, ...]:
    """The first ``want`` seeds that are witnesses of t (see ``WITNESS_SEEDS``)."""
    found: list[int] = []
    for seed in seeds:
        if len(found) == want:
            break
        if is_witness(t, seed):
            found.append(seed)
    return tuple(found)


def _effect_probe_pools(t: Any) -> list[PoolStorage]:
    """The probe pools, then pools on which t's guard holds somewhere."""
    return _probe_pools() + [scrambled_pool(seed) for seed in WITNESS_SEEDS.get(t.name, ())]


_PROBE_BY_KIND = {
    "block": range(6), "holder": ("a", "b", "zz"), "slots": (0, 1, 4, 5),
    "bool": (False, True), "hash": (NO_HASH, 11, 13), "launch": (0, 1, 2, 3),
}
# Probe values per parameter name, from the kinds the spec declares.
_PROBE_VALUES = {name: _PROBE_BY_KIND[kind] for name, kind in PARAM_KINDS.items()}


def predicate_agrees(fn: Any, params: tuple[str, ...], code: Any) -> bool:
    """The compiled predicate agrees with the interpreted one on the probe states."""
    import itertools

    key = (fn, params)
    if key not in _PROBE_CHECKED:
        ok = True
        try:
            for p in _probe_pools():
                compiled = eval(code, p.namespace())
                for combo in itertools.product(*(_PROBE_VALUES[x] for x in params)):
                    want = bool(fn(CONCRETE, p.view, **dict(zip(params, combo, strict=True))))
                    if bool(compiled(*combo)) != want:
                        ok = False
                        break
                if not ok:
                    break
        except Exception:  # noqa: BLE001 - any disagreement (even a crash) means: interpret
            ok = False
        _PROBE_CHECKED[key] = ok
    return _PROBE_CHECKED[key]



def effect_agrees(t: Any, code: Any) -> bool:
    """On the probe states, wherever the guard holds: the compiled effect writes the fields the
    interpreted effect writes, and the post-state the interpreted effect predicts passes the
    compiled check."""
    import itertools

    key = (t.effect, t.guard, t.params)
    if key in _PROBE_CHECKED:
        return _PROBE_CHECKED[key]
    ok, params = True, t.params
    try:
        for pre, post_pool in zip(_effect_probe_pools(t), _effect_probe_pools(t), strict=True):
            ns = pre.namespace()
            exec(code[0], ns)
            for combo in itertools.product(*(_PROBE_VALUES[x] for x in params)):
                kw = dict(zip(params, combo, strict=True))
                if not t.guard(CONCRETE, pre.view, **kw):
                    continue
                post = t.effect(CONCRETE, pre.view, **kw)
                written = {f for f in _VERIFIED_FIELDS if isinstance(getattr(post, f), Overlay)}
                if written != code[1]:
                    ok = False
                    break
                P = ns["predict"](*combo)
                post_pool.copy_from(pre)
                post_pool.write(post, kw.get("r"), kw.get("b"))
                post_ns = post_pool.namespace()
                exec(code[0], post_ns)
                if post_ns["check"](P, *combo) is not None:
                    ok = False
                    break
            if not ok:
                break
    except Exception:  # noqa: BLE001 - any disagreement (even a crash) means: interpret
        ok = False
    _PROBE_CHECKED[key] = ok
    return ok


# --- the request layer's position rules, over a runtime's counts ------------------------------
_RULES: dict[Any, Any] = {}
_RULE_CHECK_SIZES = (1, 3)  # block sizes on which a compiled rule must equal the spec's


def position_rule(fn: Any, params: tuple[str, ...]) -> Any:
    """A rule over positions (``fn(ops, *positions)``, each a (blocks, offset) pair, returning
    a list of conditions; such as ``spec.requests.commit_bounds``) as a function of a block
    size and the positions' counts: ``f(B, *counts) -> tuple of bools``. The spec's own terms,
    compiled, and checked against the interpreted rule on every count up to two blocks and one
    position at block sizes 1 and 3; if it differs anywhere (or cannot be compiled), the
    interpreted rule runs instead. Cached per function: a replaced one is compiled anew."""
    f = _RULES.get((fn, params))
    if f is None:
        f = _compile_rule(fn, params) or _interpreted_rule(fn)
        _RULES[fn, params] = f
    return f


def _interpreted_rule(fn: Any) -> Any:
    def rule(B: int, *counts: int) -> tuple[bool, ...]:
        return tuple(bool(c) for c in fn(CONCRETE, *(divmod(n, B) for n in counts)))

    return rule


def _rule_terms(fn: Any, params: tuple[str, ...]) -> list[str] | None:
    """The rule's conditions as Python sources over ``{p}_q``, ``{p}_o`` (each count's
    blocks and offset), or None if they cannot be written out."""
    try:
        terms = fn(_SymOps, *((_Sym(f"{p}_q"), _Sym(f"{p}_o")) for p in params))
        return [_truth(t) for t in terms]
    except (_Unsupported, TypeError, AttributeError):
        return None


def _rule_counts(B: int, n: int) -> Any:
    """The counts a compiled rule is checked on at block size B: every tuple of n counts up
    to two blocks and one position."""
    import itertools

    return itertools.product(range(2 * B + 2), repeat=n)


def _compile_rule(fn: Any, params: tuple[str, ...]) -> Any:
    terms = _rule_terms(fn, params)
    if terms is None:
        return None
    lines = [f"def rule(B, {', '.join(params)}):"]
    lines += [f"    {p}_q, {p}_o = divmod({p}, B)" for p in params]
    lines.append(f"    return ({', '.join(terms)},)")
    namespace: dict[str, Any] = {}
    exec(compile("\n".join(lines), f"<spec {fn.__name__}, compiled>", "exec"), namespace)
    compiled, interpreted = namespace["rule"], _interpreted_rule(fn)
    for B in _RULE_CHECK_SIZES:
        for counts in _rule_counts(B, len(params)):
            if tuple(map(bool, compiled(B, *counts))) != interpreted(B, *counts):
                return None
    return compiled


_RULES_MANY: dict[Any, Any] = {}


def position_rule_many(fn: Any, params: tuple[str, ...]) -> Any:
    """``position_rule`` over many rows at once: ``f(B, rows) -> int``, the index of the first
    row of counts (one per parameter) on which some condition of the rule fails, or -1. The
    spec's own terms, compiled into one loop, and checked like ``position_rule`` (each probe
    row alone, and all of them in one call, against the interpreted rule); if it differs
    anywhere or cannot be compiled, a loop over ``position_rule`` runs instead."""
    f = _RULES_MANY.get((fn, params))
    if f is None:
        f = _compile_rule_many(fn, params) or _looped_rule(position_rule(fn, params))
        _RULES_MANY[fn, params] = f
    return f


def _looped_rule(rule: Any) -> Any:
    def rule_many(B: int, rows: Any) -> int:
        for i, row in enumerate(rows):
            if not all(rule(B, *row)):
                return i
        return -1

    return rule_many


def _compile_rule_many(fn: Any, params: tuple[str, ...]) -> Any:
    terms = _rule_terms(fn, params)
    if terms is None:
        return None
    lines = ["def rule_many(B, rows):",
             f"    for _i, ({', '.join(params)},) in enumerate(rows):"]
    lines += [f"        {p}_q, {p}_o = divmod({p}, B)" for p in params]
    lines += [f"        if not ({' and '.join(terms)}):", "            return _i", "    return -1"]
    namespace: dict[str, Any] = {}
    exec(compile("\n".join(lines), f"<spec {fn.__name__}, batched>", "exec"), namespace)
    compiled, interpreted = namespace["rule_many"], _interpreted_rule(fn)
    for B in _RULE_CHECK_SIZES:
        rows = list(_rule_counts(B, len(params)))
        wants = [all(interpreted(B, *row)) for row in rows]
        if any(compiled(B, [row]) != (-1 if want else 0) for row, want in zip(rows, wants,
                                                                             strict=True)):
            return None
        if compiled(B, rows) != next((i for i, w in enumerate(wants) if not w), -1):
            return None
    return compiled
