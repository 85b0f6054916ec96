"""The spec's guards, effects and local invariants as numba source over a native pool's arrays.

A native pool (``native_pool.NativePool``) keeps the spec's fields in five NumPy arrays:

- ``B``, int64 ``[len(ROWS), num_blocks + 1]``: one row per block field (``state`` ...
  ``queued``) and the eviction queue's links (``prev``, ``next``); column ``num_blocks`` is
  the queue's sentinel, never a block of the pool;
- ``M``, int64: the per-state ``count`` (from ``COUNT0``), the ``clock`` (from ``CLOCK0``), then
  the pool's own ``CACHED_BUSY``, ``QLEN``, ``BLOCK_SIZE``, ``LAUNCH_USED`` and
  ``KEYS_USED`` (the keys in ``K``), then from
  ``LAUNCHES0`` the ``inflight`` launches, an open-addressing set (``native_clock.py``);
- ``H``, int64 ``[2, holders]``: per holder slot, ``alive`` and ``nheld``;
- ``K``, int64: the ``holds`` relation, an open-addressing set of ``(holder << 32) | block``;
- ``X``, int64: the ``hmap``, per hash slot the block registered under it (``NO_BLOCK``).

Holders and hashes are small ints (slots) there; the pool maps request ids and sha256 digests
to them. Each spec function is evaluated once with ``compiled``'s symbolic ``ops`` and a view
whose reads build source over those arrays (``read``), exactly as the list-based pool's code is
built: what runs is the spec's own guard and effect. ``module_source`` writes them out, one
``g_<name>`` (guard) and ``e_<name>`` (effect: every value it stores is read into a local
first, on the pre-state, as the spec's effect reads its pre-state) per transition, plus
``run_<name>`` (guard then effect per column of a parameter matrix, stopping at the first
refusal), for those a pool calls so ``one_<name>`` (once, on scalar arguments) and
``each_<name>`` (over a block vector, the other parameters fixed), the fused local
invariants, and the pool's policy loops (``native_policy.py``, ``native_clock.py``).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from pagedkv.spec import ALL_STATES, NO_BLOCK, PARAM_KINDS, Transition, cache_due, takeable
from pagedkv.spec.model import BLOCK_FIELDS
from pagedkv.spec.request_spec import REQUEST_SPEC

from .compiled import (
    _holds_entries,
    _lit,
    _rule_terms,
    _source_of,
    _Sym,
    _SymOps,
    _SymPost,
    _SymStore,
    _truth,
    _Unsupported,
)

ROWS = (*BLOCK_FIELDS, "prev", "next")
ROW = {name: i for i, name in enumerate(ROWS)}
COUNT0 = 0
CLOCK0 = len(ALL_STATES)
CACHED_BUSY, QLEN, BLOCK_SIZE, LAUNCH_USED, KEYS_USED = range(CLOCK0 + 2, CLOCK0 + 7)
META_SIZE = CLOCK0 + 7
LAUNCHES0 = META_SIZE  # the launches in flight: an open-addressing set in M's cells from here
EMPTY_KEY = -1
LAUNCH_EMPTY, LAUNCH_TOMB = -(2**63), -(2**63) + 1

# Every transition of the spec runs natively.
NATIVE = ("allocate", "publish", "begin_write", "end_write", "rewind", "commit", "share",
          "release", "evict", "recycle", "open_holder", "close_holder", "launch", "complete",
          "advance")
# Those a pool calls once on scalar arguments (``one_<name>``, held to ``run_<name>`` too),
# and those it runs on a block vector with the other parameters fixed (``each_<name>``): only
# these are generated (each generated function costs its dispatcher at every module load).
ONE = ("open_holder", "close_holder")
EACH = ("publish", "begin_write")


def read(field: str, *keys: str) -> str:
    """Source reading the spec's ``field[keys...]`` from the native arrays."""
    if field in ROW:
        return f"B[{ROW[field]}, {keys[0]}]"
    if field == "count":
        return f"M[{COUNT0} + {keys[0]}]"
    if field == "clock":
        return f"M[{CLOCK0} + {keys[0]}]"
    if field == "hmap":
        return f"X[{keys[0]}]"
    if field == "alive":
        return f"(H[0, {keys[0]}] != 0)"
    if field == "nheld":
        return f"H[1, {keys[0]}]"
    if field == "holds":
        return f"has_key(K, {keys[0]}, {keys[1]})"
    if field == "inflight":
        return f"has_launch(M, {keys[0]})"
    raise _Unsupported(f"{field} has no native storage")


