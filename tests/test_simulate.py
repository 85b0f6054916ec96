"""`pagedkv simulate`: presets, traces, bad records, the KV check and the planted bugs it
catches, the JSON report and the plot."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pagedkv.cli import simulate as sim
from pagedkv.cli import workloads
from pagedkv.cli.main import main
from pagedkv.cli.workloads import BadTrace

ROOT = Path(__file__).resolve().parent.parent
# Small and fast: lengths x 0.05, 4-token blocks, a pool that fills up.
SMALL = ["--requests", "12", "--length-scale", "0.05", "--num-blocks", "64", "--block-size",
         "4", "--token-budget", "64", "--max-running", "8", "--quiet"]


def run(argv: list[str], tmp_path: Path, capsys) -> tuple[int, dict, str]:
    out = tmp_path / "report.json"
    rc = main(["simulate", *argv, "--json", str(out)])
    text = capsys.readouterr().out
    return rc, (json.loads(out.read_text()) if out.exists() else {}), text


def write_trace(path: Path, records: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n"
                            for r in records))
    return path


def small_workload(preset: str = "mixed", n: int = 10, seed: int = 0) -> workloads.Workload:
    return workloads.preset_workload(preset, n, seed=seed, length_scale=0.05, max_len=252)


SMALL_CFG = dict(num_blocks=64, block_size=4, token_budget=64, max_running=8)


# ---- presets -------------------------------------------------------------------------------
@pytest.mark.parametrize("preset", workloads.PRESETS)
def test_every_preset_runs_to_completion(preset, tmp_path, capsys):
    rc, rep, text = run(["--preset", preset, *SMALL], tmp_path, capsys)
    assert rc == 0
    assert rep["workload"]["source"] == f"preset:{preset}"
    assert rep["finished"] == rep["workload"]["requests"] == 12 and rep["rejected"] == 0
    assert rep["steps"] > 0 and rep["tokens"]["scheduled"] > 0
    assert 2 <= rep["workload"]["tenants"] <= 4  # salts per tenant
    calls = rep["allocator"]["calls"]
    assert calls["publish"]["n"] == calls["complete"]["n"] == rep["steps"]
    assert calls["free"]["n"] == 12
    assert rep["allocator"]["seconds"] > 0 and rep["allocator"]["tokens_per_s"] > 0
    occ = rep["occupancy"]
    assert 0 < occ["peak_held_blocks"] <= rep["config"]["usable_blocks"] == 63
    # every turn but the last decodes tokens after its prefill; outputs are sampled one a step
    outputs = rep["tokens"]["decode"] + 12
    assert outputs <= 12 * rep["workload"]["output_tokens"]["max"]
    pc = rep["prefix_cache"]
    assert 0 <= pc["hits"] <= pc["queries"] and pc["requests"] == 12
    for line in ("allocator (front-door calls only)", "prefix cache: hit rate",
                 "paged vs contiguous", "admission headroom", "tail waste", "swap: off"):
        assert line in text


def test_presets_have_their_shape():
    """chat: shared system prompts and follow-ups that extend the previous turn; rag: long
    prompts, short outputs; agents: long chains; four tenants, salts per tenant."""
    chat = workloads.preset_workload("chat", 80, seed=1)
    follow = [r for r in chat.requests if r.parent is not None]
    assert follow
    by_id = {r.rid: r for r in chat.requests}
    for r in follow:
        p = by_id[r.parent]
        head = np.concatenate([p.prompt, p.output])
        assert np.array_equal(r.prompt[: len(head)], head) and r.salt == p.salt
    assert {r.salt for r in chat.requests} == {f"tenant-{k}" for k in range(4)}
    rag = workloads.preset_workload("rag", 80, seed=1).summary()
    agents = workloads.preset_workload("agents", 80, seed=1)
    assert rag["prompt_tokens"]["mean"] > 3 * rag["output_tokens"]["mean"]
    assert agents.summary()["follow_ups"] > 40
    mixed = workloads.preset_workload("mixed", 120, seed=1)
    assert {r.kind for r in mixed.requests} == {"chat", "rag", "agents"}
    for r in mixed.requests:
        assert r.prompt_len + r.output_len <= 8192


def test_same_seed_same_run_other_seed_other_run():
    a = sim.simulate(small_workload(seed=3), sim.SimConfig(**SMALL_CFG)).report
    b = sim.simulate(small_workload(seed=3), sim.SimConfig(**SMALL_CFG)).report
    c = sim.simulate(small_workload(seed=4), sim.SimConfig(**SMALL_CFG)).report
    keys = ("steps", "tokens", "occupancy", "prefix_cache", "preemptions", "concurrency")
    assert all(a[k] == b[k] for k in keys)
    assert any(a[k] != c[k] for k in keys)


# ---- traces --------------------------------------------------------------------------------
def test_trace_replay_prefix_hits_only_within_a_salt(tmp_path, capsys):
    """b repeats a's 12-token prefix (3 blocks of 4) after a finished: 12 hit tokens; c has the
    same prompt as b under another salt: no hit."""
    shared = list(range(100, 112))
    trace = write_trace(tmp_path / "t.jsonl", [
        {"arrival": 0, "prompt_tokens": shared + [1, 2, 3], "output_len": 2, "salt": "x",
         "id": "a"},
        "",
        {"arrival": 40, "prompt_tokens": shared + [7, 8], "output_len": 3, "salt": "x"},
        {"arrival": 80, "prompt_tokens": shared + [7, 8], "output_len": 1, "salt": "y"},
    ])
    rc, rep, text = run(["--trace", str(trace), "--num-blocks", "32", "--block-size", "4",
                         "--quiet"], tmp_path, capsys)
    assert rc == 0
    assert rep["finished"] == 3 and rep["workload"]["source"] == f"trace:{trace}"
    pc = rep["prefix_cache"]
    assert pc["hits"] == 12 and pc["queries"] == 15 + 14 + 14
    assert pc["prefix_hit_tokens"] == 12
    assert rep["workload"]["tenants"] == 2
    assert rep["tokens"]["prefill"] == 15 + 2 + 14
    assert rep["tokens"]["decode"] == 1 + 2 + 0
    assert "trace:" in text


def test_trace_prompt_len_and_requests_limit(tmp_path):
    trace = write_trace(tmp_path / "t.jsonl", [
        {"arrival": 0.7, "prompt_len": 9, "output_len": 2},
        {"arrival": 3, "prompt_len": 5, "output_len": 1, "salt": None, "id": 7},
        {"arrival": 3, "prompt_len": 5, "output_len": 1},
    ])
    wl = workloads.read_trace(trace, seed=5, limit=2)
    assert [r.rid for r in wl.requests] == ["line1", "7"]
    assert [r.arrival for r in wl.requests] == [0, 3]
    assert [r.prompt_len for r in wl.requests] == [9, 5]
    again = workloads.read_trace(trace, seed=5)
    assert np.array_equal(again.requests[0].prompt, wl.requests[0].prompt)
    other = workloads.read_trace(trace, seed=6)
    assert not np.array_equal(other.requests[0].prompt, wl.requests[0].prompt)


def test_a_request_longer_than_the_pool_is_rejected(tmp_path, capsys):
    trace = write_trace(tmp_path / "t.jsonl", [
        {"arrival": 0, "prompt_len": 200, "output_len": 2},
        {"arrival": 0, "prompt_len": 10, "output_len": 2},
    ])
    rc, rep, text = run(["--trace", str(trace), "--num-blocks", "16", "--block-size", "4",
                         "--quiet"], tmp_path, capsys)
    assert rc == 0
    assert rep["rejected"] == 1 and rep["finished"] == 1 and rep["rejected_ids"] == ["line1"]
    assert "1 rejected" in text


BAD_RECORDS = [
    ("[1, 2]", "must be a JSON object"),
    ("{not json", "not valid JSON"),
    ('{"prompt_len": 4, "output_len": 2}', "'arrival' is missing"),
    ('{"arrival": -1, "prompt_len": 4, "output_len": 2}', "'arrival' must be"),
    ('{"arrival": true, "prompt_len": 4, "output_len": 2}', "'arrival' must be"),
    ('{"arrival": 0, "output_len": 2}', "exactly one of"),
    ('{"arrival": 0, "prompt_len": 4, "prompt_tokens": [1], "output_len": 2}', "exactly one"),
    ('{"arrival": 0, "prompt_tokens": [], "output_len": 2}', "non-empty list"),
    ('{"arrival": 0, "prompt_tokens": [1, "a"], "output_len": 2}', "'prompt_tokens'[1]"),
    ('{"arrival": 0, "prompt_tokens": [1, -3], "output_len": 2}', "'prompt_tokens'[1]"),
    ('{"arrival": 0, "prompt_len": 0, "output_len": 2}', "'prompt_len' must be"),
    ('{"arrival": 0, "prompt_len": 2.5, "output_len": 2}', "'prompt_len' must be"),
    ('{"arrival": 0, "prompt_len": 4}', "'output_len' is missing"),
    ('{"arrival": 0, "prompt_len": 4, "output_len": 0}', "'output_len' must be"),
    ('{"arrival": 0, "prompt_len": 4, "output_len": 2, "salt": 3}', "'salt' must be"),
    ('{"arrival": 0, "prompt_len": 4, "output_len": 2, "colour": 1}', "unknown key"),
    ('{"arrival": 0, "prompt_len": 4, "output_len": 2, "id": "line1"}', "used by an earlier"),
]


@pytest.mark.parametrize("line, message", BAD_RECORDS)
def test_bad_trace_records_exit_2_naming_the_line(line, message, tmp_path, capsys):
    good = '{"arrival": 0, "prompt_len": 4, "output_len": 2}'
    trace = tmp_path / "bad.jsonl"
    trace.write_text(f"{good}\n\n{line}\n{good}\n")
    assert main(["simulate", "--trace", str(trace), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "pagedkv simulate: error:" in err and "line 3" in err and message in err
    with pytest.raises(BadTrace, match="line 3"):
        workloads.read_trace(trace)


def test_missing_and_empty_traces(tmp_path, capsys):
    assert main(["simulate", "--trace", str(tmp_path / "nope.jsonl"), "--quiet"]) == 2
    assert "cannot read it" in capsys.readouterr().err
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n  \n")
    assert main(["simulate", "--trace", str(empty), "--quiet"]) == 2
    assert "no records" in capsys.readouterr().err


def test_bad_trace_exits_2_in_a_real_process(tmp_path):
    trace = tmp_path / "bad.jsonl"
    trace.write_text('{"arrival": 0, "prompt_len": 4, "output_len": 2}\n'
                     '{"arrival": 0, "prompt_len": "four", "output_len": 2}\n')
    proc = subprocess.run([sys.executable, "-m", "pagedkv.cli", "simulate", "--trace",
                           str(trace), "--quiet"], capture_output=True, text=True, cwd=ROOT,
                          timeout=300, check=False)
    assert proc.returncode == 2
    assert "line 2" in proc.stderr and "'prompt_len'" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("argv, message", [
    (["--preset", "chat", "--trace", "t.jsonl"], "not both"),
    (["--host-blocks", "8"], "--host-blocks sizes the host tier"),
    (["--preempt", "swap", "--host-blocks", "0"], "--host-blocks must be"),
    (["--preempt", "swap", "--dtype", "fp8"], "--preempt swap need"),
    (["--requests", "0"], "--requests"),
    (["--num-blocks", "1"], "--num-blocks"),
    (["--block-size", "0"], "--block-size"),
    (["--heads", "3"], "multiple of --kv-heads"),
    (["--kv", "--dtype", "fp8"], "--kv and --preempt swap need"),
    (["--kv-tolerance", "0"], "--kv-tolerance"),
    (["--rate", "-1"], "--rate"),
    (["--length-scale", "nan"], "--length-scale"),
])
def test_bad_arguments_exit_2(argv, message, capsys):
    assert main(["simulate", *argv, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and message in err


# ---- preemption, occupancy, paged vs contiguous ---------------------------------------------
def test_a_small_pool_preempts_by_recompute_and_recovers():
    wl = workloads.preset_workload("agents", 12, seed=2, length_scale=0.05, max_len=100)
    res = sim.simulate(wl, sim.SimConfig(num_blocks=40, block_size=4, token_budget=64,
                                         max_running=8))
    rep = res.report
    assert rep["finished"] == 12
    assert rep["preemptions"]["recompute"] > 0 and rep["preemptions"]["recomputed_tokens"] > 0
    assert rep["preemptions"]["swap"] is None and "swap" in rep["preemptions"]["swap_note"]
    assert rep["prefix_cache"]["preempted_requests"] > 0
    assert rep["occupancy"]["peak_fraction"] > 0.9  # the pool (39 usable blocks) filled up
    assert rep["allocator"]["calls"]["preempt"]["n"] == rep["preemptions"]["recompute"]
    assert min(res.series["admission_headroom"]) == rep["admission_headroom"]["min_blocks"]
    assert rep["paged_vs_contiguous"]["paged_limited_by"] == "the pool"


AGENTS = dict(preset="agents", n=12, seed=2, length_scale=0.05, max_len=100)
TIGHT = dict(num_blocks=40, block_size=4, token_budget=64, max_running=8)


def _agents() -> workloads.Workload:
    a = AGENTS
    return workloads.preset_workload(a["preset"], a["n"], seed=a["seed"],
                                     length_scale=a["length_scale"], max_len=a["max_len"])


def test_preemption_by_swap_recomputes_nothing_and_the_kv_comes_back():
    """Side by side on one workload: recompute recomputes tokens; swap copies the victims'
    KV to the host tier and back, recomputes none, and every attention output still matches
    dense attention (the pool is NaN-poisoned, its blocks are reused meanwhile)."""
    by = {mode: sim.simulate(_agents(), sim.SimConfig(**TIGHT, kv=True, preempt=mode)).report
          for mode in ("recompute", "swap")}
    rc, sw = by["recompute"], by["swap"]
    assert rc["preemptions"]["recompute"] > 0 and rc["tokens"]["recomputed"] > 0
    swap = sw["preemptions"]["swap"]
    assert sw["preemptions"]["recompute"] == 0 and sw["tokens"]["recomputed"] == 0
    assert swap["swapped_out"] == swap["swapped_in"] > 0 and swap["tokens_swapped_in"] > 0
    assert swap["host_blocks"] == 40 and swap["host_full"] == swap["host_lost"] == 0
    assert sw["finished"] == rc["finished"] == 12
    assert sw["kv_check"]["passed"], sw["kv_check"]["failures"]
    calls = sw["allocator"]["calls"]
    assert calls["swap_out"]["n"] == calls["swap_in"]["n"] == swap["swapped_out"]
    assert sw["config"]["preempt"] == "swap" and sw["preemptions"]["swap_note"] is None


def test_a_swap_in_that_copies_nothing_is_caught_by_the_kv_check(monkeypatch):
    from pagedkv.engine.offload import Swapper

    monkeypatch.setattr(Swapper, "_load", lambda self, host_blocks, device_blocks: None)
    rep = sim.simulate(_agents(), sim.SimConfig(**TIGHT, kv=True, preempt="swap")).report
    assert rep["preemptions"]["swap"]["swapped_in"] > 0
    assert not rep["kv_check"]["passed"] and rep["kv_check"]["num_failures"] > 0


def test_swap_falls_back_to_recompute_when_the_host_tier_cannot_help(monkeypatch):
    """A host tier smaller than a victim: that one is recomputed. Host copies evicted before
    the swap-in (planted: the first swap-in finds them gone): forgotten, recomputed."""
    from pagedkv.engine.offload import SwapError, Swapper

    small = sim.simulate(_agents(), sim.SimConfig(**TIGHT, kv=True, preempt="swap",
                                                  host_blocks=2)).report
    assert small["preemptions"]["swap"]["host_full"] > 0
    assert small["preemptions"]["recompute"] == small["preemptions"]["swap"]["host_full"]
    assert small["kv_check"]["passed"] and small["finished"] == 12

    real, lost = Swapper.swap_in, []

    def first_one_lost(self, request):
        if not lost:
            lost.append(request.request_id)
            raise SwapError("planted: the host tier evicted its copies")
        return real(self, request)

    monkeypatch.setattr(Swapper, "swap_in", first_one_lost)
    rep = sim.simulate(_agents(), sim.SimConfig(**TIGHT, kv=True, preempt="swap")).report
    swap = rep["preemptions"]["swap"]
    assert lost and swap["host_lost"] == 1 and swap["swapped_in"] == swap["swapped_out"] - 1
    assert rep["tokens"]["recomputed"] > 0  # the forgotten one computed its tokens again
    assert rep["kv_check"]["passed"] and rep["finished"] == 12


def test_preempt_swap_on_the_command_line(tmp_path, capsys):
    rc, rep, text = run(["--preset", "agents", *SMALL, "--num-blocks", "40", "--preempt",
                         "swap", "--host-blocks", "24"], tmp_path, capsys)
    assert rc == 0 and rep["preemptions"]["swap"]["host_blocks"] == 24
    assert "preemption by swap" in text and "swapped out to 24 host blocks" in text


def test_series_match_the_allocator_stats():
    """Each series point is the allocator's stats() at the step's launch, without the null
    block: occupancy tokens = sum of the scheduled requests' table positions, etc."""
    res = sim.simulate(small_workload(), sim.SimConfig(**SMALL_CFG))
    s = res.series
    n = len(s["step"])
    assert n == res.report["steps"] and all(len(v) == n for v in s.values())
    assert s["step"] == sorted(s["step"])
    B = 4
    for i in range(n):
        assert s["held_blocks"][i] <= s["occupancy_blocks"][i]  # sharing saves blocks
        assert s["tail_waste_slots"][i] == s["occupancy_blocks"][i] * B - s[
            "occupancy_tokens"][i]
        assert 0 <= s["tail_waste_slots"][i] < B * max(1, s["running"][i])
        assert s["batch"][i] <= s["running"][i] <= 8
        assert s["held_blocks"][i] + 1 + s["admission_headroom"][i] == 64  # + the null block


