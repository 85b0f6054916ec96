"""The README's usage example runs as written, and its two set-up commands exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_readme_usage_example_runs(capsys):
    text = (ROOT / "README.md").read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    assert 15 <= len(code.strip().splitlines()) <= 25
    exec(compile(code, "README.md", "exec"), {})
    assert "need" in capsys.readouterr().out  # the OutOfBlocks message was printed


def test_readme_engine_loop_runs(capsys):
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    engine = next(b for b in blocks if "pagedkv.engine" in b)
    exec(compile(engine, "README.md (engine loop)", "exec"), {})
    out = capsys.readouterr().out
    hits = int(re.search(r"prefix hits (\d+) of", out).group(1))
    assert hits > 0, out  # later admissions hit the system prompt an earlier launch wrote


def test_readme_commands_are_make_targets():
    text = (ROOT / "README.md").read_text()
    makefile = (ROOT / "Makefile").read_text()
    for target in ("verify", "test"):
        assert f"make {target}" in text
        assert re.search(rf"^{target}:", makefile, re.M)
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_readme_native_pool_example_runs(capsys):
    pytest.importorskip("numba")
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    native = next(b for b in blocks if "NativePool" in b)
    exec(compile(native, "README.md (native pool)", "exec"), {})
    # b holds its two hits and the block it took, the rest usable
    assert capsys.readouterr().out.split() == ["True", "1021"]


def test_readme_native_step_path_example_runs(capsys):
    pytest.importorskip("numba")
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    native = next(b for b in blocks if "NativeAllocator" in b)
    exec(compile(native, "README.md (native step path)", "exec"), {})
    # b hit a's two cached blocks; two tables of 61 tokens, 4 blocks wide; shared prefix
    assert capsys.readouterr().out.split() == ["32", "(2,", "4)", "True"]
