# Every target builds .venv from nothing when it is missing or the lock changed. Everything Python
# comes from uv.lock (README, Deploy: locked dependencies): `make test` runs the versions that ship.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
UV_VERSION := 0.13.9
UV := $(BIN)/uv
RUN_STAMP := $(VENV)/.installed-run
STAMP := $(VENV)/.installed
# uv sync --frozen: exactly the lock's versions, hashes checked, never a new resolution.
# --inexact: keep uv itself (pip put it there), which the lock does not list.
SYNC := $(UV) sync --frozen --inexact --quiet

# Our own stamp, touched once `npm ci` succeeded: an install cut short (npm ci empties
# node_modules first) leaves none, so the next make installs again.
DEPLOY_TOOLS := infra/deploy/node_modules/.crossmem-installed
# The AI SDK's client for the test of the web's UI message stream (tests/node, `ai` 6 as its
# package-lock.json pins it), installed the same way.
NODE_CLIENT := tests/node/node_modules/.crossmem-installed
SUPABASE := infra/deploy/node_modules/.bin/supabase
# A deploy tool's failure ends in one line: its own error and the likely fix (functions/tools/tool_failures.py,
# standard library only, so it runs before the venv exists).
EXPLAINED = $(PYTHON) -m functions.tools.tool_failures --as

.PHONY: dev test bench soak lint browser requirements upgrade deploy-tools package deploy db-push db-standins

# uv from PyPI, pinned, into the venv it manages (no installer script from elsewhere).
$(UV):
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet uv==$(UV_VERSION)

# What `make dev` runs, and nothing more: the package, the embedded database, and PyYAML (the
# `deploy` extra), which `crossmem deploy --dry-run` and `crossmem doctor` read serverless.yml with.
# The Makefile is a prerequisite too: a venv made before a line here changed is synced again.
$(RUN_STAMP): uv.lock pyproject.toml Makefile | $(UV)
	$(SYNC) --extra embedded --extra deploy
	touch $(RUN_STAMP)

# The tools of `make test`, `make bench` and the deploy on top.
$(STAMP): $(RUN_STAMP)
	$(SYNC) --extra dev --extra embedded --extra deploy
	touch $(STAMP)

dev: $(RUN_STAMP)
	$(BIN)/crossmem dev

test: $(STAMP) browser $(DEPLOY_TOOLS) $(NODE_CLIENT)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
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

# After editing pyproject.toml's dependencies: the lock follows (keeping every version it can),
# then requirements.txt from it. `make upgrade`: every package to its newest allowed version.
requirements: | $(UV)
	$(UV) lock
	$(BIN)/python infra/requirements.py > requirements.txt

upgrade: | $(UV)
	$(UV) lock --upgrade
	$(BIN)/python infra/requirements.py > requirements.txt

# The Supabase CLI, as infra/deploy/package-lock.json pins it: its binary is a platform package on
# the npm registry (@supabase/cli-linux-x64, ...), so nothing is downloaded from elsewhere.
$(DEPLOY_TOOLS): infra/deploy/package-lock.json
	@echo "npm ci --prefix infra/deploy --no-audit --no-fund --loglevel=error"
	@$(EXPLAINED) "make deploy-tools" -- npm ci --prefix infra/deploy --no-audit --no-fund --loglevel=error
	touch $(DEPLOY_TOOLS)

deploy-tools: $(DEPLOY_TOOLS)

$(NODE_CLIENT): tests/node/package-lock.json
	@echo "npm ci --prefix tests/node --no-audit --no-fund --loglevel=error"
	@$(EXPLAINED) "make test" -- npm ci --prefix tests/node --no-audit --no-fund --loglevel=error
	touch $(NODE_CLIENT)

# What `make deploy` uploads, by .gcloudignore, in build/function-source/.
package: $(RUN_STAMP)
	$(BIN)/python -m functions.tools.upload

# Every function of serverless.yml as a 2nd-gen function (`crossmem deploy --dry-run` only prints).
deploy: $(STAMP)
	$(BIN)/crossmem deploy

# The migrations with the real Supabase CLI: make db-push DB_URL=postgresql://... (the URL stays
# out of the terminal: it holds the password).
db-push: $(DEPLOY_TOOLS)
	@test -n "$$DB_URL" || { echo "usage: make db-push DB_URL=postgresql://USER:PASSWORD@HOST:PORT/postgres" >&2; exit 2; }
	@echo "$(SUPABASE) db push --workdir infra --remote=\$$DB_URL --yes"
	@$(EXPLAINED) "make db-push" -- $(SUPABASE) db push --workdir infra --remote="$$DB_URL" --yes

# A plain Postgres (no Supabase): the roles and auth schema Supabase provides, then the migrations
# (recorded as the Supabase CLI records them, so a later `make db-push` finds it up to date).
db-standins: $(RUN_STAMP)
	@test -n "$$DB_URL" || { echo "usage: make db-standins DB_URL=postgresql://USER:PASSWORD@HOST:PORT/postgres" >&2; exit 2; }
	@DATABASE_URL="$$DB_URL" $(BIN)/crossmem migrate --supabase-standins
