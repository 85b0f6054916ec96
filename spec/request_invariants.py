"""The table invariants of the request layer, written once (``spec.requests``' state).

Scopes, each proved over one symbolic point of an unbounded pool:
- ``holder``: ``pred(ops, s, r)`` for every request r;
- ``entry``: ``pred(ops, s, r, i)`` for every request r and table index i;
- ``holding``: ``pred(ops, s, r, b)`` for every request r and block b;
- ``block``: ``pred(ops, s, b)`` for every block b.

``table_entries_held`` and ``table_holds_are_entries`` together say that r's table and the
blocks r holds are in bijection (entries distinct, every entry held, nothing else held); with
``nheld == tlen`` the table's length is the pool's count of what r holds.
"""

from __future__ import annotations

from typing import Any

from .invariants import ISOLATION, NO_UNWRITTEN_HIT, TABLE_SHAPE, Invariant, _in
from .requests import RequestState, pos_le
from .states import ALLOCATED, CACHED, NO_HASH, PUBLISHED, REFERENCED


def _normal(ops: Any, s: RequestState, name: str, r: Any) -> Any:
    q, o = s.position(name, r)
    return ops.And(q >= 0, o >= 0, o < s.pool.block_size)


def _table_covers_reserved(ops: Any, s: RequestState, r: Any) -> Any:
    rq, ro = s.position("reserved", r)
    n = s.tlen[r]
    res, iss, com = (s.position(x, r) for x in ("reserved", "issued", "computed"))
    return ops.And(
        *[_normal(ops, s, x, r) for x in ("reserved", "issued", "computed", "known")],
        ops.Or(ops.And(ro == 0, n == rq), ops.And(ro > 0, n == rq + 1)),
        pos_le(ops, com, iss), pos_le(ops, iss, res), pos_le(ops, com, s.position("known", r)),
        s.pool.nheld[r] == n,
        ops.Implies(ops.Not(s.pool.alive[r]), ops.And(n == 0, rq == 0, ro == 0)),
    )


def _entry(s: RequestState, r: Any, i: Any) -> Any:
    return s.tab[r][i]


def _live_entry(ops: Any, s: RequestState, r: Any, i: Any) -> Any:
    return ops.And(i >= 0, i < s.tlen[r])


def _table_entries_held(ops: Any, s: RequestState, r: Any, i: Any) -> Any:
    e = _entry(s, r, i)
    return ops.Implies(
        _live_entry(ops, s, r, i),
        ops.And(e >= 0, e < s.pool.num_blocks, s.pool.holds[r][e], s.slot[r][e] == i),
    )


def _table_holds_are_entries(ops: Any, s: RequestState, r: Any, b: Any) -> Any:
    i = s.slot[r][b]
    return ops.Implies(s.pool.holds[r][b],
                       ops.And(i >= 0, i < s.tlen[r], s.tab[r][i] == b))


def _table_positions_written(ops: Any, s: RequestState, r: Any, i: Any) -> Any:
    """Entry i's block has exactly the slots of the issued positions that fall in it written;
    a block not yet handed to a kernel lies past every issued position."""
    e = _entry(s, r, i)
    P = s.pool
    iq, io = s.position("issued", r)
    expected = ops.If(i < iq, P.block_size, ops.If(i == iq, io, 0))
    return ops.Implies(
        _live_entry(ops, s, r, i),
        ops.And(
            ops.Implies(P.state[e] == ALLOCATED,
                        ops.And(P.filled[e] == 0, pos_le(ops, (iq, io), (i, 0)))),
            ops.Implies(_in(ops, P.state[e], PUBLISHED, REFERENCED), P.filled[e] == expected),
        ),
    )


def _table_isolation(ops: Any, s: RequestState, r: Any, i: Any) -> Any:
    e = _entry(s, r, i)
    return ops.Implies(
        ops.And(_live_entry(ops, s, r, i), s.pool.hash[e] != NO_HASH),
        ops.And(i < s.known_q[r], s.pool.hash[e] == s.chain[r][i]),
    )


def _sealed_content_matches(ops: Any, s: RequestState, r: Any, b: Any) -> Any:
    i = s.slot[r][b]
    return ops.Implies(ops.And(s.pool.holds[r][b], s.content[b] != NO_HASH),
                       ops.And(i < s.known_q[r], s.chain[r][i] == s.content[b]))


def _sealed_blocks(ops: Any, s: RequestState, b: Any) -> Any:
    P = s.pool
    return ops.And(
        ops.Implies(s.content[b] != NO_HASH,
                    ops.And(P.filled[b] == P.block_size,
                            _in(ops, P.state[b], PUBLISHED, REFERENCED, CACHED))),
        ops.Implies(P.hash[b] != NO_HASH, s.content[b] == P.hash[b]),
    )


REQUEST_INVARIANTS: dict[str, Invariant] = {
    inv.name: inv
    for inv in (
        Invariant("table_covers_reserved", "holder", _table_covers_reserved, TABLE_SHAPE,
                  "a table has ceil(reserved / B) entries, as many as its request holds; "
                  "computed <= issued <= reserved and computed <= known"),
        Invariant("table_entries_held", "entry", _table_entries_held, TABLE_SHAPE,
                  "every entry names a block of the pool that its request holds, at that index "
                  "(so no block twice in a table)"),
        Invariant("table_holds_are_entries", "holding", _table_holds_are_entries, TABLE_SHAPE,
                  "a request holds only blocks in its table"),
        Invariant("table_positions_written", "entry", _table_positions_written, TABLE_SHAPE,
                  "an entry's written slots are exactly its issued positions; unpublished "
                  "entries lie past them"),
        Invariant("table_isolation", "entry", _table_isolation, ISOLATION,
                  "a hashed entry at index i carries the request's own chain value at i"),
        Invariant("sealed_content_matches", "holding", _sealed_content_matches, ISOLATION,
                  "every table holding a sealed block has its content's chain value there"),
        Invariant("sealed_blocks", "block", _sealed_blocks, NO_UNWRITTEN_HIT,
                  "a sealed block is full and live; a hashed block is sealed under its hash"),
    )
}

