"""Engine calls as programs of request transitions: what each allocator call means.

Each call of the engine-facing allocator (``add_request``, ``append_tokens``, ``allocate``,
``commit``, ``truncate``, ``fork``, ``free``, ``publish``, ``complete``, and the step-level
``append_tokens_many``, ``allocate_many``, ``commit_many``, ``free_many``, each written as the
repetition of its single call) is a sequence of the
request layer's transitions (``spec.requests``), chosen from the spec state and the call's
arguments alone: which prefix hits an admission takes, when a block is copied before a write,
which full blocks enter the cache, what a completion recycles. ``run_call`` runs it on a
concrete ``RequestState``: the post-state and the steps taken, or ``CallRefused`` naming the
first step whose guard fails and which of its conditions, in words. A call is allowed exactly
when its program runs; an implementation refines the spec at call level when it succeeds
exactly when the program runs and ends in the program's state (``proofs.refinement``).

Block choices are the runtime's (which FREE block an allocation takes, which cached blocks it
evicts on the way): a ``Chooser`` supplies them. ``first_fit`` is the spec's own, and complete:
it finds a block whenever some choice would, so a program it cannot run cannot run at all.

Concrete only (this is the meaning of calls, not a transition): not evaluated on z3 terms.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from .explain import failed_conditions, failed_table_conditions
from .ops import CONCRETE
from .request_spec import REQUEST_SPEC, RequestSpec
from .requests import RequestState, count, table_of
from .states import (
    ALLOCATED,
    FREE,
    ISSUED,
    NO_BLOCK,
    NO_HASH,
    PUBLISHED,
    RECLAIMED,
)
from .transitions import takeable


class CallRefused(Exception):
    """The call's program cannot run: ``reason`` in words; ``room`` when no block could be
    taken; ``step`` the request transition (name, params) whose guard failed, if one did."""

    def __init__(self, reason: str, *, room: bool = False,
                 step: tuple[str, dict[str, Any]] | None = None) -> None:
        super().__init__(reason)
        self.reason, self.room, self.step = reason, room, step


class Chooser(Protocol):
    def take(self, s: RequestState) -> tuple[list[int], int] | None:
        """(cached blocks to evict first, the block to allocate), or None if there is none."""


class FirstFit:
    """The spec's own choice among the ``takeable`` blocks: the lowest FREE one, else the
    lowest (idle) CACHED one, evicted and recycled first."""

    def take(self, s: RequestState) -> tuple[list[int], int] | None:
        P = s.pool
        ok = [b for b in P.block_ids if takeable(CONCRETE, P, b)]
        free = [b for b in ok if P.state[b] == FREE]
        if free:
            return [], free[0]
        return ([ok[0]], ok[0]) if ok else None


first_fit = FirstFit()


# --- saying why a step is refused ----------------------------------------------------------------
def why_refused(s: RequestState, name: str, spec: RequestSpec = REQUEST_SPEC,
                **params: Any) -> str:
    """Which of a request transition's conditions fail on s, in words: the table's own, or
    those of the first pool step whose guard fails (``spec.explain``)."""
    t = spec.transitions[name]
    failed = failed_table_conditions(t.plan, s, **params)
    if failed:
        return f"{name}: " + "; ".join(failed)
    _, steps, _ = t.plan(CONCRETE, s, **params)
    pool = s.pool
    for step_name, step_params, when in steps:
        pt = spec.pool[step_name]
        if when is True or when:
            if not pt.guard(CONCRETE, pool, **step_params):
                words = failed_conditions(pt.guard, pool, **step_params)
                return f"{name}: its {step_name} step is refused: " + (
                    "; ".join(words) or "its guard does not hold")
            pool = pt.effect(CONCRETE, pool, **step_params)
    return f"{name}: refused"  # pragma: no cover - run_steps and this walk agree


# --- running a program ---------------------------------------------------------------------------
@dataclass
class CallRun:
    """A program being run: the state so far, the steps taken, and what the call returns."""

    state: RequestState
    chooser: Chooser = first_fit
    prefix_caching: bool = True
    flatten: bool = True  # False: keep post-states as overlays (on a view of a runtime)
    spec: RequestSpec = REQUEST_SPEC
    steps: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    result: Any = None

    @property
    def B(self) -> int:
        return int(self.state.pool.block_size)

    def step(self, name: str, **params: Any) -> None:
        s = self.state
        t = self.spec.transitions[name]
        if name in ("admit", "fork_open") and params["r"] not in s.pool.holder_ids:
            s = s.replace(pool=s.pool.replace(holder_ids=(*s.pool.holder_ids, params["r"])))
        post = t.fire(s, **params)
        if post is None:
            raise CallRefused(why_refused(s, name, self.spec, **params), step=(name, params))
        s = post
        if self.flatten:
            s = s.flattened()
        if name == "close":
            s = s.replace(pool=s.pool.replace(
                holder_ids=tuple(r for r in s.pool.holder_ids if r != params["r"])))
        self.state = s
        self.steps.append((name, params))

    def enabled(self, name: str, **params: Any) -> bool:
        return self.spec.transitions[name].fire(self.state, **params) is not None

    def take(self, why: str) -> int:
        """A block for an allocation: the chooser's, after the evictions it asks for."""
        choice = self.chooser.take(self.state)
        if choice is None:
            raise CallRefused(f"{why}: no FREE block and no idle cached block to take",
                              room=True)
        evicted, b = choice
        for e in evicted:
            self.step("evict", b=e)
            if self.enabled("recycle", b=e):
                self.step("recycle", b=e)
        return b

    def pos(self, name: str, r: Hashable) -> int:
        return count(self.state, name, r)

    def require(self, ok: bool, reason: str) -> None:
        if not ok:
            raise CallRefused(reason)

    def alive(self, r: Hashable) -> None:
        self.require(bool(self.state.pool.alive[r]), f"request {r!r} is not open")


