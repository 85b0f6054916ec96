"""CrossHair targets: bounded wrappers over the pure core, each with a PEP 316 contract.

CrossHair confirms a condition "over all paths" only when the path tree is finite, so every
wrapper bounds its sizes with preconditions (loops run a bounded number of times) and calls the
real function, reached through its module (``table.f``, ``hashing.f``, ``TRANSITIONS[...]``) so
that a planted bug in a copy of that module is what the wrapper exercises.

Two CrossHair 0.0.112 quirks shape the contracts:
- ``a == b`` on two symbolic lists/tuples can evaluate wrongly (``[] == []`` came out false);
  contracts compare ``list(a) == list(b)`` instead.
- ``int.to_bytes``/``str.encode`` on symbolic values realize them, so a domain must be finite
  for the search to be exhaustive: token ids and int keys are checked on small ranges.

The transition targets run a spec transition (``pagedkv.spec.TRANSITIONS``) with the concrete
ops on a pool whose block 0 is built from small ints: block 0's fields, two holders (each may
hold block 0 and be alive), a hash map with entries for hashes 1 and 2, the launch clock and
launches 0 and 1. Each says: if the guard holds and the block-scoped invariants hold for block
0 before (and the launch-scoped ones for launches 0..2, and the pool-scoped ones that need no
sum), they hold after.
"""

from __future__ import annotations

from typing import Any

from pagedkv.allocator import hashing, table
from pagedkv.spec import (
    ALLOCATED,
    CACHED,
    CONCRETE,
    FREE,
    INVARIANTS,
    ISSUED,
    NO_BLOCK,
    NO_HASH,
    PUBLISHED,
    REFERENCED,
    TRANSITIONS,
    WATERMARK,
    Arr,
    ConcreteOps,
    PoolState,
    initial_state,
)

BLOCK_INVARIANTS = tuple(inv for inv in INVARIANTS.values() if inv.scope == "block")
LAUNCH_INVARIANTS = tuple(inv for inv in INVARIANTS.values() if inv.scope == "launch")


class _CountSums(ConcreteOps):
    def __init__(self) -> None:
        self.sums = 0

    def Sum(self, terms: Any) -> int:
        self.sums += 1
        return super().Sum(terms)


def _sums(inv: Any) -> int:
    ops = _CountSums()
    inv.pred(ops, initial_state(1, 1))
    return ops.sums


LOCAL_POOL_INVARIANTS = tuple(inv for inv in INVARIANTS.values()
                              if inv.scope == "pool" and _sums(inv) == 0)

# --- table arithmetic ------------------------------------------------------------------------


def slot_mapping_bounded(entries: list[int], bs: int, start: int, stop: int) -> list[int]:
    """Each slot is (the table's block for that position, the position's offset).

    pre: len(entries) <= 3 and 1 <= bs <= 3
    pre: 0 <= start <= stop <= len(entries) * bs and stop - start <= 4
    post: len(__return__) == stop - start
    post: all(x // bs == entries[(start + i) // bs] for i, x in enumerate(__return__))
    post: all(x % bs == (start + i) % bs for i, x in enumerate(__return__))
    """
    return table.slot_mapping(entries, bs, start, stop)


def writes_per_block_bounded(bs: int, start: int, stop: int) -> dict[int, int]:
    """Per table index, exactly how many of positions [start, stop) fall in it.

    pre: 1 <= bs <= 3 and 0 <= start <= stop <= 6
    post: sum(__return__.values()) == stop - start
    post: all(0 < n <= bs for n in __return__.values())
    post: sorted(__return__) == sorted({p // bs for p in range(start, stop)})
    post: all(n == sum(p // bs == i for p in range(start, stop)) for i, n in __return__.items())
    """
    return table.writes_per_block(bs, start, stop)


# --- hash-chain encoding ---------------------------------------------------------------------


def frame_bounded(kind: int, payload: bytes) -> bytes:
    """frame's contract on payloads of up to 3 bytes (a symbolic length is realized).

    pre: 0 <= kind < 256 and len(payload) <= 3
    post: __return__[0] == kind
    post: int.from_bytes(__return__[1:9], "big") == len(payload)
    post: __return__[9:] == payload
    """
    return hashing.frame(kind, payload)


