"""The request layer: each request's block table, written over the pool's transitions.

A request is a holder of the pool layer. ``RequestState`` is the pool's ``PoolState`` plus,
per request ``r``:

- ``tlen[r]`` entries; ``tab[r][i]`` the block of entry i (position p lives in entry p // B);
  the ghost ``slot[r][b]``: the entry of block b in r's table (the inverse of ``tab``);
- four positions, each kept as (full blocks, offset in the next block) so that every rule is
  linear in the symbolic block size: ``reserved`` (covered by the table), ``issued``
  (launches were issued to write them), ``computed`` (committed: written by completed
  launches), ``known`` (token ids known). ``known_q`` is the number of full blocks whose token
  ids are known, and ``chain[r][i]`` (i < known_q) the request's own salted hash-chain value of
  full block i;

and per block ``b`` the ghost ``content[b]``: the chain value b's KV is for, once the block is
full with known tokens and *sealed* (``NO_HASH`` before). Sealing happens while one table holds
the block; a full block is shared (fork) only sealed, so every table holding it agrees on what
its KV is. A hashed block's hash is its content.

Every request transition is a fixed sequence of pool transitions, each with its own guard
evaluated on the state the previous ones left, plus the table's own conditions and updates.
The pool invariants therefore hold in the request layer too; the table invariants
(``spec.request_invariants``) are proved inductive over these transitions by
``proofs.request_induction``, unbounded.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .model import ARRAY_FIELDS as POOL_FIELDS
from .model import PoolState
from .ops import CONCRETE, Arr, flatten
from .states import ALLOCATED, ISSUED, NO_HASH, PUBLISHED, REFERENCED
from .transitions import PARAM_KINDS, TRANSITIONS, Transition, slots_written

NO_SLOT = -1
POSITIONS = ("reserved", "issued", "computed", "known")
HOLDER_FIELDS = ("tlen",) + tuple(f"{p}_{k}" for p in POSITIONS for k in ("q", "o"))
TABLE_FIELDS = HOLDER_FIELDS + ("tab", "slot", "chain", "content")
# What each request-layer field is indexed by, outermost first (every reader derives its
# encoding from this): per request; per request and table entry; per request and block; per
# block.
REQUEST_INDEX_KIND: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(HOLDER_FIELDS, ("holder",)),
    "tab": ("holder", "entry"), "slot": ("holder", "block"), "chain": ("holder", "entry"),
    "content": ("block",),
}


@dataclass(frozen=True)
class RequestState:
    pool: PoolState
    tlen: Any
    tab: Any
    slot: Any
    reserved_q: Any
    reserved_o: Any
    issued_q: Any
    issued_o: Any
    computed_q: Any
    computed_o: Any
    known_q: Any
    known_o: Any
    chain: Any
    content: Any

    def replace(self, **changes: Any) -> RequestState:
        return dataclasses.replace(self, **changes)

    def flattened(self) -> RequestState:
        return self.replace(pool=self.pool.flattened(),
                            **{f: flatten(getattr(self, f)) for f in TABLE_FIELDS})

    def position(self, name: str, r: Any) -> tuple[Any, Any]:
        return getattr(self, f"{name}_q")[r], getattr(self, f"{name}_o")[r]


def initial_request_state(pool: PoolState) -> RequestState:
    """No request has a table yet."""
    return RequestState(
        pool=pool, tlen=Arr(0), tab=Arr(Arr(-1)), slot=Arr(Arr(NO_SLOT)),
        reserved_q=Arr(0), reserved_o=Arr(0), issued_q=Arr(0), issued_o=Arr(0),
        computed_q=Arr(0), computed_o=Arr(0), known_q=Arr(0), known_o=Arr(0),
        chain=Arr(Arr(NO_HASH)), content=Arr(NO_HASH),
    )


def count(s: RequestState, name: str, r: Any) -> int:
    """Concrete: a position of r (``reserved``, ``issued``, ``computed``, ``known``) as a count."""
    q, o = s.position(name, r)
    return int(q) * int(s.pool.block_size) + int(o)


def table_of(s: RequestState, r: Any) -> list[Any]:
    """Concrete: r's table entries."""
    return [s.tab[r][i] for i in range(s.tlen[r])]