def test_paged_vs_contiguous_figures(tmp_path, capsys):
    rc, rep, text = run(["--preset", "chat", *SMALL, "--layers", "3", "--kv-heads", "2",
                         "--head-dim", "8", "--dtype", "fp16"], tmp_path, capsys)
    assert rc == 0
    bpt = 2 * 3 * 2 * 8 * 2
    assert rep["config"]["bytes_per_token"] == bpt
    assert rep["config"]["bytes_per_block"] == 4 * bpt
    assert rep["config"]["reserved_bytes"] == 64 * 4 * bpt
    pv = rep["paged_vs_contiguous"]
    assert pv["max_len"] == rep["workload"]["max_len"]
    assert pv["contiguous_exact"] == pytest.approx(64 * 4 * bpt / (pv["max_len"] * bpt))
    assert pv["contiguous_requests"] == math.floor(pv["contiguous_exact"])
    assert pv["paged_peak_concurrency"] == rep["concurrency"]["peak_running"]
    rc, rep2, _ = run(["--preset", "chat", *SMALL, "--contiguous-max-len", "128"], tmp_path,
                      capsys)
    assert rep2["paged_vs_contiguous"]["contiguous_requests"] == 64 * 4 // 128


# ---- the KV check --------------------------------------------------------------------------
def test_kv_check_passes_on_a_small_workload(tmp_path, capsys):
    rc, rep, text = run(["--preset", "mixed", *SMALL, "--kv"], tmp_path, capsys)
    assert rc == 0
    kv = rep["kv_check"]
    assert kv["passed"] and kv["num_failures"] == 0
    assert kv["backend"] == "reference"  # the CUDA simulator is on: torch reference on CPU
    assert kv["launches"] == rep["steps"]
    assert kv["outputs_checked"] == sum(rep["series"]["batch"])  # every request, every step
    assert kv["tokens_written"] == rep["tokens"]["scheduled"]
    assert 0 <= kv["max_rel_error"] < 1e-12  # float64 both ways, fp32 values
    assert "KV check" in text and "passed" in text
    assert rep["config"]["bytes_per_block"] == 4 * 2 * 2 * 2 * 16 * 4  # the attached pool