def encode_fields_roundtrip(fields: list[tuple[int, bytes]]) -> bytes:
    """decode_fields inverts encode_fields, so the framing is injective.

    pre: len(fields) <= 2
    pre: all(0 <= k < 256 and len(p) <= 2 for k, p in fields)
    post: hashing.decode_fields(__return__) == list(fields)
    """
    return hashing.encode_fields(fields)


def decode_fields_roundtrip(data: bytes) -> list[tuple[int, bytes]]:
    """Whatever decode_fields accepts re-encodes to the same bytes (it is a left inverse).

    pre: len(data) <= 12
    raises: ValueError
    post: hashing.encode_fields(__return__) == data
    """
    return hashing.decode_fields(data)


def encode_tokens_injective(a: list[int], b: list[int]) -> bool:
    """Distinct token-id sequences encode differently.

    pre: len(a) <= 2 and len(b) <= 2
    pre: all(-2 <= t <= 2 for t in a) and all(-2 <= t <= 2 for t in b)
    post: __return__ == (list(a) == list(b))
    """
    return hashing.encode_tokens(a) == hashing.encode_tokens(b)


def extra_key_int_injective(x: int, y: int) -> bool:
    """Distinct int keys encode differently (sign and byte-length boundaries included).

    pre: -300 <= x <= 300 and -300 <= y <= 300
    post: __return__ == (x == y)
    """
    return hashing.encode_extra_key(x) == hashing.encode_extra_key(y)


def extra_key_bytes_injective(x: bytes, y: bytes) -> bool:
    """Distinct bytes keys encode differently.

    pre: len(x) <= 3 and len(y) <= 3
    post: __return__ == (x == y)
    """
    return hashing.encode_extra_key(x) == hashing.encode_extra_key(y)


def extra_key_str_injective(x: str, y: str) -> bool:
    """Distinct str keys encode differently.

    pre: len(x) <= 2 and len(y) <= 2
    post: __return__ == (x == y)
    """
    return hashing.encode_extra_key(x) == hashing.encode_extra_key(y)


def extra_key_kinds_distinct(x: int, y: str) -> bool:
    """An int key, a str key and a bytes key never share a (kind, payload) encoding.

    pre: -3 <= x <= 3 and len(y) <= 1
    post: __return__
    """
    ki = hashing.encode_extra_key(x)
    ks = hashing.encode_extra_key(y)
    kb = hashing.encode_extra_key(y.encode("utf-8"))
    return ki[0] != ks[0] and ki[0] != kb[0] and ks[0] != kb[0]


# --- spec transitions on a concrete single-block pool ----------------------------------------


# The launch clock and launches 0 and 1, (issued, watermark, inflight[0], inflight[1]): two
# epochs that satisfy watermark_bounds and launch_window (the epoch invariants are evaluated
# all the same) - two launches in flight (either may complete first), and the watermark past
# a completed launch with the next one in flight. With retire stamps 0..2 they put a stamp
# below, at and above the watermark, and at ``issued``. (A symbolic choice among all 11 epochs
# with issued <= 2 does not exhaust within the budget; four take a minute per target.)
EPOCHS = ((2, 0, True, True), (2, 1, False, True))


def _domain(st: int, retire: int, wpend: int, filled: int, hk: int, bs: int, m1: int,
            m2: int, ep: int) -> bool:
    return (
        0 <= st <= 5 and 0 <= retire <= 2 and 0 <= wpend <= 2 and 0 <= filled <= 3
        and 1 <= hk <= 2 and 1 <= bs <= 2 and -1 <= m1 <= 1 and -1 <= m2 <= 1
        and 0 <= ep < len(EPOCHS)
    )


