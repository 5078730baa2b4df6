# Two commands do all set-up on a fresh machine with Python >= 3.10 and make: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test lint bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

# The main job: an A/B of the bundled baseline against EAGLE-3 (3 steps) on this machine, against the simulator:
# 3 blocks (each launches both arms once, in a random order), so the verdict rests on restart-to-restart noise.
# Shorter runs than the seed's 2048 tokens so it finishes in about two minutes; the tok/s figures are the same.
demo: install
	$(BIN)/orch ab baseline eagle3-3step --sim --blocks 3 --warmup 2 --runs 3 --max-tokens 256 --db $(VENV)/demo.db
	@$(BIN)/orch status

test: install
	$(BIN)/pytest -q

lint: install
	$(BIN)/ruff check orchestrator tests benchmarks
	$(BIN)/ruff format --check orchestrator tests benchmarks
	$(BIN)/mypy

# Reproduces docs/performance.md: orchestration overhead (local vs SSH) and the client fidelity/capacity tables,
# the latter side by side with the field's clients installed into their own venv (.venv-ref).
REF := .venv-ref
$(REF)/.installed: benchmarks/requirements-reference.txt
	$(PYTHON) -m venv $(REF)
	$(REF)/bin/pip install --quiet --no-deps -r benchmarks/requirements-reference.txt
	touch $(REF)/.installed

bench: install $(REF)/.installed
	$(BIN)/python benchmarks/lifecycle_overhead.py
	$(REF)/bin/python benchmarks/client_fidelity.py

clean:
	rm -rf $(VENV) $(REF) .pytest_cache .mypy_cache .ruff_cache