def test_kv_check_covers_preemption_and_prefix_hits():
    wl = workloads.preset_workload("agents", 12, seed=2, length_scale=0.05, max_len=100)
    rep = sim.simulate(wl, sim.SimConfig(num_blocks=40, block_size=4, token_budget=64,
                                         max_running=8, kv=True)).report
    assert rep["preemptions"]["recompute"] > 0 and rep["prefix_cache"]["hits"] > 0
    assert rep["kv_check"]["passed"], rep["kv_check"]["failures"]


def _swap_two_table_entries(inp: sim.KernelInputs) -> None:
    """A planted bug: the first request with two used blocks gets them swapped."""
    B = 4
    for row in range(len(inp.rids)):
        if inp.seq_lens[row] > B:
            t = inp.block_tables[row]
            t[0], t[1] = t[1], t[0]
            return


def test_a_swapped_block_table_entry_is_caught(tmp_path, capsys, monkeypatch):
    res = sim.simulate(small_workload(), sim.SimConfig(**SMALL_CFG, kv=True),
                       kernel_hook=_swap_two_table_entries)
    kv = res.report["kv_check"]
    assert not kv["passed"] and kv["num_failures"] > 0 and kv["max_rel_error"] > 1e-3
    assert not res.passed
    # through the command: exit status 1 and the failure printed
    monkeypatch.setattr(sim, "KERNEL_HOOK", _swap_two_table_entries)
    rc, rep, text = run(["--preset", "mixed", *SMALL, "--kv"], tmp_path, capsys)
    assert rc == 1 and not rep["kv_check"]["passed"] and "FAILED" in text
    assert rep["kv_check"]["failures"][0]["rel_error"] > 1e-3


