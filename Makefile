# Two commands matter: `make demo` (the main job) and `make verify` (every check).
# Both create .venv on first use and install the package with pinned versions.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
CROSSHAIR_TIMEOUT ?= 4

.PHONY: install demo verify lint typecheck test contracts contracts-catch-fault soak clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $@

demo: $(STAMP)
	$(BIN)/ring-ref demo

verify: lint typecheck test contracts

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy --strict

test: $(STAMP)
	$(BIN)/python -m pytest -q -m 'not soak'

# CrossHair checks the assert-style contracts in ring_ref/contracts.py (zero
# counterexamples allowed); tests/test_contracts.py shows it catching planted faults.
contracts: $(STAMP)
	$(BIN)/crosshair check --analysis_kind=asserts --per_condition_timeout=$(CROSSHAIR_TIMEOUT) ring_ref/contracts.py

soak: $(STAMP)
	HYPOTHESIS_PROFILE=soak $(BIN)/python -m pytest -q -m soak

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .hypothesis build *.egg-info
