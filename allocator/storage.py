"""The pool's storage, and its mapping onto the spec's ``PoolState``, written once.

``FIELDS`` says, for each field of the spec's pool state, where ``PoolStorage`` keeps it and
how: a Python list indexed by the field's key (block id, state, clock key), a set of the keys
whose value is true (``inflight``), a dict with the field's default (``hmap``), or the
per-holder sets of held blocks (``alive``: r has a set, ``nheld``: its size, ``holds``: b is
in it). Everything that reads the storage as the spec's state derives from this table: the
read-only view the interpreted spec evaluates on (``view``), the source each compiled read
becomes (``read_source``, used by ``compiled.py``), the compiled code's namespace
(``namespace``), the fresh spec arrays of ``abstract()``, and writing a post-state's changes
back (``write``, the compiled code's self-check).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from typing import Any

from pagedkv.spec import ALL_STATES, FREE, NO_HASH, Arr, Overlay, PoolState
from pagedkv.spec.model import ARRAY_FIELDS, FIELD_DEFAULT

from .lru import BlockQueue

LIST, SET, DICT, ALIVE, NHELD, HOLDS = "list", "set", "dict", "alive", "nheld", "holds"

# spec field -> (storage attribute, representation)
FIELDS: dict[str, tuple[str, str]] = {
    **{f: (f, LIST) for f in ("state", "ref", "retire", "wpend", "filled", "gen", "init",
                              "hash", "queued", "count", "clock")},
    "hmap": ("hmap", DICT),
    "inflight": ("inflight", SET),
    "alive": ("held", ALIVE),
    "nheld": ("held", NHELD),
    "holds": ("held", HOLDS),
}
assert set(FIELDS) == set(ARRAY_FIELDS), "every spec field has a storage"
ATTRIBUTES = tuple(dict.fromkeys(attr for attr, _ in FIELDS.values()))


def read_source(field: str, *keys: str) -> str:
    """Python source reading ``field[keys...]`` from the storage's attributes by name."""
    attr, rep = FIELDS[field]
    if rep == LIST:
        return f"{attr}[{keys[0]}]"
    if rep == DICT:
        return f"{attr}.get({keys[0]}, {FIELD_DEFAULT[field]!r})"
    if rep in (SET, ALIVE):
        return f"({keys[0]} in {attr})"
    if rep == NHELD:
        return f"len({attr}.get({keys[0]}, ()))"
    return f"({keys[1]} in {attr}.get({keys[0]}, ()))"  # HOLDS


# --- the read-only view: the spec's total arrays over the storage ------------------------------
class _DefaultMap:
    """Read-only ``m[k]`` over a dict with a default."""

    __slots__ = ("_d", "_default")

    def __init__(self, d: dict[Any, Any], default: Any) -> None:
        self._d, self._default = d, default

    def __getitem__(self, key: Any) -> Any:
        return self._d.get(key, self._default)


class _Members:
    """Read-only ``m[k]``: whether k is in a set (or a dict's keys); ``items()`` yields
    ``(k, True)`` for each member (what ``spec.check.launch_ids`` enumerates)."""

    __slots__ = ("_members",)

    def __init__(self, members: Any) -> None:
        self._members = members

    def __getitem__(self, k: Any) -> bool:
        return k in self._members

    def items(self) -> Iterator[tuple[Any, bool]]:
        try:
            keys = sorted(self._members)
        except TypeError:  # holder ids of mixed types: any order
            keys = list(self._members)
        return ((k, True) for k in keys)


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


class _NHeld:
    __slots__ = ("_held",)

    def __init__(self, held: dict[Hashable, set[int]]) -> None:
        self._held = held

    def __getitem__(self, r: Any) -> int:
        blocks = self._held.get(r)
        return 0 if blocks is None else len(blocks)


def _view_of(field: str, store: Any) -> Any:
    rep = FIELDS[field][1]
    if rep == LIST:
        return store
    if rep == DICT:
        return _DefaultMap(store, FIELD_DEFAULT[field])
    if rep in (SET, ALIVE):
        return _Members(store)
    return _NHeld(store) if rep == NHELD else _Holds(store)


