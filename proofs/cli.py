"""``pagedkv verify``: prove the spec, check the code against it, and print the invariant report.

Runs the z3 proofs and the reachability search (proofs.runner), CrossHair on the pure core,
the planted-bug canaries, a fixed-seed stateful refinement campaign, and a short serving
workload through a checked allocator; reads the committed mutation report; prints one table
and writes verify-report.json and verify-report.md. Exit code 1 when anything fails.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import re
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from functools import partial
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from pagedkv.spec import INVARIANTS, REQUEST_INVARIANTS, spec_digest
from pagedkv.spec.host_invariants import HOST_INVARIANTS

FULL_STEPS = 80_000
QUICK_STEPS = 8_000
HOST_STEPS = 10_000  # the host tier's campaign (``proofs.host_refinement``)
QUICK_HOST_STEPS = 2_000


def _say(msg: str) -> None:
    from tqdm import tqdm

    tqdm.write(f"[verify] {msg}", file=sys.stderr)


def _guarded(name: str, fn: Callable[[], dict]) -> dict:
    """Run one part; an exception becomes a failed part with its traceback, not a crash."""
    started = time.perf_counter()
    try:
        result = fn()
    except Exception as exc:  # noqa: BLE001 - reported, and the verdict fails
        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}",
                  "traceback": traceback.format_exc()}
    result.setdefault("elapsed_s", round(time.perf_counter() - started, 2))
    _say(f"{name}: {'ok' if result.get('ok') else 'FAILED'} ({result['elapsed_s']} s)")
    return result


# ---- the parts -----------------------------------------------------------------------------
def run_proofs(quick: bool) -> dict:
    from pagedkv.proofs.runner import run_all

    chatty = ("induction", "safety", "non-vacuity", "bmc: depth")
    report = run_all(quick=quick, progress=lambda m: None if m.startswith(chatty) else _say(m))
    return report.to_dict()


def run_crosshair_part(quick: bool) -> dict:
    from pagedkv.proofs.crosshair_check import run_crosshair

    result = run_crosshair(quick=quick, progress=None)
    result.pop("raw_output", None)
    return result


def run_canaries_part() -> dict:
    from pagedkv.proofs.canaries import run_canaries

    return run_canaries(progress=_say)


CAMPAIGN_SHARDS = 2  # fixed, so the seeds and figures are the same on any machine


def campaign_shard(target_steps: int, shard: int = 0, shards: int = 1, step_count: int = 100,
                   examples: int = 200) -> dict:
    """The refinement state machine on fixed seeds ``shard``, ``shard + shards``, ... until
    ``target_steps`` steps (a seed runs at most ``examples`` examples of at most ``step_count``
    steps, fewer when fewer steps remain); the raw outcome counts (see ``merge_campaign``)."""
    from hypothesis import HealthCheck, settings
    from hypothesis import seed as fixed_seed
    from hypothesis.stateful import run_state_machine_as_test

    from pagedkv.proofs import refinement

    refinement.CAMPAIGN.clear()
    seeds: list[int] = []
    while (left := target_steps - refinement.CAMPAIGN[refinement.STEPS]) > 0:
        seed = shard + shards * len(seeds)
        seeds.append(seed)
        runs = min(examples, -(-left // step_count))

        @fixed_seed(seed)
        def machine() -> refinement.AllocatorMachine:
            return refinement.AllocatorMachine()

        before = refinement.CAMPAIGN[refinement.STEPS]
        run_state_machine_as_test(machine, settings=settings(
            max_examples=runs, stateful_step_count=step_count, database=None,
            deadline=None, suppress_health_check=list(HealthCheck),
        ))
        if refinement.CAMPAIGN[refinement.STEPS] == before:
            raise RuntimeError(f"campaign seed {seed} ran no steps")
        _say(f"stateful campaign: seed {seed} done, "
             f"{refinement.CAMPAIGN[refinement.STEPS]:,} steps in this shard")
    return {"ok": True, "seeds": seeds, "counts": dict(refinement.CAMPAIGN)}


def merge_campaign(shards: list[dict], target_steps: int) -> dict:
    """One campaign part from its shards' raw counts; a failed shard fails the part."""
    from collections import Counter

    from pagedkv.proofs import refinement

    failed = [s for s in shards if not s.get("ok")]
    if failed:
        return {k: v for k, v in failed[0].items() if k != "elapsed_s"}
    counts: Counter[str] = Counter()
    for s in shards:
        counts.update(s["counts"])
    steps = counts.pop(refinement.STEPS, 0)
    live = {k[len(refinement.LIVE):]: counts.pop(k) for k in list(counts)
            if k.startswith(refinement.LIVE)}
    return {"ok": steps >= target_steps, "steps": steps,
            "seeds": sorted(seed for s in shards for seed in s["seeds"]),
            "shards": len(shards), "live_every": refinement.LIVE_EVERY,
            "live_instances": live, "rules": _rule_table(dict(counts))}