class _NativeOps(_SymOps):
    """The connectives as numba compiles them fast: ``and``/``or`` chains over mixed bools
    and ints cost numba tens of nanoseconds each, ``&``/``|`` over ``bool(...)`` about one
    (and a conditional's branches are both made ints).
    Every operand is evaluated (no short circuit): the callers range-check block ids before
    any guard runs, so every read is in bounds."""

    @staticmethod
    def And(*args: Any) -> Any:
        if not args:
            return True
        return _Sym("(" + " & ".join(f"bool({_truth(a)})" for a in args) + ")", True)

    @staticmethod
    def Or(*args: Any) -> Any:
        if not args:
            return False
        return _Sym("(" + " | ".join(f"bool({_truth(a)})" for a in args) + ")", True)

    @staticmethod
    def Implies(a: Any, b: Any) -> _Sym:
        return _Sym(f"((not bool({_truth(a)})) | bool({_truth(b)}))", True)

    @staticmethod
    def If(c: Any, a: Any, b: Any) -> _Sym:  # both branches int64: no bool/int unification
        return _Sym(f"(int({_lit(a)}) if bool({_truth(c)}) else int({_lit(b)}))")


def _native(fn: Any, params: tuple[str, ...]) -> Any:
    return _source_of(fn, params, read, _NativeOps)


def _target(field: str, key: str) -> str:
    """The array cell a store to ``field[key]`` writes (list-like fields only)."""
    if field == "alive":
        return f"H[0, {key}]"
    src = read(field, key)
    if not src.startswith(("B[", "M[", "X[", "H[")):
        raise _Unsupported(f"{field} is not stored by cell")
    return src


def guard_source(t: Transition) -> str:
    term = _native(t.guard, t.params)
    if term is None:
        raise _Unsupported(f"the guard of {t.name}")
    return _truth(term)


def effect_lines(t: Transition) -> list[str]:
    """The effect's stores, each value and key read first (on the pre-state) into a local."""
    post = _native(t.effect, t.params)
    if not isinstance(post, _SymPost):
        raise _Unsupported(f"the effect of {t.name}")
    reads: list[str] = []
    stores: list[str] = []

    def local(src: str) -> str:
        reads.append(f"    _t{len(reads)} = {src}")
        return f"_t{len(reads) - 1}"

    for field, arr in post.fields.items():
        if field == "holds":
            for r, b, v in _holds_entries(arr):
                r, b = local(r), local(b)
                if v in ("True", "False"):
                    op = "add_key(K, M, " if v == "True" else "discard_key(K, M, "
                    stores.append(f"    {op}{r}, {b})")
                else:
                    v = local(f"bool({v})")
                    stores.append(f"    if {v}:\n        add_key(K, M, {r}, {b})\n"
                                  f"    else:\n        discard_key(K, M, {r}, {b})")
            continue
        if not isinstance(arr, _SymStore):
            raise _Unsupported(f"{field} is not a store chain")
        if field == "inflight":  # a set: membership stored
            for k, v in arr.entries():
                k = local(k)
                if v in ("True", "False"):
                    op = "add_launch" if v == "True" else "discard_launch"
                    stores.append(f"    {op}(M, {k})")
                else:
                    v = local(f"bool({v})")
                    stores.append(f"    if {v}:\n        add_launch(M, {k})\n"
                                  f"    else:\n        discard_launch(M, {k})")
            continue
        for k, v in arr.entries():  # oldest first: a later store to the same cell wins
            k, v = local(k), local(v)
            stores.append(f"    {_target(field, k)} = {v}")
    return reads + stores


def _sig(*params: str) -> str:
    return ", ".join(("B", "M", "H", "K", "X", *params))


# The pool's geometry as the spec's functions name it (``s.num_blocks``, ``s.block_size``).
GEOMETRY = "    num_blocks = B.shape[1] - 1\n    block_size = M[BLOCK_SIZE]\n"


def transition_source(t: Transition) -> str:
    """``g_<name>``, ``e_<name>`` and ``run_<name>`` of one transition, and its ``one_<name>``
    and ``each_<name>`` where a pool calls them (``ONE``, ``EACH``)."""
    params = t.params
    body = effect_lines(t) or ["    pass"]
    cols = "\n".join(f"        {p} = P[{i}, _i]" for i, p in enumerate(params))
    inline = "@njit(cache=True, inline='always')\n"  # no call: numba inlines its IR
    return (f"{inline}def g_{t.name}({_sig(*params)}):\n" + GEOMETRY
            + f"    return bool({guard_source(t)})\n\n\n"
            f"{inline}def e_{t.name}({_sig(*params)}):\n" + GEOMETRY + "\n".join(body)
            + "\n\n\n"
            f"@njit(cache=True)\ndef run_{t.name}({_sig('P', 'n')}):\n"
            f"    for _i in range(n):\n{cols}\n"
            + "".join(f"        if {p} < 0 or {p} >= B.shape[1] - 1:\n            return _i\n"
                      for p in params if PARAM_KINDS.get(p) == "block")
            + f"        if not g_{t.name}({_sig(*params)}):\n"
            f"            return _i\n"
            f"        e_{t.name}({_sig(*params)})\n"
            f"    return n\n"
            + (one_source(t) if t.name in ONE else "")
            + (repeat_source(t) if t.name in EACH else ""))