def test_a_misdirected_slot_is_caught():
    """A planted bug: one written token goes to the next block's slot."""
    hit = []

    def shift(inp: sim.KernelInputs) -> None:
        if inp.step >= 3 and not hit and len(inp.slot_mapping):
            inp.slot_mapping[-1] = (inp.slot_mapping[-1] + 4) % (64 * 4)
            hit.append(inp.step)

    res = sim.simulate(small_workload(), sim.SimConfig(**SMALL_CFG, kv=True), kernel_hook=shift)
    assert hit and not res.report["kv_check"]["passed"]
    assert res.report["kv_check"]["failures"][0]["step"] == hit[0]


def test_an_off_by_one_slot_mapping_in_the_allocator_is_caught(monkeypatch):
    """The allocator's own slot mapping, planted off by one for one launch (a bug in
    publish, not in the simulator)."""
    import pagedkv.allocator.allocator as allocator_mod

    real = allocator_mod._launch_slots
    planted = {"n": 0}

    def off_by_one(*args):
        out = real(*args)
        if planted["n"] == 0 and len(out) >= 2:
            planted["n"] = 1
            out[[0, 1]] = out[[1, 0]]
        return out

    monkeypatch.setattr(allocator_mod, "_launch_slots", off_by_one)
    rep = sim.simulate(small_workload(), sim.SimConfig(**SMALL_CFG, kv=True)).report
    assert planted["n"] == 1 and not rep["kv_check"]["passed"]


