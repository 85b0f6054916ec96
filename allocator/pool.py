"""BlockPool: the block-level runtime. Each public method is one spec transition.

Guards are the spec's own functions (``spec.TRANSITIONS[name].guard``), evaluated on a
read-only view of the pool's arrays, so a refused call raises a typed error and changes
nothing. In checked mode each transition's real effect is compared with the spec's predicted
effect on the touched blocks, and the block-scoped invariants are re-evaluated there: O(1) per
touched block, never a pool scan.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Any

from pagedkv.spec import (
    ALL_STATES,
    ALLOCATED,
    CACHED,
    CONCRETE,
    FREE,
    INVARIANTS,
    NO_BLOCK,
    NO_HASH,
    PUBLISHED,
    RECLAIMED,
    REFERENCED,
    TRANSITIONS,
    Arr,
    Overlay,
    PoolState,
    state_name,
)

from .errors import (
    DoubleFree,
    GuardViolation,
    InvalidArgument,
    InvariantViolation,
    PendingAccess,
    PublishError,
)
from .lru import BlockQueue
from .table import check_block_size, check_count

_GUARD_ERRORS: dict[str, type[GuardViolation]] = {
    "release": DoubleFree,
    "recycle": PendingAccess,
    "allocate": PendingAccess,
    "publish": PublishError,
    "begin_access": PublishError,
}
_BLOCK_INVARIANTS = [inv for inv in INVARIANTS.values() if inv.scope == "block"]
_HASH_INVARIANTS = [inv for inv in INVARIANTS.values() if inv.scope == "hash"]


class _DefaultMap:
    """Read-only ``m[k]`` over a dict with a default (the spec's total arrays)."""

    __slots__ = ("_d", "_default")

    def __init__(self, d: dict[Any, Any], default: Any) -> None:
        self._d = d
        self._default = default

    def __getitem__(self, key: Any) -> Any:
        return self._d.get(key, self._default)


class _HeldBy:
    __slots__ = ("_blocks",)

    def __init__(self, blocks: set[int] | None) -> None:
        self._blocks = blocks

    def __getitem__(self, b: Any) -> bool:
        return self._blocks is not None and b in self._blocks


class _Holds:
    __slots__ = ("_held",)

    def __init__(self, held: dict[Hashable, set[int]]) -> None:
        self._held = held

    def __getitem__(self, r: Any) -> _HeldBy:
        return _HeldBy(self._held.get(r))


class _Alive:
    __slots__ = ("_held",)

    def __init__(self, held: dict[Hashable, set[int]]) -> None:
        self._held = held

    def __getitem__(self, r: Any) -> bool:
        return r in self._held


class _NHeld(_Alive):
    def __getitem__(self, r: Any) -> int:
        blocks = self._held.get(r)
        return 0 if blocks is None else len(blocks)


# ---- the spec's guards, effects and invariants, compiled --------------------------------------
# Each spec function is evaluated once with a symbolic ``ops`` and a symbolic view whose reads
# build Python source over the pool's arrays (``s.state[b] == FREE`` builds ``state[b] == 0``,
# ``ops.And(x, y)`` builds ``(x and y)``); the source is compiled into a function over this
# pool's arrays. What runs is the spec's own guard, compiled: replacing a spec function (e.g.
# a weakened guard) is picked up at the next call. A compiled function is checked against the
# interpreted one on a few concrete probe states before use; anything the symbolic evaluation
# cannot express (Python truth tests on terms, unknown constants) falls back to interpretation.


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


def _row(r: str) -> _SymArr:
    return _SymArr(lambda k: _Sym(f"({k} in held.get({r}, ()))"))


class _SymView:
    """The pool's arrays as the spec sees them; reads build source over BlockPool's fields."""

    def __init__(self) -> None:
        for f in ("state", "ref", "pending", "wpend", "filled", "gen", "init", "hash",
                  "queued", "count"):
            setattr(self, f, _SymArr(lambda k, f=f: _Sym(f"{f}[{k}]")))
        self.hmap = _SymArr(lambda k: _Sym(f"hmap.get({k}, {NO_BLOCK})"))
        self.alive = _SymArr(lambda k: _Sym(f"({k} in held)"))
        self.nheld = _SymArr(lambda k: _Sym(f"len(held.get({k}, ()))"))
        self.holds = _SymArr(_row)
        self.block_size = _Sym("block_size")
        self.num_blocks = _Sym("num_blocks")
        self.block_ids = _SymIds("range(num_blocks)")
        self.holder_ids = _SymIds("held")

    def replace(self, **changes: Any) -> _SymPost:
        return _SymPost(changes)


_VERIFIED_FIELDS = ("state", "ref", "pending", "wpend", "filled", "gen", "init", "hash",
                    "queued", "count", "hmap")
_READ = {f: f"{f}[{{}}]" for f in _VERIFIED_FIELDS}
_READ["hmap"] = f"hmap.get({{}}, {NO_BLOCK})"
_CODE_CACHE: dict[Any, Any] = {}


def _source_of(fn: Any, params: tuple[str, ...]) -> Any:
    """Evaluate a spec function symbolically: a term, a post-state, or None if unsupported."""
    _LOOPS.clear()
    try:
        return fn(_SymOps, _SymView(), **{p: _Sym(p) for p in params})
    except (_Unsupported, TypeError, AttributeError):
        return None


def _predicate_code(fn: Any, params: tuple[str, ...], label: str) -> Any:
    """Code of ``lambda *params: <the predicate>`` (truthiness), or None."""
    key = ("pred", fn, params)
    if key not in _CODE_CACHE:
        term = _source_of(fn, params)
        code = None
        if term is not None:
            src = f"lambda {', '.join(params)}: {_truth(term)}"
            code = compile(src, f"<spec {label}, compiled>", "eval")
        _CODE_CACHE[key] = code
    return _CODE_CACHE[key]


def _effect_code(fn: Any, params: tuple[str, ...], label: str) -> Any:
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
                    read = _READ[f].format(f"P[{i}]")
                    cond = f"{read} != P[{i + 1}]"
                    if later:
                        cond = f"P[{i}] not in ({', '.join(later)},) and {cond}"
                    checks.append(
                        f"    if {cond}: return ({f!r}, P[{i}], P[{i + 1}], {read})")
                    if f not in ("count", "hmap"):
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
                   f"def check(P, {args}):\n" + "\n".join(checks) + "\n    return None\n"
                   f"def touched(P):\n    return {{{', '.join(touched)}}}\n")
            code = (compile(src, f"<spec {label}, compiled>", "exec"),
                    frozenset(f for f in _VERIFIED_FIELDS if f in post.fields))
        except _Unsupported:
            code = None
    _CODE_CACHE[key] = code
    return code


