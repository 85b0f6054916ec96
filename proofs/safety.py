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
    any transition that makes a block PUBLISHED, or starts an access to it (pending grows),
    or hands it to a holder (holds[r][b] becomes true), finds its record initialized, and
    leaves it initialized.
no recycling while accesses are pending
    any transition that makes a block FREE finds pending[b] == 0; any transition that hands
    a block out anew (-> ALLOCATED) finds pending[b] == 0.
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
from pagedkv.spec.states import ALLOCATED, FREE, NO_BLOCK, NO_HASH, PUBLISHED
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
                post.pending[b] > s.pending[b],
                z3.Or(*[z3.And(post.holds[r][b], z3.Not(s.holds[r][b])) for r in fr.anchors_r]),
            )
            # allocate initializes the record itself: the post-state is what is handed out
            return z3.Implies(hands_out, post.init[b])

        out.append(Claim(NO_EARLY_PUBLICATION, "publishing / accessing / handing out a block "
                         "finds it initialized", t.name, init_seen))

        # -- no recycling while pending (generic)
        def no_recycle_pending(fr: Any, post: Any, bp: str = bp) -> Any:
            b, s = fr.params[bp], fr.s
            return z3.And(
                z3.Implies(z3.And(s.state[b] != FREE, post.state[b] == FREE), s.pending[b] == 0),
                z3.Implies(z3.And(s.state[b] != ALLOCATED, post.state[b] == ALLOCATED),
                           s.pending[b] == 0),
            )

        out.append(Claim(NO_RECYCLE_WHILE_PENDING, "-> FREE / -> ALLOCATED only with "
                         "pending == 0", t.name, no_recycle_pending))

        # -- copy-on-write (generic)
        def cow(fr: Any, post: Any, bp: str = bp) -> Any:
            b, s = fr.params[bp], fr.s
            return z3.Implies(
                post.filled[b] > s.filled[b],
                z3.And(s.state[b] == PUBLISHED, s.ref[b] == 1, s.hash[b] == NO_HASH),
            )

        out.append(Claim(COPY_ON_WRITE, "a write finds the block PUBLISHED, ref 1, unhashed",
                         t.name, cow))

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
                post.state[b] != PUBLISHED,  # no writer can begin_access it (needs PUBLISHED)
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
    fr = build_frame(mode, t, invariants, cfg, extra_blocks=c.extra_blocks,
                     extra_hashes=c.extra_hashes)
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
                       fr.universe.hashes + list(fr.extra_hashes))
        cx = {
            "property": c.prop, "claim": c.name, "transition": c.transition,
            "params": {p: str(m.eval(v, model_completion=True)) for p, v in fr.params.items()},
            "extra": {str(v): str(m.eval(v, model_completion=True))
                      for v in fr.extra_blocks + fr.extra_hashes},
            "pre": decode_state(m, fr.s, uni),
            "post": decode_state(m, post, uni) if post is not None else None,
        }
        text = (f"counterexample to {c.prop!r} ({c.name}) via {c.transition}"
                f"({cx['params']}) {cx['extra']}\n pre-state:\n{format_state(cx['pre'], '   ')}")
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
) -> dict[str, SafetyResult]:
    out: dict[str, SafetyResult] = {}
    for c in claims(transitions):
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
