"""The allocator's request storage as the spec's request-layer state, written once.

``request_view`` returns a read-only ``RequestState`` whose fields read the allocator's
request records and its pool directly, without copying: the spec's request transitions
(``spec.requests``) and call programs (``spec.calls``) evaluate on it as written, and
``materialize`` turns it into the plain state ``BlockAllocator.abstract()`` returns. The
mapping, field by field (B the block size, positions kept as (blocks, offset)):

- ``tlen[r]``, ``tab[r][i]``: the request's table; ``slot[r][b]``: the entry of b in it;
- ``reserved``, ``issued``, ``computed``: the request's counts, ``divmod(count, B)``;
  ``known``: its number of known token ids;
- ``chain[r][i]``: the chain hash of its full block i (computed as tokens become known);
- ``content[b]``: b's hash once cached; else, for a full PUBLISHED block, the chain hash of
  the entry that holds it, when that block's tokens are known (its seal); else none.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any

from pagedkv.spec import NO_HASH, PUBLISHED, PoolState, RequestState
from pagedkv.spec.ops import Arr
from pagedkv.spec.requests import NO_SLOT, REQUEST_INDEX_KIND


class _PerRequest:
    """``field[r]``: a value read off request r's record (``default`` for an unknown r)."""

    __slots__ = ("_reqs", "_read", "_default")

    def __init__(self, reqs: Mapping[Hashable, Any], read: Callable[[Any], Any],
                 default: Any) -> None:
        self._reqs, self._read, self._default = reqs, read, default

    def __getitem__(self, r: Any) -> Any:
        req = self._reqs.get(r)
        return self._default if req is None else self._read(req)

    def keys(self) -> Iterable[Any]:
        return self._reqs.keys()


class _Row:
    """``row[i]``: item i of a sequence, ``default`` past its end."""

    __slots__ = ("_seq", "_default")

    def __init__(self, seq: Sequence[Any], default: Any) -> None:
        self._seq, self._default = seq, default

    def __getitem__(self, i: Any) -> Any:
        return self._seq[i] if 0 <= i < len(self._seq) else self._default

    def keys(self) -> Iterable[int]:
        return range(len(self._seq))


class _SlotRow:
    """``slot[r][b]``: the entry of block b in r's table (``NO_SLOT`` if none)."""

    __slots__ = ("_table",)

    def __init__(self, table: list[int]) -> None:
        self._table = table

    def __getitem__(self, b: Any) -> int:
        try:
            return self._table.index(b)
        except ValueError:
            return NO_SLOT

    def keys(self) -> Iterable[int]:
        return self._table


class _Content:
    """``content[b]``: the chain value b's KV is for (module docstring), or ``NO_HASH``."""

    __slots__ = ("_reqs", "_pool")

    def __init__(self, reqs: Mapping[Hashable, Any], pool: Any) -> None:
        self._reqs, self._pool = reqs, pool

    def __getitem__(self, b: Any) -> int:
        pool = self._pool
        h = pool.hash[b]
        if h != NO_HASH or pool.state[b] != PUBLISHED or pool.filled[b] != pool.block_size:
            return h
        for r in pool.held:  # the holders of a full PUBLISHED block agree on its seal
            req = self._reqs.get(r)
            if req is not None and b in pool.held[r] and b in req.table:
                i = req.table.index(b)
                if i < len(req.hashes):
                    return req.hashes[i]
        return NO_HASH

    def keys(self) -> Iterable[int]:
        return range(self._pool.num_blocks)


def request_view(reqs: Mapping[Hashable, Any], pool: Any) -> RequestState:
    """The spec's request-layer state over live request records (``table``, ``tokens``,
    ``hashes``, ``reserved``, ``issued``, ``computed``) and a ``BlockPool``."""
    B = pool.block_size

    def position(attr: str) -> dict[str, _PerRequest]:
        return {f"{attr}_q": _PerRequest(reqs, lambda q: getattr(q, attr) // B, 0),
                f"{attr}_o": _PerRequest(reqs, lambda q: getattr(q, attr) % B, 0)}

    return RequestState(
        pool=pool.view,
        tlen=_PerRequest(reqs, lambda q: len(q.table), 0),
        tab=_PerRequest(reqs, lambda q: _Row(q.table, -1), _Row((), -1)),
        slot=_PerRequest(reqs, lambda q: _SlotRow(q.table), _SlotRow([])),
        **position("reserved"), **position("issued"), **position("computed"),
        known_q=_PerRequest(reqs, lambda q: len(q.tokens) // B, 0),
        known_o=_PerRequest(reqs, lambda q: len(q.tokens) % B, 0),
        chain=_PerRequest(reqs, lambda q: _Row(q.hashes, NO_HASH), _Row((), NO_HASH)),
        content=_Content(reqs, pool),
    )


def materialize(view: RequestState, pool: PoolState, template: RequestState) -> RequestState:
    """The view as plain spec arrays (each field over the keys its view names), on ``pool``;
    ``template`` gives each field's defaults (``spec.initial_request_state``)."""
    return RequestState(pool=pool, **{f: _materialize(getattr(view, f), getattr(template, f))
                                      for f in REQUEST_INDEX_KIND})


def _materialize(v: Any, template: Arr) -> Arr:
    inner = template.default
    if isinstance(inner, Arr):
        return Arr(inner, {k: _materialize(v[k], inner) for k in v.keys()})
    return Arr(inner, {k: v[k] for k in v.keys() if v[k] != inner})
