"""BlockPool: the block-level runtime. Each public method is one spec transition.

Guards are the spec's own functions (``spec.TRANSITIONS[name].guard``, or those of the
``spec`` passed in), evaluated on a read-only view of the pool's arrays, so a refused call
raises a typed error and changes nothing. In checked mode each transition's real effect is
compared with the spec's predicted effect on the touched blocks, and the block-scoped
invariants are re-evaluated there: O(1) per touched block, never a pool scan.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Hashable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from pagedkv.spec import (
    ALLOCATED,
    BLOCK_FIELDS,
    CACHED,
    CONCRETE,
    FREE,
    INVARIANTS,
    ISSUED,
    NO_HASH,
    PUBLISHED,
    RECLAIMED,
    REFERENCED,
    TRANSITIONS,
    WATERMARK,
    Overlay,
    PoolState,
    Transition,
    cache_due,
    takeable,
)
from pagedkv.spec.explain import refusal_detail

from .compiled import (
    batch_agrees,
    batch_code,
    effect_agrees,
    effect_code,
    fused_check_agrees,
    fused_check_source,
    predicate_agrees,
    predicate_code,
    predicate_many_agrees,
    predicate_many_code,
    predicate_source,
)
from .errors import (
    DoubleFree,
    GuardViolation,
    InvalidArgument,
    InvariantViolation,
    OutOfBlocks,
    PendingAccess,
    PublishError,
)
from .storage import PoolStorage
from .table import MAX_COUNT, check_block_size, check_count

MAX_BLOCKS = 2**31 - 1  # block ids are int32 in the tables handed to kernels
MAX_HASH = 2**256 - 1  # block hashes are sha256 digests

_GUARD_ERRORS: dict[str, type[GuardViolation]] = {
    "release": DoubleFree,
    "recycle": PendingAccess,
    "allocate": PendingAccess,
    "publish": PublishError,
    "begin_write": PublishError,
}


class _CountedRange:
    """An iterable that records whether anything iterated it."""

    def __init__(self, items: Iterable[Any]) -> None:
        self.items, self.used = tuple(items), False

    def __iter__(self) -> Any:
        self.used = True
        return iter(self.items)


def _sums_over_pool(inv: Any) -> bool:
    """Does the invariant sum over every holder or block (O(pool) to evaluate)?"""
    from pagedkv.spec import initial_state

    holders, blocks = _CountedRange(("a",)), _CountedRange(range(2))
    probe = initial_state(2, 1).replace(holder_ids=holders, block_ids=blocks)
    inv.pred(CONCRETE, probe, *(() if inv.scope == "pool" else (0,)))
    return holders.used or blocks.used


def local_invariants() -> list[Any]:
    """The block- and hash-scoped invariants checked mode re-evaluates on each touched block:
    those that read only that block (and its hash). A pool-wide sum such as
    ``ref_matches_holders`` would cost O(holders) per operation; at run time it is covered by
    the refinement check of ``ref`` and ``holds[r][b]`` on the touched pair together with the
    z3 proof that the invariant is inductive, and ``check_invariants()`` scans it."""
    return [inv for inv in INVARIANTS.values()
            if inv.scope in ("block", "hash") and not _sums_over_pool(inv)]


def clock_invariants() -> list[Any]:
    """The launch-scoped invariants and the pool-wide ones that sum over nothing (the
    watermark's bounds): checked mode re-evaluates them after each transition that moves the
    clock or a launch's flag, at that launch (O(1))."""
    return [inv for inv in INVARIANTS.values()
            if inv.scope == "launch" or (inv.scope == "pool" and not _sums_over_pool(inv))]


def check_admission(hashes: Sequence[int], n: int) -> None:
    """An admission of ``n`` blocks (a count) looking up ``hashes``: ``InvalidArgument``
    unless they are a sequence no longer than n (a request's prefix hits are among its
    blocks). ``BlockPool.admit``'s check, and ``NativePool.admit``'s."""
    try:
        nh = len(hashes)
    except TypeError:
        raise InvalidArgument("hashes must be a sequence of hashable digests") from None
    if nh > n:
        raise InvalidArgument(f"admit of {n} blocks with {nh} hashes: a request's prefix hits "
                              "are among its blocks")


class BlockPool(PoolStorage):
    """Physical blocks, their lifecycle states, the eviction queue and the prefix-hash map."""

    def __init__(self, num_blocks: int, block_size: int, *, checked: bool = True,
                 spec: Mapping[str, Transition] | None = None) -> None:
        """``spec``: the lifecycle transitions this pool enforces, by name (default: the
        spec's own ``spec.TRANSITIONS``). Entries are read at call time, and each guard and
        effect is compiled for this pool on first use (again if the entry is replaced)."""
        # Block ids are int32 in block tables; slots (block * B + offset) are int64.
        num_blocks = check_count(num_blocks, "num_blocks", MAX_BLOCKS)
        if num_blocks == 0:
            raise InvalidArgument("num_blocks must be >= 1")
        block_size = check_block_size(block_size)
        if num_blocks * block_size > MAX_COUNT:
            raise InvalidArgument(
                f"num_blocks * block_size must be <= {MAX_COUNT} (int64 slot ids), got "
                f"{num_blocks} * {block_size}"
            )
        if not isinstance(checked, bool | np.bool_):
            raise InvalidArgument(f"checked must be a bool, got {type(checked).__name__}")
        checked = bool(checked)
        self.spec: Mapping[str, Transition] = TRANSITIONS if spec is None else spec
        super().__init__(num_blocks, block_size)
        self.checked = checked
        # (stamp, b) each time a block is retired above the watermark; stamps never decrease
        # (FIFO). Drained as the watermark passes them: see ``_drain``.
        self.retire_queue: deque[tuple[int, int]] = deque()
        # CACHED blocks retired above the watermark (a launch that may read them has not
        # completed): evictable, but not reusable yet.
        self.cached_busy = 0
        # Set to a list to record every transition performed as (name, params).
        self.trace: list[tuple[str, dict[str, Any]]] | None = None
        # Compiled spec functions for this pool's arrays (see compiled.py); per name:
        # (transition, guard, predict, check, touched, fields written). False: interpret.
        self.compile_spec = True
        # Checked mode: the transition's own block as it was before the transition (frame).
        # (block or None, its fields or None, clock, number of launches in flight).
        self._pre: tuple[Any, ...] | None = None
        self._block_arrays = (self.state, self.ref, self.retire, self.wpend, self.filled,
                              self.gen, self.init, self.hash, self.queue.inq)
        self._fast: dict[str, tuple[Any, ...]] = {}
        self._predicates: dict[tuple[Any, ...], Any] = {}
        # (name, "run_many" | "run_where") -> (transition, the compiled function | None)
        self._batched: dict[tuple[str, str], tuple[Any, Any]] = {}
        self._invs: list[tuple[str, str, Any]] | None = None
        self._clock_invs: list[tuple[str, str, Any]] | None = None
        self._first_failing: Any = None  # the fused local invariants (_bind_invariants)

    # ---- the guard/effect protocol ------------------------------------------------------------
    def _bind(self, name: str, t: Any) -> tuple[Any, ...]:
        """The spec's guard (and effect) of t, compiled for this pool, or interpreters."""
        view, params = self.view, t.params
        guard = predict = check = touched = written = None
        if self.compile_spec:
            ns = self.namespace()
            code = predicate_code(t.guard, params, f"guard {name}")
            if code is not None and predicate_agrees(t.guard, params, code):
                guard = eval(code, ns)
            code = effect_code(t.effect, params, f"effect {name}")
            if code is not None and effect_agrees(t, code):
                exec(code[0], ns)
                written = code[1]
                predict, check, touched = ns["predict"], ns["check"], ns["touched"]
        if guard is None:
            def guard(*args: Any, _g: Any = t.guard) -> Any:
                return _g(CONCRETE, view, **dict(zip(params, args, strict=True)))
        entry = (t, guard, predict, check, touched, written)
        self._fast[name] = entry
        return entry

    def predicate(self, fn: Any, params: tuple[str, ...]) -> Any:
        """A spec predicate ``fn(ops, s, *params)`` as a function of ``params`` over this
        pool: compiled like the guards (and checked against the interpreted one on the probe
        states), else interpreted. Cached per function: a replaced one is compiled anew."""
        key = (fn, params)
        f = self._predicates.get(key)
        if f is None:
            code = (predicate_code(fn, params, getattr(fn, "__name__", "predicate"))
                    if self.compile_spec else None)
            if code is not None and predicate_agrees(fn, params, code):
                f = eval(code, self.namespace())
            else:
                def f(*args: Any, _fn: Any = fn, _view: Any = self.view) -> Any:
                    return _fn(CONCRETE, _view, *args)
            self._predicates[key] = f
        return f

    def predicate_many(self, fn: Any, params: tuple[str, ...]) -> Any:
        """``predicate`` over many parameter tuples at once: ``f(items) -> int``, the index of
        the first tuple on which it is false, or -1. One compiled loop of the spec's predicate
        (checked against the interpreted one on the probe states, alone and in one call),
        else a loop over ``predicate``. Cached per function, as ``predicate``."""
        key = ("many", fn, params)
        f = self._predicates.get(key)
        if f is None:
            code = (predicate_many_code(fn, params, getattr(fn, "__name__", "predicate"))
                    if self.compile_spec else None)
            if code is not None and predicate_many_agrees(fn, params, code):
                ns = self.namespace()
                exec(code, ns)
                f = ns["many"]
            else:
                single = self.predicate(fn, params)

                def f(items: Any, _single: Any = single) -> int:
                    for i, args in enumerate(items):
                        if not _single(*args):
                            return i
                    return -1
            self._predicates[key] = f
        return f

    # Transitions a step, an admission or a free performs once per block: their spec effects
    # store into the pool's lists, hash map and holder sets only, so a batch runs as one
    # compiled loop of the spec's guard and effect. What the pool keeps beyond the spec (the
    # eviction queue's links, the retire queue, the busy count, recycling) follows, as the
    # methods do it: ``_after_allocate``, ``_after_release``, ``_after_evict``, ``_after_share``.
    BATCHED = ("allocate", "publish", "begin_write", "end_write", "release", "recycle",
               "commit", "evict", "share")

    def run_many(self, name: str, items: Sequence[tuple[Any, ...]]) -> None:
        """Transition ``name`` (one of ``BATCHED``) on each parameter tuple of ``items``, in
        order: what calling the single transition on each would do, with the same guards,
        effects and errors (an element whose guard fails raises its typed error; the elements
        before it stay applied, as with single calls). The guard and effect run as one loop
        compiled from the spec (``compiled.batch_code``, checked against the interpreted spec
        on the probe states first): the effect that runs is the spec's, so checked mode has no
        effect to compare and re-evaluates the local invariants on the touched blocks, in
        their compiled form. What ``allocate``, ``release``, ``evict``, ``share`` and
        ``recycle`` keep beyond the spec follows (``_after_allocate``, ``_after_release``,
        ``_after_evict``, ``_after_share``; a recycled block goes to the queue's head); after
        ``end_write``, ``release`` and ``evict`` each block is recycled if it can be, as the
        single transitions do (as one batch: ``_recycle_ready``). A spec entry that does not
        compile runs as the single transitions."""
        if name not in self.BATCHED:
            raise InvalidArgument(f"run_many runs {self.BATCHED}, not {name!r}")
        run = self._batch(name)
        if run is None:
            single = getattr(self, name)
            for args in items:
                single(*args)
            return
        self._run_batch(name, run, items)

    def _batch(self, name: str) -> Any:
        """The compiled batch of spec transition ``name`` (``compiled.batch_code``, used only
        if ``batch_agrees`` with the interpreted spec), or None: run the single transitions.
        Compiled anew when the spec entry is replaced."""
        return self._compiled_batch(name, "run_many")

    def _compiled_batch(self, name: str, fn: str) -> Any:
        """Spec transition ``name``'s compiled ``run_many`` or ``run_where``
        (``compiled.batch_code``), each used only if it ``batch_agrees`` with the interpreted
        spec (checked on its first use), or None. Compiled anew when the spec entry is
        replaced."""
        t = self.spec[name]
        entry = self._batched.get((name, fn))
        if entry is None or entry[0] is not t:
            code = batch_code(t, name) if self.compile_spec else None
            run = None
            if code is not None and batch_agrees(t, code, fn):
                ns = self.namespace()
                exec(code, ns)
                run = ns[fn]
            entry = self._batched[name, fn] = (t, run)
        return entry[1]

    def _run_batch(self, name: str, run: Any, items: Sequence[tuple[Any, ...]],
                   unlinked: Any = None) -> None:
        """``run_many``'s compiled path. ``unlinked(done)``: for ``allocate``, unlinks the
        blocks allocated from the eviction queue (default: ``_after_allocate``)."""
        stamp = self.clock[ISSUED]
        retired_before = [self.retire[args[0]] for args in items] if name == "release" else ()
        if name == "share":
            state = self.state
            revived = [args[0] for args in items if state[args[0]] == CACHED]
        failed = run(items)
        done = items if failed < 0 else items[:failed]
        if name == "release":
            self._after_release(done, retired_before, stamp)
        elif name == "share":
            self._after_share(done, revived)
        elif name == "allocate":
            (unlinked or self._after_allocate)(done)
        elif name == "evict":
            self._after_evict(done)
        elif name == "recycle":
            self.queue.push_head_many([args[0] for args in done])
        if self.checked:
            self._check_invariants(name, {args[0] for args in done})
        trace, recycles = self.trace, name in ("end_write", "release", "evict")
        if trace is None and recycles:
            # A recycle commutes with the other blocks' transitions of the batch, and each
            # block reaches the queue's head in the same order as by single transitions.
            self._recycle_ready(done)
        elif trace is not None:
            # Recorded as the single transitions record them: each one, then its block's
            # recycle.
            params = self.spec[name].params
            for args in done:
                trace.append((name, dict(zip(params, args, strict=True))))
                if recycles:
                    self._recycle_if_safe(args[0])
        if failed >= 0:
            self._enter(name, *items[failed])  # raises the guard's typed error, in words
            raise AssertionError(f"{name}{items[failed]}: the compiled guard refused "
                                 "what the spec's allows")  # pragma: no cover

    def _recycle_ready(self, done: Sequence[tuple[Any, ...]]) -> None:
        """Recycle, as one batch of the spec's ``recycle``, each block of ``done`` (in order,
        once) whose recycle guard holds now: what ``_recycle_if_safe`` does per block."""
        state = self.state
        where = self._compiled_batch("recycle", "run_where")
        if where is None or self.trace is not None:  # one recycle at a time, each recorded
            for args in done:
                self._recycle_if_safe(args[0])
            return
        # The compiled loop applies the spec's recycle where its guard holds: a block whose
        # guard fails, or a repeat of one recycled already (FREE now), is skipped.
        recycled = where([(args[0],) for args in done if state[args[0]] == RECLAIMED])
        if recycled:
            blocks = [b for b, in recycled]
            self.queue.push_head_many(blocks)
            if self.checked:
                self._check_invariants("recycle", blocks)

    def _after_allocate(self, done: Sequence[tuple[Any, ...]]) -> None:
        """What ``allocate`` does beyond the spec's effect, for a batch the compiled loop
        allocated (the spec's effect already cleared ``queued``): each block leaves the
        eviction queue's links."""
        unlink = self.queue.unlink
        for args in done:
            unlink(args[0])

    def _after_share(self, done: Sequence[tuple[Any, ...]], revived: Sequence[int]) -> None:
        """What ``share`` does beyond the spec's effect, for a batch the compiled loop ran:
        each block of ``revived`` (CACHED before the batch) that a done element revived
        leaves the eviction queue (``_unqueue_cached``), once."""
        if not revived:
            return
        shared = {args[0] for args in done}
        for b in dict.fromkeys(revived):
            if b in shared:
                self._unqueue_cached(b)

    def _after_evict(self, done: Sequence[tuple[Any, ...]]) -> None:
        """What ``evict`` does beyond the spec's effect, for a batch the compiled loop evicted:
        each block leaves the eviction queue (``_unqueue_cached``)."""
        for args in done:
            self._unqueue_cached(args[0])

    def _unqueue_cached(self, b: int) -> None:
        """A CACHED block leaves the eviction queue (evicted or revived); a busy one (retired
        above the watermark) stops counting in ``cached_busy``."""
        self.queue.unlink(b)
        if self.retire[b] > self.clock[WATERMARK]:
            self.cached_busy -= 1

    def _after_release(self, done: Sequence[tuple[Any, ...]], retired_before: Sequence[int],
                       stamp: int) -> None:
        """What ``release`` does beyond the spec's effect, for a batch the compiled loop
        released (the spec's effect already set ref, state, retire, queued, ...): a block
        whose last holder let it go is queued for the watermark when a launch that may read
        it is in flight, and a cached one joins the eviction queue's tail."""
        busy = stamp > self.clock[WATERMARK]
        state, ref = self.state, self.ref
        seen: set[int] = set()  # a block released by several holders is let go once
        cached: list[int] = []
        for (b, _r), before in zip(done, retired_before, strict=False):  # done: a prefix
            if ref[b] or b in seen:
                continue
            seen.add(b)
            if busy and before != stamp:
                self.retire_queue.append((stamp, b))
            if state[b] == CACHED:  # flagged queued by the spec's effect: link it
                cached.append(b)
        self.queue.push_tail_many(cached)
        if busy:
            self.cached_busy += len(cached)

    def _entry(self, name: str) -> tuple[Any, ...]:
        entry = self._fast.get(name)
        t = self.spec[name]
        if entry is None or entry[0] is not t:
            entry = self._bind(name, t)
        return entry

    def _enter(self, name: str, *args: Any) -> Any:
        """Evaluate the spec guard (raise if it fails); in checked mode, predict the effect."""
        entry = self._fast.get(name)
        t = self.spec[name]
        if entry is None or entry[0] is not t:
            entry = self._bind(name, t)
        try:
            allowed = entry[1](*args)
        except TypeError:  # an unhashable holder or hash (the guard looks it up)
            raise InvalidArgument(
                f"{name}: holder ids and hashes must be hashable, got "
                f"{', '.join(type(a).__name__ for a in args)}"
            ) from None
        if not allowed:
            params = dict(zip(t.params, args, strict=True))
            raise _GUARD_ERRORS.get(name, GuardViolation)(name, self._describe(t, params))
        if self.trace is not None:
            self.trace.append((name, dict(zip(t.params, args, strict=True))))
        if not self.checked:
            return None
        clock = self.clock
        if "b" in t.params:
            b = args[t.params.index("b")]
            self._pre = (b, tuple(arr[b] for arr in self._block_arrays), clock[0], clock[1],
                         len(self.inflight))
        else:
            self._pre = (None, None, clock[0], clock[1], len(self.inflight))
        if entry[2] is not None:
            return entry[2](*args)
        return t.effect(CONCRETE, self.view, **dict(zip(t.params, args, strict=True)))

    def _verify(self, name: str, predicted: Any, *args: Any) -> None:
        """Checked mode: where touched, the real post-state is the spec's and invariants hold."""
        if predicted is None:
            return
        if isinstance(predicted, PoolState):
            params = dict(zip(self.spec[name].params, args, strict=True))
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
        written = entry[5]
        self._check_frame(name, written)
        self._check_invariants(name, entry[4](predicted))
        if "clock" in written or "inflight" in written:
            self._check_clock_invariants(name, args[0] if self.spec[name].params == ("L",)
                                         else None)

    def _check_frame(self, name: str, written: Iterable[str]) -> None:
        """Fields of the transition's own block, the clock and the launches in flight that the
        spec's effect leaves alone must be unchanged (a stray side effect is a refinement
        failure, not just a wrong value)."""
        if self._pre is None:
            return
        b, before, issued, watermark, inflight = self._pre
        self._pre = None
        if before is not None:
            for field, arr, old in zip(BLOCK_FIELDS, self._block_arrays, before, strict=True):
                if field not in written and arr[b] != old:
                    raise InvariantViolation(
                        f"refines:{name}",
                        f"{field}[{b}] changed from {old!r} to {arr[b]!r}; the spec leaves it",
                    )
        if "clock" not in written and (issued, watermark) != (self.clock[0], self.clock[1]):
            raise InvariantViolation(
                f"refines:{name}",
                f"clock changed from {[issued, watermark]} to {self.clock}; the spec leaves it",
            )
        if "inflight" not in written and inflight != len(self.inflight):
            raise InvariantViolation(
                f"refines:{name}", "the launches in flight changed; the spec leaves them")

    def _check_clock_invariants(self, name: str, L: Any) -> None:
        """The launch-scoped invariants at the transition's launch (or the watermark) and the
        pool-wide ones that sum over nothing, after a transition that moved the clock."""
        invs = self._clock_invs
        if invs is None:
            invs = self._clock_invs = self._bind_clock_invariants()
        at = self.clock[WATERMARK] if L is None else L
        for inv_name, scope, pred in invs:
            if not (pred(at) if scope == "launch" else pred()):
                where = f"launch {at}" if scope == "launch" else "the clock"
                raise InvariantViolation(inv_name, f"{where} after {name}")

    def _bind_clock_invariants(self) -> list[tuple[str, str, Any]]:
        out = []
        for inv in clock_invariants():
            params = ("L",) if inv.scope == "launch" else ()
            code = (predicate_code(inv.pred, params, f"invariant {inv.name}")
                    if self.compile_spec else None)
            if code is not None and predicate_agrees(inv.pred, params, code):
                fn = eval(code, self.namespace())
            else:
                def fn(*x: Any, _p: Any = inv.pred) -> Any:
                    return _p(CONCRETE, self.view, *x)
            out.append((inv.name, inv.scope, fn))
        return out

    def _check_invariants(self, name: str, blocks: Collection[int]) -> None:
        invs = self._invs
        if invs is None:
            invs = self._invs = self._bind_invariants()
        first_failing = self._first_failing
        if first_failing is not None and first_failing(blocks) is None:
            return
        h_of = self.hash
        for b in blocks:
            for inv_name, scope, pred in invs:  # name the one that fails
                if scope == "block":
                    if not pred(b):
                        raise InvariantViolation(inv_name, f"block {b} after {name}")
                elif not pred(h_of[b]):
                    raise InvariantViolation(inv_name, f"hash of block {b} after {name}")

    def _bind_invariants(self) -> list[tuple[str, str, Any]]:
        """The local invariants, compiled one by one, and all of them fused into one loop over
        the touched blocks (``self._first_failing``, ``compiled.fused_check_source``) when every
        one of them compiles and the loop agrees with the interpreted invariants."""
        out, bodies = [], []
        for inv in local_invariants():
            param = "b" if inv.scope == "block" else "h"
            code = (predicate_code(inv.pred, (param,), f"invariant {inv.name}")
                    if self.compile_spec else None)
            if code is not None and predicate_agrees(inv.pred, (param,), code):
                fn = eval(code, self.namespace())
                bodies.append((inv.scope, predicate_source(inv.pred, (param,))))
            else:
                def fn(x: Any, _p: Any = inv.pred) -> Any:
                    return _p(CONCRETE, self.view, x)
                bodies.append(None)
            out.append((inv.name, inv.scope, fn))
        if bodies and None not in bodies:
            src = fused_check_source(bodies)  # type: ignore[arg-type]
            if fused_check_agrees(src, local_invariants()):
                ns = self.namespace()
                exec(compile(src, "<spec local invariants, fused>", "exec"), ns)
                self._first_failing = ns["first_failing"]
        return out

    def _verify_interpreted(self, name: str, predicted: PoolState, **params: Any) -> None:
        touched_blocks: set[Any] = set()
        for field in ("state", "ref", "retire", "wpend", "filled", "gen", "init", "hash",
                      "queued", "count", "clock"):
            value = getattr(predicted, field)
            if isinstance(value, Overlay):
                real = getattr(self.view, field)
                for key, expected in value.changes().items():
                    if real[key] != expected:
                        raise InvariantViolation(
                            f"refines:{name}",
                            f"{field}[{key}] is {real[key]!r}, the spec says {expected!r}",
                        )
                    if field not in ("count", "clock"):
                        touched_blocks.add(key)
        if isinstance(predicted.inflight, Overlay):
            for L, expected in predicted.inflight.changes().items():
                if (L in self.inflight) != bool(expected):
                    raise InvariantViolation(
                        f"refines:{name}",
                        f"inflight[{L}] is {L in self.inflight}, the spec says {expected!r}",
                    )
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
        b = params.get("b")
        written = [f for f in BLOCK_FIELDS
                   if isinstance(getattr(predicted, f), Overlay)
                   and b in getattr(predicted, f).changes()]
        written += [f for f in ("clock", "inflight")
                    if isinstance(getattr(predicted, f), Overlay)]
        self._check_frame(name, written)
        self._check_invariants(name, touched_blocks)
        if "clock" in written or "inflight" in written:
            self._check_clock_invariants(name, params.get("L"))

    def _describe(self, t: Any, params: dict[str, Any]) -> str:
        """The guard's failed conditions in words, then the call's arguments."""
        return refusal_detail(t.guard, self.view, t.name, params)

    def check_block_id(self, b: object) -> int:
        """A block id of this pool (a Python or NumPy integer, not a bool) as a Python int."""
        if isinstance(b, bool | np.bool_) or not isinstance(b, int | np.integer):
            raise InvalidArgument(f"block id {b!r} is not an integer")
        if not 0 <= b < self.num_blocks:
            raise InvalidArgument(f"block id {b!r} out of range [0, {self.num_blocks})")
        return int(b)

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
            b = self.check_block_id(b)
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
            b = self.check_block_id(b)
        predicted = self._enter("publish", b, r)
        self._move(b, PUBLISHED)
        self._verify("publish", predicted, b, r)

    def begin_write(self, b: int, r: Hashable, w: int) -> None:
        """spec: begin_write — a launch through r's table writes w > 0 slots of its exclusive
        PUBLISHED block b (reads are not tracked per block: see ``launch``)."""
        if type(b) is not int or not 0 <= b < self.num_blocks:
            b = self.check_block_id(b)
        if type(w) is not int or not 0 <= w <= self.block_size:
            w = check_count(w, "w (slots written)", self.block_size)
        predicted = self._enter("begin_write", b, r, w)
        self.wpend[b] += 1
        self.filled[b] += w
        self._verify("begin_write", predicted, b, r, w)

    def end_write(self, b: int) -> None:
        """spec: end_write — a launch that wrote b completed its write; then recycles b if it
        was reclaimed and the watermark passed its retire clock."""
        if type(b) is not int or not 0 <= b < self.num_blocks:
            b = self.check_block_id(b)
        predicted = self._enter("end_write", b)
        self.wpend[b] -= 1
        self._verify("end_write", predicted, b)
        self._recycle_if_safe(b)

    def launch(self, L: int) -> None:
        """spec: launch — launch number L (``clock[ISSUED]``, the next one) is published; it
        may read every block any holder holds now."""
        if type(L) is not int or L < 0:
            L = check_count(L, "launch number")
        predicted = self._enter("launch", L)
        self.inflight.add(L)
        self.clock[ISSUED] += 1
        self._verify("launch", predicted, L)

    def complete(self, L: int) -> None:
        """spec: complete — launch L's kernels are done (launches complete in any order)."""
        if type(L) is not int or L < 0:
            L = check_count(L, "launch number")
        predicted = self._enter("complete", L)
        self.inflight.discard(L)
        self._verify("complete", predicted, L)

    def advance(self) -> None:
        """spec: advance — the watermark passes the oldest launch, which completed; then the
        blocks retired at the new watermark stop waiting (reclaimed ones are recycled)."""
        predicted = self._enter("advance")
        self.clock[WATERMARK] += 1
        self._verify("advance", predicted)
        self._drain()

    def advance_watermark(self) -> int:
        """``advance`` as far as its guard allows (up to the oldest launch in flight, or the
        clock); returns how many times it advanced."""
        guard = self._entry("advance")[1]
        n = 0
        while guard():
            self.advance()
            n += 1
        return n

    def rewind(self, b: int, r: Hashable, k: int) -> None:
        """spec: rewind — r keeps only the first k written slots of its PUBLISHED block b."""
        if type(b) is not int or not 0 <= b < self.num_blocks:
            b = self.check_block_id(b)
        if type(k) is not int or not 0 <= k <= self.block_size:
            k = check_count(k, "k (slots kept)", self.block_size)
        predicted = self._enter("rewind", b, r, k)
        self.filled[b] = k
        self._verify("rewind", predicted, b, r, k)

    def commit(self, b: int, r: Hashable, h: int) -> None:
        """spec: commit — PUBLISHED -> REFERENCED under prefix hash h."""
        if type(b) is not int or not 0 <= b < self.num_blocks:
            b = self.check_block_id(b)
        if type(h) is not int or not 0 <= h <= MAX_HASH:
            h = check_count(h, "hash", MAX_HASH)  # the guard refuses NO_HASH itself
        predicted = self._enter("commit", b, r, h)
        self._move(b, REFERENCED)
        self.hash[b] = h
        self.hmap[h] = b
        self._verify("commit", predicted, b, r, h)

    def cache_many(self, r: Hashable, blocks: Sequence[int], hashes: Sequence[int]) -> None:
        """Commit each block under its hash, for holder r, where the spec's ``cache_due``
        holds (the block is PUBLISHED and no block is registered under the hash yet), in
        order: a request's full blocks once the launch that wrote them completed, whether or
        not an earlier request cached the same content (vLLM's ``cache_full_blocks``). The
        hashes are checked first; a bad block id, or a due block whose ``commit`` is refused,
        raises, the commits before it staying."""
        try:
            blocks, hashes = list(blocks), list(hashes)
        except TypeError:
            raise InvalidArgument("cache_many takes a sequence of block ids and one of "
                                  "hashes") from None
        if len(blocks) != len(hashes):
            raise InvalidArgument(f"cache_many needs one hash per block: {len(hashes)} "
                                  f"hashes for {len(blocks)} blocks")
        hashes = [h if type(h) is int and 0 <= h <= MAX_HASH else check_count(h, "hash", MAX_HASH)
                  for h in hashes]
        due = self.predicate(cache_due, ("b", "h"))
        for b, h in zip(blocks, hashes, strict=True):
            if type(b) is not int or not 0 <= b < self.num_blocks:
                b = self.check_block_id(b)
            if due(b, h):
                self.commit(b, r, h)

    def share(self, b: int, r: Hashable) -> None:
        """spec: share — a prefix hit or fork takes a reference (revives a CACHED block)."""
        if type(b) is not int or not 0 <= b < self.num_blocks:
            b = self.check_block_id(b)
        predicted = self._enter("share", b, r)
        if self.state[b] == CACHED:
            self._unqueue_cached(b)
            self._move(b, REFERENCED)
        self.ref[b] += 1
        self.held[r].add(b)
        self._verify("share", predicted, b, r)

    def release(self, b: int, r: Hashable) -> None:
        """spec: release — ref - 1; at 0 a REFERENCED block is cached, others reclaimed."""
        if type(b) is not int or not 0 <= b < self.num_blocks:
            b = self.check_block_id(b)
        predicted = self._enter("release", b, r)
        self.ref[b] -= 1
        self.held[r].discard(b)
        if self.ref[b] == 0:
            stamp = self.clock[ISSUED]
            busy = stamp > self.clock[WATERMARK]  # a launch that may read b is in flight
            if busy and self.retire[b] != stamp:
                # (an entry (stamp, b) is queued already when b was retired at this stamp)
                self.retire_queue.append((stamp, b))
            self.retire[b] = stamp
            if self.state[b] == REFERENCED:
                self._move(b, CACHED)
                self.queue.push_tail(b)
                if busy:
                    self.cached_busy += 1
            else:
                self._invalidate(b)
        self._verify("release", predicted, b, r)
        self._recycle_if_safe(b)

    def evict(self, b: int) -> None:
        """spec: evict — CACHED -> RECLAIMED; the hash is dropped."""
        if type(b) is not int or not 0 <= b < self.num_blocks:
            b = self.check_block_id(b)
        predicted = self._enter("evict", b)
        self._unqueue_cached(b)  # a busy one stays in the retire queue: recycled at its drain
        del self.hmap[self.hash[b]]
        self.hash[b] = NO_HASH
        self._invalidate(b)
        self._verify("evict", predicted, b)
        self._recycle_if_safe(b)

    def recycle(self, b: int) -> None:
        """spec: recycle — RECLAIMED -> FREE, to the head of the queue (reused first)."""
        if type(b) is not int or not 0 <= b < self.num_blocks:
            b = self.check_block_id(b)
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

    def _drain(self) -> None:
        """The retire-queue entries the watermark has passed: a block still RECLAIMED at that
        stamp is recycled (once its writes ended: else ``end_write`` recycles it), a block
        still CACHED at that stamp stops counting as busy. An entry whose block was retired
        again later (another stamp) or revived is stale and dropped."""
        q, retire, state = self.retire_queue, self.retire, self.state
        watermark = self.clock[WATERMARK]
        reclaimed: list[tuple[int]] = []
        while q and q[0][0] <= watermark:
            stamp, b = q.popleft()
            if retire[b] != stamp:
                continue
            st = state[b]
            if st == CACHED:
                self.cached_busy -= 1
            elif st == RECLAIMED:
                reclaimed.append((b,))
        if reclaimed:
            self._recycle_ready(reclaimed)

    # ---- composite helpers -------------------------------------------------------------------
    def busy(self, b: int) -> bool:
        """Whether b was retired at a clock the watermark has not reached: a launch that may
        still read it is in flight, so it is not reusable yet (a CACHED one may be revived)."""
        return self.retire[b] > self.clock[WATERMARK]

    def usable(self) -> int:
        """Blocks an allocation can take now: FREE ones and CACHED ones that are not busy
        (the spec's ``takeable``; ``structure_errors`` checks the count against it)."""
        return self.count[FREE] + self.count[CACHED] - self.cached_busy

    def waiting(self) -> int:
        """Blocks that become usable only when in-flight launches complete: RECLAIMED ones and
        busy CACHED ones (retired while a launch that may read them was in flight)."""
        return self.count[RECLAIMED] + self.cached_busy

    def take(self, r: Hashable) -> int:
        """Allocate the queue's head for r, evicting cached blocks on the way (LRU order).

        The caller has checked ``usable()``; a busy CACHED head is evicted (it becomes FREE
        when the watermark passes its retire clock) and the walk goes on; an idle one is
        evicted, recycled to the head and taken.
        """
        while True:
            b = self.queue.head()
            if b is None:  # pragma: no cover - callers check usable() first
                raise AssertionError("take() on an exhausted pool")
            if self.state[b] == CACHED:
                self.evict(b)
                continue
            self.allocate(b, r)
            return b

    # Unchecked, a single allocate costs about what a compiled batch of two does (the batch's
    # setup), less than a batch of one; checked, the batch is cheaper from one block on.
    UNCHECKED_BATCH_MIN = 3

    def take_many(self, r: Hashable, n: int) -> list[int]:
        """``take(r)`` n times: the same blocks in the same order, the same evictions of
        CACHED heads (LRU order), the same transitions recorded, the same errors (the blocks
        taken before a refused one stay taken, as with single calls). The run of FREE blocks
        at the queue's head is allocated as one compiled batch of the spec's ``allocate``
        (``run_many``'s path: guard and effect the spec's, checked mode re-checks the touched
        blocks' local invariants), then cut from the queue's links at once; a run of CACHED
        blocks at the head is evicted (``_evict_head``). Unchecked, fewer than
        ``UNCHECKED_BATCH_MIN`` blocks (in all, or in a FREE run at the head, such as the
        block an eviction recycles there) are taken by single transitions, which cost less
        there than a batch that short. The caller has checked ``usable()``, as for
        ``take``."""
        if type(n) is not int or n < 0:
            n = check_count(n, "n (blocks taken)")
        queue, state, checked = self.queue, self.state, self.checked
        if n < self.UNCHECKED_BATCH_MIN and not checked:
            return [self.take(r) for _ in range(n)]
        out: list[int] = []
        run = None
        while True:
            left = n - len(out)
            if left <= 0:
                return out
            b = queue.head()
            if b is None:  # callers check usable() first; take fails here too
                raise AssertionError("take_many() on an exhausted pool")
            if state[b] == CACHED:
                self._evict_head(left)
                continue
            batch = checked or left >= self.UNCHECKED_BATCH_MIN
            if batch and run is None:
                run = self._batch("allocate")
            blocks = queue.head_run(state, FREE, left) if batch and run is not None else ()
            if not blocks or (len(blocks) < self.UNCHECKED_BATCH_MIN and not checked):
                # a short run unchecked (such as the one block an eviction just recycled to
                # the head), interpreted, or a head neither FREE nor CACHED (refused there,
                # as take refuses it)
                self.allocate(b, r)
                out.append(b)
                continue
            self._run_batch("allocate", run, [(b, r) for b in blocks], queue.cut_head)
            out += blocks

    def _evict_head(self, most: int) -> None:
        """Evict the CACHED blocks at the queue's head, at most ``most`` of them (``take_many``
        needs ``most`` more blocks): as one compiled batch of the spec's ``evict`` when the run
        is long enough (see ``UNCHECKED_BATCH_MIN``) and no trace is kept, else the head alone
        by the single transition. The batch evicts them last first, so that the idle ones,
        each recycled to the head in turn, stand there in queue order: single takes would
        evict the same blocks (each of them, to find that many idle ones) and take the idle
        ones in that order."""
        run = None
        if self.trace is None:
            cached = self.queue.head_run(self.state, CACHED, most)
            if len(cached) >= (1 if self.checked else self.UNCHECKED_BATCH_MIN):
                run = self._batch("evict")
        if run is None:
            self.evict(self.queue.head())
            return
        self._run_batch("evict", run, [(b,) for b in reversed(cached)])

    def lookup(self, h: int) -> int | None:
        b = self.hmap.get(h)
        return b

    def prefix_hits(self, hashes: Sequence[int]) -> list[int]:
        """The blocks registered under the leading hashes, up to the first that is not (what
        an admission shares: a prefix hit stops at the first miss)."""
        found: list[int] = []
        try:
            for h in hashes:
                b = self.hmap.get(h)
                if b is None:
                    break
                found.append(b)
        except TypeError:
            raise InvalidArgument("hashes must be a sequence of hashable digests") from None
        return found

    # ---- an admission and a request's end, each as one call ----------------------------------
    def admit(self, r: Hashable, hashes: Sequence[int], n: int) -> tuple[list[int], int]:
        """An admission's pool calls as one: holder r opened (``open_holder``), the blocks
        registered under the leading ``hashes`` shared for it (``prefix_hits``, each
        ``share``), then blocks taken to make ``n`` in all (``take_many``). Returns the n
        blocks, the hits first, and how many are hits. Refused with nothing changed: ``n``
        not a count, or fewer than the hashes (``InvalidArgument``: a request's hits are
        among its blocks); too few blocks usable for the n - hits to take once the hits an
        allocation could take are revived (``OutOfBlocks``); r open already (the guard's
        error). A refused share raises, the shares before it staying, r open."""
        n = check_count(n, "n (blocks)")
        check_admission(hashes, n)
        hits = self.prefix_hits(hashes)
        can_take = self.predicate(takeable, ("b",))
        need = n - len(hits)
        available = self.usable() - sum(1 for b in hits if can_take(b))
        if need > available:
            raise OutOfBlocks(need, available, self.waiting())
        self.open_holder(r)
        self.run_many("share", [(b, r) for b in hits])
        return hits + self.take_many(r, need), len(hits)

    def finish(self, r: Hashable, blocks: Sequence[int]) -> None:
        """A request's end as one call: each block released for holder r, in order
        (``release``), then r closed (``close_holder``). A refused release raises, the
        releases before it staying and r open; so does a refused close (r holds blocks
        still)."""
        try:
            items = [(b, r) for b in blocks]
        except TypeError:
            raise InvalidArgument("finish takes a sequence of block ids") from None
        self.run_many("release", items)
        self.close_holder(r)

    # ---- abstraction and scans ---------------------------------------------------------------
    def structure_errors(self) -> list[tuple[str, str]]:
        """Implementation facts the spec abstracts away (queue links, the busy counter, the
        retire queue)."""
        errors = [("queue_is_free_and_cached", e) for e in self.queue.structure_errors()]
        watermark = self.clock[WATERMARK]
        busy = sum(1 for b in range(self.num_blocks)
                   if self.state[b] == CACHED and self.retire[b] > watermark)
        if busy != self.cached_busy:
            errors.append(("conservation", f"cached_busy {self.cached_busy} != {busy}"))
        is_takeable = self.predicate(takeable, ("b",))
        takeable_now = sum(1 for b in range(self.num_blocks) if is_takeable(b))
        if takeable_now != self.usable():  # what allocations plan with: the spec's rule
            errors.append(("conservation", f"usable() {self.usable()} != {takeable_now}, the "
                                           "blocks the spec's takeable holds for"))
        stamps = [stamp for stamp, _ in self.retire_queue]
        if stamps != sorted(stamps) or (stamps and stamps[0] <= watermark):
            errors.append(("reused_after_its_readers",
                           f"retire queue stamps {stamps[:8]} not increasing above the "
                           f"watermark {watermark}"))
        entries = set(self.retire_queue)
        for b in range(self.num_blocks):
            st, stamp = self.state[b], self.retire[b]
            if st not in (CACHED, RECLAIMED):
                continue
            if stamp > watermark:
                if (stamp, b) not in entries:
                    errors.append(("reused_after_its_readers",
                                   f"block {b} retired at {stamp} has no retire-queue entry"))
            elif st == RECLAIMED and self.wpend[b] == 0:
                errors.append(("reused_after_its_readers",
                               f"block {b} is RECLAIMED but recyclable (retired at {stamp}, "
                               f"watermark {watermark})"))
        return errors
