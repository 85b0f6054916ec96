"""The connectives the spec is written against, on concrete values and on z3 terms.

Every guard, effect and invariant in spec/ takes an ``ops`` argument and uses only
``ops.And/Or/Not/Implies/If/store/Sum`` plus comparisons, linear arithmetic and array reads.
Python's ``and``/``or``/``not``/``in`` and chained comparisons would silently misbehave on z3
terms; tests/test_spec_lint.py rejects them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any


class Arr:
    """An immutable total map with a default value (the concrete twin of a z3 array)."""

    __slots__ = ("_default", "_data")

    def __init__(self, default: Any, data: Mapping[Any, Any] | None = None) -> None:
        self._default = default
        self._data = dict(data or {})

    def __getitem__(self, key: Any) -> Any:
        return self._data.get(key, self._default)

    def items(self) -> Iterator[tuple[Any, Any]]:
        """The entries that differ from the default."""
        return ((k, v) for k, v in self._data.items() if not _same(v, self._default))

    @property
    def default(self) -> Any:
        return self._default

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Arr | Overlay):
            return NotImplemented
        mine, theirs = flatten(self), flatten(other)
        return _same(mine._default, theirs._default) and dict(mine.items()) == dict(theirs.items())

    def __hash__(self) -> int:  # pragma: no cover - arrays are compared, not hashed
        raise TypeError("Arr is not hashable")

    def __repr__(self) -> str:
        return f"Arr({self._default!r}, {dict(self.items())!r})"


class Overlay:
    """``store(base, key, value)`` on concrete values: O(1), remembers what it changed."""

    __slots__ = ("base", "key", "value")

    def __init__(self, base: Any, key: Any, value: Any) -> None:
        self.base = base
        self.key = key
        self.value = value

    def __getitem__(self, key: Any) -> Any:
        node: Any = self
        while isinstance(node, Overlay):
            if node.key == key:
                return node.value
            node = node.base
        return node[key]

    def changes(self) -> dict[Any, Any]:
        """The keys this chain of stores wrote, with their final values."""
        out: dict[Any, Any] = {}
        node: Any = self
        while isinstance(node, Overlay):
            out.setdefault(node.key, node.value)
            node = node.base
        return out

    def root(self) -> Any:
        node: Any = self
        while isinstance(node, Overlay):
            node = node.base
        return node

    __eq__ = Arr.__eq__
    __hash__ = Arr.__hash__


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, Arr | Overlay) or isinstance(b, Arr | Overlay):
        return isinstance(a, Arr | Overlay) and isinstance(b, Arr | Overlay) and a == b
    return a == b


def flatten(arr: Any) -> Arr:
    """Collapse a chain of overlays over an ``Arr`` into a plain ``Arr`` (nested ones too)."""
    if isinstance(arr, Arr):
        return Arr(_flat_value(arr.default), {k: _flat_value(v) for k, v in arr._data.items()})
    if isinstance(arr, Overlay):
        base = flatten(arr.root())
        data = dict(base._data)
        for k, v in arr.changes().items():
            data[k] = _flat_value(v)
        return Arr(base.default, data)
    raise TypeError(f"not a spec array: {type(arr).__name__}")


def _flat_value(v: Any) -> Any:
    return flatten(v) if isinstance(v, Arr | Overlay) else v


class ConcreteOps:
    """Connectives on plain Python values (runtime checked mode, stateful-test model)."""

    name = "concrete"

    @staticmethod
    def And(*args: Any) -> bool:
        return all(args)

    @staticmethod
    def Or(*args: Any) -> bool:
        return any(args)

    @staticmethod
    def Not(a: Any) -> bool:
        return not a

    @staticmethod
    def Implies(a: Any, b: Any) -> bool:
        return (not a) or bool(b)

    @staticmethod
    def If(c: Any, a: Any, b: Any) -> Any:
        return a if c else b

    @staticmethod
    def store(arr: Any, key: Any, value: Any) -> Overlay:
        return Overlay(arr, key, value)

    @staticmethod
    def Sum(terms: Iterable[Any]) -> int:
        return sum(int(t) for t in terms)

    @staticmethod
    def is_true(value: Any) -> bool:
        return bool(value)


class Z3Ops:
    """Connectives on z3 terms (proofs). z3 is imported lazily: the runtime never needs it."""

    name = "z3"

    def __init__(self) -> None:
        import z3

        self.z3 = z3
        self.And: Callable[..., Any] = z3.And
        self.Or: Callable[..., Any] = z3.Or
        self.Not: Callable[..., Any] = z3.Not
        self.Implies: Callable[..., Any] = z3.Implies
        self.If: Callable[..., Any] = z3.If
        self.store: Callable[..., Any] = z3.Store

    def Sum(self, terms: Iterable[Any]) -> Any:
        terms = list(terms)
        if not terms:
            return self.z3.IntVal(0)
        return self.z3.Sum([self.z3.If(t, 1, 0) if self.z3.is_bool(t) else t for t in terms])

    @staticmethod
    def is_true(value: Any) -> bool:  # pragma: no cover - only meaningful concretely
        raise TypeError("a z3 term has no truth value; ask a solver")


CONCRETE = ConcreteOps()
