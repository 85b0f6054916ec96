"""The `pagedkv` command: verify (delegated), plan, lab, diagram, --version, bad arguments."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import tomllib
from collections import OrderedDict
from importlib.metadata import PackageNotFoundError, entry_points, version
from pathlib import Path

import pytest

from pagedkv.cli import diagram, lab, plan
from pagedkv.cli.errors import BadKernelBench, BadLengths, BadSize, CliError
from pagedkv.cli.main import main, package_version
from pagedkv.cli.units import parse_size

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SKETCH = ["plan", "--free-gb", "40", "--kv-bytes-per-token", "250KB", "--max-len", "8192",
          "--requests", "50", "--mean-len", "500"]


def run_cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300, check=False)


# ---- the command itself --------------------------------------------------------------------
def test_version_flag_prints_the_installed_version():
    proc = run_cli("-m", "pagedkv.cli", "--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"pagedkv {version('pagedkv')}"
    assert version("pagedkv") == PYPROJECT["project"]["version"]


def test_version_falls_back_to_pyproject(monkeypatch):
    import importlib.metadata

    def missing(name):
        raise PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    assert package_version() == PYPROJECT["project"]["version"]


def test_python_m_pagedkv_runs_the_same_command():
    proc = run_cli("-m", "pagedkv", "--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"pagedkv {version('pagedkv')}"


def test_console_script_is_the_new_entry_point():
    assert PYPROJECT["project"]["scripts"]["pagedkv"] == "pagedkv.cli.main:main"
    (ep,) = [e for e in entry_points(group="console_scripts") if e.name == "pagedkv"]
    assert ep.load() is main
    assert "pagedkv.cli" in PYPROJECT["tool"]["setuptools"]["packages"]


def test_help_lists_every_subcommand(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for command in ("verify", "plan", "lab", "diagram", "--version"):
        assert command in out


def test_verify_delegates_to_the_existing_implementation(monkeypatch, tmp_path):
    import pagedkv.proofs.cli as proofs_cli

    calls = []

    def fake_verify(**kwargs):
        calls.append({k: kwargs.get(k) for k in ("quick", "steps", "out_dir")})
        return 1 if kwargs.get("quick") else 0

    monkeypatch.setattr(proofs_cli, "verify", fake_verify)
    assert main(["verify", "--quick", "--out-dir", str(tmp_path)]) == 1
    assert main(["verify", "--steps", "7"]) == 0
    assert calls == [{"quick": True, "steps": None, "out_dir": tmp_path},
                     {"quick": False, "steps": 7, "out_dir": Path(".")}]


def test_verify_help_is_unchanged():
    new = run_cli("-m", "pagedkv.cli", "verify", "--help")
    old = run_cli("-m", "pagedkv.proofs.cli", "verify", "--help")
    assert new.returncode == old.returncode == 0
    assert new.stdout == old.stdout and "--quick" in new.stdout


# ---- bad arguments -------------------------------------------------------------------------
@pytest.mark.parametrize("argv, message", [
    (["plan"], "--free-gb"),
    (["plan", "--free-gb", "40", "--kv-bytes-per-token", "250KB"], "--max-len"),
    (["plan", "--free-gb", "40", "--max-len", "10"], "bytes per token"),
    (["plan", "--free-gb", "-1", "--kv-bytes-per-token", "1", "--max-len", "1"], "--free-gb"),
    (["plan", "--free-gb", "40", "--kv-bytes-per-token", "1KB", "--layers", "2",
      "--max-len", "8"], "not both"),
    (["plan", "--free-gb", "40", "--layers", "2", "--max-len", "8"], "--kv-heads"),
    (["plan", "--free-gb", "40", "--kv-bytes-per-token", "1KB", "--max-len", "8",
      "--requests", "3"], "--mean-len"),
    (["plan", "--lengths", "/nonexistent/lengths.txt"], "cannot read"),
    (["plan", "--free-gb", "1", "--kv-bytes-per-token", "1KB", "--max-len", "8",
      "--mean-len", "0"], "--mean-len"),
    (["plan", "--free-gb", "1", "--kv-bytes-per-token", "1KB", "--max-len", "8",
      "--mean-len", "4", "--block-size", "0"], "--block-size"),
    (["plan", "--kv-bytes-per-token", "1KB", "--free-gb", "1", "--mean-len", "4",
      "--max-len", "8", "--kernel-slack", "nan"], "--kernel-slack"),
    (["lab", "--capacity", "0", "--stride", "1"], "--capacity"),
    (["lab", "--capacity", "2", "--stride", "0"], "--stride"),
    (["lab", "--capacity", "2", "--stride", "1", "--time", "-3"], "--time"),
])
def test_bad_arguments_exit_2_with_a_message(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "error:" in err and message in err


@pytest.mark.parametrize("argv", [
    ["frobnicate"],
    [],
    ["plan", "--kv-bytes-per-token", "250parsecs"],
    ["plan", "--free-gb", "forty"],
    ["lab", "--stride", "3"],
    ["diagram", "--format", "svg"],
])
def test_argparse_errors_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert "error" in capsys.readouterr().err


def test_bad_arguments_exit_2_in_a_real_process(tmp_path):
    bad = tmp_path / "lengths.txt"
    bad.write_text("12\nabc\n")
    proc = run_cli("-m", "pagedkv.cli", "plan", "--lengths", str(bad))
    assert proc.returncode == 2
    assert "line 2" in proc.stderr and "'abc'" in proc.stderr and "Traceback" not in proc.stderr


def test_lengths_file_rules(tmp_path):
    f = tmp_path / "l.txt"
    f.write_text("# measured\n10\n\n 20  # a comment\n0\n")
    assert plan.read_lengths(f) == [10, 20, 0]
    f.write_text("5\n-1\n")
    with pytest.raises(BadLengths, match="line 2.*negative"):
        plan.read_lengths(f)
    f.write_text("# nothing\n")
    with pytest.raises(BadLengths, match="no lengths"):
        plan.read_lengths(f)


def test_sizes_parse_with_suffixes():
    assert parse_size("250KB") == 250e3
    assert parse_size("250kb") == 250e3
    assert parse_size("1.5GB") == 1.5e9
    assert parse_size("2KiB") == 2048
    assert parse_size("800000") == 800000
    assert parse_size("3e3") == 3000
    for bad in ("250 parsecs", "abc", "-5", "", "1..2KB"):
        with pytest.raises(BadSize):
            parse_size(bad)


# ---- plan: capacity ------------------------------------------------------------------------
def test_plan_design_sketch_via_python_m(tmp_path):
    """40 GB free, 250 KB/token, 8,192 max -> 19.5 (19 whole) contiguous requests; 50 x 500
    tokens paged = 6.25 GB at block size 1, 6.4 GB at 16 (31.25 -> 32 blocks each)."""
    out = tmp_path / "plan.json"
    proc = run_cli("-m", "pagedkv.cli", *SKETCH, "--json", str(out), "--quiet")
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert "40 GB / 2.048 GB = 19.53125 -> 19 whole requests" in text
    assert "25,000 tokens = 6.25 GB" in text
    assert "500 / 16 = 31.25 -> 32 blocks per request, 1,600 blocks = 6.4 GB" in text
    assert "tail waste 600 slots = 150 MB" in text
    figures = json.loads(out.read_text())["capacity"]
    assert figures["contiguous"]["ratio"] == 40e9 / (8192 * 250e3) == 19.53125
    assert figures["contiguous"]["requests"] == 19
    paged = figures["paged"]
    assert paged["memory_bytes_block_size_1"] == pytest.approx(6.25e9)
    assert paged["memory_bytes"] == pytest.approx(6.4e9)
    assert paged["blocks_per_request"] == 32 and paged["tail_waste_slots"] == 50 * 12
    assert paged["fit_requests"] == math.floor(40e9 / (512 * 250e3)) == 312
    assert paged["fit_requests_block_size_1"] == 320


def test_plan_block_size_one_is_exact(tmp_path, capsys):
    out = tmp_path / "p.json"
    assert main([*SKETCH, "--block-size", "1", "--json", str(out)]) == 0
    paged = json.loads(out.read_text())["capacity"]["paged"]
    assert paged["memory_bytes"] == pytest.approx(6.25e9) and paged["tail_waste_slots"] == 0
    assert "6.25 GB" in capsys.readouterr().out


@pytest.mark.parametrize("dtype, size", [("fp16", 2), ("bf16", 2), ("fp32", 4), ("fp8", 1)])
def test_plan_bytes_per_token_from_model_shape(dtype, size, tmp_path):
    out = tmp_path / "p.json"
    argv = ["plan", "--free-gb", "10", "--layers", "32", "--kv-heads", "8", "--head-dim", "128",
            "--dtype", dtype, "--max-len", "4096", "--json", str(out)]
    assert main(argv) == 0
    figures = json.loads(out.read_text())
    assert figures["bytes_per_token"] == 2 * 32 * 8 * 128 * size
    assert figures["capacity"]["contiguous"]["requests"] == math.floor(
        10e9 / (4096 * 2 * 32 * 8 * 128 * size))


def test_plan_lengths_fit_in_file_order(tmp_path):
    f = tmp_path / "l.txt"
    f.write_text("\n".join(["100", "30", "100", "1"]))
    # 1 KB per token, block size 16: 112 + 32 + 112 + 16 slots; 260 KB holds the first three.
    c = plan.capacity(260e3, 1e3, 128, 16, plan.read_lengths(f))
    assert c["paged"]["fit_requests"] == 3
    assert c["paged"]["fit_requests_block_size_1"] == 4
    assert c["paged"]["memory_bytes"] == (112 + 32 + 112 + 16) * 1e3
    assert c["contiguous"]["requests"] == 2  # 260 KB / 128 KB


# ---- plan: block-size advisor --------------------------------------------------------------
LENGTHS = [1, 15, 16, 17, 100, 257, 1000, 4095]


def test_advisor_exact_sums_against_brute_force():
    a = plan.advise(LENGTHS, bpt=2.0)
    assert [r["block_size"] for r in a["rows"]] == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    for r in a["rows"]:
        B = r["block_size"]
        slots = [math.ceil(L / B) * B for L in LENGTHS]
        assert r["table_entries"] == sum(s // B for s in slots)
        assert r["tail_waste_slots"] == sum(s - L for s, L in zip(slots, LENGTHS, strict=True))
        assert r["tail_waste_bytes"] == 2.0 * r["tail_waste_slots"]
        assert r["metadata_bytes"] == 4 * r["table_entries"]
        assert r["max_blocks_per_request"] == math.ceil(4095 / B)


def test_advisor_kernel_bound_decides():
    kernel = {8: 2.0e-5, 16: 1.0e-5, 32: 1.0e-5}
    a = plan.advise(LENGTHS, 1.0, kernel, plan.Bounds(kernel_slack=0.1))
    assert a["recommended"] == 16
    assert a["decided_by"] == "kernel bound"
    assert "block size 8 would waste less" in a["reason"]
    loose = plan.advise(LENGTHS, 1.0, kernel, plan.Bounds(kernel_slack=1.5))
    assert loose["recommended"] == 8  # now within 2.5x of the fastest: less waste wins


def test_advisor_metadata_and_width_bounds_decide():
    entries = {r["block_size"]: r["metadata_bytes"] for r in plan.advise(LENGTHS)["rows"]}
    a = plan.advise(LENGTHS, bounds=plan.Bounds(max_metadata_bytes=entries[32]))
    assert a["recommended"] == 32 and a["decided_by"] == "metadata bound"
    b = plan.advise(LENGTHS, bounds=plan.Bounds(max_blocks_per_request=100))
    assert b["recommended"] == 64 and b["decided_by"] == "blocks per request bound"
    none = plan.advise(LENGTHS, bounds=plan.Bounds(max_blocks_per_request=1))
    assert none["recommended"] is None


def test_advisor_without_bounds_takes_least_waste_and_the_largest_tie():
    assert plan.advise(LENGTHS)["recommended"] == 1
    tie = plan.advise([32, 64, 96])  # no waste up to B = 32
    assert tie["recommended"] == 32
    assert "1, 2, 4, 8, 16 too" in tie["reason"]


def test_kernel_bench_simple_format(tmp_path, capsys):
    lengths = tmp_path / "l.txt"
    lengths.write_text("\n".join(map(str, LENGTHS)))
    kb = tmp_path / "kb.json"
    kb.write_text(json.dumps({"8": 2.0e-5, "16": 1.0e-5, "32": 1.0e-5}))
    out = tmp_path / "p.json"
    assert main(["plan", "--lengths", str(lengths), "--kernel-bench", str(kb),
                 "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "recommended block size: 16" in text and "decided by: kernel bound" in text
    advice = json.loads(out.read_text())["block_size_advice"]
    assert advice["recommended"] == 16
    assert {r["block_size"]: r["kernel_s"] for r in advice["rows"]}[8] == 2.0e-5


def test_kernel_bench_script_format(tmp_path):
    def result(name, bs, us, config="default", group=4):
        return {"case": {"name": name, "batch": 64, "seq_len": 4096, "kv_heads": 8,
                         "head_dim": 128, "group": group, "block_size": bs,
                         "dtype": "float16"}, "config": config, "kernel_us": us}

    payload = {"meta": {"gpu": "x"}, "results": [
        result("a-B16", 16, 100.0), result("a-B16", 16, 90.0, "tuned"), result("a-B32", 32, 80.0),
        result("b-B16", 16, 50.0, group=8), result("b-B32", 32, 60.0, group=8),
        result("c-B16", 16, 1000.0, group=1),  # measured at one block size only: left out
    ]}
    f = tmp_path / "kernel_bench_2026.json"
    f.write_text(json.dumps(payload))
    times, source = plan.read_kernel_bench(f)
    assert times == pytest.approx({16: 140e-6, 32: 140e-6})
    assert "2 case shapes" in source
    f.write_text(json.dumps({"meta": {}, "results": [result("c", 16, 1.0)]}))
    with pytest.raises(BadKernelBench, match="more than one block size"):
        plan.read_kernel_bench(f)
    f.write_text(json.dumps({"sixteen": 1.0}))
    with pytest.raises(BadKernelBench):
        plan.read_kernel_bench(f)


# ---- lab -----------------------------------------------------------------------------------
def brute_force_lru(capacity: int, stride: int, n: int) -> tuple[int, list[list[int]]]:
    cache: OrderedDict[int, None] = OrderedDict()
    hits, orders = 0, []
    for i in range(n):
        ident = i % stride
        if ident in cache:
            hits += 1
            cache.move_to_end(ident)
        else:
            if len(cache) == capacity:
                cache.popitem(last=False)
            cache[ident] = None
        orders.append(list(cache))
    return hits, orders


def test_requests_for_time():
    assert lab.requests_for_time(0) == 16
    assert lab.requests_for_time(10.7) == 16 + 21
    assert lab.requests_for_time(1e9) == 4096


@pytest.mark.parametrize("capacity, stride, t", [(1, 1, 0), (4, 1, 3), (4, 4, 10), (8, 3, 7.5),
                                                 (16, 16, 100)])
def test_lab_stride_within_capacity_hits_after_first_pass(capacity, stride, t):
    r = lab.run_lab(capacity, stride, t)
    assert r.requests == lab.requests_for_time(t)
    assert r.hits == r.requests - stride and r.misses == stride and r.evictions == 0


@pytest.mark.parametrize("capacity, t", [(1, 0), (3, 20), (8, 100)])
def test_lab_stride_one_past_capacity_always_misses(capacity, t):
    r = lab.run_lab(capacity, capacity + 1, t)
    assert r.hits == 0 and r.misses == r.requests
    assert r.evictions == r.requests - capacity


@pytest.mark.parametrize("capacity, stride, t", [(2, 3, 5), (3, 2, 0), (5, 7, 40), (4, 9, 12),
                                                 (6, 5, 30), (7, 12, 80)])
def test_lab_matches_brute_force_lru(capacity, stride, t):
    r = lab.run_lab(capacity, stride, t, block_size=4, record=True)
    hits, orders = brute_force_lru(capacity, stride, r.requests)
    assert (r.hits, r.misses) == (hits, r.requests - hits)
    assert [s.lru for s in r.steps] == orders
    assert all(len(s.blocks) == capacity for s in r.steps)


def test_lab_runs_on_the_real_block_pool(monkeypatch):
    from pagedkv.allocator.pool import BlockPool

    calls = {"take": 0, "share": 0}
    take, share = BlockPool.take, BlockPool.share

    def counting_take(self, r):
        calls["take"] += 1
        return take(self, r)

    def counting_share(self, b, r):
        calls["share"] += 1
        return share(self, b, r)

    monkeypatch.setattr(BlockPool, "take", counting_take)
    monkeypatch.setattr(BlockPool, "share", counting_share)
    r = lab.run_lab(3, 5, 20)
    assert calls == {"take": r.misses, "share": r.hits}


def test_lab_is_a_pure_function_of_c_s_t():
    a = lab.run_lab(4, 6, 30, record=True)
    b = lab.run_lab(4, 6, 30, record=True)
    assert a.to_dict(with_steps=True) == b.to_dict(with_steps=True)
    assert lab.run_lab(4, 6, 30.4).to_dict() == {**a.to_dict(), "time": 30.4}


def test_lab_cli_counts_step_and_json(tmp_path, capsys):
    out = tmp_path / "lab.json"
    assert main(["lab", "--capacity", "3", "--stride", "4", "--quiet", "--json", str(out)]) == 0
    captured = capsys.readouterr()
    assert "16 requests: 0 hits, 16 misses" in captured.out and captured.err == ""
    assert json.loads(out.read_text())["misses"] == 16
    assert main(["lab", "--capacity", "2", "--stride", "2", "--step"]) == 0
    text = capsys.readouterr().out
    assert text.count(" miss ") == 2 and text.count(" hit ") == 14
    assert "LRU ids, least recent first [0 1]" in text


def test_lab_progress_goes_to_stderr_unless_quiet(capsys):
    assert main(["lab", "--capacity", "2", "--stride", "3"]) == 0
    assert "lab requests" in capsys.readouterr().err


# ---- diagram -------------------------------------------------------------------------------
LIFECYCLE = {
    ("allocate", "FREE", "ALLOCATED"), ("publish", "ALLOCATED", "PUBLISHED"),
    ("begin_write", "PUBLISHED", "PUBLISHED"),
    ("end_write", "PUBLISHED", "PUBLISHED"), ("end_write", "RECLAIMED", "RECLAIMED"),
    ("commit", "PUBLISHED", "REFERENCED"), ("share", "PUBLISHED", "PUBLISHED"),
    ("share", "REFERENCED", "REFERENCED"), ("share", "CACHED", "REFERENCED"),
    ("release", "ALLOCATED", "RECLAIMED"), ("release", "PUBLISHED", "PUBLISHED"),
    ("release", "PUBLISHED", "RECLAIMED"), ("release", "REFERENCED", "REFERENCED"),
    ("release", "REFERENCED", "CACHED"), ("evict", "CACHED", "RECLAIMED"),
    ("recycle", "RECLAIMED", "FREE"), ("rewind", "PUBLISHED", "PUBLISHED"),
}


@pytest.fixture(scope="module")
def lifecycle():
    return diagram.derive()


def test_diagram_edges_are_the_spec_lifecycle(lifecycle):
    assert {(e.transition, e.source, e.target) for e in lifecycle.edges} == LIFECYCLE
    assert {(e.transition, e.source, e.target) for e in lifecycle.holder_edges} == {
        ("open_holder", "NO_TABLE", "OPEN"), ("close_holder", "OPEN", "NO_TABLE")}
    quals = {(e.transition, e.target): e.qualifier for e in lifecycle.edges}
    assert quals[("release", "CACHED")] == "last reference"
    assert quals[("release", "REFERENCED")] == "other references remain"
    # launch / complete / advance fired (they move the clock) but move no block's state
    assert not {e.transition for e in lifecycle.edges} & {"launch", "complete", "advance"}
    assert lifecycle.config["max_inflight"] >= 2  # completions out of order were explored


def test_diagram_does_not_depend_on_the_small_pool(lifecycle):
    bigger = diagram.derive(blocks=1, holders=3, block_size=2, hashes=(1, 2))
    assert bigger.edges == lifecycle.edges and bigger.explored_states > lifecycle.explored_states


def test_diagram_is_derived_by_running_the_spec():
    from dataclasses import replace

    import pagedkv.spec as spec

    real = spec.TRANSITIONS["recycle"]

    def to_allocated(ops, s, b):  # a planted spec change: recycling lands on ALLOCATED
        return real.effect(ops, s, b).replace(state=ops.store(s.state, b, spec.ALLOCATED))

    changed = dict(spec.TRANSITIONS, recycle=replace(real, effect=to_allocated))
    edges = {(e.transition, e.source, e.target)
             for e in diagram.derive(transitions=changed).edges}
    assert ("recycle", "RECLAIMED", "ALLOCATED") in edges
    assert ("recycle", "RECLAIMED", "FREE") not in edges


def test_diagram_labels_carry_the_guards_and_are_mermaid_safe(lifecycle):
    text = diagram.to_mermaid(lifecycle)
    assert text.startswith("stateDiagram-v2\n") and "[*] --> FREE" in text
    assert "FREE --> ALLOCATED : allocate, for holder r [launches that saw it completed]" in text
    assert ("RECLAIMED --> FREE : recycle [the watermark passed its retire clock, no write "
            "pending]") in text
    for e in lifecycle.edges + lifecycle.holder_edges:
        assert not set(diagram.edge_label(e)) & set(":;#\n")


def test_diagram_dot_and_render(lifecycle, tmp_path, monkeypatch, capsys):
    dot = diagram.to_dot(lifecycle)
    assert dot.startswith("digraph") and dot.rstrip().endswith("}")
    assert dot.count(" -> ") == len(LIFECYCLE) + 2 + 2  # + start, holder start, holder edges
    assert main(["diagram", "--format", "dot", "--quiet"]) == 0
    assert capsys.readouterr().out == dot
    import shutil

    if shutil.which("dot") is not None:
        svg = diagram.render_with_dot(dot, tmp_path / "lifecycle.svg")
        assert "<svg" in svg.read_text()
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert main(["diagram", "--quiet", "--render", str(tmp_path / "x.svg")]) == 2
    assert "Graphviz" in capsys.readouterr().err
    with pytest.raises(CliError, match=r"\.svg or \.png"):
        diagram.render_with_dot(dot, tmp_path / "x.pdf")


def test_readme_diagram_matches_the_generated_one(lifecycle):
    readme = (ROOT / "README.md").read_text()
    m = re.search(r"<!-- cli:begin -->(.*?)<!-- cli:end -->", readme, re.S)
    assert m, "README.md has no <!-- cli:begin --> ... <!-- cli:end --> section"
    block = re.search(r"```mermaid\n(.*?)```", m.group(1), re.S)
    assert block, "the cli section embeds no ```mermaid block"
    assert block.group(1) == diagram.to_mermaid(lifecycle), (
        "README.md's lifecycle diagram is stale: paste the output of `pagedkv diagram`")
    sections = re.findall(r"^## (.*)$", readme, re.M)
    verify = sections.index("`pagedkv verify` and its report")
    before_markers = readme[: m.start()]
    assert re.findall(r"^## (.*)$", before_markers, re.M)[-1] == sections[verify]
