#!/usr/bin/env bash
# GPU check for pagedkv's kernels, meant for one device call of a few minutes on a fresh machine
# with an NVIDIA GPU: pick a Python that has torch (CUDA) + numba-cuda (the repo's .venv, else
# one created and installed here, else the system python with the sources on PYTHONPATH),
# print versions, run the `gpu` tests, then benchmark decode (benchmarks/kernel_bench.py),
# which also measures device-to-device copy bandwidth. Results go to benchmarks/results/ and
# to $OUT when that is set. Exit status: non-zero if the tests or the benchmark failed.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
OUT_DIR=${OUT:-}
TEST_TIMEOUT=${TEST_TIMEOUT:-300}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-300}
LOG_DIR=$(mktemp -d)
export PAGEDKV_GPU=1
unset NUMBA_ENABLE_CUDASIM

has_deps() {  # can this python run the GPU checks?
  "$1" - <<'PY' 2>/dev/null
import numba, numba_cuda, pytest, torch  # noqa: F401
assert torch.cuda.is_available()
PY
}

PY=""
if [ -x .venv/bin/python ] && has_deps .venv/bin/python; then
  PY=.venv/bin/python
else
  echo "== creating .venv and installing pagedkv[dev]"
  python3 -m venv --system-site-packages .venv 2>/dev/null || python3 -m venv .venv
  if .venv/bin/python -m pip install --quiet -e '.[dev]' && has_deps .venv/bin/python; then
    PY=.venv/bin/python
  elif has_deps python3; then
    echo "== install failed (offline?): using the system python with the sources on PYTHONPATH"
    PY=python3
  elif has_deps .venv/bin/python; then
    PY=.venv/bin/python
  else
    echo "!! no python with torch (CUDA), numba, numba-cuda and pytest found" >&2
    exit 2
  fi
fi
# Make `import pagedkv.*` work even without an (editable) install: a shim of symlinks.
if ! "$PY" -c "import pagedkv.kernels" 2>/dev/null; then
  SHIM="$LOG_DIR/shim/pagedkv"
  mkdir -p "$SHIM"
  touch "$SHIM/__init__.py"
  for pkg in spec allocator kernels proofs; do ln -s "$ROOT/$pkg" "$SHIM/$pkg"; done
  export PYTHONPATH="$LOG_DIR/shim${PYTHONPATH:+:$PYTHONPATH}"
fi

echo "== versions"
"$PY" - <<'PY'
import platform
import numba, torch
try:
    import numba_cuda
    ncv = getattr(numba_cuda, "__version__", "?")
except ImportError:
    ncv = "missing"
print(f"python {platform.python_version()}  torch {torch.__version__} (cuda {torch.version.cuda})"
      f"  numba {numba.__version__}  numba-cuda {ncv}")
print("gpu:", torch.cuda.get_device_name() if torch.cuda.is_available() else "none")
PY
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem \
  --format=csv 2>/dev/null || nvidia-smi || echo "nvidia-smi not available"

status=0
echo "== gpu tests (PAGEDKV_GPU=1 pytest -m gpu)"
timeout "$TEST_TIMEOUT" "$PY" -m pytest -m gpu -q -p no:cacheprovider 2>&1 \
  | tee "$LOG_DIR/gpu-tests.log"
rc=${PIPESTATUS[0]}
if [ "$rc" -ne 0 ]; then echo "!! gpu tests failed (exit $rc)"; status=1; fi

echo "== decode benchmark"
timeout "$BENCH_TIMEOUT" "$PY" benchmarks/kernel_bench.py ${BENCH_ARGS:-} 2>&1 \
  | tee "$LOG_DIR/kernel-bench.log"
rc=${PIPESTATUS[0]}
if [ "$rc" -ne 0 ]; then echo "!! benchmark failed (exit $rc)"; status=1; fi

if [ -n "$OUT_DIR" ]; then
  mkdir -p "$OUT_DIR"
  cp "$LOG_DIR"/*.log "$OUT_DIR"/ 2>/dev/null || true
fi
echo "== gpu-check done (status $status)"
exit $status
