# Two entry points: `make verify` (the main job) and `make test` (the test suite).
# Each creates .venv on first use and installs pagedkv into it (editable).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: verify verify-quick test lint bench clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

verify: $(STAMP)
	$(BIN)/pagedkv verify

verify-quick: $(STAMP)
	$(BIN)/pagedkv verify --quick

test: $(STAMP)
	NUMBA_ENABLE_CUDASIM=1 HYPOTHESIS_PROFILE=ci $(BIN)/python -m pytest -q
	$(BIN)/ruff check .

bench: $(STAMP)
	$(BIN)/python benchmarks/allocator_bench.py

clean:
	rm -rf $(VENV) verify-report.json verify-report.md