def run_native_part(quick: bool) -> dict:
    """The native pool: its generated module compiled and self-checked against the
    interpreted spec, then the differential campaigns against BlockPool (the pool layer) and
    BlockAllocator (the native step path, ``NativeAllocator``). Skipped (ok) where numba is
    not installed: nothing native can run there."""
    try:
        import numba  # noqa: F401
    except ImportError:
        return {"ok": True, "skipped": "numba is not installed (pip install pagedkv[native])"}
    from pagedkv.allocator.native_pool import NativeUnavailable, native_module
    from pagedkv.proofs.native_allocator_refinement import run_native_allocator_campaign
    from pagedkv.proofs.native_refinement import run_native_campaign

    try:
        native_module()
    except NativeUnavailable as exc:
        return {"ok": False, "error": str(exc)}
    out = run_native_campaign(range(4 if quick else 16))
    out["allocator"] = run_native_allocator_campaign(range(4 if quick else 12))
    return out


def run_host_campaign_part(target_steps: int) -> dict:
    from pagedkv.proofs.host_refinement import run_host_campaign

    return run_host_campaign(target_steps)


def _rule_table(counts: dict[str, int]) -> dict[str, dict]:
    """Per rule: how often it ran, and the share of each outcome."""
    rules: dict[str, dict] = {}
    for label, n in counts.items():
        rule, _, outcome = label.partition(":")
        if not outcome:
            rule, _, outcome = label.partition(" ")
        entry = rules.setdefault(rule.strip(), {"calls": 0, "outcomes": {}})
        entry["calls"] += n
        entry["outcomes"][outcome.strip() or "ok"] = n
    for entry in rules.values():
        entry["outcomes"] = {k: round(v / entry["calls"], 3)
                             for k, v in sorted(entry["outcomes"].items())}
    return dict(sorted(rules.items()))


def run_workload_part(quick: bool) -> dict:
    from tqdm import tqdm

    from pagedkv.proofs.workload import run_workload

    steps = 150 if quick else 600
    with tqdm(total=steps, desc="serving workload", unit="step", mininterval=2,
              file=sys.stderr) as bar:
        return run_workload(steps=steps, progress=bar.update).to_dict()


SOAK_OPS = 1_000_000
QUICK_SOAK_OPS = 100_000


def run_soak_part(quick: bool) -> dict:
    """The random serving soak with the in-flight oracle (proofs/soak.py), fixed seed."""
    from pagedkv.proofs.soak import run_soak

    ops = QUICK_SOAK_OPS if quick else SOAK_OPS
    started = time.perf_counter()
    figures = run_soak(ops, seed=0)
    elapsed = time.perf_counter() - started
    return {"ok": True, "ops": ops, "seed": 0, "ops_per_s": round(ops / elapsed),
            "figures": figures}


def mutation_part() -> dict:
    from pagedkv.proofs.mutation import load_mutation_report

    summary = load_mutation_report()
    if summary is None:
        return {"ok": False, "error": "no committed mutation report"}
    summary = dict(summary)
    summary.setdefault("ok", True)
    summary["killed_by_invariant"] = _kills_per_invariant(Path(summary["path"]))
    summary["stale_files"] = _changed_since(Path(summary["path"]), summary.get("commit"))
    return summary


