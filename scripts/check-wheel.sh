#!/usr/bin/env bash
# Check pagedkv as a library user gets it: build the wheel, install it (not editable) into clean
# venvs under $TMPDIR and run it from a directory outside the source tree, so nothing can be
# imported from the checkout.
#   1. core: the wheel (--no-deps) + numpy alone; pagedkv.allocator / .spec / .engine import
#      without loading numba, z3, hypothesis, crosshair, tqdm, torch or matplotlib;
#   2. full: the wheel with [verify,kernels] at the versions of constraints.txt (torch from
#      disk); `pagedkv --version`, `pagedkv verify --quick`, the README's usage example (its
#      first ```python block), and the kernels on numpy arrays in the CUDA simulator without
#      torch being imported.
# Needs python3 (3.11), pip, and the packages of constraints.txt from an index or the pip cache.
# KEEP_WORK=1 keeps the work directory. VERIFY=full runs the full `pagedkv verify` (the main
# job) instead of --quick. With VERIFY=full or VERIFY_OUT set (as CI does) the invariant report
# is printed and verify-report.{json,md} are written to VERIFY_OUT (default the checkout);
# otherwise only its last lines are shown. Exit status non-zero on the first failure.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PY=${PY:-python3}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/pagedkv-wheel.XXXXXX")
if [ "${KEEP_WORK:-0}" = 1 ]; then
  trap 'echo "work directory kept: $WORK"' EXIT
else
  trap 'rm -rf "$WORK"' EXIT
fi
PIP_QUIET=(--quiet --disable-pip-version-check)
SECONDS=0
step() { printf '== [%3ds] %s\n' "$SECONDS" "$*"; }

step "copying the source tree (what git knows: tracked and untracked, not ignored files)"
"$PY" - "$ROOT" "$WORK/src" <<'PY'
import shutil, subprocess, sys
from pathlib import Path

root, dst = Path(sys.argv[1]), Path(sys.argv[2])
try:
    out = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=root,
                         capture_output=True, check=True).stdout.decode()
    names = sorted(set(out.split("\0")) - {""})
except (OSError, subprocess.CalledProcessError):  # not a git checkout: all but the usual junk
    junk = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__",
                                  ".hypothesis", ".ruff_cache", ".pytest_cache", "mutants")
    shutil.copytree(root, dst, ignore=junk, symlinks=True)
    sys.exit(0)
for name in names:
    src = root / name
    if src.is_file():  # skips files deleted in the working tree
        (dst / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst / name)
PY
VERSION=$("$PY" -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["project"]["version"])' "$ROOT/pyproject.toml")

step "full venv: pip and setuptools from constraints.txt (the build backend; torch needs it too)"
"$PY" -m venv "$WORK/venv"
V="$WORK/venv/bin"
"$V/pip" install "${PIP_QUIET[@]}" -c "$ROOT/constraints.txt" --upgrade pip setuptools

step "building the wheel (pip wheel --no-deps --no-build-isolation, in the copy)"
"$V/pip" wheel "${PIP_QUIET[@]}" --no-deps --no-build-isolation -w "$WORK/dist" "$WORK/src"
WHEEL=$(ls "$WORK"/dist/pagedkv-*.whl)
echo "   $(basename "$WHEEL")"
"$PY" - "$WHEEL" <<'PY'
import sys, zipfile

names = set(zipfile.ZipFile(sys.argv[1]).namelist())
need = ["pagedkv/__main__.py", "pagedkv/proofs/data/mutation-report.json"] + [
    f"pagedkv/{p}/py.typed" for p in ("spec", "allocator", "kernels", "proofs", "cli", "engine",
                                      "testing")]
missing = [n for n in need if n not in names]
stray = sorted(n for n in names if n.startswith(("tests/", "benchmarks/", "scripts/"))
               or n == "pagedkv/__init__.py")
if missing or stray:
    sys.exit(f"wheel: missing {missing}, should not contain {stray}")
print(f"   {len(names)} files; mutation report and py.typed markers present")
PY

mkdir -p "$WORK/run"
cd "$WORK/run"  # outside the source tree from here on

step "core venv: the wheel (--no-deps) and numpy alone"
"$PY" -m venv "$WORK/core"
"$WORK/core/bin/pip" install "${PIP_QUIET[@]}" -c "$ROOT/constraints.txt" --no-deps "$WHEEL" numpy
"$WORK/core/bin/python" - <<'PY'
import importlib, sys

OPTIONAL = {"numba", "llvmlite", "z3", "hypothesis", "crosshair", "tqdm", "torch", "matplotlib"}
for name in ("pagedkv.allocator", "pagedkv.spec", "pagedkv.engine"):
    mod = importlib.import_module(name)
    assert "site-packages" in mod.__file__, f"{name} comes from {mod.__file__}"
loaded = sorted(OPTIONAL & {m.partition(".")[0] for m in sys.modules})
assert not loaded, f"importing the core loaded optional dependencies: {loaded}"
from pagedkv.allocator import BlockAllocator