def request_state(pool: PoolState, block_size: int,
                  requests: Sequence[tuple[Any, Sequence[int], dict[str, int], Sequence[int]]],
                  content: dict[int, int]) -> RequestState:
    """Concrete: the request layer's state from each request's (holder, table, position counts
    by name, chain values of its known full blocks) and the sealed blocks' content."""
    fields: dict[str, Any] = {
        "tlen": Arr(0, {r: len(tab) for r, tab, _, _ in requests}),
        "tab": Arr(Arr(-1), {r: Arr(-1, dict(enumerate(tab))) for r, tab, _, _ in requests}),
        "slot": Arr(Arr(NO_SLOT), {r: Arr(NO_SLOT, {b: i for i, b in enumerate(tab)})
                                   for r, tab, _, _ in requests}),
        "chain": Arr(Arr(NO_HASH), {r: Arr(NO_HASH, dict(enumerate(ch)))
                                    for r, _, _, ch in requests}),
        "content": Arr(NO_HASH, content),
    }
    for name in POSITIONS:
        q = {r: pos[name] // block_size for r, _, pos, _ in requests}
        o = {r: pos[name] % block_size for r, _, pos, _ in requests}
        fields[f"{name}_q"], fields[f"{name}_o"] = Arr(0, q), Arr(0, o)
    return RequestState(pool=pool, **fields)


# --- positions as (blocks, offset) pairs: linear comparisons -----------------------------------
def pos_le(ops: Any, a: tuple[Any, Any], b: tuple[Any, Any]) -> Any:
    return ops.Or(a[0] < b[0], ops.And(a[0] == b[0], a[1] <= b[1]))


def pos_eq(ops: Any, a: tuple[Any, Any], b: tuple[Any, Any]) -> Any:
    return ops.And(a[0] == b[0], a[1] == b[1])


def pos_min(ops: Any, a: tuple[Any, Any], b: tuple[Any, Any]) -> tuple[Any, Any]:
    first = pos_le(ops, a, b)
    return ops.If(first, a[0], b[0]), ops.If(first, a[1], b[1])


def end_of(ops: Any, q: Any, o: Any, B: Any) -> tuple[Any, Any]:
    """The position ``q * B + o`` for an offset ``0 < o <= B``, normalized."""
    return ops.If(o == B, q + 1, q), ops.If(o == B, 0, o)


def _set(ops: Any, arr: Any, key: Any, value: Any) -> Any:
    return ops.store(arr, key, value)


def _set2(ops: Any, arr: Any, k1: Any, k2: Any, value: Any) -> Any:
    return ops.store(arr, k1, ops.store(arr[k1], k2, value))


def _set_pos(ops: Any, s: RequestState, name: str, r: Any, p: tuple[Any, Any]) -> dict[str, Any]:
    return {f"{name}_q": _set(ops, getattr(s, f"{name}_q"), r, p[0]),
            f"{name}_o": _set(ops, getattr(s, f"{name}_o"), r, p[1])}


# --- position rules the runtime evaluates too (concretely, on its counts as pairs) ------------
def may_hit(ops: Any, i: Any, known: tuple[Any, Any]) -> Any:
    """Entry i of a table may be taken from the prefix cache: its tokens are known, and at
    least one known token follows it (the last known token is always computed: its logits)."""
    return pos_le(ops, (i + 1, 1), known)


def commit_bounds(ops: Any, new: tuple[Any, Any], issued: tuple[Any, Any],
                  known: tuple[Any, Any]) -> list[Any]:
    """Committing up to position ``new`` needs [launches were issued to write every position
    below it, the token ids of every position below it are known]."""
    return [pos_le(ops, new, issued), pos_le(ops, new, known)]


def leading_hits(chain: Sequence[int], known: int, B: int,
                 lookup: Callable[[int], Any | None], start: int = 0,
                 rule: Callable[..., Any] = may_hit) -> list[Any]:
    """Concrete, for runtimes: what ``lookup`` (a chain value -> a cached block, or None)
    finds for a table's entries ``start``, ``start + 1``, ..., while each entry may be a hit
    (``rule``: ``may_hit`` unless a ``RequestSpec`` passes its own, on ``known`` token ids)
    and is found. ``chain``: the request's chain values of its full blocks.
    ``spec.calls.take_hits`` takes these blocks on an empty table."""
    out: list[Any] = []
    for i in range(start, hit_limit(len(chain), known, B, start, rule)):
        found = lookup(chain[i])
        if found is None:
            break
        out.append(found)
    return out


def hit_limit(entries: int, known: int, B: int, start: int = 0,
              rule: Callable[..., Any] = may_hit) -> int:
    """Concrete: where the entries from ``start`` on that may be hits end (``rule`` on
    ``known`` token ids; ``entries``: the chain's length). ``leading_hits`` looks up entries
    ``start .. hit_limit - 1`` in order, up to the first not found; a runtime may look them up
    in one batch, the same way."""
    known_pos = divmod(known, B)
    # may_hit holds for a prefix of the entries (its bound grows with i): find where it ends
    # from the top, where at most the last full block is not a hit.
    limit = entries
    while limit > start and not rule(CONCRETE, limit - 1, known_pos):
        limit -= 1
    return limit


# --- composing pool transitions ---------------------------------------------------------------
Step = tuple[str, dict[str, Any], Any]  # (pool transition, its parameters, run only when)


def _merge(ops: Any, when: Any, post: PoolState, pre: PoolState) -> PoolState:
    return pre.replace(**{f: ops.If(when, getattr(post, f), getattr(pre, f))
                          for f in POOL_FIELDS})


def run_steps(ops: Any, pool: PoolState, steps: Sequence[Step],
              transitions: Mapping[str, Transition] | None = None
              ) -> tuple[list[Any], PoolState]:
    """Each step's guard on the state the steps before it left, and the final pool state. A
    step with a ``when`` condition runs only when it holds (its guard is then required).
    ``transitions``: the pool transitions the steps name (default ``spec.TRANSITIONS``)."""
    transitions = TRANSITIONS if transitions is None else transitions
    guards: list[Any] = []
    for name, params, when in steps:
        t = transitions[name]
        g = t.guard(ops, pool, **params)
        post = t.effect(ops, pool, **params)
        guards.append(g if when is True else ops.Implies(when, g))
        pool = post if when is True else _merge(ops, when, post, pool)
    return guards, pool


Plan = tuple[list[Any], list[Step], Callable[[PoolState], RequestState]]


@dataclass(frozen=True)
class RequestTransition:
    """A request-layer transition: the table's conditions, the pool steps, the table update."""

    name: str
    params: tuple[str, ...]
    plan: Callable[..., Plan]
    doc: str
    # The pool transitions its steps name: spec.TRANSITIONS itself unless a RequestSpec says.
    pool: Mapping[str, Transition] = field(default_factory=lambda: TRANSITIONS, compare=False,
                                           repr=False)

    def guard(self, ops: Any, s: RequestState, **params: Any) -> Any:
        conds, steps, _ = self.plan(ops, s, **params)
        guards, _ = run_steps(ops, s.pool, steps, self.pool)
        return ops.And(*conds, *guards)

    def effect(self, ops: Any, s: RequestState, **params: Any) -> RequestState:
        _, steps, finish = self.plan(ops, s, **params)
        _, pool = run_steps(ops, s.pool, steps, self.pool)
        return finish(pool)

    def fire(self, s: RequestState, **params: Any) -> RequestState | None:
        """Concrete: ``effect`` when ``guard`` holds, else None, from one plan, stopping at
        the first false condition: the table's conditions, then each step's guard on the
        state the steps before it left (what ``guard`` conjoins), skipping a step whose
        ``when`` is false (its guard is then implied and its effect is not applied)."""
        conds, steps, finish = self.plan(CONCRETE, s, **params)
        for c in conds:
            if not c:
                return None
        pool = s.pool
        for name, p, when in steps:
            if not when:
                continue
            t = self.pool[name]
            if not t.guard(CONCRETE, pool, **p):
                return None
            pool = t.effect(CONCRETE, pool, **p)
        return finish(pool)


def _alive(s: RequestState, r: Any) -> Any:
    return s.pool.alive[r]


def _append(ops: Any, s: RequestState, r: Any, b: Any) -> dict[str, Any]:
    i = s.tlen[r]
    return {"tab": _set2(ops, s.tab, r, i, b), "slot": _set2(ops, s.slot, r, b, i),
            "tlen": _set(ops, s.tlen, r, i + 1)}


def _positions(ops: Any, s: RequestState, r: Any, **pos: tuple[Any, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, p in pos.items():
        out.update(_set_pos(ops, s, name, r, p))
    return out


def _chained(d: dict[str, Any], s: RequestState, ops: Any, r: Any,
             **pos: tuple[Any, Any]) -> dict[str, Any]:
    """Position updates applied on top of field updates ``d`` already made."""
    merged = s.replace(**d)
    d = dict(d)
    d.update(_positions(ops, merged, r, **pos))
    return d


# --- admission, tokens ------------------------------------------------------------------------
def _admit(ops: Any, s: RequestState, r: Any) -> Plan:
    zero = (0, 0)

    def finish(pool: PoolState) -> RequestState:
        d = {"tlen": _set(ops, s.tlen, r, 0)}
        return s.replace(pool=pool, **_chained(d, s, ops, r, reserved=zero, issued=zero,
                                               computed=zero, known=zero))

    return [], [("open_holder", {"r": r}, True)], finish


def _learn(ops: Any, s: RequestState, r: Any) -> Plan:
    q, o = s.position("known", r)
    B = s.pool.block_size
    conds = [_alive(s, r), o + 1 < B]
    return conds, [], lambda pool: s.replace(pool=pool, **_positions(ops, s, r, known=(q, o + 1)))


def _learn_block(ops: Any, s: RequestState, r: Any, h: Any) -> Plan:
    q, o = s.position("known", r)
    B = s.pool.block_size
    conds = [_alive(s, r), o + 1 == B, h != NO_HASH]

    def finish(pool: PoolState) -> RequestState:
        d = {"chain": _set2(ops, s.chain, r, q, h)}
        return s.replace(pool=pool, **_chained(d, s, ops, r, known=(q + 1, 0)))

    return conds, [], finish


# --- growing the table --------------------------------------------------------------------------
def _hit(ops: Any, s: RequestState, r: Any, b: Any) -> Plan:
    i = s.tlen[r]
    h = s.chain[r][i]
    at_boundary = (i, 0)
    conds = [
        _alive(s, r),
        pos_eq(ops, s.position("reserved", r), at_boundary),
        pos_eq(ops, s.position("issued", r), at_boundary),
        pos_eq(ops, s.position("computed", r), at_boundary),
        may_hit(ops, i, s.position("known", r)),
        h != NO_HASH,
        s.pool.hmap[h] == b,
    ]

    def finish(pool: PoolState) -> RequestState:
        end = (i + 1, 0)
        return s.replace(pool=pool, **_chained(_append(ops, s, r, b), s, ops, r,
                                               reserved=end, issued=end, computed=end))

    return conds, [("share", {"b": b, "r": r}, True)], finish


def _grow(ops: Any, s: RequestState, r: Any, b: Any, k: Any) -> Plan:
    i = s.tlen[r]
    conds = [pos_eq(ops, s.position("reserved", r), (i, 0)), k >= 1, k <= s.pool.block_size]

    def finish(pool: PoolState) -> RequestState:
        end = end_of(ops, i, k, pool.block_size)
        return s.replace(pool=pool, **_chained(_append(ops, s, r, b), s, ops, r, reserved=end))

    return conds, [("allocate", {"b": b, "r": r}, True)], finish


def _reserve(ops: Any, s: RequestState, r: Any, k: Any) -> Plan:
    q, o = s.position("reserved", r)
    conds = [_alive(s, r), o > 0, k > o, k <= s.pool.block_size]
    return conds, [], lambda pool: s.replace(
        pool=pool, **_positions(ops, s, r, reserved=end_of(ops, q, k, pool.block_size)))


# --- launches: publishing entries, writing blocks ------------------------------------------------
def _publish_entry(ops: Any, s: RequestState, r: Any, b: Any) -> Plan:
    return [], [("publish", {"b": b, "r": r}, True)], lambda pool: s.replace(pool=pool)


def _write_extent(ops: Any, s: RequestState, r: Any) -> tuple[Any, Any, Any]:
    """(block index, first offset, end offset) of r's next write: issued to the end of its
    block or to reserved."""
    iq, io = s.position("issued", r)
    rq, ro = s.position("reserved", r)
    return iq, io, ops.If(rq == iq, ro, s.pool.block_size)


def _write_block(ops: Any, s: RequestState, r: Any, b: Any) -> Plan:
    iq, io, end = _write_extent(ops, s, r)
    conds = [_alive(s, r), iq < s.tlen[r], s.tab[r][iq] == b, end > io]

    def finish(pool: PoolState) -> RequestState:
        return s.replace(pool=pool, **_positions(ops, s, r,
                                                 issued=end_of(ops, iq, end, pool.block_size)))

    return conds, [("begin_write", {"b": b, "r": r, "w": end - io}, True)], finish


def _copy_write(ops: Any, s: RequestState, r: Any, b: Any, d: Any) -> Plan:
    """Copy-on-write: r's next write lands in b, shared; a new block d gets b's written slots
    (read by the launch issued last, numbered while b is still held) and the write; b is let
    go."""
    iq, io, end = _write_extent(ops, s, r)
    P = s.pool
    conds = [
        _alive(s, r), iq < s.tlen[r], s.tab[r][iq] == b, end > io, P.ref[b] > 1,
        P.clock[ISSUED] > 0, P.inflight[P.clock[ISSUED] - 1],
    ]
    steps: list[Step] = [
        ("allocate", {"b": d, "r": r}, True),
        ("publish", {"b": d, "r": r}, True),
        ("begin_write", {"b": d, "r": r, "w": end}, True),
        ("release", {"b": b, "r": r}, True),
    ]

    def finish(pool: PoolState) -> RequestState:
        d_ = {"tab": _set2(ops, s.tab, r, iq, d),
              "slot": _set2(ops, _set2(ops, s.slot, r, b, NO_SLOT), r, d, iq)}
        return s.replace(pool=pool, **_chained(d_, s, ops, r,
                                               issued=end_of(ops, iq, end, pool.block_size)))

    return conds, steps, finish


# --- commit, seal, cache ------------------------------------------------------------------------
def _commit_pos(ops: Any, s: RequestState, r: Any, k: Any) -> Plan:
    cq, co = s.position("computed", r)
    e = s.tab[r][cq]
    P = s.pool
    new = end_of(ops, cq, k, P.block_size)
    conds = [
        _alive(s, r), cq < s.tlen[r], k > co, k <= P.block_size,
        *commit_bounds(ops, new, s.position("issued", r), s.position("known", r)),
        slots_written(ops, P, e, k),
    ]
    return conds, [], lambda pool: s.replace(pool=pool, **_positions(ops, s, r, computed=new))


def _seal(ops: Any, s: RequestState, r: Any, b: Any) -> Plan:
    i = s.slot[r][b]
    P = s.pool
    conds = [
        _alive(s, r), P.holds[r][b], P.state[b] == PUBLISHED, P.ref[b] == 1,
        P.filled[b] == P.block_size, i < s.known_q[r], s.chain[r][i] != NO_HASH,
        s.content[b] == NO_HASH,
    ]
    return conds, [], lambda pool: s.replace(
        pool=pool, content=_set(ops, s.content, b, s.chain[r][i]))


def _cache(ops: Any, s: RequestState, r: Any, b: Any) -> Plan:
    i = s.slot[r][b]
    conds = [_alive(s, r), s.pool.holds[r][b], s.content[b] != NO_HASH,
             i < s.computed_q[r]]
    steps: list[Step] = [("commit", {"b": b, "r": r, "h": s.content[b]}, True)]
    return conds, steps, lambda pool: s.replace(pool=pool)


# --- fork -----------------------------------------------------------------------------------------
def _fork_open(ops: Any, s: RequestState, r: Any, p: Any) -> Plan:
    zero = (0, 0)
    conds = [_alive(s, p), r != p]

    def finish(pool: PoolState) -> RequestState:
        d = {"tlen": _set(ops, s.tlen, r, 0), "chain": _set(ops, s.chain, r, s.chain[p])}
        return s.replace(pool=pool, **_chained(d, s, ops, r, reserved=zero, issued=zero,
                                               computed=zero,
                                               known=s.position("known", p)))

    return conds, [("open_holder", {"r": r}, True)], finish


def _fork_conds(ops: Any, s: RequestState, r: Any, p: Any) -> list[Any]:
    i = s.tlen[r]
    return [
        _alive(s, r), _alive(s, p), r != p, i < s.tlen[p],
        # the child is a copy of the parent's first i entries, positions included
        pos_eq(ops, s.position("reserved", r), (i, 0)),
        pos_eq(ops, s.position("issued", r), pos_min(ops, s.position("issued", p), (i, 0))),
        pos_eq(ops, s.position("computed", r),
               pos_min(ops, s.position("computed", p), (i, 0))),
        pos_eq(ops, s.position("known", r), s.position("known", p)),
        ops.Implies(i < s.known_q[r], s.chain[r][i] == s.chain[p][i]),
    ]


def _fork_finish(ops: Any, s: RequestState, r: Any, p: Any, b: Any
                 ) -> Callable[[PoolState], RequestState]:
    """The child's table gains b; its positions follow the parent's, up to this entry."""
    end = (s.tlen[r] + 1, 0)

    def finish(pool: PoolState) -> RequestState:
        return s.replace(pool=pool, **_chained(
            _append(ops, s, r, b), s, ops, r,
            reserved=pos_min(ops, s.position("reserved", p), end),
            issued=pos_min(ops, s.position("issued", p), end),
            computed=pos_min(ops, s.position("computed", p), end)))

    return finish


def _fork_share(ops: Any, s: RequestState, r: Any, p: Any, b: Any) -> Plan:
    """A full block is shared only sealed: both tables then agree on what its KV is."""
    P = s.pool
    conds = [*_fork_conds(ops, s, r, p), b == s.tab[p][s.tlen[r]],
             ops.Implies(P.filled[b] == P.block_size, s.content[b] != NO_HASH)]
    return conds, [("share", {"b": b, "r": r}, True)], _fork_finish(ops, s, r, p, b)


def _fork_fresh(ops: Any, s: RequestState, r: Any, p: Any, b: Any) -> Plan:
    """An entry the parent has not handed to a kernel holds no KV: the child takes a new one."""
    conds = [*_fork_conds(ops, s, r, p), s.pool.state[s.tab[p][s.tlen[r]]] == ALLOCATED]
    return conds, [("allocate", {"b": b, "r": r}, True)], _fork_finish(ops, s, r, p, b)


# --- shrinking: release the tail, truncate, close ------------------------------------------------
def _release_tail(ops: Any, s: RequestState, r: Any, b: Any) -> Plan:
    i = s.tlen[r] - 1
    P = s.pool
    conds = [_alive(s, r), i >= 0, s.tab[r][i] == b]
    invalidated = ops.And(P.ref[b] == 1, P.state[b] != REFERENCED)
    end = (i, 0)

    def finish(pool: PoolState) -> RequestState:
        d = {"tlen": _set(ops, s.tlen, r, i), "slot": _set2(ops, s.slot, r, b, NO_SLOT),
             "content": _set(ops, s.content, b, ops.If(invalidated, NO_HASH, s.content[b]))}
        return s.replace(pool=pool, **_chained(
            d, s, ops, r,
            reserved=pos_min(ops, s.position("reserved", r), end),
            issued=pos_min(ops, s.position("issued", r), end),
            computed=pos_min(ops, s.position("computed", r), end)))

    return conds, [("release", {"b": b, "r": r}, True)], finish


def _truncate_tail(ops: Any, s: RequestState, r: Any, k: Any) -> Plan:
    """Keep the first k positions of the last entry (rejected speculative tokens dropped):
    a kept block holding dropped slots is rewound, and its seal broken."""
    i = s.tlen[r] - 1
    e = s.tab[r][i]
    P = s.pool
    new = end_of(ops, i, k, P.block_size)
    rewound = P.filled[e] > k
    conds = [
        _alive(s, r), i >= 0, k >= 1, k <= P.block_size,
        pos_le(ops, new, s.position("reserved", r)),
        pos_le(ops, s.position("computed", r), new),
    ]

    def finish(pool: PoolState) -> RequestState:
        d = {"content": _set(ops, s.content, e, ops.If(rewound, NO_HASH, s.content[e]))}
        return s.replace(pool=pool, **_chained(
            d, s, ops, r, reserved=new,
            issued=pos_min(ops, s.position("issued", r), new),
            known=pos_min(ops, s.position("known", r), new)))

    return conds, [("rewind", {"b": e, "r": r, "k": k}, rewound)], finish


def _close(ops: Any, s: RequestState, r: Any) -> Plan:
    return [s.tlen[r] == 0], [("close_holder", {"r": r}, True)], lambda pool: s.replace(pool=pool)


# --- pool transitions that touch no table -------------------------------------------------------
def _passthrough(name: str) -> Callable[..., Plan]:
    def plan(ops: Any, s: RequestState, **params: Any) -> Plan:
        return [], [(name, dict(params), True)], lambda pool: s.replace(pool=pool)

    return plan


def _evict(ops: Any, s: RequestState, b: Any) -> Plan:
    return [], [("evict", {"b": b}, True)], lambda pool: s.replace(
        pool=pool, content=_set(ops, s.content, b, NO_HASH))


# The pool's parameter kinds, plus a fork's parent and a copy's destination.
REQUEST_PARAM_KINDS = {**PARAM_KINDS, "p": "holder", "d": "block"}

REQUEST_TRANSITIONS: dict[str, RequestTransition] = {
    t.name: t
    for t in (
        RequestTransition("admit", ("r",), _admit, "a request's table opens, empty"),
        RequestTransition("learn", ("r",), _learn,
                          "one more token id is known, within a block"),
        RequestTransition("learn_block", ("r", "h"), _learn_block,
                          "one more token id completes a block; h is its chain value"),
        RequestTransition("hit", ("r", "b"), _hit,
                          "admission: the cached block under r's next chain value is shared "
                          "and appended, computed"),
        RequestTransition("grow", ("r", "b", "k"), _grow,
                          "a new block appended to a full table, covering k positions"),
        RequestTransition("reserve", ("r", "k"), _reserve,
                          "the last, partial block covers k positions"),
        RequestTransition("publish_entry", ("r", "b"), _publish_entry,
                          "an entry is handed to kernels"),
        RequestTransition("write_block", ("r", "b"), _write_block,
                          "the next issued positions, in one exclusively held block"),
        RequestTransition("copy_write", ("r", "b", "d"), _copy_write,
                          "copy-on-write of the shared block the next write lands in"),
        RequestTransition("commit_pos", ("r", "k"), _commit_pos,
                          "positions of the next block up to k are committed [written]"),
        RequestTransition("seal", ("r", "b"), _seal,
                          "a full block with known tokens, held once, is bound to its chain "
                          "value"),
        RequestTransition("cache", ("r", "b"), _cache,
                          "a sealed, committed block enters the prefix cache"),
        RequestTransition("fork_open", ("r", "p"), _fork_open,
                          "a child of p opens with p's tokens and an empty table"),
        RequestTransition("fork_share", ("r", "p", "b"), _fork_share,
                          "the child shares p's next entry"),
        RequestTransition("fork_fresh", ("r", "p", "b"), _fork_fresh,
                          "the child takes a new block where p's entry holds no KV yet"),
        RequestTransition("release_tail", ("r", "b"), _release_tail,
                          "the last entry is let go (free, truncation, preemption)"),
        RequestTransition("truncate_tail", ("r", "k"), _truncate_tail,
                          "the last entry keeps k positions; tokens past them are forgotten"),
        RequestTransition("close", ("r",), _close, "an empty table closes"),
        RequestTransition("evict", ("b",), _evict,
                          "a zero-ref cached block is evicted; its seal goes"),
        *(RequestTransition(n, TRANSITIONS[n].params, _passthrough(n), TRANSITIONS[n].doc)
          for n in ("launch", "complete", "advance", "end_write", "recycle")),
    )
}


def request_step(s: RequestState, name: str,
                 transitions: Mapping[str, RequestTransition] | None = None,
                 **params: Any) -> RequestState | None:
    """Run one request transition concretely: the post-state, or None if the guard fails.
    ``transitions``: a ``RequestSpec``'s (default ``REQUEST_TRANSITIONS``, the spec as
    written)."""
    post = (REQUEST_TRANSITIONS if transitions is None else transitions)[name].fire(s, **params)
    return None if post is None else post.flattened()




def tables(s: RequestState) -> dict[Any, tuple[tuple[Any, ...], int, int]]:
    """Concrete: every open request's (entries, reserved, computed)."""
    return {r: (tuple(table_of(s, r)), count(s, "reserved", r), count(s, "computed", r))
            for r in s.pool.holder_ids if s.pool.alive[r]}


def summary(s: RequestState) -> dict[str, Any]:
    """Concrete: everything the request layer's state says, as plain values (for equality)."""
    reqs = {r: (tuple(table_of(s, r)), *(count(s, n, r) for n in POSITIONS),
                tuple(s.chain[r][i] for i in range(s.known_q[r])))
            for r in s.pool.holder_ids if s.pool.alive[r]}
    content = {b: s.content[b] for b in s.pool.block_ids if s.content[b] != NO_HASH}
    return {"requests": reqs, "content": content}