def _pool(
    st: int, retire: int, wpend: int, filled: int, hk: int, h0: bool, h1: bool, a0: bool,
    a1: bool, bs: int, m1: int, m2: int, ep: int,
) -> PoolState:
    """Block 0 from ints; block 1 exists only as a hash-map target; holders 0 and 1; the clock
    and launches 0 and 1 from ``EPOCHS[ep]``.

    The fields a block invariant pins to the others are built from them (ref = number of
    holders; init, queued and the hash follow the state), which keeps the path tree small;
    ``block_ok`` still evaluates every block invariant on the result.
    """
    iss, wm, f0, f1 = EPOCHS[ep]
    live = st == ALLOCATED or st == PUBLISHED or st == REFERENCED
    hashed = st == REFERENCED or st == CACHED
    hmap = {1: m1, 2: m2}
    if hashed:
        hmap[hk] = 0
    return PoolState(
        state=Arr(0, {0: st}), ref=Arr(0, {0: int(h0) + int(h1)}), retire=Arr(0, {0: retire}),
        wpend=Arr(0, {0: wpend}), filled=Arr(0, {0: filled}), gen=Arr(0),
        init=Arr(False, {0: live or st == CACHED}),
        hash=Arr(NO_HASH, {0: hk if hashed else NO_HASH}),
        queued=Arr(True, {0: st == FREE or st == CACHED}), hmap=Arr(NO_BLOCK, hmap),
        holds=Arr(Arr(False), {0: Arr(False, {0: h0}), 1: Arr(False, {0: h1})}),
        alive=Arr(False, {0: a0, 1: a1}), nheld=Arr(0), count=Arr(0),
        inflight=Arr(False, {0: f0, 1: f1}), clock=Arr(0, {ISSUED: iss, WATERMARK: wm}),
        block_size=bs, num_blocks=2, block_ids=(0, 1), holder_ids=(0, 1),
    )


def block_ok(s: PoolState) -> bool:
    """Every block-scoped invariant holds for block 0, every launch-scoped one for launches
    0..2, and every pool-scoped one that sums over nothing (the pool here is not a whole pool:
    its ghost counts are not kept)."""
    return (all(CONCRETE.is_true(inv.pred(CONCRETE, s, 0)) for inv in BLOCK_INVARIANTS)
            and all(CONCRETE.is_true(inv.pred(CONCRETE, s, L)) for inv in LAUNCH_INVARIANTS
                    for L in (0, 1, 2))
            and all(CONCRETE.is_true(inv.pred(CONCRETE, s)) for inv in LOCAL_POOL_INVARIANTS))


def _keeps(name: str, s: PoolState, **params: Any) -> bool:
    """guard and invariants before => invariants after (vacuously true otherwise)."""
    t = TRANSITIONS[name]
    if not (block_ok(s) and CONCRETE.is_true(t.guard(CONCRETE, s, **params))):
        return True
    return block_ok(t.effect(CONCRETE, s, **params))



def allocate_keeps_block_invariants(
    st: int, retire: int, wpend: int, filled: int, hk: int, h0: bool, h1: bool, a0: bool,
    a1: bool, bs: int, m1: int, m2: int, ep: int,
    r: int,
) -> bool:
    """
    pre: _domain(st, retire, wpend, filled, hk, bs, m1, m2, ep) and 0 <= r <= 1
    post: __return__
    """
    s = _pool(st, retire, wpend, filled, hk, h0, h1, a0, a1, bs, m1, m2, ep)
    return _keeps("allocate", s, b=0, r=r)


def publish_keeps_block_invariants(
    st: int, retire: int, wpend: int, filled: int, hk: int, h0: bool, h1: bool, a0: bool,
    a1: bool, bs: int, m1: int, m2: int, ep: int,
    r: int,
) -> bool:
    """
    pre: _domain(st, retire, wpend, filled, hk, bs, m1, m2, ep) and 0 <= r <= 1
    post: __return__
    """
    s = _pool(st, retire, wpend, filled, hk, h0, h1, a0, a1, bs, m1, m2, ep)
    return _keeps("publish", s, b=0, r=r)


def begin_write_keeps_block_invariants(
    st: int, retire: int, wpend: int, filled: int, hk: int, h0: bool, h1: bool, a0: bool,
    a1: bool, bs: int, m1: int, m2: int, ep: int,
    r: int, w: int,
) -> bool:
    """
    pre: _domain(st, retire, wpend, filled, hk, bs, m1, m2, ep) and 0 <= r <= 1
    pre: -1 <= w <= 3
    post: __return__
    """
    s = _pool(st, retire, wpend, filled, hk, h0, h1, a0, a1, bs, m1, m2, ep)
    return _keeps("begin_write", s, b=0, r=r, w=w)