def run_call(s: RequestState, call: str, *args: Any, chooser: Chooser = first_fit,
             prefix_caching: bool = True, spec: RequestSpec = REQUEST_SPEC) -> CallRun:
    """Run call ``call`` (a name of ``CALLS``) on s: the finished run, or CallRefused.
    ``spec``: the request layer to run it in (a changed one is passed here, not patched)."""
    run = CallRun(s, chooser, prefix_caching, spec=spec)
    CALLS[call](run, *args)
    return run


def call_allowed(s: RequestState, call: str, *args: Any, prefix_caching: bool = True,
                 spec: RequestSpec = REQUEST_SPEC) -> CallRun | CallRefused:
    """The run with the spec's own block choices, or why the call cannot run at all."""
    try:
        return run_call(s, call, *args, prefix_caching=prefix_caching, spec=spec)
    except CallRefused as exc:
        return exc


# --- shared pieces -------------------------------------------------------------------------------
def _learn(run: CallRun, r: Hashable, known: int, chain: Sequence[int]) -> None:
    """Token ids up to ``known`` become known; ``chain[i]``: full block i's chain value."""
    B = run.B
    for p in range(run.pos("known", r), known):
        if (p + 1) % B:
            run.step("learn", r=r)
        else:
            run.step("learn_block", r=r, h=chain[p // B])


def _seal_touched(run: CallRun, rids: Sequence[Hashable]) -> None:
    """Seal every block of these tables that can be sealed (full, known, held once)."""
    s = run.state
    for r in rids:
        if not s.pool.alive[r]:
            continue
        for i in range(min(s.tlen[r], s.known_q[r])):
            b = run.state.tab[r][i]
            if run.state.content[b] == NO_HASH and run.enabled("seal", r=r, b=b):
                run.step("seal", r=r, b=b)


def _settle(run: CallRun) -> None:
    """The watermark goes as far as it can, and every block it passed is recycled."""
    while run.enabled("advance"):
        run.step("advance")
    P = run.state.pool
    for b in [b for b in P.block_ids if P.state[b] == RECLAIMED]:
        if run.enabled("recycle", b=b):
            run.step("recycle", b=b)


def take_hits(run: CallRun, r: Hashable) -> int:
    """Admission: while the cache holds the block under r's next chain value, share it (a
    runtime finds these blocks with ``spec.requests.leading_hits``)."""
    n = 0
    while run.prefix_caching:
        s = run.state
        h = s.chain[r][s.tlen[r]]
        b = s.pool.hmap[h] if h != NO_HASH else NO_BLOCK
        if b == NO_BLOCK or not run.enabled("hit", r=r, b=b):
            return n
        run.step("hit", r=r, b=b)
        n += 1
    return n


def cached_prefix(s: RequestState, r: Hashable, prefix_caching: bool = True,
                  spec: RequestSpec = REQUEST_SPEC) -> int:
    """Positions an admission of the open, empty request r would take from the cache now."""
    run = CallRun(s, first_fit, prefix_caching, spec=spec)
    return take_hits(run, r) * run.B


# --- the calls -----------------------------------------------------------------------------------
def add_request(run: CallRun, r: Hashable, known: int, chain: Sequence[int]) -> None:
    """Open r's empty table with ``known`` token ids; returns the cached prefix's positions."""
    run.require(not run.state.pool.alive[r], f"request {r!r} is already open")
    run.step("admit", r=r)
    _learn(run, r, known, chain)
    run.result = cached_prefix(run.state, r, run.prefix_caching)


def append_tokens(run: CallRun, r: Hashable, known: int, chain: Sequence[int]) -> None:
    run.alive(r)
    _learn(run, r, known, chain)
    _seal_touched(run, [r])


def allocate(run: CallRun, r: Hashable, n: int) -> None:
    """Cover n positions: an empty table first takes every prefix hit (whatever n), then the
    last partial block is extended and new blocks appended."""
    run.alive(r)
    run.require(n >= run.pos("reserved", r),
                f"{r!r} covers {run.pos('reserved', r)} positions; tables only grow")
    B = run.B
    if run.state.tlen[r] == 0:
        take_hits(run, r)
    target = max(n, run.pos("reserved", r))
    reserved = run.pos("reserved", r)
    if reserved % B and target > reserved:
        run.step("reserve", r=r, k=min(B, reserved % B + target - reserved))
    while run.pos("reserved", r) < target:
        b = run.take(f"allocate({r!r}, {n})")
        run.step("grow", r=r, b=b, k=min(B, target - run.pos("reserved", r)))
    run.result = table_of(run.state, r)


def commit(run: CallRun, r: Hashable, n: int) -> None:
    """Positions below n are written: committed block by block; the full blocks this commit
    completes enter the prefix cache when no block is cached under their content yet."""
    run.alive(r)
    before = run.pos("computed", r)
    run.require(n >= before, f"{r!r} already committed {before} positions")
    B = run.B
    while run.pos("computed", r) < n:
        cq = run.pos("computed", r) // B
        run.step("commit_pos", r=r, k=min(B, n - cq * B))
    if not run.prefix_caching:
        return
    for i in range(before // B, n // B):
        s = run.state
        b = s.tab[r][i]
        if s.pool.state[b] == PUBLISHED and s.pool.hmap[s.content[b]] == NO_BLOCK:
            run.step("cache", r=r, b=b)


def truncate(run: CallRun, r: Hashable, n: int) -> None:
    """Keep r's first n >= 1 positions: entries past them are let go, tail first, and the
    last kept one keeps its first k positions (rewound if it holds dropped slots)."""
    run.alive(r)
    run.require(n >= 1, "truncate keeps at least one position (free drops a request)")
    run.require(n <= run.pos("reserved", r),
                f"{r!r} covers {run.pos('reserved', r)} positions; cannot truncate to {n}")
    run.require(n >= run.pos("computed", r),
                f"{r!r} committed {run.pos('computed', r)} positions; cannot truncate to {n}")
    B = run.B
    keep = -(-n // B)
    while run.state.tlen[r] > keep:
        s = run.state
        run.step("release_tail", r=r, b=s.tab[r][s.tlen[r] - 1])
    run.step("truncate_tail", r=r, k=n - (keep - 1) * B)
    _settle(run)
    run.result = table_of(run.state, r)


def fork(run: CallRun, parent: Hashable, child: Hashable) -> None:
    """The child opens with the parent's tokens and shares each of its entries, except those
    never handed to a kernel, for which it takes new blocks. KV whose token ids nobody knows
    is never shared."""
    run.alive(parent)
    run.require(not run.state.pool.alive[child], f"request {child!r} is already open")
    run.require(run.pos("issued", parent) <= run.pos("known", parent),
                f"fork of {parent!r}: its KV covers {run.pos('issued', parent)} positions but "
                f"only {run.pos('known', parent)} token ids are known")
    run.step("fork_open", r=child, p=parent)
    for b in table_of(run.state, parent):
        if run.state.pool.state[b] == ALLOCATED:
            run.step("fork_fresh", r=child, p=parent, b=run.take(f"fork({parent!r})"))
        else:
            run.step("fork_share", r=child, p=parent, b=b)
    run.result = table_of(run.state, child)


def free(run: CallRun, r: Hashable) -> None:
    """Let go of r's entries, tail first, and close its table."""
    run.alive(r)
    while run.state.tlen[r]:
        s = run.state
        run.step("release_tail", r=r, b=s.tab[r][s.tlen[r] - 1])
    run.step("close", r=r)
    _settle(run)


def publish(run: CallRun, rids: Sequence[Hashable]) -> None:
    """One launch for these requests: their unpublished entries are handed to kernels, the
    launch is numbered, and each request's issued-to-reserved positions are written, block by
    block; a block still shared is copied first (copy-on-write). Returns (seq_lens,
    query_lens)."""
    run.require(len(rids) > 0, "a launch needs at least one request")
    run.require(len(set(rids)) == len(rids), "a request appears twice in one launch")
    for r in rids:
        run.alive(r)
        run.require(run.pos("reserved", r) > 0, f"request {r!r} has no allocated positions")
    for r in rids:
        for b in table_of(run.state, r):
            if run.state.pool.state[b] == ALLOCATED:
                run.step("publish_entry", r=r, b=b)
    run.step("launch", L=run.state.pool.clock[ISSUED])
    seq_lens, query_lens = [], []
    for r in rids:
        reserved = run.pos("reserved", r)
        seq_lens.append(reserved)
        query_lens.append(reserved - run.pos("issued", r))
        while run.pos("issued", r) < reserved:
            s = run.state
            b = s.tab[r][run.pos("issued", r) // run.B]
            if s.pool.ref[b] > 1:
                run.step("copy_write", r=r, b=b, d=run.take(f"copy-on-write for {r!r}"))
            else:
                run.step("write_block", r=r, b=b)
    _seal_touched(run, rids)
    run.result = (seq_lens, query_lens)


def complete(run: CallRun, L: int, writes: Sequence[int]) -> None:
    """Launch L completed: its writes end, then the watermark and recycling follow."""
    run.require(bool(run.state.pool.inflight[L]), f"launch {L} is not in flight")
    for b in writes:
        run.step("end_write", b=b)
    run.step("complete", L=L)
    _settle(run)


# --- step-level calls: each one the repetition of its single call, over distinct requests ------
def _distinct(run: CallRun, rids: Sequence[Hashable], call: str) -> None:
    run.require(len(set(rids)) == len(rids), f"a request appears twice in one {call}")


def append_tokens_many(run: CallRun,
                       updates: Sequence[tuple[Hashable, int, Sequence[int]]]) -> None:
    """``append_tokens`` of each ``(r, known, chain)`` in order."""
    _distinct(run, [u[0] for u in updates], "append_tokens_many")
    for r, known, chain in updates:
        append_tokens(run, r, known, chain)
    run.result = None


def allocate_many(run: CallRun, grow: Sequence[tuple[Hashable, int]]) -> None:
    """``allocate`` of each ``(r, n)`` in order, every table already non-empty (an admission
    takes prefix hits one request at a time); returns the entries each one appended."""
    _distinct(run, [r for r, _ in grow], "allocate_many")
    added = []
    for r, n in grow:
        run.alive(r)
        before = run.state.tlen[r]
        run.require(before > 0, f"allocate_many grows running requests; {r!r} has an empty "
                                "table (its first allocation takes prefix hits: allocate)")
        allocate(run, r, n)
        added.append(run.result[before:])
    run.result = added


def commit_many(run: CallRun, updates: Sequence[tuple[Hashable, int]]) -> None:
    """``commit`` of each ``(r, n)`` in order."""
    _distinct(run, [r for r, _ in updates], "commit_many")
    for r, n in updates:
        commit(run, r, n)


def free_many(run: CallRun, rids: Sequence[Hashable]) -> None:
    """``free`` of each request in order."""
    _distinct(run, list(rids), "free_many")
    for r in rids:
        free(run, r)


CALLS: dict[str, Callable[..., None]] = {
    f.__name__: f
    for f in (add_request, append_tokens, allocate, commit, truncate, fork, free, publish,
              complete, append_tokens_many, allocate_many, commit_many, free_many)
}

__all__ = ["CALLS", "CallRefused", "CallRun", "Chooser", "FirstFit", "cached_prefix",
           "call_allowed", "first_fit", "run_call", "take_hits", "why_refused"]