def _changed_since(report: Path, commit: str | None) -> list[str] | None:
    """The mutated files that differ from the commit the report ran at (None: unknown, e.g.
    an installed wheel without git)."""
    targets = [t["path"] for t in json.loads(report.read_text()).get("targets", [])]
    if not commit or not targets:
        return None
    try:
        out = subprocess.run(["git", "diff", "--name-only", commit, "--", *targets],
                             cwd=Path(__file__).resolve().parent.parent, capture_output=True,
                             text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.split() if out.returncode == 0 else None


def _kills_per_invariant(path: Path) -> dict[str, int]:
    """How many killed mutants were killed by evidence that names each invariant."""
    mutants = json.loads(path.read_text()).get("mutants", [])
    killers = [m.get("killer") or "" for m in mutants if m.get("status") in ("killed", "timeout")]
    return {name: sum(re.search(rf"\b{name}\b", k) is not None for k in killers)
            for name in {**INVARIANTS, **REQUEST_INVARIANTS}}


# ---- the report ----------------------------------------------------------------------------
def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for pkg in ("pagedkv", "z3-solver", "hypothesis", "crosshair-tool", "numba", "numba-cuda",
                "numpy", "torch"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def _induction(entry: dict) -> str:
    results = [r["result"] for mode in ("induction", "induction_bounded")
               for r in entry.get(mode, {}).values()]
    if not results:
        return "n/a (tested)"
    proved = sum(r == "proved" for r in results)
    return f"{'proved' if proved == len(results) else 'FAILED'} {proved}/{len(results)}"


def _reachable(entry: dict) -> str:
    layers = entry.get("reachable", {})
    if not layers:
        return "-"
    bad = [k for k, v in layers.items() if v.get("result") != "holds"]
    states = sum(v.get("states", 0) for v in layers.values())
    return f"{'FAILED ' + ','.join(bad) if bad else 'holds'} ({states:,})"


def _mentions(part: dict, key: str, name: str) -> list[str]:
    items = part.get(key) or {}
    if isinstance(items, dict):
        items = [dict(v, name=k) if isinstance(v, dict) else {"name": k, "v": v}
                 for k, v in items.items()]
    return [str(i.get("name")) for i in items if name in json.dumps(i, default=str)]


def build_rows(parts: dict[str, dict]) -> list[dict[str, str]]:
    proofs = parts.get("proofs", {})
    campaign = parts.get("campaign", {})
    crosshair = parts.get("crosshair", {})
    spec_targets = {k: v for k, v in (crosshair.get("functions") or {}).items()
                    if "crosshair_targets" in k}
    ch_status = "-"
    if spec_targets:
        conds = [c["status"] for f in spec_targets.values() for c in f.get("conditions", [])]
        good = sum(s.startswith(("confirmed", "allowlisted")) for s in conds)
        ch_status = f"{good}/{len(conds)} confirmed"
    host_campaign = parts.get("host_campaign", {})
    rows = []
    for name, inv in {**INVARIANTS, **REQUEST_INVARIANTS, **HOST_INVARIANTS}.items():
        host = name in HOST_INVARIANTS
        entry = (proofs.get("invariants") or {}).get(name, {})
        canaries = _mentions(parts.get("canaries", {}), "canaries", name)
        mutation = parts.get("mutation", {})
        mutants = mutation.get("killed_by_invariant", {}).get(name)
        stale = " (stale)" if mutation.get("stale_files") else ""
        rows.append({
            "invariant": name,
            "property": inv.property,
            "z3 induction": _induction(entry) if entry else "not run",
            "reachable states": "-" if host else _reachable(entry) if entry else "not run",
            "stateful steps": (
                (f"{host_campaign.get('steps', 0):,} ok (host tier)" if host_campaign.get("ok")
                 else "FAILED" if host_campaign else "not run") if host else
                f"{campaign.get('steps', 0):,} ok, "
                f"{campaign.get('live_instances', {}).get(name, 0):,} live"
                if campaign.get("ok") else "FAILED" if campaign else "not run"),
            "CrossHair (spec)": (ch_status if inv.scope in ("block", "launch") and not host
                                 else "-"),
            "canaries": ", ".join(canaries) or "-",
            "mutants killed": f"{mutants}{stale}" if mutants is not None else "-",
        })
    return rows


def render_table(rows: list[dict[str, str]]) -> str:
    cols = list(rows[0])
    widths = {c: max(len(c), *(len(r[c]) for r in rows)) for c in cols}
    line = "  ".join(f"{c:<{widths[c]}}" for c in cols)
    out = [line, "-" * len(line)]
    out += ["  ".join(f"{r[c]:<{widths[c]}}" for c in cols) for r in rows]
    return "\n".join(out)


def render_summary(parts: dict[str, dict]) -> str:
    lines = []
    p = parts.get("proofs", {})
    if p.get("totals"):
        t = p["totals"]
        lines.append(
            f"z3: {t.get('proved')}/{t.get('obligations')} induction obligations proved, "
            f"{t.get('safety_proved')}/{t.get('safety_claims')} safety claims; reachable "
            f"states {t.get('reachable_states')}; BMC clean to depth {t.get('bmc_depth')}"
        )
        lines.append(
            f"z3, request layer: {t.get('request_proved')}/{t.get('request_obligations')} "
            f"table-invariant obligations proved (unbounded); {t.get('request_walk_steps', 0):,} "
            "random-walk steps through the request transitions")
    for name, prop in (p.get("safety") or {}).items():
        lines.append(f"  safety: {name}: {prop.get('result')}")
    for layer, e in (p.get("exploration") or {}).items():
        norm = e.get("normalization") or {}
        own = [k for k in (e.get("violations") or {}) if k.startswith("<")]
        lines.append(
            f"  explorer[{layer}]: {e.get('states', 0):,} states; epoch normalization "
            f"{'proved a bisimulation (z3)' if norm.get('ok') else 'NOT PROVED'}; readers "
            f"ghost: {e.get('readers_checked', 0):,} FREE blocks checked"
            + (f"; FAILED: {', '.join(own)}" if own else ", none freed while a launch that "
               "may read it is in flight"))
    for name, tr in (p.get("transitions") or {}).items():
        lines.append(f"  non-vacuity: {name}: {tr.get('status', tr.get('result', tr))}"
                     if not isinstance(tr, dict) or "status" in tr or "result" in tr
                     else f"  non-vacuity: {name}: enabled")
    c = parts.get("crosshair", {})
    if c.get("totals"):
        t = c["totals"]
        lines.append(f"CrossHair: {t.get('confirmed')} confirmed, {t.get('allowlisted')} "
                     f"allowlisted, {t.get('counterexample')} counterexamples, "
                     f"{t.get('unknown')} unknown")
    k = parts.get("canaries", {})
    for name, can in (k.get("canaries") or {}).items():
        lines.append(f"canary {name}: {'caught' if can.get('caught') else 'MISSED'} by "
                     f"{can.get('by', '?')}")
    camp = parts.get("campaign", {})
    if camp.get("rules"):
        lines.append(f"stateful campaign: {camp['steps']:,} steps, seeds {camp['seeds']}")
        for rule, e in camp["rules"].items():
            shares = ", ".join(f"{k} {v:.0%}" for k, v in e["outcomes"].items())
            lines.append(f"  {rule:<24} {e['calls']:>7,} calls: {shares}")
    hc = parts.get("host_campaign", {})
    if hc.get("rules"):
        lines.append(f"host tier campaign: {hc['steps']:,} steps, seeds {hc['seeds']}; "
                     + ", ".join(f"{k} {v:,}" for k, v in hc["rules"].items()))
    nat = parts.get("native_pool", {})
    if nat.get("skipped"):
        lines.append(f"native pool: skipped, {nat['skipped']}")
    elif nat.get("ops"):
        lines.append(f"native pool: generated module self-checked against the spec; "
                     f"differential campaign against BlockPool: {nat['ops']:,} operations on "
                     f"seeds {nat['seeds'][0]}-{nat['seeds'][1] - 1}, the same moves")
        al = nat.get("allocator", {})
        if al.get("ops"):
            lines.append(f"native step path: differential campaign against BlockAllocator: "
                         f"{al['ops']:,} calls on seeds {al['seeds'][0]}-{al['seeds'][1] - 1},"
                         " the same results and states")
    w = parts.get("workload", {})
    if "steps" in w:
        lines.append(
            f"serving workload: {w['steps']} steps, {w['requests_finished']} finished, "
            f"{w['preemptions']} preemptions, {w['forks']} forks, "
            f"{w['copy_on_write_copies']} CoW copies, {w['invariant_scans']} invariant scans"
        )
    soak = parts.get("soak", {})
    if soak.get("ops"):
        fig = ", ".join(f"{k} {v:,}" for k, v in soak.get("figures", {}).items()
                        if isinstance(v, int) and k != "ops")
        lines.append(f"serving soak (seed {soak['seed']}): {soak['ops']:,} operations, no block "
                     f"of an in-flight launch handed out again; {fig}")
    m = parts.get("mutation", {})
    if "kill_rate" in m:
        stale = m.get("stale_files")
        fresh = ("STALE: changed since: " + ", ".join(stale) if stale
                 else "unknown whether stale (no git)" if stale is None
                 else "current: no mutated file changed since")
        lines.append(f"mutation (committed report, commit {m.get('commit', '?')}; {fresh}): "
                     f"kill rate {m['kill_rate']}, {m.get('killed')} killed, "
                     f"{m.get('equivalent')} equivalent, {m.get('survived')} survived"
                     + (f", {m['pending']} not run yet (pending)" if m.get("pending") else ""))
    for name, part in parts.items():
        if part.get("error"):
            lines.append(f"{name}: ERROR {part['error']}")
    return "\n".join(lines)


def code_check_jobs(quick: bool, campaign_steps: int) -> dict[str, Callable[[], dict]]:
    """The checks of the code against the spec; they share nothing, so each can run in its own
    process: the campaign's shards, the canaries, the host tier's campaign, the workload and
    the soak."""
    share = -(-campaign_steps // CAMPAIGN_SHARDS)
    jobs: dict[str, Callable[[], dict]] = {
        f"campaign shard {k}": partial(campaign_shard, share, k, CAMPAIGN_SHARDS)
        for k in range(CAMPAIGN_SHARDS)}
    jobs |= {
        "canaries": run_canaries_part,
        "host_campaign": partial(run_host_campaign_part,
                                 QUICK_HOST_STEPS if quick else HOST_STEPS),
        "workload": partial(run_workload_part, quick),
        "native_pool": partial(run_native_part, quick),
        "soak": partial(run_soak_part, quick),
    }
    return jobs


def run_parts(jobs: dict[str, Callable[[], dict]], workers: int | None = None) -> dict:
    """Each job guarded (see ``_guarded``) in a pool of worker processes (spawned: nothing of
    this process's state is inherited), by default one per core."""
    workers = workers or max(1, min(len(jobs), os.cpu_count() or 1))
    _say(f"{', '.join(jobs)}: in {workers} worker processes")
    with ProcessPoolExecutor(max_workers=workers,
                             mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {name: pool.submit(_guarded, name, fn) for name, fn in jobs.items()}
        return {name: _result(name, f) for name, f in futures.items()}


def run_code_checks(quick: bool, campaign_steps: int) -> dict:
    done = run_parts(code_check_jobs(quick, campaign_steps))
    shards = [done.pop(f"campaign shard {k}") for k in range(CAMPAIGN_SHARDS)]
    campaign = merge_campaign(shards, campaign_steps)
    campaign["elapsed_s"] = max(s["elapsed_s"] for s in shards)
    return {"canaries": done.pop("canaries"), "campaign": campaign, **done}


def _result(name: str, future: Future) -> dict:
    """A worker's part; a worker that died (not an exception in the part) fails the part."""
    try:
        return future.result()
    except Exception as exc:  # noqa: BLE001 - reported, and the verdict fails
        return {"ok": False, "error": f"worker for {name} died: {type(exc).__name__}: {exc}",
                "elapsed_s": 0.0}


def verify(quick: bool = False, steps: int | None = None, out_dir: Path = Path(".")) -> int:
    started = time.time()
    parts: dict[str, dict] = {}
    # CrossHair runs in its own subprocesses: start it first, beside the z3 proofs.
    _say("CrossHair on the pure core (in the background), z3 proofs and reachability")
    with ThreadPoolExecutor(max_workers=1) as pool:
        crosshair = pool.submit(_guarded, "crosshair", lambda: run_crosshair_part(quick))
        parts["proofs"] = _guarded("proofs", lambda: run_proofs(quick))
        parts["crosshair"] = crosshair.result()
    parts.update(run_code_checks(quick, steps or (QUICK_STEPS if quick else FULL_STEPS)))
    parts["mutation"] = _guarded("mutation report", mutation_part)
    ok = all(p.get("ok") for p in parts.values())
    rows = build_rows(parts)
    table = render_table(rows)
    summary = render_summary(parts)
    assumptions = parts["proofs"].get("assumptions", [])
    report = {
        "ok": ok,
        "quick": quick,
        "spec_digest": spec_digest(),
        "versions": _versions(),
        "elapsed_s": round(time.time() - started, 1),
        "assumptions": assumptions,
        "rows": rows,
        "parts": parts,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "verify-report.json").write_text(json.dumps(report, indent=2, default=str))
    (out_dir / "verify-report.md").write_text(_markdown(report, table, summary))
    print(table)
    print()
    print(summary)
    print()
    print(f"spec sha256 {report['spec_digest'][:16]}…  {report['elapsed_s']} s  "
          f"{'VERIFIED' if ok else 'FAILED'}")
    return 0 if ok else 1


def _markdown(report: dict, table: str, summary: str) -> str:
    cols = list(report["rows"][0])
    md = ["# pagedkv verify report", "",
          "**Proved** (z3, about the spec): every block/hash/holder/launch/pool invariant is "
          "inductive over every transition, for an unbounded pool and launch clock and for a "
          "3-block / 3-holder pool with launches 0..3; the safety claims (with the readers "
          "ghost: no block freed while a launch that may read it is in flight) and "
          "non-vacuity of every transition; the table invariants over every request "
          "transition, unbounded. **Tested** (about the code): that the allocator implements "
          "the spec — the stateful refinement campaign (each call against its program of "
          "request transitions in `spec/calls.py`, both directions, and each pool transition "
          "against the pool model), checked mode, the serving soak with its in-flight oracle, "
          "CrossHair on the pure core, canaries and the mutation run.", "",
          f"- verdict: **{'verified' if report['ok'] else 'FAILED'}**"
          f"{' (quick)' if report['quick'] else ''}",
          f"- spec sha256: `{report['spec_digest']}`",
          "- versions: " + ", ".join(f"{k} {v}" for k, v in report["versions"].items()),
          f"- elapsed: {report['elapsed_s']} s", "",
          "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    md += ["| " + " | ".join(r[c] for c in cols) + " |" for r in report["rows"]]
    md += ["", "## Details", "", "```", summary, "```", "", "## Assumptions", ""]
    md += [f"- {a}" for a in report["assumptions"]]
    return "\n".join(md) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pagedkv", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    v = sub.add_parser("verify", help="run every proof and check; print the invariant report")
    v.add_argument("--quick", action="store_true",
                   help="smaller budgets: about 4 minutes on 2 cores (measured 256 s), "
                        "against about 18 for the full run")
    v.add_argument("--steps", type=int, default=None, help="stateful campaign steps")
    v.add_argument("--out-dir", type=Path, default=Path("."), help="where to write the reports")
    args = parser.parse_args(argv)
    if args.command == "verify":
        return verify(quick=args.quick, steps=args.steps, out_dir=args.out_dir)
    return 2  # pragma: no cover


if __name__ == "__main__":
    sys.exit(main())
