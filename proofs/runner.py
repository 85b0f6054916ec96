"""Run every z3 proof and the reachability search; one JSON-able report.

API (for the CLI)::

    from pagedkv.proofs.runner import run_all
    report = run_all(quick=False, progress=print)   # progress: Callable[[str], None] | None
    report.ok            # False if any obligation is not "proved", any check fails
    report.to_dict()     # JSON-serializable
    print(report.table())

``python -m pagedkv.proofs.runner [--quick] [--json PATH]`` prints the table.

The first exploration runs in a forked child process while z3 (induction, safety,
non-vacuity, BMC) and the other explorations run in this one (2 cores).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from pagedkv.spec.check import spec_digest
from pagedkv.spec.host_invariants import HOST_INVARIANTS
from pagedkv.spec.invariants import Invariant
from pagedkv.spec.request_invariants import REQUEST_INVARIANTS
from pagedkv.spec.requests import REQUEST_TRANSITIONS
from pagedkv.spec.transitions import Transition

from .bmc import BMCConfig, bmc
from .explore import (
    ExploreConfig,
    ExploreResult,
    explore,
    layer_key,
    walk_requests,
)
from .host_induction import host_nonvacuity, prove_host
from .induction import COUNTEREXAMPLE, PROVED, UNKNOWN, induction_matrix, unsupported
from .nonvacuity import ENABLED, nonvacuity
from .request_induction import prove_all as prove_requests
from .safety import prove_safety
from .z3_model import DEFAULT_INVARIANTS, DEFAULT_TRANSITIONS, BoundedConfig

Progress = Callable[[str], None] | None


@dataclass
class ProofReport:
    ok: bool
    quick: bool
    spec_digest: str
    config: dict[str, Any]
    assumptions: list[str]
    invariants: dict[str, dict[str, Any]]
    safety: dict[str, dict[str, Any]]
    transitions: dict[str, dict[str, Any]]
    exploration: dict[str, dict[str, Any]]
    request_transitions: dict[str, dict[str, Any]]
    bmc: dict[str, Any]
    totals: dict[str, Any]
    failures: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self, **kw: Any) -> str:
        return json.dumps(self.to_dict(), default=str, **kw)

    def table(self) -> str:
        return format_table(self)


def assumptions(bcfg: BoundedConfig, ecfgs: list[ExploreConfig], mcfg: BMCConfig) -> list[str]:
    e = ecfgs[0]
    layers = "; ".join(f"{layer_key(asdict(c))}: {c.blocks} blocks, {c.holders} holders, "
                       f"block size {c.block_size}, at most {c.max_inflight} launches in "
                       f"flight and {c.max_window} issued past the watermark"
                       + (f", {c.max_tokens} known tokens per request" if c.layer == "request"
                          else "") for c in ecfgs)
    return [
        "Launches are numbered in publish order (launch L is published when clock[ISSUED] = "
        "L): launches on one stream run in publish order, but their completions may arrive "
        "in any order (complete(L) for any launch in flight); the watermark passes a launch "
        "only once it and every launch before it completed (advance).",
        "A launch reads only blocks some table holds when it is published (its number pins "
        "them: a block let go is retired at clock[ISSUED] and reused only once the watermark "
        "passes that stamp). The allocator guarantees it for copy-on-write by numbering the "
        "copy launch before it releases the source block; the explorer's request layer "
        "models the copy in that order, and its readers ghost (the launches in flight that "
        "may read each block) checks that no block is FREE while one of them is in flight. "
        "Writes are tracked per block (begin_write / end_write, wpend).",
        "No hash collisions: distinct chain values (salt, tokens) are distinct integers; "
        "NO_HASH = 0 is no hash.",
        "Holder ids are arbitrary integers; block ids are range-checked by every guard "
        "that takes a block (0 <= b < num_blocks).",
        "Symbolic (unbounded) proofs: pool size, block size and every array are symbolic; a "
        "pool-wide sum (conservation, ref = #holders, nheld = #held) is split into the "
        "transition's own block/holder plus a symbolic rest, bounded by 0 <= rest <= n - 1 "
        "when each term is 0/1; the frame condition (the transition changes no other term) is "
        "proved for every sum of every goal. Sound for any number of blocks and holders.",
        "Symbolic proofs range over an unbounded launch clock too: clock values, retire stamps "
        "and launch numbers are symbolic integers, inflight an unconstrained array.",
        f"Bounded proofs: exactly {bcfg.blocks} blocks and {bcfg.holders} holders, hashes "
        f"{bcfg.hashes[1:]} (complete for that size up to renaming of hash values: at most "
        f"{bcfg.blocks} hashes are carried plus one fresh one to commit), block size symbolic, "
        f"clock values and launches 0..{bcfg.launches} (complete for states whose clock window "
        f"issued - watermark is at most {bcfg.launches}, up to the epoch normalization).",
        "The request layer (spec.requests): every request transition is a fixed sequence of "
        "pool transitions, each under its own guard, so the pool invariants hold there too. "
        "The table invariants (spec.request_invariants) are proved inductive over the request "
        "transitions with z3 over an unbounded pool, any block size and any number of "
        "requests (positions kept as (blocks, offset) pairs: linear), assuming the pool "
        "invariants without pool-wide sums plus two lemmas proved from ref_matches_holders "
        "(a held block has ref >= 1, one held by two holders ref >= 2). The request layer is "
        "also searched breadth-first to the end in small configurations (block size 1, "
        "which leaves out learn and reserve; the quick report bounds the search by depth "
        "instead), each required to pass through the patterns it is there for (launches "
        "completing out of order, copy-on-write, fork while a write is in flight, "
        "truncation; prefix hits), and by seeded random walks with block size 2, deep "
        "enough for prefix hits and evictions.",
        "A fork shares a block whose write is still in flight: the child's launches are "
        "published later, so on the one stream they run after the write.",
        f"Exploration ({layers}): hash values {list(e.hashes)} shared by every holder's "
        "chain; fields nothing reads (gen) are not part of the explored state (a "
        "bisimulation; found with z3); every state is stored as seen from its watermark "
        "(clock values and launch numbers shifted down by it, retire stamps below it clamped "
        "to it), a bisimulation proved with z3 for this spec (normalization lemma: guards, "
        "successors and invariants agree).",
        f"BMC: {mcfg.blocks} blocks, {mcfg.holders} holders, block size {mcfg.block_size}, "
        f"hashes {list(mcfg.hashes)}, no launch bound, no normalization; deepened until the "
        "time budget.",
    ]


# The request layer searched to the end (no depth bound): two launches in flight completing
# in any order, copy-on-write, fork while a write is in flight, truncation; and, with one
# launch in flight and two known tokens per request, prefix hits. Each must pass through the
# SCENARIOS it names (a block size of 1 keeps them finite: learn and reserve need 2, and are
# left to the walks, the depth-bounded quick search and the unbounded z3 proof).
COMPLETE_REQUEST_SEARCHES = (
    ExploreConfig(blocks=2, holders=2, block_size=1, max_inflight=2, max_window=2,
                  layer="request", max_tokens=1, hashes=(1,)),
    ExploreConfig(blocks=2, holders=2, block_size=1, max_inflight=1, max_window=1,
                  layer="request", label="hits", max_tokens=2, hashes=(1,)),
)
REQUIRED_SCENARIOS: dict[str, tuple[str, ...]] = {
    "request": ("a launch completes while an older one is in flight",
                "copy-on-write of a shared block",
                "fork sharing a block whose write is in flight",
                "truncation of rejected positions"),
    "request:hits": ("a prefix hit on a cached block",),
}


def scenario_failures(exps: Iterable[ExploreResult]) -> list[str]:
    """A search run to the end (no depth bound) that never passed through a scenario
    ``REQUIRED_SCENARIOS`` names for it is a failure: its configuration is too small to
    cover what it is reported as covering."""
    out = []
    for e in exps:
        if e.config.get("max_depth") is not None:
            continue
        key = layer_key(e.config)
        out += [f"explorer[{key}]: never passed through {what!r}"
                for what in REQUIRED_SCENARIOS.get(key, ()) if not e.scenarios.get(what)]
    return out


def _explore_child(conn: Any, cfgs: list[ExploreConfig], transitions: Any, invariants: Any
                   ) -> None:
    try:
        conn.send([explore(c, transitions, invariants) for c in cfgs])
    except BaseException as e:  # pragma: no cover - reported in the parent
        conn.send(e)
    finally:
        conn.close()


def _start_explorer(cfgs: list[ExploreConfig], transitions: Any, invariants: Any,
                    parallel: bool) -> Callable[[], list[ExploreResult]]:
    if parallel:
        try:
            ctx = mp.get_context("fork")
            parent, child = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_explore_child, args=(child, cfgs, transitions,
                                                            invariants), daemon=True)
            proc.start()
            child.close()

            def join() -> list[ExploreResult]:
                out = parent.recv()
                proc.join()
                if isinstance(out, BaseException):
                    raise out
                return out

            return join
        except (ValueError, OSError):
            pass
    results = [explore(c, transitions, invariants) for c in cfgs]
    return lambda: results


def run_all(
    quick: bool = False,
    progress: Progress = None,
    transitions: Mapping[str, Transition] = DEFAULT_TRANSITIONS,
    invariants: Mapping[str, Invariant] = DEFAULT_INVARIANTS,
    parallel: bool = True,
    bounded: BoundedConfig | None = None,
    explore_cfgs: list[ExploreConfig] | None = None,
    bmc_cfg: BMCConfig | None = None,
    request_layer: bool = True,
) -> ProofReport:
    """Every proof and search; ``request_layer=False`` leaves out the request layer's z3
    proof and walks (for tests of the pool layer's reporting)."""
    t0 = time.perf_counter()
    say = progress or (lambda _m: None)
    bcfg = bounded or BoundedConfig(blocks=3, holders=3)
    if explore_cfgs is None:
        if quick:
            explore_cfgs = [  # two launches in flight: completions out of order
                ExploreConfig(blocks=2, holders=2, block_size=1, max_inflight=2, max_window=2,
                              layer="pool"),
                ExploreConfig(blocks=2, holders=2, block_size=2, max_inflight=2, max_window=2,
                              layer="request", max_tokens=3, hashes=(1,), max_depth=7),
            ]
        else:
            explore_cfgs = [  # out-of-order completions: the request layer's first search
                ExploreConfig(blocks=3, holders=2, block_size=1, max_inflight=1, max_window=1,
                              layer="pool"),
                *COMPLETE_REQUEST_SEARCHES,
            ]
    mcfg = bmc_cfg or BMCConfig(budget_s=5.0 if quick else 12.0)
    timings: dict[str, float] = {}

    # the first exploration runs in a child process, the others here after the z3 work
    say("explorer: started (child process)")
    join = _start_explorer(explore_cfgs[:1], transitions, invariants, parallel)

    tt = time.perf_counter()
    sym = induction_matrix("symbolic", transitions, invariants, bcfg, progress=progress)
    timings["induction_symbolic_s"] = round(time.perf_counter() - tt, 2)
    tt = time.perf_counter()
    bnd = induction_matrix("bounded", transitions, invariants, bcfg, progress=progress)
    timings["induction_bounded_s"] = round(time.perf_counter() - tt, 2)
    tt = time.perf_counter()
    saf = prove_safety(transitions, invariants, bcfg, progress=progress)
    timings["safety_s"] = round(time.perf_counter() - tt, 2)
    tt = time.perf_counter()
    nv = nonvacuity(transitions, invariants, bcfg, progress=progress)
    timings["nonvacuity_s"] = round(time.perf_counter() - tt, 2)
    tt = time.perf_counter()
    mres = bmc(mcfg, transitions, invariants, progress=progress)
    timings["bmc_s"] = round(time.perf_counter() - tt, 2)
    tt = time.perf_counter()
    req_obs = prove_requests(pool_invariants=invariants) if request_layer else []
    timings["induction_requests_s"] = round(time.perf_counter() - tt, 2)
    tt = time.perf_counter()
    host_obs, host_nv = prove_host(), host_nonvacuity()
    timings["induction_host_s"] = round(time.perf_counter() - tt, 2)
    wcfg = ExploreConfig(blocks=3, holders=2, block_size=2, max_window=3, layer="request",
                         max_tokens=6, hashes=(1, 2))
    walks = walk_requests(wcfg, walks=(100 if quick else 300) if request_layer else 0,
                          steps=150, invariants=invariants)
    timings["request_walks_s"] = walks.time_s
    rest = [explore(c, transitions, invariants) for c in explore_cfgs[1:]]
    tt = time.perf_counter()
    exps = join() + rest
    timings["explorer_wait_s"] = round(time.perf_counter() - tt, 2)
    for e in exps:
        timings[f"explore_{layer_key(e.config)}_s"] = e.time_s
        say(f"explore[{layer_key(e.config)}]: {e.states} states, {e.edges} edges, "
            f"complete={e.complete}, violations={list(e.violations)}")

    failures: list[str] = []
    unsup = unsupported(invariants)
    inv_rows: dict[str, dict[str, Any]] = {}
    for name, inv in invariants.items():
        row: dict[str, Any] = {"scope": inv.scope, "property": inv.property, "doc": inv.doc}
        row["induction"] = {o.transition: _ob(o) for o in sym if o.invariant == name}
        row["induction_bounded"] = {o.transition: _ob(o) for o in bnd if o.invariant == name}
        if name in unsup:
            row["symbolic_note"] = unsup[name]
        reach = {}
        for e in exps:
            v = e.violations.get(name)
            reach[layer_key(e.config)] = {
                "result": "violated" if v else ("holds" if e.complete else "incomplete"),
                "states": e.states,
                "trace": v.trace if v else None,
                "text": v.text if v else None,
            }
        row["reachable"] = reach
        row["bmc_depth"] = mres.depth
        row["status"] = _status(row)
        inv_rows[name] = row
        if row["status"] != "proved":
            failures.append(f"invariant {name}: {row['status']}")
        for mode in ("induction", "induction_bounded"):
            for tname, ob in row[mode].items():
                if ob["result"] != PROVED:
                    failures.append(f"{name} / {tname} [{mode}]: {ob['result']}"
                                    + (f"\n{ob['text']}" if ob.get("text") else ""))
        for layer, r in reach.items():
            if r["result"] != "holds":
                failures.append(f"{name} [{layer} reachability]: {r['result']}"
                                + (f"\n{r['text']}" if r.get("text") else ""))

    req_layer = [e for e in exps if e.config["layer"] == "request"]
    for name, inv in (REQUEST_INVARIANTS if request_layer else {}).items():
        row = {"scope": inv.scope, "property": inv.property, "doc": inv.doc,
               "induction": {o.transition: _ob(o) for o in req_obs if o.invariant == name},
               "induction_bounded": {}, "bmc_depth": None}
        reach = {}
        for e in req_layer:
            v = e.violations.get(name)
            reach[layer_key(e.config)] = {
                "result": "violated" if v else ("holds" if e.complete else "incomplete"),
                "states": e.states, "trace": v.trace if v else None,
                "text": v.text if v else None}
        if name in walks.violations:
            reach["walks"] = {"result": "violated", "states": walks.walks * walks.steps,
                              "trace": None, "text": walks.violations[name]}
        row["reachable"] = reach
        row["status"] = _status(row)
        inv_rows[name] = row
        if row["status"] != "proved":
            failures.append(f"table invariant {name}: {row['status']}")
        for tname, ob in row["induction"].items():
            if ob["result"] != PROVED:
                failures.append(f"{name} / {tname} [request layer]: {ob['result']} "
                                f"{ob.get('detail', '')}")
    for name, inv in HOST_INVARIANTS.items():
        row = {"scope": inv.scope, "layer": "host", "property": inv.property, "doc": inv.doc,
               "induction": {o.transition: _ob(o) for o in host_obs if o.invariant == name},
               "induction_bounded": {}, "reachable": {}, "bmc_depth": None}
        row["status"] = _status(row)
        inv_rows[name] = row
        for tname, ob in row["induction"].items():
            if ob["result"] != PROVED:
                failures.append(f"{name} / {tname} [host tier]: {ob['result']} "
                                f"{ob.get('detail', '')}" + (f"\n{ob['text']}"
                                                              if ob.get("text") else ""))
    failures += [f"host transition {n}: {r} under the host invariants"
                 for n, r in host_nv.items() if r != ENABLED]
    for o in req_obs:
        if o.transition == "-" and o.result != PROVED:
            failures.append(f"request layer {o.invariant}: {o.result}")
    for vname, text in walks.violations.items():
        if vname not in REQUEST_INVARIANTS and vname not in invariants:
            failures.append(f"request walks {vname}: {text}")
    r_rows = {}
    for name in (REQUEST_TRANSITIONS if request_layer else ()):
        fired = {layer_key(e.config): e.fired.get(name, 0) for e in req_layer}
        fired["walks"] = walks.fired.get(name, 0)
        r_rows[name] = {"fired": fired}
        if not any(fired.values()):
            failures.append(f"request transition {name}: never fired (explorer, walks)")

    saf_rows = {p: r.to_dict() for p, r in saf.items()}
    for p, r in saf.items():
        if r.result != PROVED:
            failures += [f"safety {p}: {c.claim} / {c.transition} [{c.mode}]: {c.result}"
                         + (f"\n{c.text}" if c.text else "")
                         for c in r.claims if c.result != PROVED]

    t_rows: dict[str, dict[str, Any]] = {}
    for name in transitions:
        nvs = {e.mode: e.result for e in nv.get(name, [])}
        fired = {layer_key(e.config): e.fired.get(name, 0) for e in exps}
        t_rows[name] = {"nonvacuity": nvs, "fired": fired,
                        "witness": next((e.text for e in nv.get(name, []) if e.text), None)}
        if any(v != ENABLED for v in nvs.values()):
            failures.append(f"transition {name}: not enabled under the invariants: {nvs}")
        if exps and not any(fired.values()):
            failures.append(f"transition {name}: never fired in the explorer")

    ex_rows = {layer_key(e.config): _exp(e) for e in exps}
    for e in exps:
        if not e.complete:
            failures.append(f"explorer[{layer_key(e.config)}] incomplete (state cap)")
        for vname, v in e.violations.items():  # the explorer's own checks (not invariants)
            if vname not in invariants:
                failures.append(f"explorer[{layer_key(e.config)}] {vname}: {v.text}")
    failures += scenario_failures(exps)
    if mres.violation:
        failures.append(f"bmc: violation {mres.violation}")

    obs = sym + bnd
    claims = [c for r in saf.values() for c in r.claims]
    totals = {
        "obligations": len(obs),
        "proved": sum(o.result == PROVED for o in obs),
        "counterexample": sum(o.result == COUNTEREXAMPLE for o in obs),
        "unknown": sum(o.result == UNKNOWN for o in obs),
        "request_obligations": len(req_obs),
        "request_proved": sum(o.result == PROVED for o in req_obs),
        "request_walk_steps": sum(walks.fired.values()),
        "host_obligations": len(host_obs),
        "host_proved": sum(o.result == PROVED for o in host_obs),
        "host_transitions_enabled": sum(r == ENABLED for r in host_nv.values()),
        "host_transitions": len(host_nv),
        "safety_claims": len(claims),
        "safety_proved": sum(c.result == PROVED for c in claims),
        "reachable_states": {layer_key(e.config): e.states for e in exps},
        "edges": {layer_key(e.config): e.edges for e in exps},
        "bmc_depth": mres.depth,
        "time_s": round(time.perf_counter() - t0, 2),
        **timings,
    }
    config = {
        "bounded": {"blocks": bcfg.blocks, "holders": bcfg.holders,
                    "hashes": list(bcfg.hashes)},
        "explore": [asdict(c) for c in explore_cfgs],
        "bmc": asdict(mcfg),
        "invariants": len(invariants),
        "transitions": len(transitions),
    }
    return ProofReport(
        ok=not failures, quick=quick, spec_digest=spec_digest(), config=config,
        assumptions=assumptions(bcfg, explore_cfgs, mcfg), invariants=inv_rows,
        safety=saf_rows, transitions=t_rows, request_transitions=r_rows,
        exploration=ex_rows, bmc=mres.to_dict(),
        totals=totals, failures=failures,
    )


def _ob(o: Any) -> dict[str, Any]:
    d = {"result": o.result, "time_s": o.time_s}
    if o.detail:
        d["detail"] = o.detail
    if o.counterexample:
        d["counterexample"] = o.counterexample
        d["text"] = o.text
    return d


def _exp(e: ExploreResult) -> dict[str, Any]:
    d = e.to_dict()
    d["violations"] = {k: {"where": str(v.where), "depth": v.depth, "trace": v.trace,
                           "text": v.text} for k, v in e.violations.items()}
    return d


def _status(row: dict[str, Any]) -> str:
    results = [o["result"] for o in row["induction"].values()] + [
        o["result"] for o in row["induction_bounded"].values()]
    if COUNTEREXAMPLE in results:
        return "counterexample"
    if any(r["result"] == "violated" for r in row["reachable"].values()):
        return "violated"
    if UNKNOWN in results:
        return "unknown"
    return "proved"


def _cell(obs: Mapping[str, Any]) -> str:
    if not obs:
        return "-"
    n = len(obs)
    p = sum(o["result"] == PROVED for o in obs.values())
    bad = [t for t, o in obs.items() if o["result"] != PROVED]
    return f"{p}/{n}" + (f" ({','.join(bad)})" if bad else "")


def format_table(r: ProofReport) -> str:
    lines = []
    hdr = (f"{'invariant':26} {'scope':6} {'symbolic':9} {'bounded':9} {'reachable':24} "
           f"{'bmc':4} status")
    lines.append(hdr)
    lines.append("-" * len(hdr))
    for name, row in r.invariants.items():
        reach = ",".join(f"{k}:{v['result']}" for k, v in row["reachable"].items()) or "-"
        bmc_d = "-" if row["bmc_depth"] is None else str(row["bmc_depth"])
        lines.append(f"{name:26} {row['scope']:6} {_cell(row['induction']):9} "
                     f"{_cell(row['induction_bounded']):9} {reach:24} {bmc_d:4} {row['status']}")
    lines.append("")
    lines.append(f"{'safety property':42} {'claims':7} result")
    for p, row in r.safety.items():
        n = len(row["claims"])
        ok = sum(c["result"] == PROVED for c in row["claims"])
        lines.append(f"{p:42} {f'{ok}/{n}':7} {row['result']}")
    lines.append("")
    layers = list(r.exploration)
    lines.append(f"{'transition':14} {'z3 enabled (bounded/symbolic)':30} fired "
                 + "/".join(layers))
    for name, row in r.transitions.items():
        nv = "/".join(row["nonvacuity"].get(m, "-") for m in ("bounded", "symbolic"))
        fired = "/".join(str(row["fired"].get(k, 0)) for k in layers)
        lines.append(f"{name:14} {nv:30} {fired}")
    lines.append("")
    lines.append(f"{'request transition':18} fired " + "/".join(
        next(iter(r.request_transitions.values()), {}).get("fired", {})))
    for name, row in r.request_transitions.items():
        lines.append(f"{name:18} " + "/".join(str(v) for v in row["fired"].values()))
    lines.append("")
    for layer, e in r.exploration.items():
        bound = e["config"].get("max_depth")
        extent = (f"complete={e['complete']}" if bound is None else
                  f"every state to depth {bound}: {e['complete']}, "
                  f"{e.get('frontier', 0)} at the bound")
        lines.append(f"explorer[{layer}]: {e['states']} states, {e['edges']} edges, depth "
                     f"{e['depth']}, {extent}, {e['time_s']}s")
        seen = {k: v for k, v in (e.get("scenarios") or {}).items() if v}
        if seen:
            lines.append("  passed through: " + "; ".join(f"{k} ({v:,} edges)"
                                                         for k, v in seen.items()))
        norm = e.get("normalization") or {}
        own = [k for k in e["violations"] if k not in r.invariants]
        lines.append(f"  epoch normalization lemma: "
                     f"{'proved' if norm.get('ok') else 'NOT PROVED' if norm else 'not run'}"
                     f" ({norm.get('queries', 0)} z3 queries); readers ghost: "
                     f"{e.get('readers_checked', 0)} FREE blocks checked, "
                     f"{'violated' if '<readers>' in own else 'no block freed while read'}")
    b = r.bmc
    lines.append(f"bmc: clean to depth {b['depth']} ({b['time_s']}s; per depth "
                 f"{b['per_depth_s']}; stop: {b['stopped'] or '-'})")
    t = r.totals
    lines.append(f"obligations: {t['proved']}/{t['obligations']} proved, "
                 f"{t['counterexample']} counterexample(s), {t['unknown']} unknown; safety "
                 f"claims {t['safety_proved']}/{t['safety_claims']}; request layer "
                 f"{t.get('request_proved', 0)}/{t.get('request_obligations', 0)} proved, "
                 f"{t.get('request_walk_steps', 0)} walk steps; host tier "
                 f"{t.get('host_proved', 0)}/{t.get('host_obligations', 0)} proved, "
                 f"{t.get('host_transitions_enabled', 0)}/{t.get('host_transitions', 0)} "
                 f"transitions enabled; total {t['time_s']}s")
    lines.append("assumptions:")
    lines += [f"  - {a}" for a in r.assumptions]
    if r.failures:
        lines.append("FAILURES:")
        lines += [f"  {f}" for f in r.failures]
    lines.append("OK" if r.ok else "NOT OK")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m pagedkv.proofs.runner")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("-v", "--verbose", action="store_true")
    a = ap.parse_args(argv)
    rep = run_all(quick=a.quick, progress=(lambda m: print(m, file=sys.stderr))
                  if a.verbose else None)
    print(rep.table())
    if a.json:
        with open(a.json, "w") as fh:
            fh.write(rep.to_json(indent=1))
    return 0 if rep.ok else 1


if __name__ == "__main__":
    sys.exit(main())