def end_write_keeps_block_invariants(
    st: int, retire: int, wpend: int, filled: int, hk: int, h0: bool, h1: bool, a0: bool,
    a1: bool, bs: int, m1: int, m2: int, ep: int,
) -> bool:
    """
    pre: _domain(st, retire, wpend, filled, hk, bs, m1, m2, ep)
    post: __return__
    """
    s = _pool(st, retire, wpend, filled, hk, h0, h1, a0, a1, bs, m1, m2, ep)
    return _keeps("end_write", s, b=0)


def launch_keeps_block_invariants(
    st: int, retire: int, wpend: int, filled: int, hk: int, h0: bool, h1: bool, a0: bool,
    a1: bool, bs: int, m1: int, m2: int, ep: int,
    L: int,
) -> bool:
    """
    pre: _domain(st, retire, wpend, filled, hk, bs, m1, m2, ep)
    pre: -1 <= L <= 3
    post: __return__
    """
    s = _pool(st, retire, wpend, filled, hk, h0, h1, a0, a1, bs, m1, m2, ep)
    return _keeps("launch", s, L=L)


def complete_keeps_block_invariants(
    st: int, retire: int, wpend: int, filled: int, hk: int, h0: bool, h1: bool, a0: bool,
    a1: bool, bs: int, m1: int, m2: int, ep: int,
    L: int,
) -> bool:
    """
    pre: _domain(st, retire, wpend, filled, hk, bs, m1, m2, ep)
    pre: -1 <= L <= 3
    post: __return__
    """
    s = _pool(st, retire, wpend, filled, hk, h0, h1, a0, a1, bs, m1, m2, ep)
    return _keeps("complete", s, L=L)


def advance_keeps_block_invariants(
    st: int, retire: int, wpend: int, filled: int, hk: int, h0: bool, h1: bool, a0: bool,
    a1: bool, bs: int, m1: int, m2: int, ep: int,
) -> bool:
    """
    pre: _domain(st, retire, wpend, filled, hk, bs, m1, m2, ep)
    post: __return__
    """
    s = _pool(st, retire, wpend, filled, hk, h0, h1, a0, a1, bs, m1, m2, ep)
    return _keeps("advance", s)


def rewind_keeps_block_invariants(
    st: int, retire: int, wpend: int, filled: int, hk: int, h0: bool, h1: bool, a0: bool,
    a1: bool, bs: int, m1: int, m2: int, ep: int,
    r: int, k: int,
) -> bool:
    """
    pre: _domain(st, retire, wpend, filled, hk, bs, m1, m2, ep) and 0 <= r <= 1
    pre: -1 <= k <= 3
    post: __return__
    """
    s = _pool(st, retire, wpend, filled, hk, h0, h1, a0, a1, bs, m1, m2, ep)
    return _keeps("rewind", s, b=0, r=r, k=k)


def commit_keeps_block_invariants(
    st: int, retire: int, wpend: int, filled: int, hk: int, h0: bool, h1: bool, a0: bool,
    a1: bool, bs: int, m1: int, m2: int, ep: int,
    r: int, h: int,
) -> bool:
    """
    pre: _domain(st, retire, wpend, filled, hk, bs, m1, m2, ep) and 0 <= r <= 1
    pre: 0 <= h <= 2
    post: __return__
    """
    s = _pool(st, retire, wpend, filled, hk, h0, h1, a0, a1, bs, m1, m2, ep)
    return _keeps("commit", s, b=0, r=r, h=h)


def share_keeps_block_invariants(
    st: int, retire: int, wpend: int, filled: int, hk: int, h0: bool, h1: bool, a0: bool,
    a1: bool, bs: int, m1: int, m2: int, ep: int,
    r: int,
) -> bool:
    """
    pre: _domain(st, retire, wpend, filled, hk, bs, m1, m2, ep) and 0 <= r <= 1
    post: __return__
    """
    s = _pool(st, retire, wpend, filled, hk, h0, h1, a0, a1, bs, m1, m2, ep)
    return _keeps("share", s, b=0, r=r)


