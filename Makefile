# Two entry points: `make verify` (the main job) and `make test` (the test suite).
# Each creates .venv on first use and installs pagedkv into it (editable), with every
# dependency at the version of constraints.txt (the versions CI tests; torch is the CPU build).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: verify verify-quick test lint bench check-wheel clean

$(STAMP): pyproject.toml constraints.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet -c constraints.txt --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

verify: $(STAMP)
	$(BIN)/pagedkv verify

verify-quick: $(STAMP)
	$(BIN)/pagedkv verify --quick

test: $(STAMP)
	NUMBA_ENABLE_CUDASIM=1 HYPOTHESIS_PROFILE=ci $(BIN)/python -m pytest -q -n 2
	$(BIN)/ruff check .

bench: $(STAMP)
	$(BIN)/python benchmarks/allocator_bench.py

# the built wheel, installed in clean venvs under /tmp (see the script)
check-wheel:
	bash scripts/check-wheel.sh

clean:
	rm -rf $(VENV) verify-report.json verify-report.md
