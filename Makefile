# Build and test entry points. CI runs `make test` (via .ci/run).
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := test

VENV  := .venv
PY    := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: venv run test lint clean

# The version check runs every time (not as a file prerequisite) because a
# stale .venv built on an old interpreter can have an up-to-date stamp.
venv:
	@if [[ -e $(VENV) ]] && ! $(PY) -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then \
		echo "make: $(VENV) is missing a working Python >= 3.12; recreating it"; \
		rm -rf $(VENV); \
	fi
	@$(MAKE) --no-print-directory $(STAMP)

# Reinstall only when the pinned dependencies change.
$(STAMP): pyproject.toml clients/python/pyproject.toml
	@if [[ ! -x $(PY) ]]; then \
		py=$$(scripts/find-python); \
		echo "make: creating $(VENV) with $$py"; \
		"$$py" -m venv $(VENV); \
	fi
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install -e ".[dev]"
	$(PY) -m pip install -e ./clients/python
	@touch $(STAMP)

run: venv
	scripts/run

test: venv
	scripts/test

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy .

# Back to a fresh checkout: var/ holds only regenerable demo state
# (SQLite DB, secret key, demo API key, openapi.yaml).
clean:
	rm -rf $(VENV) var .mypy_cache .ruff_cache .pytest_cache *.egg-info
	find . -path ./.git -prune -o -type d -name __pycache__ -prune -exec rm -rf {} +
