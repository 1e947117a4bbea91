# allocscope — `make help` lists the targets.
SHELL := /bin/bash
VENV  := .venv
PY    := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: help setup host venv agent cfi prebuilt lint demo test test-unit test-bpf bench bundle clean rustd
help: ## this list
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | column -t -s $$'\t'

host: ## Debian packages, kernel headers link, tracefs mount (root, idempotent)
	@bash scripts/setup-host.sh

$(STAMP): pyproject.toml
	@test -x $(PY) || /usr/bin/python3 -m venv --system-site-packages $(VENV)
	@$(PY) -m pip install -q --disable-pip-version-check -e '.[test]'
	@touch $@

venv: $(STAMP) ## .venv/ with allocscope and its PyPI deps (BCC from Debian)

AGENT := tracer/inject/agent/allocscope-agent.so
$(AGENT): tracer/inject/agent/agent.c tracer/inject/agent/agent.h tracer/inject/agent.py
	@$(PY) -c 'from pathlib import Path; from tracer.inject.agent import build_agent; build_agent(Path("$@"))'

agent: venv $(AGENT) ## the --inject agent (freestanding C, no dependencies)

CFI := tracer/unwind/cfi/allocscope-cfi.so
$(CFI): tracer/unwind/cfi/cfi.c tracer/unwind/native.py
	@$(PY) -c 'from pathlib import Path; from tracer.unwind.native import build_library; build_library(Path("$@"))'

cfi: venv $(CFI) ## the unwind-table decoder (plain C; without it pyelftools decodes, 100-300x slower)

PREBUILT := probes/prebuilt/allocscope-bpf.json
$(PREBUILT): $(wildcard probes/*.c probes/*.h) tracer/bpf/source.py tracer/bpf/prebuilt.py tracer/bpf/prebuilt_build.py tracer/bpf/kernel_btf.py | $(STAMP)
	@$(PY) -m tracer.bpf.prebuilt_build $@ || echo 'make: the prebuilt probes were not built (see above): recordings compile them with BCC on this box (allocscope doctor)' >&2

prebuilt: venv $(PREBUILT) ## the BPF programs compiled once (every option loads from them; no compile per run)

setup: host venv $(AGENT) $(CFI) $(PREBUILT) ## everything the tool needs on this box
	@$(PY) -m compileall -q allocscope tracer reports common >/dev/null  # bytecode now: PYTHONDONTWRITEBYTECODE boxes recompile every start

demo: setup ## record the bundled demo daemon and report it
	@$(VENV)/bin/allocscope demo

# The formatter: `ruff format --check` (Python) and clang-format (the C of probes/ and tracer/;
# tracer/unwind/cfi/ keeps its own style file); tests/targets, bench and demo C are not formatted.
lint: venv ## ruff (lint and format check), mypy on allocscope/, reports/, common/, tracer/ (pyproject.toml), clang-format on probes/ and tracer/ C; a finding fails
	@$(VENV)/bin/ruff check .
	@$(VENV)/bin/ruff format --check --quiet . || { echo 'ruff format: run .venv/bin/ruff format .' >&2; exit 1; }
	@$(VENV)/bin/mypy
	@find probes tracer -name '*.[ch]' -print0 | xargs -0 clang-format --dry-run --Werror

# tests/targets/rustd (cargo over Debian's crates, ~40 s in a clean clone) built before pytest, not
# inside the first test that runs it (one worker stalled, the other sharing its cores); the stamp in
# tests/targets/bin/rustd-*/ makes a second call nothing (tests/rust_targets.py)
rustd: venv ## the Rust test target as the tests build it (none: the tests that run it say why)
	@$(PY) -c 'import sys; sys.path[:0] = ["tests", "."]; from rust_targets import build_rustd; build_rustd()' 2>/dev/null \
	  || echo 'make: tests/targets/rustd was not built: the tests that run it build it or say why' >&2

# 3 workers on the 2-core box: the tests spend ~30 % of their time waiting on the programs they
# record (their sleeps, signals, intervals), so a third keeps both cores busy (CPU 70 % of 2 cores
# with 2 workers; pytest 7:25 -> 6:00 with 3, every test passing)
TEST_JOBS ?= 3
# The longest files first (most work first, then the small ones fill the gaps: no worker is left
# with a long file at the end). Named files, not `tests`: pytest 9 collects a directory argument
# in its own order and drops the files named before it.
TEST_FIRST ?= $(addprefix tests/test_,unwind_bpf.py watch_bpf.py python_bpf.py faults_bpf.py equations_bpf.py prebuilt_bpf.py retention_bpf.py record_bpf.py inject_bpf.py \
              watch_fleet_bpf.py launch_bpf.py fault_duty_bpf.py \
              rustd_bpf.py modes_bpf.py allocators_bpf.py top_bpf.py demo_bpf.py fuzz_reader.py waits_bpf.py \
              soak_bpf.py regions_bpf.py residency_bpf.py cuda_bpf.py interrupt_bpf.py cli_errors.py)
TEST_FILES = $(TEST_FIRST) $(filter-out $(TEST_FIRST),$(sort $(wildcard tests/test_*.py)))
# rustd (cargo, mostly waiting on its own 2 jobs) is built in the background while setup and lint
# run (the probes' store: ~17 s of one core); it needs only the venv and cargo
test: venv ## ruff, then every test (what would skip fails instead when CI=true); TEST_JOBS=N workers (a file per worker at a time, the longest files first), prints the slowest 15
	@$(MAKE) --no-print-directory rustd & rustd=$$!; $(MAKE) --no-print-directory setup lint; rc=$$?; wait $$rustd; exit $$rc
	@$(PY) -m pytest -q -rs -n $(TEST_JOBS) --dist loadfile --durations=15 $(or $(PYTEST_ARGS),$(TEST_FILES))

test-unit: venv lint ## ruff, then the tests that need no BPF
	@$(PY) -m pytest -q -m 'not bpf' $(PYTEST_ARGS)

bench: setup ## overhead benchmark: loop, redis, demo, demo-large (installs heaptrack, gdb, py-spy; BENCH_ARGS=...)
	@bash scripts/setup-bench.sh
	@$(PY) -m pip install -q --disable-pip-version-check -e '.[test,bench]'
	@$(PY) bench/overhead.py $(BENCH_ARGS)

bundle: ## dist/allocscope-VERSION-x86_64.tar.xz: relocatable, BCC and kernel headers inside (docs/bundle.md)
	@bash scripts/bundle.sh

clean: ## remove build products (keeps .venv)
	rm -rf build tests/targets/bin *.egg-info .pytest_cache $(AGENT) $(CFI) probes/prebuilt