_PROBE_CHECKED: dict[Any, bool] = {}


def _probe_pools() -> list[BlockPool]:
    """A few small pools with scrambled arrays (not necessarily reachable states)."""
    import random

    pools = []
    for seed in range(4):
        rnd = random.Random(seed)
        p = BlockPool(6, 4, checked=False)
        p.compile_spec = False
        n = p.num_blocks
        p.state[:] = [rnd.randrange(6) for _ in range(n)]
        for arr, hi in ((p.ref, 3), (p.pending, 3), (p.wpend, 3), (p.filled, 5), (p.gen, 3)):
            arr[:] = [rnd.randrange(-1 if seed == 3 else 0, hi) for _ in range(n)]
        p.init[:] = [rnd.random() < 0.5 for _ in range(n)]
        p.hash[:] = [rnd.choice((NO_HASH, 11, 12)) for _ in range(n)]
        p.queue.inq[:] = [rnd.random() < 0.5 for _ in range(n)]
        p.hmap.update({11: rnd.randrange(n), 12: rnd.randrange(-1, n)})
        p.held.update({"a": {b for b in range(n) if rnd.random() < 0.5}, "b": set()})
        p.count[:] = [rnd.randrange(4) for _ in p.count]
        pools.append(p)
    return pools


_PROBE_VALUES = {
    "b": range(6), "r": ("a", "b", "zz"), "w": (0, 1, 4, 5), "writes": (False, True),
    "h": (NO_HASH, 11, 13),
}