def one_source(t: Transition) -> str:
    """``one_<name>(B, M, H, K, X, <its parameters>)``: the transition once, on scalar
    arguments; whether it ran."""
    params = t.params
    return (f"\n\n@njit(cache=True)\ndef one_{t.name}({_sig(*params)}):\n"
            + "".join(f"    if {p} < 0 or {p} >= B.shape[1] - 1:\n        return False\n"
                      for p in params if PARAM_KINDS.get(p) == "block")
            + f"    if not g_{t.name}({_sig(*params)}):\n        return False\n"
            f"    e_{t.name}({_sig(*params)})\n    return True\n")


def repeat_source(t: Transition) -> str:
    """``each_<name>(B, M, H, K, X, blocks, n, <the other parameters>)``: the transition on
    each of ``blocks[:n]`` in order, the other parameters the same for every block, stopping
    at the first refusal (returns how many ran). For a transition whose first parameter is
    the block and whose others are not blocks."""
    params = t.params
    if not params or params[0] != "b" or any(PARAM_KINDS.get(p) == "block"
                                             for p in params[1:]):
        raise ValueError(f"each_{t.name}: its block is not its only block parameter, first")
    return (f"\n\n@njit(cache=True)\ndef each_{t.name}({_sig('blocks', 'n', *params[1:])}):\n"
            f"    for _i in range(n):\n        b = blocks[_i]\n"
            f"        if b < 0 or b >= B.shape[1] - 1 or not g_{t.name}({_sig(*params)}):\n"
            f"            return _i\n"
            f"        e_{t.name}({_sig(*params)})\n"
            f"    return n\n")


def invariants_source(invariants: list[Any]) -> str:
    """``first_failing(blocks, n)``: the index of the first of ``blocks[:n]`` where one of the
    (block- or hash-scoped) invariants is false, or -1; ``each(b)``: their values at b."""
    terms = []
    for inv in invariants:
        if inv.scope == "block":
            term = _native(lambda ops, s, b, _p=inv.pred: _p(ops, s, b), ("b",))
        else:  # over the block's hash
            term = _native(lambda ops, s, h, _p=inv.pred: _p(ops, s, h), ("h",))
        if term is None:
            raise _Unsupported(f"invariant {inv.name}")
        terms.append(f"bool({_truth(term)})")
    each = ", ".join(terms) + ("," if len(terms) == 1 else "")
    return (f"@njit(cache=True)\ndef each({_sig('b')}):\n" + GEOMETRY +
            f"    h = B[{ROW['hash']}, b]\n"
            f"    return ({each})\n\n\n"
            f"@njit(cache=True)\ndef first_failing({_sig('blocks', 'n')}):\n" + GEOMETRY +
            f"    for _i in range(n):\n"
            f"        b = blocks[_i]\n"
            f"        h = B[{ROW['hash']}, b]\n"
            f"        if not ({' and '.join(terms) or 'True'}):\n"
            f"            return _i\n"
            f"    return -1\n")


def clock_invariants_source(invariants: list[Any]) -> str:
    """``clock_each(L)``: the values of the clock's invariants (the pool-wide ones that sum
    over nothing, and the launch-scoped ones at launch L), natively, for checked mode."""
    terms = []
    for inv in invariants:
        if inv.scope == "pool":
            term = _native(lambda ops, s, L, _p=inv.pred: _p(ops, s), ("L",))
        else:
            term = _native(lambda ops, s, L, _p=inv.pred: _p(ops, s, L), ("L",))
        if term is None:
            raise _Unsupported(f"invariant {inv.name}")
        terms.append(f"bool({_truth(term)})")
    each = ", ".join(terms) + ("," if len(terms) == 1 else "")
    return (f"@njit(cache=True)\ndef clock_each({_sig('L')}):\n" + GEOMETRY
            + f"    return ({each})\n")