a = BlockAllocator(num_blocks=8, block_size=4)
a.add_request("r", list(range(10)))
a.allocate("r", 10)
a.publish(["r"]).complete()
a.commit("r", 10)
a.free("r")
print("   allocator, spec, engine import and run with numpy alone")
PY

step "full venv: the wheel with [verify,kernels], -c constraints.txt"
"$V/pip" install "${PIP_QUIET[@]}" -c "$ROOT/constraints.txt" "$WHEEL[verify,kernels]"
"$V/python" - "$VERSION" <<'PY'
import sys
from importlib.metadata import version

import torch

import pagedkv.allocator
import pagedkv.cli

want = sys.argv[1]
assert version("pagedkv") == want, (version("pagedkv"), want)
assert pagedkv.allocator.__version__ == pagedkv.cli.__version__ == want
assert torch.__version__.split("+")[0] == "2.13.0", f"another torch was installed: {torch.__version__}"
assert torch.version.cuda is None, f"a CUDA torch was installed ({torch.version.cuda})"
print(f"   pagedkv {want}, torch {torch.__version__}")
PY
got=$("$V/pagedkv" --version)
[ "$got" = "pagedkv $VERSION" ] || { echo "pagedkv --version said '$got'" >&2; exit 1; }
echo "   $got"

step "the kernels on numpy arrays in the CUDA simulator, torch not imported"
NUMBA_ENABLE_CUDASIM=1 "$V/python" - <<'PY'
import sys

import numpy as np

import pagedkv.kernels as K

assert "torch" not in sys.modules, "importing pagedkv.kernels imported torch"
kc = np.zeros((4, 2, 1, 4), np.float32)
vc = np.zeros_like(kc)
k = np.arange(12, dtype=np.float32).reshape(3, 1, 4)
K.write_kv(k, -k, kc, vc, np.array([2, 3, 6], np.int64))
out = K.paged_attention_decode(np.ones((1, 1, 4), np.float32), kc, vc,
                               np.array([[1, 3]], np.int32), np.array([3], np.int32))
assert out.shape == (1, 1, 4) and np.isfinite(out).all()
assert "torch" not in sys.modules, "a numpy launch imported torch"
pool = K.KVCachePool(1, 4, 2, 1, 4, dtype="float32")  # torch-backed: loads torch now
assert "torch" in sys.modules and pool.reserved_bytes == 2 * 4 * 2 * 4 * 4
print("   numpy launches without torch; KVCachePool loads it on use")
PY

if [ "${VERIFY:-quick}" = full ]; then
  VERIFY_ARGS=()
else
  VERIFY_ARGS=(--quick)
fi
if [ "${VERIFY:-quick}" = full ] || [ -n "${VERIFY_OUT:-}" ]; then
  REPORTS=${VERIFY_OUT:-$ROOT}
  step "pagedkv verify ${VERIFY_ARGS[*]} (from the installed wheel; reports in $REPORTS)"
  "$V/pagedkv" verify "${VERIFY_ARGS[@]}" --out-dir "$REPORTS" 2>&1 | tee "$WORK/verify.log" || {
    echo "pagedkv verify failed (log above)" >&2
    exit 1
  }
else
  REPORTS=$WORK/verify
  step "pagedkv verify --quick"
  "$V/pagedkv" verify --quick --out-dir "$REPORTS" > "$WORK/verify.log" 2>&1 || {
    tail -n 60 "$WORK/verify.log" >&2
    echo "pagedkv verify --quick failed (log above)" >&2
    exit 1
  }
  tail -n 3 "$WORK/verify.log"
fi
"$V/python" - "$REPORTS/verify-report.json" <<'PY'
import json, sys

rep = json.load(open(sys.argv[1]))
m = rep["parts"]["mutation"]
assert rep["ok"] and m.get("ok"), m
assert "site-packages" in m["path"], f"mutation report read from {m['path']}, not the wheel"
print(f"   report ok; mutation report from the wheel, kill rate {m['kill_rate']}")
nat = rep["parts"]["native_pool"]  # [kernels] brings numba: the native pool's check ran
assert nat.get("ok") and nat.get("ops") and nat["allocator"].get("ops"), nat
print(f"   native pool: self-checked, {nat['ops']:,} operations the same as BlockPool's, "
      f"{nat['allocator']['ops']:,} native step-path calls the same as BlockAllocator's")
PY

step "the README's usage example"
"$PY" - "$ROOT/README.md" > "$WORK/readme_example.py" <<'PY'
import re, sys

block = re.search(r"^```python\n(.*?)^```", open(sys.argv[1]).read(), re.S | re.M)
if block is None:
    sys.exit("README.md has no ```python block")
print(block.group(1))
PY
"$V/python" "$WORK/readme_example.py"
"$WORK/core/bin/python" "$WORK/readme_example.py" > /dev/null  # numpy alone suffices
echo "   ran with [verify,kernels] and in the numpy-only venv"

step "wheel OK"
