"""The mutation tool: its operators, the import hook that runs a mutant without touching disk,
and the report it writes (the kill runs themselves are ``python -m pagedkv.proofs.mutation``)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from pathlib import Path

from pagedkv.proofs import mutation as mt

SAMPLE = textwrap.dedent('''\
    """doc"""


    def guard(ops, s, b):
        """doc"""
        return ops.And(*_in_pool(s, b), s.ref[b] == 1,
                       s.pending[b] < 2)


    class Q:
        def push(self, b):
            self.n += 1
            self.items[b] = True
            self.log.append(b)
            if b > 0 and self.ok:
                x = b - 1
                return x
            return b + 0


    def untouched():
        return 1 == 2
''')


def _sample_mutants(tmp_path: Path, **kw) -> list[mt.Mutant]:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text(SAMPLE)
    target = mt.Target("pkg/m.py", "pagedkv.pkg.m", "allocator",
                       functions=frozenset({"guard", "push"}), **kw)
    return mt.generate(target, tmp_path)


def test_every_operator_is_generated_and_keeps_lines(tmp_path):
    ms = _sample_mutants(tmp_path)
    ops = {m.operator for m in ms}
    assert ops == {"cmp", "int+1", "int-1", "drop-conjunct", "drop-and-clause", "negate-if",
                   "delete-stmt", "arith", "bool"}
    lines = SAMPLE.count("\n")
    for m in ms:
        new = mt.mutated_source(m, tmp_path).decode()
        assert new.count("\n") == lines
        ast.parse(new)
        assert new != SAMPLE
        assert m.function in ("guard", "push")
    assert all(m.line < SAMPLE.splitlines().index("def untouched():") for m in ms)
    by = {(m.operator, m.mutated.strip()) for m in ms}
    assert ("cmp", "return ops.And(*_in_pool(s, b), s.ref[b] != 1,") in by
    assert ("cmp", "s.pending[b] <= 2)") in by
    assert ("drop-conjunct", "return ops.And(*(), s.ref[b] == 1,") in by
    assert ("delete-stmt", "pass") in by
    assert ("negate-if", "if not (b > 0 and self.ok):") in by
    assert ("drop-and-clause", "if b > 0 and True:") in by
    assert ("arith", "return b - 0") in by
    assert ("int+1", "return b + 1") in by
    assert len({m.key for m in ms}) == len(ms)


def test_no_statement_deletion_when_disabled(tmp_path):
    ms = _sample_mutants(tmp_path, delete_statements=False)
    assert "delete-stmt" not in {m.operator for m in ms}


def test_real_targets_generate_mutants():
    ms = mt.all_mutants()
    assert {m.file for m in ms} == {t.path for t in mt.TARGETS}
    assert [m.id for m in ms] == list(range(len(ms)))
    ops = {m.operator for m in ms}
    assert {"cmp", "drop-conjunct", "delete-stmt", "negate-if", "bool"} <= ops


def test_mutant_is_imported_without_touching_disk():
    """The import hook serves the mutated module; the file on disk is unchanged."""
    path = mt.REPO / "allocator" / "lru.py"
    before = path.read_bytes()
    m = next(m for m in mt.all_mutants(files=["allocator/lru.py"])
             if m.function == "unlink" and m.operator == "delete-stmt"
             and "inq" in m.original)
    code = textwrap.dedent(f"""
        from pathlib import Path
        from pagedkv.proofs import mutation as mt
        m = [x for x in mt.all_mutants(files=["allocator/lru.py"]) if x.id == {m.id}][0]
        mt.install(Path({str(mt.REPO)!r}), {{m.module: mt.mutated_source(m)}})
        from pagedkv.allocator.lru import BlockQueue
        q = BlockQueue(3)
        q.unlink(1)
        print(q.inq[1], q.order())
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["True", "[0,", "2]"]  # the mutant forgot to clear the flag
    assert path.read_bytes() == before


def test_every_package_of_the_tree_is_imported_from_the_snapshot(tmp_path):
    """A run on a snapshot (``--rev``) must import every pagedkv package from it: one imported
    from the working tree instead mixes two versions of the code (an engine module newer than
    the snapshot's spec, say)."""
    import tomllib

    dirs = tomllib.loads((mt.REPO / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-dir"]
    own = {name.split(".")[1] for name, folder in dirs.items()
           if name.count(".") == 1 and folder == name.split(".")[1]}
    assert own == mt.PACKAGES
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "__init__.py").write_text("WHERE = 'snapshot'\n")
    code = textwrap.dedent(f"""
        from pathlib import Path
        from pagedkv.proofs import mutation as mt
        mt.install(Path({str(tmp_path)!r}))
        import pagedkv.engine
        print(pagedkv.engine.WHERE)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["snapshot"]


def test_summary_markdown_and_loader(tmp_path):
    ms = _sample_mutants(tmp_path)[:4]
    for m, status in zip(ms, (mt.KILLED, mt.TIMEOUT, mt.EQUIV, mt.SURVIVED), strict=True):
        m.status, m.killer = status, f"by {status}"
    s = mt.summarize(ms)
    assert (s["killed"], s["timeout"], s["equivalent"], s["survived"]) == (1, 1, 1, 1)
    assert s["kill_rate"] == round(2 / 3, 4)
    rep = mt.build_report(ms, root=tmp_path, commit="abc", dirty=[], quick=True, timeout=9,
                          seconds=1.0, baseline=(mt.SURVIVED, "", 1.0))
    md = mt.to_markdown(rep)
    assert "Kill rate 66.7 %" in md and "`abc`" in md and "by equivalent" in md
    out = tmp_path / "r.json"
    out.write_text(json.dumps(rep))
    loaded = mt.load_mutation_report(out)
    assert loaded["commit"] == "abc" and loaded["kill_rate"] == s["kill_rate"]
    assert loaded["survived"] == 1 and loaded["ok"] is False
    assert mt.load_mutation_report(tmp_path / "missing.json") is None


def test_committed_report_loads_if_present():
    rep = mt.load_mutation_report()
    if rep is not None:
        assert 0 <= rep["kill_rate"] <= 1 and rep["commit"]


def test_every_equivalence_names_a_mutant_of_the_tree():
    """An argued equivalence whose mutant no longer exists is stale: its code changed, and a
    new mutant with the same key would be waved through unexamined."""
    from pathlib import Path

    from pagedkv.proofs import mutation

    keys = {m.key for m in mutation.all_mutants(Path(__file__).resolve().parents[1])}
    assert [k for k in mutation.EQUIVALENT if k not in keys] == []