def _plain(field: str, store: Any) -> Arr:
    """A fresh spec array holding the field's current values."""
    rep, default = FIELDS[field][1], FIELD_DEFAULT[field]
    if rep == LIST:
        return Arr(default, dict(enumerate(store)))
    if rep == DICT:
        return Arr(default, dict(store))
    if rep in (SET, ALIVE):
        return Arr(default, dict.fromkeys(store, True))
    if rep == NHELD:
        return Arr(default, {r: len(bs) for r, bs in store.items()})
    return Arr(default, {r: Arr(default.default, dict.fromkeys(bs, True))
                         for r, bs in store.items()})


class PoolStorage:
    """The pool's arrays (``FIELDS``), the eviction queue whose flags are ``queued``, and the
    block geometry; ``view`` reads them as the spec's state."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        n = num_blocks
        self.num_blocks = n
        self.block_size = block_size
        self.state = [FREE] * n
        self.ref = [0] * n
        self.retire = [0] * n  # the launch clock when the last holder let the block go
        self.wpend = [0] * n
        self.filled = [0] * n
        self.gen = [0] * n
        self.init = [False] * n
        self.hash = [NO_HASH] * n
        self.queue = BlockQueue(n)
        self.queued = self.queue.inq
        self.hmap: dict[int, int] = {}
        self.held: dict[Hashable, set[int]] = {}
        self.count = [0] * len(ALL_STATES)
        self.count[FREE] = n
        # Launch numbers in flight; clock[ISSUED]: launches published so far (the next
        # number), clock[WATERMARK]: every launch below it has completed.
        self.inflight: set[int] = set()
        self.clock = [0, 0]
        self.view = PoolState(
            **{f: _view_of(f, getattr(self, FIELDS[f][0])) for f in ARRAY_FIELDS},
            block_size=block_size, num_blocks=n,
            block_ids=range(n),  # type: ignore[arg-type]
            holder_ids=self.held.keys(),  # type: ignore[arg-type]
        )

    def namespace(self) -> dict[str, Any]:
        """The names compiled spec code reads (``read_source``), bound to this storage."""
        return {**{a: getattr(self, a) for a in ATTRIBUTES},
                "block_size": self.block_size, "num_blocks": self.num_blocks,
                "len": len, "bool": bool, "int": int, "sum": sum, "range": range}

    def abstract(self) -> PoolState:
        """The storage mapped to the spec's state (fresh concrete arrays)."""
        return PoolState(
            **{f: _plain(f, getattr(self, FIELDS[f][0])) for f in ARRAY_FIELDS},
            block_size=self.block_size, num_blocks=self.num_blocks,
            block_ids=tuple(range(self.num_blocks)), holder_ids=tuple(self.held),
        )

    def copy_from(self, other: PoolStorage) -> None:
        """This storage's contents := other's (same geometry; queue links left alone)."""
        for attr in ATTRIBUTES:
            mine, theirs = getattr(self, attr), getattr(other, attr)
            if isinstance(mine, list):
                mine[:] = theirs
            else:
                mine.clear()
                mine.update({k: set(v) for k, v in theirs.items()} if attr == "held"
                            else theirs)

    def write(self, post: PoolState, r: Any = None, b: Any = None) -> None:
        """Apply the writes of an interpreted post-state (its ``Overlay`` fields) whose
        pre-state was this storage's view; ``held`` follows holder r (and block b)."""
        for f, (attr, rep) in FIELDS.items():
            value = getattr(post, f)
            if not isinstance(value, Overlay) or rep in (ALIVE, NHELD, HOLDS):
                continue
            store = getattr(self, attr)
            for k, v in value.changes().items():
                if rep == LIST:
                    store[k] = v
                elif rep == SET:
                    (store.add if v else store.discard)(k)
                elif v == FIELD_DEFAULT[f]:
                    store.pop(k, None)
                else:
                    store[k] = v
        if r is not None:
            if not post.alive[r]:
                self.held.pop(r, None)
            else:
                blocks = self.held.setdefault(r, set())
                if b is not None:
                    (blocks.add if post.holds[r][b] else blocks.discard)(b)
