"""The named safety properties, proved from the invariants with z3.

Each property is a list of claims about one pre-state that satisfies every (non-table)
invariant, optionally a transition whose guard holds there, and its post-state. The claims
use the transitions' own guards and effects (looked up by name in the dict handed in, never
restated). "Generic" claims range over every transition that has a block parameter, so a new
transition is covered without editing this file. Each claim is checked in both encodings
(``symbolic`` unbounded pool and ``bounded`` explicit pool) like the induction obligations.

The formulations (the properties are English in spec/invariants.py):

no double free
    release(b, r) is disabled when r does not hold b or ref[b] <= 0; and right after a
    release(b, r) a second release(b, r) is disabled and ref[b] >= 0.
no publication before initialization
    any transition that makes a block PUBLISHED, or starts a write to it (wpend grows), or
    hands it to a holder (holds[r][b] becomes true), finds its record initialized, and leaves
    it initialized; any transition that publishes a launch (``inflight[L]`` becomes true)
    finds every block a table holds (``ref > 0``) initialized: that launch may read them.
no recycling while accesses are pending
    Launches are not tracked per block any more; a launch pins by its number every block a
    table holds when it is published, and a block is retired at the clock when its last
    holder lets it go. Three claims:
    (1) any transition that makes a block FREE, or hands it out anew (-> ALLOCATED), finds no
        write pending on it (``wpend == 0``) and no launch in flight numbered below its retire
        stamp (for every L: ``inflight[L] -> L >= retire[b]``);
    (2) the readers ghost. ``may_read[b][L]``: launch L was published while a table held b
        (``ref[b] > 0``) - under the assumption that a launch reads only blocks some table
        holds when it is published. The ghost is updated by every transition that publishes
        a launch (``inflight[L]`` false -> true), whatever its name. The ghost invariant
        ``may_read[b][L] -> L < clock[ISSUED]`` and ``may_read[b][L] and inflight[L] and
        ref[b] == 0 -> L < retire[b]`` (a launch that may read a block nobody holds any more is
        numbered below its retire stamp) is preserved by every transition;
    (3) with it: any transition that makes a block FREE finds no launch in flight that may
        have read it. This is what "retired at the clock" is for: release without the stamp
        breaks (2), a recycle guard without ``retire[b] <= clock[WATERMARK]`` breaks (1), (3).
no prefix hit on unwritten KV
    a block the hash map returns (hmap[c] = b, c != NO_HASH) is full and its writes have
    completed (``spec.transitions.slots_written``), and if share(b, r) is enabled for it, the
    shared block stays full and no write to it can begin afterwards.
shared blocks are never written (copy-on-write)
    any transition that adds written slots to a block finds it PUBLISHED, held once, without
    a hash.
isolation between salts
    a prefix-hit lookup with the requester's chain value c returns only a block whose hash is
    c (and still is after share); two different chain values (different salts or tokens; we
    assume no hash collisions) never map to the same block.
failed allocation changes nothing
    (1) By construction: ``spec.check.step`` applies no effect when the guard is false (it
    returns None), and allocate takes one block per transition, so the only way to fail half
    way through a k-block allocation is for the allocator to start one it cannot finish.
    (2) What makes "all or nothing" decidable up front: for any alive holder r, the number of
    blocks allocate(·, r) is enabled for is exactly count[FREE] (bounded pool: all N blocks
    enumerated), and in the unbounded pool k distinct allocate-enabled blocks imply
    count[FREE] >= k (k = 1, 2). So checking count[FREE] >= k first makes a k-block
    allocation either fully succeed or change nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import z3

from pagedkv.spec.invariants import (
    COPY_ON_WRITE,
    ISOLATION,
    NO_DOUBLE_FREE,
    NO_EARLY_PUBLICATION,
    NO_RECYCLE_WHILE_PENDING,
    NO_UNWRITTEN_HIT,
    Invariant,
)
from pagedkv.spec.states import ALLOCATED, FREE, ISSUED, NO_BLOCK, NO_HASH, PUBLISHED
from pagedkv.spec.transitions import Transition, slots_written

from .induction import COUNTEREXAMPLE, PROVED, UNKNOWN, build_frame, solve
from .z3_model import (
    DEFAULT_BOUNDED,
    DEFAULT_INVARIANTS,
    DEFAULT_TRANSITIONS,
    BoundedConfig,
    Universe,
    decode_state,
    format_state,
    param_kind,
)

FAILED_ALLOCATION = "failed allocation changes nothing"


@dataclass
class Claim:
    prop: str
    name: str
    transition: str | None
    # (frame, post or None) -> formula that must hold
    build: Callable[[Any, Any], Any]
    extra_blocks: int = 0
    extra_hashes: int = 0
    extra_launches: int = 0
    # extra_blocks[0] is any block, the transition's own included: in the symbolic pool it is
    # the goal point (not an anchor, so not assumed distinct from the transition's blocks)
    any_block: bool = False
    modes: tuple[str, ...] = ("symbolic", "bounded")


@dataclass
class ClaimResult:
    prop: str
    claim: str
    transition: str | None
    mode: str
    result: str
    time_s: float
    detail: str = ""
    counterexample: dict[str, Any] | None = None
    text: str | None = None


@dataclass
class SafetyResult:
    prop: str
    result: str
    claims: list[ClaimResult] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _block_param(t: Transition) -> str | None:
    return next((p for p in t.params if param_kind(p) == "block"), None)


def _holder_param(t: Transition) -> str | None:
    return next((p for p in t.params if param_kind(p) == "holder"), None)


# --- the readers ghost (see the module doc, claim (2)) -----------------------------------------
MAY_READ = "may_read"


def _ghost() -> Any:
    return z3.Array(MAY_READ, z3.IntSort(), z3.ArraySort(z3.IntSort(), z3.BoolSort()))


def _held(s: Any, b: Any) -> Any:
    return s.ref[b] > 0


def _publishes(s: Any, post: Any, L: Any) -> Any:
    """The transition publishes launch L (it was not in flight and is now)."""
    return z3.And(z3.Not(s.inflight[L]), post.inflight[L])


def may_read_after(s: Any, post: Any, b: Any, L: Any) -> Any:
    """The ghost after a transition, at (b, L): a launch published now may read every block a
    table holds now."""
    return z3.Or(_ghost()[b][L], z3.And(_publishes(s, post, L), _held(s, b)))


def readers_invariant(s: Any, may_read: Any, b: Any, L: Any) -> Any:
    return z3.And(
        z3.Implies(may_read, L < s.clock[ISSUED]),
        z3.Implies(z3.And(may_read, s.inflight[L], s.ref[b] == 0), L < s.retire[b]),
    )


def claims(transitions: Mapping[str, Transition]) -> list[Claim]:
    out: list[Claim] = []
    T = transitions

    # -- no double free
    if "release" in T:
        rel = T["release"]

        def not_held_disables(fr: Any, post: Any) -> Any:
            b, r = fr.params["b"], fr.params["r"]
            return z3.And(fr.s.holds[r][b], fr.s.ref[b] > 0)

        def no_second_release(fr: Any, post: Any) -> Any:
            b = fr.params["b"]
            return z3.And(z3.Not(rel.guard(fr.ops, post, **fr.params)), post.ref[b] >= 0)

        out.append(Claim(NO_DOUBLE_FREE, "release needs holds[r][b] and ref[b] > 0", "release",
                         not_held_disables))
        out.append(Claim(NO_DOUBLE_FREE, "a second release(b, r) is disabled; ref stays >= 0",
                         "release", no_second_release))

    for t in T.values():
        bp = _block_param(t)
        if bp is None:
            continue

        # -- no publication before initialization (generic over transitions)
        def init_seen(fr: Any, post: Any, bp: str = bp) -> Any:
            b, s = fr.params[bp], fr.s
            hands_out = z3.Or(
                z3.And(post.state[b] == PUBLISHED, s.state[b] != PUBLISHED),
                post.wpend[b] > s.wpend[b],
                z3.Or(*[z3.And(post.holds[r][b], z3.Not(s.holds[r][b])) for r in fr.anchors_r]),
            )
            # allocate initializes the record itself: the post-state is what is handed out
            return z3.Implies(hands_out, post.init[b])

        out.append(Claim(NO_EARLY_PUBLICATION, "publishing / writing / handing out a block "
                         "finds it initialized", t.name, init_seen))

        # -- no recycling while pending (generic), claim (1)
        def no_recycle_pending(fr: Any, post: Any, bp: str = bp) -> Any:
            b, s = fr.params[bp], fr.s
            L = fr.extra_launches[0]
            idle = z3.And(s.wpend[b] == 0, z3.Implies(s.inflight[L], L >= s.retire[b]))
            return z3.And(
                z3.Implies(z3.And(s.state[b] != FREE, post.state[b] == FREE), idle),
                z3.Implies(z3.And(s.state[b] != ALLOCATED, post.state[b] == ALLOCATED), idle),
            )

        out.append(Claim(NO_RECYCLE_WHILE_PENDING, "-> FREE / -> ALLOCATED only with no write "
                         "pending and no launch in flight below the retire stamp", t.name,
                         no_recycle_pending, extra_launches=1))

        # -- copy-on-write (generic)
        def cow(fr: Any, post: Any, bp: str = bp) -> Any:
            b, s = fr.params[bp], fr.s
            return z3.Implies(
                post.filled[b] > s.filled[b],
                z3.And(s.state[b] == PUBLISHED, s.ref[b] == 1, s.hash[b] == NO_HASH),
            )

        out.append(Claim(COPY_ON_WRITE, "a write finds the block PUBLISHED, ref 1, unhashed",
                         t.name, cow))

    for t in T.values():
        # -- a launch reads initialized blocks (generic: any transition that publishes one)
        def launch_reads_initialized(fr: Any, post: Any) -> Any:
            s, b, L = fr.s, fr.extra_blocks[0], fr.extra_launches[0]
            return z3.Implies(z3.And(_publishes(s, post, L), _held(s, b)), s.init[b])

        out.append(Claim(NO_EARLY_PUBLICATION, "a launch published finds every held block "
                         "initialized", t.name, launch_reads_initialized, extra_blocks=1,
                         extra_launches=1, any_block=True))

        # -- the readers ghost is preserved (generic), claim (2)
        def readers_kept(fr: Any, post: Any) -> Any:
            s, b, L = fr.s, fr.extra_blocks[0], fr.extra_launches[0]
            before = readers_invariant(s, _ghost()[b][L], b, L)
            return z3.Implies(before, readers_invariant(post, may_read_after(s, post, b, L),
                                                        b, L))

        out.append(Claim(NO_RECYCLE_WHILE_PENDING, "a launch that may read a block nobody holds "
                         "is numbered below its retire stamp (readers ghost kept)", t.name,
                         readers_kept, extra_blocks=1, extra_launches=1, any_block=True))

        # -- claim (3): freed only after its readers
        def freed_after_readers(fr: Any, post: Any) -> Any:
            s, b, L = fr.s, fr.extra_blocks[0], fr.extra_launches[0]
            mr = _ghost()[b][L]
            return z3.Implies(
                z3.And(readers_invariant(s, mr, b, L), s.state[b] != FREE, post.state[b] == FREE,
                       may_read_after(s, post, b, L)),
                z3.And(z3.Not(s.inflight[L]), z3.Not(post.inflight[L])))

        out.append(Claim(NO_RECYCLE_WHILE_PENDING, "-> FREE only once every launch that may "
                         "have read the block completed", t.name, freed_after_readers,
                         extra_blocks=1, extra_launches=1, any_block=True))

    # -- no prefix hit on unwritten KV / isolation
    def hit(fr: Any) -> tuple[Any, Any, Any]:
        c = fr.extra_hashes[0]
        b = fr.params["b"] if "b" in fr.params else fr.extra_blocks[0]
        return c, b, z3.And(c != NO_HASH, fr.s.hmap[c] == b, b != NO_BLOCK)

    def hit_written(fr: Any, post: Any) -> Any:
        c, b, is_hit = hit(fr)
        return z3.Implies(is_hit, slots_written(fr.ops, fr.s, b, fr.s.block_size))

    out.append(Claim(NO_UNWRITTEN_HIT, "a block the hash map returns is full and written",
                     None, hit_written, extra_blocks=1, extra_hashes=1))
    if "share" in T:
        def share_stays_written(fr: Any, post: Any) -> Any:
            c, b, is_hit = hit(fr)
            return z3.Implies(is_hit, z3.And(
                slots_written(fr.ops, post, b, post.block_size),
                post.state[b] != PUBLISHED,  # no writer can begin_write it (needs PUBLISHED)
            ))

        def share_isolated(fr: Any, post: Any) -> Any:
            c, b, is_hit = hit(fr)
            return z3.Implies(is_hit, z3.And(fr.s.hash[b] == c, post.hash[b] == c))

        out.append(Claim(NO_UNWRITTEN_HIT, "a prefix hit shares a full, written, read-only block",
                         "share", share_stays_written, extra_hashes=1))
        out.append(Claim(ISOLATION, "a prefix hit on chain value c hands a block hashed c",
                         "share", share_isolated, extra_hashes=1))

    def salts_apart(fr: Any, post: Any) -> Any:
        c1, c2 = fr.extra_hashes
        s = fr.s
        return z3.Implies(z3.And(c1 != c2, s.hmap[c1] == s.hmap[c2]), s.hmap[c1] == NO_BLOCK)

    out.append(Claim(ISOLATION, "different chain values never map to the same block", None,
                     salts_apart, extra_hashes=2))

    # -- failed allocation: capacity is decidable up front
    if "allocate" in T:
        alloc = T["allocate"]

        def exact_capacity(fr: Any, post: Any) -> Any:
            s, r = fr.s, z3.Int("cap_r")  # any holder; a dead or unknown one is vacuous
            enabled = [alloc.guard(fr.ops, s, b=b, r=r) for b in s.block_ids]
            return z3.Implies(s.alive[r], z3.Sum([z3.If(e, 1, 0) for e in enabled])
                              == s.count[FREE])

        out.append(Claim(FAILED_ALLOCATION, "#allocate-enabled blocks == count[FREE] for an "
                         "alive holder (N blocks enumerated)", None, exact_capacity,
                         modes=("bounded",)))
        for k in (1, 2):
            def k_enabled(fr: Any, post: Any, k: int = k) -> Any:
                s, r = fr.s, z3.Int("cap_r")
                bs = fr.extra_blocks
                return z3.Implies(z3.And(*[alloc.guard(fr.ops, s, b=b, r=r) for b in bs]),
                                  s.count[FREE] >= k)

            out.append(Claim(FAILED_ALLOCATION, f"{k} distinct allocate-enabled blocks imply "
                             f"count[FREE] >= {k}", None, k_enabled, extra_blocks=k))
    return out


def check_claim(
    c: Claim, mode: str, transitions: Mapping[str, Transition],
    invariants: Mapping[str, Invariant], cfg: BoundedConfig, timeout_ms: int,
) -> ClaimResult:
    t0 = time.perf_counter()
    t = transitions[c.transition] if c.transition else None
    point = c.any_block and mode == "symbolic"
    fr = build_frame(mode, t, invariants, cfg, goal_scope="block" if point else None,
                     extra_blocks=c.extra_blocks - point, extra_hashes=c.extra_hashes,
                     extra_launches=c.extra_launches)
    if point:
        fr.extra_blocks = [fr.goal_point, *fr.extra_blocks]
    facts = list(fr.hyps)
    post = None
    if t is not None:
        facts.append(t.guard(fr.ops, fr.s, **fr.params))
        post = t.effect(fr.ops, fr.s, **fr.params)
    if c.extra_blocks > 1 and mode == "bounded":
        facts.append(z3.Distinct(*fr.extra_blocks))
    claim = c.build(fr, post)
    facts += list(getattr(fr.ops, "side", []))
    res, m, why = solve(facts + [z3.Not(claim)], timeout_ms)
    cx = text = None
    if res == COUNTEREXAMPLE:
        uni = Universe(fr.universe.blocks + list(fr.extra_blocks), fr.universe.holders,
                       fr.universe.hashes + list(fr.extra_hashes),
                       launches=fr.universe.launches + list(fr.extra_launches))
        ghost = {}
        if fr.extra_launches and fr.extra_blocks and post is not None:
            b, L = fr.extra_blocks[0], fr.extra_launches[0]
            ev = lambda e: str(m.eval(e, model_completion=True))  # noqa: E731
            ghost = {"block": ev(b), "launch": ev(L), "may_read_before": ev(_ghost()[b][L]),
                     "may_read_after": ev(may_read_after(fr.s, post, b, L))}
        cx = {
            "property": c.prop, "claim": c.name, "transition": c.transition,
            "params": {p: str(m.eval(v, model_completion=True)) for p, v in fr.params.items()},
            "extra": {str(v): str(m.eval(v, model_completion=True))
                      for v in fr.extra_blocks + fr.extra_hashes + fr.extra_launches},
            "ghost": ghost,
            "pre": decode_state(m, fr.s, uni),
            "post": decode_state(m, post, uni) if post is not None else None,
        }
        text = (f"counterexample to {c.prop!r} ({c.name}) via {c.transition}"
                f"({cx['params']}) {cx['extra']}\n")
        if ghost:
            text += (f" ghost: launch {ghost['launch']} may read block {ghost['block']}: "
                     f"{ghost['may_read_before']} before, {ghost['may_read_after']} after\n")
        text += f" pre-state:\n{format_state(cx['pre'], '   ')}"
        if post is not None:
            text += f"\n post-state:\n{format_state(cx['post'], '   ')}"
    return ClaimResult(c.prop, c.name, c.transition, mode, res,
                       round(time.perf_counter() - t0, 4), why, cx, text)


def prove_safety(
    transitions: Mapping[str, Transition] = DEFAULT_TRANSITIONS,
    invariants: Mapping[str, Invariant] = DEFAULT_INVARIANTS,
    cfg: BoundedConfig = DEFAULT_BOUNDED,
    timeout_ms: int = 20000,
    progress: Callable[[str], None] | None = None,
    modes: tuple[str, ...] = ("symbolic", "bounded"),
    only: set[str] | None = None,
) -> dict[str, SafetyResult]:
    """Every claim in every mode; ``only``: just the claims about these transitions."""
    out: dict[str, SafetyResult] = {}
    for c in claims(transitions):
        if only is not None and c.transition not in only:
            continue
        for mode in c.modes:
            if mode not in modes:
                continue
            r = check_claim(c, mode, transitions, invariants, cfg, timeout_ms)
            if progress:
                progress(f"safety[{mode}] {c.prop}: {c.name} / {c.transition}: {r.result}")
            sr = out.setdefault(c.prop, SafetyResult(c.prop, PROVED))
            sr.claims.append(r)
            if r.result != PROVED and sr.result != COUNTEREXAMPLE:
                sr.result = r.result if r.result == COUNTEREXAMPLE else UNKNOWN
    return out