def release_keeps_block_invariants(
    st: int, retire: int, wpend: int, filled: int, hk: int, h0: bool, h1: bool, a0: bool,
    a1: bool, bs: int, m1: int, m2: int, ep: int,
    r: int,
) -> bool:
    """
    pre: _domain(st, retire, wpend, filled, hk, bs, m1, m2, ep) and 0 <= r <= 1
    post: __return__
    """
    s = _pool(st, retire, wpend, filled, hk, h0, h1, a0, a1, bs, m1, m2, ep)
    return _keeps("release", s, b=0, r=r)


def evict_keeps_block_invariants(
    st: int, retire: int, wpend: int, filled: int, hk: int, h0: bool, h1: bool, a0: bool,
    a1: bool, bs: int, m1: int, m2: int, ep: int,
) -> bool:
    """
    pre: _domain(st, retire, wpend, filled, hk, bs, m1, m2, ep)
    post: __return__
    """
    s = _pool(st, retire, wpend, filled, hk, h0, h1, a0, a1, bs, m1, m2, ep)
    return _keeps("evict", s, b=0)


def recycle_keeps_block_invariants(
    st: int, retire: int, wpend: int, filled: int, hk: int, h0: bool, h1: bool, a0: bool,
    a1: bool, bs: int, m1: int, m2: int, ep: int,
) -> bool:
    """
    pre: _domain(st, retire, wpend, filled, hk, bs, m1, m2, ep)
    post: __return__
    """
    s = _pool(st, retire, wpend, filled, hk, h0, h1, a0, a1, bs, m1, m2, ep)
    return _keeps("recycle", s, b=0)


def open_holder_keeps_block_invariants(
    st: int, retire: int, wpend: int, filled: int, hk: int, h0: bool, h1: bool, a0: bool,
    a1: bool, bs: int, m1: int, m2: int, ep: int,
    r: int,
) -> bool:
    """
    pre: _domain(st, retire, wpend, filled, hk, bs, m1, m2, ep) and 0 <= r <= 1
    post: __return__
    """
    s = _pool(st, retire, wpend, filled, hk, h0, h1, a0, a1, bs, m1, m2, ep)
    return _keeps("open_holder", s, r=r)


def close_holder_keeps_block_invariants(
    st: int, retire: int, wpend: int, filled: int, hk: int, h0: bool, h1: bool, a0: bool,
    a1: bool, bs: int, m1: int, m2: int, ep: int,
    r: int,
) -> bool:
    """
    pre: _domain(st, retire, wpend, filled, hk, bs, m1, m2, ep) and 0 <= r <= 1
    post: __return__
    """
    s = _pool(st, retire, wpend, filled, hk, h0, h1, a0, a1, bs, m1, m2, ep)
    return _keeps("close_holder", s, r=r)


def release_refused_to_non_holder(
    st: int, retire: int, wpend: int, filled: int, hk: int, h0: bool, h1: bool, a0: bool,
    a1: bool, bs: int, m1: int, m2: int, ep: int,
    r: int,
) -> bool:
    """release's guard is false when the holder does not hold the block (no double free).

    pre: _domain(st, retire, wpend, filled, hk, bs, m1, m2, ep) and 0 <= r <= 1
    pre: not (h0 if r == 0 else h1)
    post: not __return__
    """
    s = _pool(st, retire, wpend, filled, hk, h0, h1, a0, a1, bs, m1, m2, ep)
    return CONCRETE.is_true(TRANSITIONS["release"].guard(CONCRETE, s, b=0, r=r))


# The functions CrossHair checks: real functions (contracts in their docstrings) and the
# wrappers above. Qualified names; the runner maps each reported line to one of these.
REAL_TARGETS = (
    "pagedkv.allocator.table.blocks_needed",
    "pagedkv.allocator.table.resolve",
    "pagedkv.allocator.table.slot",
)
WRAPPER_TARGETS = (
    "slot_mapping_bounded",
    "writes_per_block_bounded",
    "frame_bounded",
    "encode_fields_roundtrip",
    "decode_fields_roundtrip",
    "encode_tokens_injective",
    "extra_key_int_injective",
    "extra_key_bytes_injective",
    "extra_key_str_injective",
    "extra_key_kinds_distinct",
    *(f"{name}_keeps_block_invariants" for name in TRANSITIONS),
    "release_refused_to_non_holder",
)