def test_a_prefix_hit_across_salts_is_wrong_kv(tmp_path, monkeypatch):
    """Planted bug: block hashes that ignore the cache salt let tenant y hit tenant x's
    blocks. The KV of a token depends on its salt here, so the check fails."""
    import pagedkv.allocator.allocator as allocator_mod

    shared = list(range(100, 112))
    trace = write_trace(tmp_path / "t.jsonl", [
        {"arrival": 0, "prompt_tokens": shared + [1], "output_len": 2, "salt": "x"},
        {"arrival": 40, "prompt_tokens": shared + [2], "output_len": 2, "salt": "y"},
    ])
    wl = workloads.read_trace(trace)
    cfg = dict(num_blocks=32, block_size=4, kv=True)
    clean = sim.simulate(wl, sim.SimConfig(**cfg)).report
    assert clean["prefix_cache"]["hits"] == 0 and clean["kv_check"]["passed"]
    real = allocator_mod.digest

    def saltless(parent, tokens, keys, salt):
        return real(parent, tokens, keys, None)

    # every block hash the allocator (and the manager, through it) takes is this digest
    monkeypatch.setattr(allocator_mod, "digest", saltless)
    leaky = sim.simulate(wl, sim.SimConfig(**cfg)).report
    assert leaky["prefix_cache"]["hits"] == 12
    assert not leaky["kv_check"]["passed"]