def _self_check(fn: Any, params: tuple[str, ...], code: Any) -> bool:
    """The compiled predicate agrees with the interpreted one on the probe states."""
    import itertools

    key = (fn, params)
    if key not in _PROBE_CHECKED:
        ok = True
        try:
            for p in _probe_pools():
                compiled = eval(code, p._namespace())
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



def _effect_self_check(t: Any, code: Any) -> bool:
    """On the probe states, wherever the guard holds: the compiled effect writes the fields the
    interpreted effect writes, and the post-state the interpreted effect predicts passes the
    compiled check."""
    import itertools

    key = (t.effect, t.guard, t.params)
    if key in _PROBE_CHECKED:
        return _PROBE_CHECKED[key]
    ok, params = True, t.params
    try:
        for pre, post_pool in zip(_probe_pools(), _probe_pools(), strict=True):
            ns = pre._namespace()
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
                _apply(post_pool, pre, post, kw)
                post_ns = post_pool._namespace()
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


def _apply(dst: BlockPool, pre: BlockPool, post: PoolState, kw: dict[str, Any]) -> None:
    """dst := pre's arrays with the interpreted post-state's writes applied."""
    for f in ("state", "ref", "pending", "wpend", "filled", "gen", "init", "hash", "count"):
        getattr(dst, f)[:] = getattr(pre, f)
    dst.queue.inq[:] = pre.queue.inq
    dst.hmap.clear()
    dst.hmap.update(pre.hmap)
    dst.held.clear()
    dst.held.update({r: set(bs) for r, bs in pre.held.items()})
    for f in ("state", "ref", "pending", "wpend", "filled", "gen", "init", "hash", "count",
              "queued"):
        value = getattr(post, f)
        if isinstance(value, Overlay):
            arr = dst.queue.inq if f == "queued" else getattr(dst, f)
            for k, v in value.changes().items():
                arr[k] = v
    if isinstance(post.hmap, Overlay):
        for h, v in post.hmap.changes().items():
            if v == NO_BLOCK:
                dst.hmap.pop(h, None)
            else:
                dst.hmap[h] = v
    r = kw.get("r")
    if r is not None:
        if not post.alive[r]:
            dst.held.pop(r, None)
        else:
            dst.held.setdefault(r, set())
            if "b" in kw:
                if post.holds[r][kw["b"]]:
                    dst.held[r].add(kw["b"])
                else:
                    dst.held[r].discard(kw["b"])


