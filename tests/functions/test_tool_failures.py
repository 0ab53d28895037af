"""`make deploy-tools` (npm ci) and `make db-push` (the Supabase CLI) run their tool through
functions/tools/tool_failures.py: a failure ends in one line naming the target, the tool's own error and
the likely fix; no traceback, and no flag's value (DB_URL holds the password). The tools here are
fakes on PATH that fail as the real ones do."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEPLOY_TOOLS = "infra/deploy/node_modules/.crossmem-installed"

# npm 10's `npm ci` without a registry (its own lines, the log's path shortened).
NPM_OFFLINE = "\n".join(
    [
        "npm error code ENOTFOUND",
        "npm error syscall getaddrinfo",
        "npm error errno ENOTFOUND",
        "npm error network request to https://registry.npmjs.org/supabase/-/supabase-3.1.0.tgz failed, "
        "reason: getaddrinfo ENOTFOUND registry.npmjs.org",
        "npm error network This is a problem related to network connectivity.",
        "npm error A complete log of this run can be found in: /root/.npm/_logs/debug-0.log",
        "",
    ]
)
NPM_OUT_OF_SYNC = "\n".join(
    [
        "npm error code EUSAGE",
        "npm error",
        "npm error `npm ci` can only install packages when your package.json and package-lock.json or "
        "npm-shrinkwrap.json are in sync. Please update your lock file with `npm install` before continuing.",
        "npm error A complete log of this run can be found in: /root/.npm/_logs/debug-0.log",
        "",
    ]
)
# The Supabase CLI's `db push` with a wrong password (pgx's wording, then the CLI's advice).
SUPABASE_WRONG_PASSWORD = "\n".join(
    [
        "Connecting to remote database...",
        "failed to connect to postgres: failed to connect to `host=127.0.0.1 user=postgres database=postgres`: "
        'failed SASL auth (FATAL: password authentication failed for user "postgres" (SQLSTATE 28P01))',
        "Try rerunning the command with --debug to troubleshoot the error.",
        "",
    ]
)
DB_URL = "postgresql://postgres:hunter2-password@127.0.0.1:5432/postgres"

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def fake_tool(directory: Path, name: str, stderr: str) -> Path:
    """An executable `name` that prints `stderr` and exits 1, as the real tool fails."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.stderr").write_text(stderr)
    tool = directory / name
    tool.write_text(f'#!/bin/sh\ncat "{directory / name}.stderr" >&2\nexit 1\n')
    tool.chmod(0o755)
    return tool


def make(arguments: list[str], fakes: Path) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "PATH": f"{fakes}{os.pathsep}{os.environ['PATH']}", "DB_URL": DB_URL}
    return subprocess.run(
        ["make", "--no-print-directory", *arguments],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )


def our_line(stderr: str, target: str) -> str:
    """The one line the target ends in (make's own `*** [...] Error 1` follows it)."""
    ours = [line for line in stderr.splitlines() if line.startswith(f"{target}: ")]
    assert len(ours) == 1, stderr
    return ours[0]


@pytest.mark.parametrize(
    ("said", "line"),
    [
        (
            NPM_OFFLINE,
            "make deploy-tools: `npm ci` failed: npm could not install the pinned tools: check the registry is "
            "reachable (npm config get registry; docs/deploy.md#1-the-database-a-supabase-project). "
            "It said: npm error network request to https://registry.npmjs.org/"
            "supabase/-/supabase-3.1.0.tgz failed, reason: getaddrinfo ENOTFOUND registry.npmjs.org",
        ),
        (
            NPM_OUT_OF_SYNC,
            "make deploy-tools: `npm ci` failed: infra/deploy/package.json and package-lock.json disagree: "
            "`npm install --prefix infra/deploy`, then commit the lock "
            "(docs/deploy.md#1-the-database-a-supabase-project). It said: npm error `npm ci` can only install "
            "packages when your package.json and package-lock.json or npm-shrinkwrap.json are in sync. Please update "
            "your lock file with `npm install` before continuing.",
        ),
    ],
)
def test_npm_ci_failing_ends_in_its_error_and_the_fix(tmp_path: Path, said: str, line: str) -> None:
    fake_tool(tmp_path, "npm", said)
    done = make(["-B", DEPLOY_TOOLS], tmp_path)  # -B: as when package-lock.json changed
    assert done.returncode != 0
    assert our_line(done.stderr, "make deploy-tools") == line
    assert "Traceback" not in done.stderr
    # The tool's own output stays, above the line.
    assert done.stderr.index(said.splitlines()[0]) < done.stderr.index("make deploy-tools: ")


def test_db_push_with_a_wrong_password_says_so_without_the_url(tmp_path: Path) -> None:
    supabase = fake_tool(tmp_path, "supabase", SUPABASE_WRONG_PASSWORD)
    # -o: the Supabase CLI counts as installed; SUPABASE: the fake in its place.
    done = make(["-o", DEPLOY_TOOLS, "db-push", f"SUPABASE={supabase}"], tmp_path)
    assert done.returncode != 0
    assert our_line(done.stderr, "make db-push") == (
        "make db-push: `supabase db push` failed: the database refused the password in DB_URL: check it "
        "(Supabase: Project Settings, Database; docs/deploy.md#1-the-database-a-supabase-project). It said: failed to "
        "connect to postgres: failed to connect to "
        "`host=127.0.0.1 user=postgres database=postgres`: failed SASL auth (FATAL: password authentication failed "
        'for user "postgres" (SQLSTATE 28P01))'
    )
    assert "hunter2" not in done.stdout + done.stderr and "Traceback" not in done.stderr


def test_a_tool_that_is_not_installed(tmp_path: Path) -> None:
    done = make(["-o", DEPLOY_TOOLS, "db-push", f"SUPABASE={tmp_path / 'missing' / 'supabase'}"], tmp_path)
    assert done.returncode != 0
    assert our_line(done.stderr, "make db-push") == (
        f"make db-push: {tmp_path / 'missing' / 'supabase'} is not on PATH: `make deploy-tools` installs the pinned "
        "Supabase CLI (docs/deploy.md#1-the-database-a-supabase-project)"
    )