def test_the_numba_kernels_path_in_the_simulator(tmp_path):
    """--kv-backend kernels: write_kv and the paged-attention kernels (CUDA simulator here,
    a GPU when there is one), checked launch mode; and the hook's bug is caught there too."""
    trace = write_trace(tmp_path / "t.jsonl", [
        {"arrival": 0, "prompt_len": 9, "output_len": 3, "salt": "a"},
        {"arrival": 0, "prompt_len": 6, "output_len": 2},
    ])
    wl = workloads.read_trace(trace)
    cfg = dict(num_blocks=16, block_size=4, kv=True, kv_backend="kernels")
    rep = sim.simulate(wl, sim.SimConfig(**cfg)).report
    kv = rep["kv_check"]
    assert kv["backend"] == "kernels" and kv["passed"], kv["failures"]
    assert 0 <= kv["max_rel_error"] <= kv["tolerance"]
    bad = sim.simulate(wl, sim.SimConfig(**cfg), kernel_hook=_swap_two_table_entries).report
    assert not bad["kv_check"]["passed"]


def test_expected_kv_is_a_function_of_salt_and_prefix():
    toks = np.array([5, 6, 7, 8, 9], dtype=np.int64)
    a = sim.prefix_keys(toks, "s")
    assert np.array_equal(a, sim.prefix_keys(toks.copy(), "s"))
    assert np.array_equal(a[:3], sim.prefix_keys(toks[:3], "s"))  # prefix-determined
    changed = toks.copy()
    changed[1] = 60
    b = sim.prefix_keys(changed, "s")
    assert a[0] == b[0] and (a[1:] != b[1:]).all()  # every later position changes
    assert (a != sim.prefix_keys(toks, "t")).all() and (a != sim.prefix_keys(toks, None)).all()
    swapped = toks[[1, 0, 2, 3, 4]]
    assert (a[:2] != sim.prefix_keys(swapped, "s")[:2]).all()  # order matters