def _constants() -> str:
    from pagedkv import spec

    names = ["FREE", "ALLOCATED", "PUBLISHED", "REFERENCED", "CACHED", "RECLAIMED",
             "NO_HASH", "NO_BLOCK", "ISSUED", "WATERMARK"]
    lines = [f"{n} = {getattr(spec, n)!r}" for n in names]
    lines += [f"ROW_{name.upper()} = {i}" for i, name in enumerate(ROWS)]
    lines += [f"CLOCK0 = {CLOCK0}", f"COUNT0 = {COUNT0}", f"CACHED_BUSY = {CACHED_BUSY}",
              f"QLEN = {QLEN}", f"BLOCK_SIZE = {BLOCK_SIZE}",
              f"LAUNCH_USED = {LAUNCH_USED}", f"LAUNCHES0 = {LAUNCHES0}",
              f"LAUNCH_EMPTY = {LAUNCH_EMPTY}", f"LAUNCH_TOMB = {LAUNCH_TOMB}",
              f"KEYS_USED = {KEYS_USED}", f"EMPTY_KEY = {EMPTY_KEY}"]
    return "\n".join(lines) + "\n"


POLICY = Path(__file__).with_name("native_policy.py")
STEPS = Path(__file__).with_name("native_steps.py")
CLOCK = Path(__file__).with_name("native_clock.py")

# Every function is compiled without numba's reference counting: none of them allocates, and
# counting the arrays passed from call to call costs tens of nanoseconds per call (atomics),
# more than the transition itself.
_HEADER = """from numba import njit as _njit


def njit(**options):
    return _njit(_nrt=False, **options)
"""


def rules_source(commit_bounds: Any, slots_written: Any) -> str:
    """The request layer's rules the step loops (``native_steps.py``) evaluate:
    ``rule_commit_bounds(Bsz, new, issued, known)``, the spec's ``commit_bounds`` over three
    position counts (as ``compiled.position_rule`` writes it), ``g_slots_written(b, k)``, the
    pool predicate ``slots_written`` over the native arrays, and ``g_takeable(b)``, the
    spec's ``takeable`` (what an allocation may take: a cached hit that is takeable is
    revived, not taken), and ``g_cache_due(b, h)``, the spec's ``cache_due`` (which commits
    a caching pass makes)."""
    params = ("new", "issued", "known")
    terms = _rule_terms(commit_bounds, params)
    if terms is None:
        raise _Unsupported("the request rule commit_bounds")
    written = _native(slots_written, ("b", "k"))
    if written is None:
        raise _Unsupported("the request rule slots_written")
    can_take = _native(takeable, ("b",))
    if can_take is None:
        raise _Unsupported("the pool predicate takeable")
    due = _native(cache_due, ("b", "h"))
    if due is None:
        raise _Unsupported("the pool predicate cache_due")
    split = "".join(f"    {p}_q = {p} // Bsz\n    {p}_o = {p} - {p}_q * Bsz\n" for p in params)
    inline = "@njit(cache=True, inline='always')\n"
    return (f"{inline}def rule_commit_bounds(Bsz, {', '.join(params)}):\n{split}"
            f"    return ({', '.join(f'bool({t})' for t in terms)},)\n\n\n"
            f"{inline}def g_slots_written({_sig('b', 'k')}):\n" + GEOMETRY
            + f"    return bool({_truth(written)})\n\n\n"
            f"{inline}def g_takeable({_sig('b')}):\n" + GEOMETRY
            + f"    return bool({_truth(can_take)})\n\n\n"
            f"{inline}def g_cache_due({_sig('b', 'h')}):\n" + GEOMETRY
            + f"    return bool({_truth(due)})\n")


def module_source(spec: dict[str, Transition], invariants: list[Any],
                  rules: tuple[Any, Any] | None = None,
                  clock: list[Any] | None = None) -> str:
    """The whole native module for these transitions, local invariants and request rules
    (``commit_bounds``, ``slots_written``): constants, the holds set and the queue
    (``native_policy.py``), one guard/effect/run per transition of ``NATIVE``, the fused
    invariants, the rules and the request layer's step loops (``native_steps.py``). Raises
    ``_Unsupported`` if some spec function cannot be written over the native arrays.
    ``rules``: default, those of ``spec.REQUEST_SPEC``; ``clock``: the clock's invariants
    (default ``pool.clock_invariants()``)."""
    assert NO_BLOCK == -1
    if rules is None:
        rules = (REQUEST_SPEC.commit_bounds, REQUEST_SPEC.slots_written)
    if clock is None:
        from .pool import clock_invariants

        clock = clock_invariants()
    parts = [_HEADER, _constants(), POLICY.read_text(), CLOCK.read_text()]
    parts += [transition_source(spec[name]) for name in NATIVE]
    parts.append(invariants_source(invariants))
    parts.append(clock_invariants_source(clock))
    parts += [rules_source(*rules), STEPS.read_text()]
    return "\n\n".join(parts)


def source_digest(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:20]