class BlockPool:
    """Physical blocks, their lifecycle states, the eviction queue and the prefix-hash map."""

    def __init__(self, num_blocks: int, block_size: int, *, checked: bool = True) -> None:
        if check_count(num_blocks, "num_blocks") == 0:
            raise InvalidArgument("num_blocks must be >= 1")
        check_block_size(block_size)
        n = num_blocks
        self.num_blocks = n
        self.block_size = block_size
        self.checked = checked
        self.state = [FREE] * n
        self.ref = [0] * n
        self.pending = [0] * n
        self.wpend = [0] * n
        self.filled = [0] * n
        self.gen = [0] * n
        self.init = [False] * n
        self.hash = [NO_HASH] * n
        self.hmap: dict[int, int] = {}
        self.held: dict[Hashable, set[int]] = {}
        self.count = [0] * len(ALL_STATES)
        self.count[FREE] = n
        self.queue = BlockQueue(n)
        # CACHED blocks that a pending launch still reads: evictable, but not reusable yet.
        self.cached_busy = 0
        # Set to a list to record every transition performed as (name, params).
        self.trace: list[tuple[str, dict[str, Any]]] | None = None
        # Compiled spec functions for this pool's arrays (see "compiled" above); per name:
        # (transition, guard, predict, check, touched). False: interpret everything.
        self.compile_spec = True
        self._fast: dict[str, tuple[Any, ...]] = {}
        self._invs: list[tuple[str, str, Any]] | None = None
        self.view = PoolState(
            state=self.state,
            ref=self.ref,
            pending=self.pending,
            wpend=self.wpend,
            filled=self.filled,
            gen=self.gen,
            init=self.init,
            hash=self.hash,
            queued=self.queue.inq,
            hmap=_DefaultMap(self.hmap, NO_BLOCK),
            holds=_Holds(self.held),
            alive=_Alive(self.held),
            nheld=_NHeld(self.held),
            count=self.count,
            block_size=block_size,
            num_blocks=n,
            block_ids=range(n),  # type: ignore[arg-type]
            holder_ids=self.held.keys(),  # type: ignore[arg-type]
        )

    # ---- the guard/effect protocol ------------------------------------------------------------
    def _namespace(self) -> dict[str, Any]:
        return {
            "state": self.state, "ref": self.ref, "pending": self.pending, "wpend": self.wpend,
            "filled": self.filled, "gen": self.gen, "init": self.init, "hash": self.hash,
            "queued": self.queue.inq, "count": self.count, "hmap": self.hmap, "held": self.held,
            "block_size": self.block_size, "num_blocks": self.num_blocks,
            "len": len, "bool": bool, "int": int, "sum": sum, "range": range,
        }

    def _bind(self, name: str, t: Any) -> tuple[Any, ...]:
        """The spec's guard (and effect) of t, compiled for this pool, or interpreters."""
        view, params = self.view, t.params
        guard = predict = check = touched = None
        if self.compile_spec:
            ns = self._namespace()
            code = _predicate_code(t.guard, params, f"guard {name}")
            if code is not None and _self_check(t.guard, params, code):
                guard = eval(code, ns)
            code = _effect_code(t.effect, params, f"effect {name}")
            if code is not None and _effect_self_check(t, code):
                exec(code[0], ns)
                predict, check, touched = ns["predict"], ns["check"], ns["touched"]
        if guard is None:
            def guard(*args: Any, _g: Any = t.guard) -> Any:
                return _g(CONCRETE, view, **dict(zip(params, args, strict=True)))
        entry = (t, guard, predict, check, touched)
        self._fast[name] = entry
        return entry

    def _entry(self, name: str) -> tuple[Any, ...]:
        entry = self._fast.get(name)
        t = TRANSITIONS[name]
        if entry is None or entry[0] is not t:
            entry = self._bind(name, t)
        return entry

    def _enter(self, name: str, *args: Any) -> Any:
        """Evaluate the spec guard (raise if it fails); in checked mode, predict the effect."""
        entry = self._fast.get(name)
        t = TRANSITIONS[name]
        if entry is None or entry[0] is not t:
            entry = self._bind(name, t)
        if not entry[1](*args):
            params = dict(zip(t.params, args, strict=True))
            raise _GUARD_ERRORS.get(name, GuardViolation)(name, self._describe(params))
        if self.trace is not None:
            self.trace.append((name, dict(zip(t.params, args, strict=True))))
        if not self.checked:
            return None
        if entry[2] is not None:
            return entry[2](*args)
        return t.effect(CONCRETE, self.view, **dict(zip(t.params, args, strict=True)))

    def _verify(self, name: str, predicted: Any, *args: Any) -> None:
        """Checked mode: where touched, the real post-state is the spec's and invariants hold."""
        if predicted is None:
            return
        if isinstance(predicted, PoolState):
            params = dict(zip(TRANSITIONS[name].params, args, strict=True))
            return self._verify_interpreted(name, predicted, **params)
        entry = self._fast[name]
        bad = entry[3](predicted, *args)
        if bad is not None:
            field, key, expected, real = bad
            if field == "nheld":
                detail = f"holder {key!r} holds a different count"
            elif field == "holds":
                detail = f"holds[{key[0]!r}][{key[1]}] differs"
            else:
                detail = f"{field}[{key}] is {real!r}, the spec says {expected!r}"
            raise InvariantViolation(f"refines:{name}", detail)
        self._check_invariants(name, entry[4](predicted))

    def _check_invariants(self, name: str, blocks: Iterable[int]) -> None:
        invs = self._invs
        if invs is None:
            invs = self._invs = self._bind_invariants()
        h_of = self.hash
        for b in blocks:
            for inv_name, scope, pred in invs:
                if scope == "block":
                    if not pred(b):
                        raise InvariantViolation(inv_name, f"block {b} after {name}")
                elif not pred(h_of[b]):
                    raise InvariantViolation(inv_name, f"hash of block {b} after {name}")

    def _bind_invariants(self) -> list[tuple[str, str, Any]]:
        out = []
        for inv in _BLOCK_INVARIANTS + _HASH_INVARIANTS:
            param = "b" if inv.scope == "block" else "h"
            code = (_predicate_code(inv.pred, (param,), f"invariant {inv.name}")
                    if self.compile_spec else None)
            if code is not None and _self_check(inv.pred, (param,), code):
                fn = eval(code, self._namespace())
            else:
                def fn(x: Any, _p: Any = inv.pred) -> Any:
                    return _p(CONCRETE, self.view, x)
            out.append((inv.name, inv.scope, fn))
        return out

    def _verify_interpreted(self, name: str, predicted: PoolState, **params: Any) -> None:
        touched_blocks: set[Any] = set()
        for field in ("state", "ref", "pending", "wpend", "filled", "gen", "init", "hash",
                      "queued", "count"):
            value = getattr(predicted, field)
            if isinstance(value, Overlay):
                real = getattr(self.view, field)
                for key, expected in value.changes().items():
                    if real[key] != expected:
                        raise InvariantViolation(
                            f"refines:{name}",
                            f"{field}[{key}] is {real[key]!r}, the spec says {expected!r}",
                        )
                    if field != "count":
                        touched_blocks.add(key)
        if isinstance(predicted.hmap, Overlay):
            for h, expected in predicted.hmap.changes().items():
                if self.view.hmap[h] != expected:
                    raise InvariantViolation(f"refines:{name}", f"hmap[{h}] differs")
        r = params.get("r")
        if r is not None and self.view.nheld[r] != predicted.nheld[r]:
            raise InvariantViolation(f"refines:{name}", f"holder {r!r} holds a different count")
        if r is not None and "b" in params:
            b = params["b"]
            if self.view.holds[r][b] != bool(predicted.holds[r][b]):
                raise InvariantViolation(f"refines:{name}", f"holds[{r!r}][{b}] differs")
        self._check_invariants(name, touched_blocks)

    def _describe(self, params: dict[str, Any]) -> str:
        parts = [f"{k}={v!r}" for k, v in params.items()]
        b = params.get("b")
        if b is not None:
            parts.append(
                f"block {b} is {state_name(self.state[b])} ref={self.ref[b]} "
                f"pending={self.pending[b]}"
            )
        return ", ".join(parts)

    def check_block_id(self, b: object) -> int:
        if isinstance(b, bool) or not isinstance(b, int) or not 0 <= b < self.num_blocks:
            raise InvalidArgument(f"block id {b!r} out of range [0, {self.num_blocks})")
        return b

    def _move(self, b: int, new_state: int) -> None:
        self.count[self.state[b]] -= 1
        self.count[new_state] += 1
        self.state[b] = new_state

    # ---- transitions -------------------------------------------------------------------------
    def open_holder(self, r: Hashable) -> None:
        """spec: open_holder."""
        predicted = self._enter("open_holder", r)
        self.held[r] = set()
        self._verify("open_holder", predicted, r)

    def close_holder(self, r: Hashable) -> None:
        """spec: close_holder."""
        predicted = self._enter("close_holder", r)
        del self.held[r]
        self._verify("close_holder", predicted, r)

    def allocate(self, b: int, r: Hashable) -> None:
        """spec: allocate — FREE block b becomes ALLOCATED to holder r."""
        if type(b) is not int or not 0 <= b < self.num_blocks:
            self.check_block_id(b)
        predicted = self._enter("allocate", b, r)
        self.queue.unlink(b)
        self._move(b, ALLOCATED)
        self.ref[b] = 1
        self.init[b] = True
        self.filled[b] = 0
        self.held[r].add(b)
        self._verify("allocate", predicted, b, r)

    def publish(self, b: int, r: Hashable) -> None:
        """spec: publish — ALLOCATED -> PUBLISHED."""
        if type(b) is not int or not 0 <= b < self.num_blocks:
            self.check_block_id(b)
        predicted = self._enter("publish", b, r)
        self._move(b, PUBLISHED)
        self._verify("publish", predicted, b, r)

    def begin_access(self, b: int, r: Hashable, w: int) -> None:
        """spec: begin_access — a launch through r's table reads b, or writes w of its slots."""
        if type(b) is not int or not 0 <= b < self.num_blocks:
            self.check_block_id(b)
        predicted = self._enter("begin_access", b, r, w)
        self.pending[b] += 1
        if w > 0:
            self.wpend[b] += 1
            self.filled[b] += w
        self._verify("begin_access", predicted, b, r, w)

    def end_access(self, b: int, writes: bool) -> None:
        """spec: end_access; then recycles b if it was reclaimed and nothing else reads it."""
        if type(b) is not int or not 0 <= b < self.num_blocks:
            self.check_block_id(b)
        predicted = self._enter("end_access", b, writes)
        self.pending[b] -= 1
        if writes:
            self.wpend[b] -= 1
        if self.state[b] == CACHED and self.pending[b] == 0:
            self.cached_busy -= 1
        self._verify("end_access", predicted, b, writes)
        self._recycle_if_safe(b)

    def commit(self, b: int, r: Hashable, h: int) -> None:
        """spec: commit — PUBLISHED -> REFERENCED under prefix hash h."""
        if type(b) is not int or not 0 <= b < self.num_blocks:
            self.check_block_id(b)
        predicted = self._enter("commit", b, r, h)
        self._move(b, REFERENCED)
        self.hash[b] = h
        self.hmap[h] = b
        self._verify("commit", predicted, b, r, h)

    def share(self, b: int, r: Hashable) -> None:
        """spec: share — a prefix hit or fork takes a reference (revives a CACHED block)."""
        if type(b) is not int or not 0 <= b < self.num_blocks:
            self.check_block_id(b)
        predicted = self._enter("share", b, r)
        if self.state[b] == CACHED:
            self.queue.unlink(b)
            self._move(b, REFERENCED)
            if self.pending[b] > 0:
                self.cached_busy -= 1
        self.ref[b] += 1
        self.held[r].add(b)
        self._verify("share", predicted, b, r)

    def release(self, b: int, r: Hashable) -> None:
        """spec: release — ref - 1; at 0 a REFERENCED block is cached, others reclaimed."""
        if type(b) is not int or not 0 <= b < self.num_blocks:
            self.check_block_id(b)
        predicted = self._enter("release", b, r)
        self.ref[b] -= 1
        self.held[r].discard(b)
        if self.ref[b] == 0:
            if self.state[b] == REFERENCED:
                self._move(b, CACHED)
                self.queue.push_tail(b)
                if self.pending[b] > 0:
                    self.cached_busy += 1
            else:
                self._invalidate(b)
        self._verify("release", predicted, b, r)
        self._recycle_if_safe(b)

    def evict(self, b: int) -> None:
        """spec: evict — CACHED -> RECLAIMED; the hash is dropped."""
        predicted = self._enter("evict", b)
        self.queue.unlink(b)
        if self.pending[b] > 0:
            self.cached_busy -= 1
        del self.hmap[self.hash[b]]
        self.hash[b] = NO_HASH
        self._invalidate(b)
        self._verify("evict", predicted, b)

    def recycle(self, b: int) -> None:
        """spec: recycle — RECLAIMED -> FREE, to the head of the queue (reused first)."""
        predicted = self._enter("recycle", b)
        self._move(b, FREE)
        self.queue.push_head(b)
        self._verify("recycle", predicted, b)

    def _invalidate(self, b: int) -> None:
        self._move(b, RECLAIMED)
        self.init[b] = False
        self.gen[b] += 1
        self.filled[b] = 0

    def _recycle_if_safe(self, b: int) -> None:
        if self.state[b] == RECLAIMED and self._entry("recycle")[1](b):
            self.recycle(b)

    # ---- composite helpers -------------------------------------------------------------------
    def usable(self) -> int:
        """Blocks an allocation can take now: FREE ones and CACHED ones no launch reads."""
        return self.count[FREE] + self.count[CACHED] - self.cached_busy

    def take(self, r: Hashable) -> int:
        """Allocate the queue's head for r, evicting cached blocks on the way (LRU order).

        The caller has checked ``usable()``; a CACHED head that a pending launch still reads is
        evicted (it becomes FREE when that launch completes) and the walk goes on.
        """
        while True:
            b = self.queue.head()
            if b is None:  # pragma: no cover - callers check usable() first
                raise AssertionError("take() on an exhausted pool")
            if self.state[b] == CACHED:
                self.evict(b)
                self._recycle_if_safe(b)
                continue
            self.allocate(b, r)
            return b

    def lookup(self, h: int) -> int | None:
        b = self.hmap.get(h)
        return b

    # ---- abstraction and scans ---------------------------------------------------------------
    def abstract(self) -> PoolState:
        """The pool's state mapped to the spec's state (fresh concrete arrays)."""
        n = self.num_blocks

        def arr(values: Iterable[Any], default: Any) -> Arr:
            return Arr(default, dict(enumerate(values)))

        return PoolState(
            state=arr(self.state, FREE),
            ref=arr(self.ref, 0),
            pending=arr(self.pending, 0),
            wpend=arr(self.wpend, 0),
            filled=arr(self.filled, 0),
            gen=arr(self.gen, 0),
            init=arr(self.init, False),
            hash=arr(self.hash, NO_HASH),
            queued=arr(self.queue.inq, False),
            hmap=Arr(NO_BLOCK, dict(self.hmap)),
            holds=Arr(Arr(False), {r: Arr(False, dict.fromkeys(bs, True))
                                   for r, bs in self.held.items()}),
            alive=Arr(False, dict.fromkeys(self.held, True)),
            nheld=Arr(0, {r: len(bs) for r, bs in self.held.items()}),
            count=arr(self.count, 0),
            block_size=self.block_size,
            num_blocks=n,
            block_ids=tuple(range(n)),
            holder_ids=tuple(self.held),
        )

    def structure_errors(self) -> list[tuple[str, str]]:
        """Implementation facts the spec abstracts away (queue links, busy counter)."""
        errors = [("queue_is_free_and_cached", e) for e in self.queue.structure_errors()]
        busy = sum(1 for b in range(self.num_blocks)
                   if self.state[b] == CACHED and self.pending[b] > 0)
        if busy != self.cached_busy:
            errors.append(("conservation", f"cached_busy {self.cached_busy} != {busy}"))
        return errors