def test_dense_attention_matches_the_kernels_reference():
    import torch

    from pagedkv.kernels.reference import attention_reference

    g = torch.Generator().manual_seed(0)
    q = torch.randn(7, 8, 16, generator=g)
    k, v = torch.randn(20, 4, 16, generator=g), torch.randn(20, 4, 16, generator=g)
    ours = sim.dense_attention(q, k, v, 13, 0.25)
    ref = attention_reference(q, k, v, torch.arange(13, 20), 0.25)
    assert torch.allclose(ours, ref, rtol=0, atol=1e-12)
    assert sim.relative_error(ours, ref) < 1e-12
    assert sim.relative_error(ours + float("nan"), ref) == math.inf


# ---- the report ----------------------------------------------------------------------------
def test_json_report_has_the_documented_keys(tmp_path, capsys):
    rc, rep, _ = run(["--preset", "rag", *SMALL, "--kv"], tmp_path, capsys)
    assert rc == 0
    assert set(rep) == set(sim.REPORT_KEYS) | {"series"}
    for key in sim.REPORT_KEYS:  # each is described in the module docstring
        assert f"``{key}``" in sim.__doc__, key
    assert set(rep["series"]) == set(sim.SERIES_KEYS)
    assert set(rep["allocator"]) >= {"seconds", "requests_per_s", "tokens_per_s", "calls"}
    assert set(rep["allocator"]["calls"]) == set(sim.CALLS)
    assert set(rep["occupancy"]) >= {"peak_held_blocks", "peak_tokens", "reserved_bytes",
                                     "peak_held_bytes", "mean_fraction"}
    assert set(rep["prefix_cache"]) >= {"hit_rate", "hits", "queries"}
    assert set(rep["preemptions"]) == {"recompute", "recomputed_tokens", "swap", "swap_note"}
    assert set(rep["paged_vs_contiguous"]) >= {"contiguous_requests",
                                               "paged_peak_concurrency", "ratio"}
    assert set(rep["kv_check"]) >= {"backend", "max_rel_error", "tolerance", "passed",
                                    "outputs_checked"}
    rc, rep, _ = run(["--preset", "rag", *SMALL], tmp_path, capsys)
    assert rep["kv_check"] is None


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None,
                    reason="matplotlib is not installed (pip install matplotlib)")
def test_plot_writes_a_png(tmp_path, capsys):
    png = tmp_path / "occupancy.png"
    rc, _, _ = run(["--preset", "chat", *SMALL, "--plot", str(png)], tmp_path, capsys)
    assert rc == 0
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_plot_without_matplotlib_is_a_clear_error(tmp_path, capsys, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "matplotlib" else real(name, *a))
    assert main(["simulate", "--preset", "chat", *SMALL, "--plot",
                 str(tmp_path / "x.png")]) == 2
    assert "--plot needs matplotlib" in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()


def test_help_lists_simulate(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "simulate" in capsys.readouterr().out
