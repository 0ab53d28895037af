"""`make db-push`: the real Supabase CLI (pinned in infra/deploy) pushes the migrations to a
Postgres made like a Supabase project, says "up to date" the second time, and leaves the same
schema `crossmem migrate` makes."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import psycopg
import pytest

from core.stores.embedded import MIGRATIONS, SUPABASE_STANDINS
from functions.tools.cli import main
from tests.database import SUPABASE_PUSH_VARIABLE, catalog, fresh_database, over_tcp, supabase_push_server

ROOT = Path(__file__).resolve().parent.parent
SUPABASE = ROOT / "infra" / "deploy" / "node_modules" / ".bin" / "supabase"


def applied_migrations(url: str) -> list[tuple[str, str]]:
    with psycopg.connect(url) as connection:
        query = "select version, name from supabase_migrations.schema_migrations order by 1"
        return connection.execute(query).fetchall()


def db_push(url: str, home: Path) -> subprocess.CompletedProcess[str]:
    environment = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),  # the CLI keeps its own files under ~/.supabase
        "DB_URL": url,
        "SUPABASE_TELEMETRY_DISABLED": "1",
        "DO_NOT_TRACK": "1",
    }
    command = ["make", "--no-print-directory", "-C", str(ROOT), "db-push"]
    return subprocess.run(command, capture_output=True, text=True, env=environment, timeout=120)


def test_supabase_db_push_makes_the_schema_crossmem_migrate_makes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if not SUPABASE.exists():
        pytest.fail("the Supabase CLI is not installed: `make deploy-tools` (make test runs it) installs it")
    postgres_server = supabase_push_server()
    if postgres_server is None:
        pytest.skip(f"the Supabase CLI reaches Postgres over TCP only: {SUPABASE_PUSH_VARIABLE} gives it one (CI's)")
    if not over_tcp(postgres_server):
        pytest.fail(f"{SUPABASE_PUSH_VARIABLE} names a server on a socket: the Supabase CLI needs one over TCP")
    migrations = [path.name for path in sorted(MIGRATIONS.glob("*.sql"))]
    with fresh_database(postgres_server) as pushed, fresh_database(postgres_server) as migrated:
        with psycopg.connect(pushed, autocommit=True) as connection:
            connection.execute(SUPABASE_STANDINS.read_text())
        first = db_push(pushed, tmp_path)
        assert first.returncode == 0, first.stderr
        for migration in migrations:
            assert f"Applying migration {migration}..." in first.stderr
        assert pushed not in first.stdout + first.stderr  # the URL holds the password
        again = db_push(pushed, tmp_path)
        assert again.returncode == 0, again.stderr
        assert "Remote database is up to date." in again.stdout + again.stderr

        monkeypatch.chdir(tmp_path)
        monkeypatch.setenv("DATABASE_URL", migrated)
        assert main(["migrate", "--supabase-standins"]) == 0
        assert catalog(pushed) == catalog(migrated)
        assert applied_migrations(pushed) == applied_migrations(migrated)
        # Either path after the other finds nothing to do: both keep Supabase's migration table.
        capsys.readouterr()
        monkeypatch.setenv("DATABASE_URL", pushed)
        assert main(["migrate"]) == 0
        assert "up to date" in capsys.readouterr().out
        after_migrate = db_push(migrated, tmp_path)
        assert "Remote database is up to date." in after_migrate.stdout + after_migrate.stderr


def test_make_db_push_without_a_url_says_how() -> None:
    done = subprocess.run(
        ["make", "--no-print-directory", "-C", str(ROOT), "db-push"],
        capture_output=True,
        text=True,
        env={"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/")},
        timeout=60,
    )
    assert done.returncode == 2
    assert "usage: make db-push DB_URL=postgresql://" in done.stderr
