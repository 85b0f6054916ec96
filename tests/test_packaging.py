"""Packaging: the metadata in pyproject.toml, constraints.txt, py.typed, ``__version__``, the
packaged mutation report, and which imports need which optional dependency.

scripts/check-wheel.sh checks the built wheel in clean venvs; these are the fast checks.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import tomllib
from importlib.metadata import PackageNotFoundError, requires, version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]
EXTRAS: dict[str, list[str]] = PROJECT["optional-dependencies"]
NAME = PROJECT["name"]

# what each extra must bring (the issue "a package that installs like a library")
WANT = {
    "kernels": {"numba", "numba-cuda", "torch"},
    "verify": {"z3-solver", "hypothesis", "crosshair-tool", "tqdm"},
    "plot": {"matplotlib"},
    "native": {"numba"},
}
# never imported by pagedkv.allocator / .spec / .engine (numpy is the one core dependency)
OPTIONAL_MODULES = ("numba", "llvmlite", "numba_cuda", "z3", "hypothesis", "crosshair", "tqdm",
                    "torch", "matplotlib")


def _name(req: Requirement) -> str:
    return canonicalize_name(req.name)


def _expand(extra: str, seen: frozenset[str] = frozenset()) -> list[Requirement]:
    """The requirements of ``extra``, with self-references (``pagedkv[a,b]``) expanded."""
    out: list[Requirement] = []
    for text in EXTRAS[extra]:
        req = Requirement(text)
        if _name(req) == NAME:
            for sub in sorted(req.extras - seen):
                out += _expand(sub, seen | {extra})
        else:
            out.append(req)
    return out


def _all_requirements() -> list[Requirement]:
    reqs = [Requirement(t) for t in PROJECT["dependencies"]]
    for extra in EXTRAS:
        reqs += [r for r in map(Requirement, EXTRAS[extra]) if _name(r) != NAME]
    return reqs


def _constraints() -> dict[str, Requirement]:
    pins: dict[str, Requirement] = {}
    for raw in (ROOT / "constraints.txt").read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        req = Requirement(line)
        assert _name(req) not in pins, f"constraints.txt pins {req.name} twice"
        specs = list(req.specifier)
        assert len(specs) == 1 and specs[0].operator == "==", f"not an exact pin: {raw!r}"
        pins[_name(req)] = req
    return pins


def _pinned_version(req: Requirement) -> Version:
    return Version(next(iter(req.specifier)).version)


def test_core_dependency_is_numpy_alone():
    assert [_name(Requirement(t)) for t in PROJECT["dependencies"]] == ["numpy"]


@pytest.mark.parametrize("extra", sorted(WANT))
def test_extra_brings_what_it_should(extra):
    assert extra in EXTRAS, f"no [{extra}] extra"
    assert {_name(r) for r in _expand(extra)} == WANT[extra]


def test_dev_extra_is_everything_the_tests_need():
    names = {_name(r) for r in _expand("dev")}
    assert names == set().union(*WANT.values()) | {"pytest", "pytest-xdist", "ruff"}


def test_every_requirement_has_lower_and_upper_bound():
    for req in _all_requirements():
        ops = {s.operator for s in req.specifier}
        assert ">=" in ops and "<" in ops, f"{req}: want a lower bound and a tested upper bound"


def test_constraints_pin_every_requirement_inside_its_range():
    pins = _constraints()
    for req in _all_requirements():
        assert _name(req) in pins, f"constraints.txt does not pin {req.name}"
        pinned = _pinned_version(pins[_name(req)])
        assert req.specifier.contains(pinned, prereleases=True), (
            f"constraints.txt pins {req.name}=={pinned}, outside pyproject's {req.specifier}")


def test_constraints_pin_what_is_installed():
    """The environment the tests run in is the one constraints.txt describes."""
    for name, req in _constraints().items():
        try:
            installed = version(name)
        except PackageNotFoundError:
            continue  # e.g. matplotlib's dependencies on a machine without [plot]
        if name in {_name(r) for r in _all_requirements()}:
            assert Version(installed) == _pinned_version(req), f"{name} {installed} installed"


def test_torch_is_the_cpu_build_on_disk_and_nothing_can_swap_it():
    pin = _constraints()["torch"]
    assert str(pin.specifier) == "==2.13.0+cpu"
    for extra in EXTRAS:
        for req in _expand(extra):
            if _name(req) == "torch":
                assert not req.specifier.contains("2.14.0"), f"[{extra}]: {req}"
    # every install the project runs goes through the constraints file
    for path in ("Makefile", "scripts/check-wheel.sh"):
        for line in (ROOT / path).read_text().splitlines():
            if re.search(r"\bpip\"? install\b", line):
                assert "-c" in line.split() and "constraints.txt" in line, f"{path}: {line}"
    assert "-c constraints.txt -e '.[dev]'" in (ROOT / "Makefile").read_text()


def test_installed_metadata_matches_pyproject():
    """A stale editable install (pyproject.toml changed since) fails here: rerun make."""
    def key(req: Requirement) -> tuple[str, str]:
        return _name(req), ",".join(sorted(str(s) for s in req.specifier))

    declared = {None: {key(Requirement(t)) for t in PROJECT["dependencies"]}}
    for extra, reqs in EXTRAS.items():
        declared[extra] = {key(Requirement(t)) for t in reqs}
    installed: dict[str | None, set[tuple[str, str]]] = {}
    for text in requires(NAME) or []:
        req = Requirement(text)
        m = re.search(r'extra == "([^"]+)"', str(req.marker or ""))
        installed.setdefault(m.group(1) if m else None, set()).add(key(req))
    assert installed == declared


def _packages() -> dict[str, Path]:
    dirs = SETUPTOOLS["package-dir"]
    return {pkg: ROOT / dirs[pkg] for pkg in SETUPTOOLS["packages"]}


def test_py_typed_in_every_package():
    assert "py.typed" in SETUPTOOLS["package-data"]["*"]
    for pkg, folder in _packages().items():
        if (folder / "__init__.py").is_file():
            assert (folder / "py.typed").is_file(), f"{pkg}: no {folder / 'py.typed'}"
    # pagedkv itself stays an implicit namespace package
    assert not (_packages()["pagedkv"] / "__init__.py").exists()


def test_version():
    import pagedkv.allocator
    import pagedkv.cli

    assert pagedkv.allocator.__version__ == PROJECT["version"]
    assert pagedkv.cli.__version__ == PROJECT["version"]
    assert version(NAME) == PROJECT["version"]


def test_version_falls_back_to_pyproject(monkeypatch):
    import importlib.metadata

    import pagedkv.allocator

    def missing(name):
        raise PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    assert pagedkv.allocator._package_version() == PROJECT["version"]


def test_mutation_report_is_package_data():
    """`pagedkv verify` reads the committed report; the wheel ships it as
    pagedkv/proofs/data/mutation-report.json (from benchmarks/results/)."""
    from pagedkv.proofs.mutation import DEFAULT_OUT

    data_dir = SETUPTOOLS["package-dir"]["pagedkv.proofs.data"]
    assert "pagedkv.proofs.data" in SETUPTOOLS["packages"]
    assert Path(DEFAULT_OUT).parent == Path(data_dir)
    assert SETUPTOOLS["package-data"]["pagedkv.proofs.data"] == [Path(DEFAULT_OUT).name]
    assert (ROOT / DEFAULT_OUT).is_file()
    assert not list((ROOT / data_dir).glob("*.py")), "benchmarks/results must hold no modules"


def _run(code: str, *, block: tuple[str, ...] = (), **env: str) -> str:
    """Run ``code`` in a fresh interpreter in which the modules ``block`` cannot be imported."""
    prelude = textwrap.dedent(f"""
        import importlib.abc, sys

        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.partition(".")[0] in {block!r}:
                    raise ImportError(f"{{name}} is not installed (blocked by the test)")

        sys.meta_path.insert(0, Block())
    """)
    proc = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env}, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_core_imports_with_numpy_alone():
    out = _run("""
        import pagedkv.allocator, pagedkv.engine, pagedkv.spec
        from pagedkv.allocator import BlockAllocator

        a = BlockAllocator(num_blocks=8, block_size=4)
        a.add_request("r", list(range(10)))
        a.allocate("r", 10)
        a.publish(["r"]).complete()
        a.commit("r", 10)
        a.free("r")
        print("core ok")
    """, block=OPTIONAL_MODULES)
    assert "core ok" in out


def test_kernels_take_numpy_arrays_without_torch():
    out = _run("""
    import numpy as np

    import pagedkv.kernels as K

    print("torch imported:", "torch" in sys.modules)
    sys.modules["torch"] = None  # from here on, as if torch were not installed
    kc = np.zeros((4, 2, 1, 4), np.float32)
    vc = np.zeros_like(kc)
    k = np.arange(12, dtype=np.float32).reshape(3, 1, 4)
    K.write_kv(k, -k, kc, vc, np.array([2, 3, 6], np.int64))
    assert (kc[1, 0, 0] == k[0, 0]).all() and (vc[3, 0, 0] == -k[2, 0]).all()
    q = np.ones((1, 1, 4), np.float32)
    out = K.paged_attention_decode(q, kc, vc, np.array([[1, 3]], np.int32),
                                   np.array([3], np.int32))
    s = k[:, 0] @ q[0, 0] / 2.0
    p = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
    assert np.allclose(out[0, 0], p @ -k[:, 0], atol=1e-4), out
    try:
        K.KVCachePool
    except ImportError:
        print("KVCachePool needs torch")
    """, NUMBA_ENABLE_CUDASIM="1")
    assert "torch imported: False" in out
    assert "KVCachePool needs torch" in out
