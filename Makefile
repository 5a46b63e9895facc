# The two entry points of the README: `make demo` runs Corral, `make test` runs every check.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test lint typecheck unit bench install bytecode stubs clean

$(STAMP): pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# Bytecode for the project's own modules, which an editable install does not compile: where
# PYTHONDONTWRITEBYTECODE is set, every process would otherwise compile them afresh at each start
# (a control plane served after 0.46 s instead of 0.37 s; the tests start hundreds of processes).
# compileall skips what is up to date; Python checks each file's timestamp, so an edit is never missed.
bytecode: $(STAMP)
	$(BIN)/python -m compileall -q -j 0 corral control worker runner bench tests

demo: $(STAMP) bytecode
	$(BIN)/corral demo

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

# Most tests wait on processes far more than they compute, so they run in parallel, one process per core
# and one more (at most 8): on two cores the run took 10.5 min instead of 18. Those that need the cores
# or the timing of the machine to themselves (marked serial), and the Docker ones, which share one engine
# and its containers, run after them, one at a time.
TEST_PROCS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); echo $$(( n + 1 < 8 ? n + 1 : 8 )))

unit: $(STAMP) bytecode
	$(BIN)/pytest -n $(TEST_PROCS) -m "not serial and not docker"
	$(BIN)/pytest -m "serial or docker"

test: lint typecheck unit

stubs: $(STAMP)
	$(BIN)/python protos/generate.py

bench: $(STAMP)
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) build *.egg-info
