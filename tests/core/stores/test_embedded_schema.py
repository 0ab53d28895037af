"""`make dev`'s embedded database follows the checkout: one made from other schema definitions (the
baseline edited in place since, as it is until the first deploy) is set aside and made anew, where
its old functions would have stayed beside today's code."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import psycopg
import pytest

from core.errors import ConfigurationError
from core.stores import embedded
from core.stores.embedded import current_embedded_database, stop_embedded_postgres

LATER = "the definitions of a later checkout"


def people(url: str) -> list[tuple[object, ...]]:
    with psycopg.connect(url) as connection:
        return connection.execute("select user_id from conversations").fetchall()


def test_a_database_of_other_definitions_is_set_aside_and_made_anew(monkeypatch: pytest.MonkeyPatch) -> None:
    with tempfile.TemporaryDirectory(prefix="crossmem-dev-") as directory:
        data = Path(directory) / "pgdata"
        person = uuid.uuid4()
        try:
            url = current_embedded_database(data)
            with psycopg.connect(url) as connection:
                connection.execute(
                    "insert into conversations (user_id, surface, title) values (%s, 'web', 'x')", (person,)
                )
            assert (Path(directory) / "pgdata.schema").read_text() == embedded.schema_fingerprint()
            assert people(current_embedded_database(data)) == [(person,)]  # the same definitions: kept

            monkeypatch.setattr(embedded, "schema_fingerprint", lambda: LATER)
            # Still served (this process's server, as another `make dev`'s would be): said, nothing moved.
            with pytest.raises(ConfigurationError, match=r"a server \(pid \d+\) still runs on it"):
                current_embedded_database(data)
            assert (data / "PG_VERSION").exists() and not (Path(directory) / "pgdata.old").exists()

            stop_embedded_postgres(data)
            url = current_embedded_database(data)
            assert people(url) == []
            assert (Path(directory) / "pgdata.old" / "PG_VERSION").exists()
            assert (Path(directory) / "pgdata.schema").read_text() == LATER
            with psycopg.connect(url) as connection:
                columns = "select column_name from information_schema.columns where table_name = 'messages'"
                names = [row[0] for row in connection.execute(columns).fetchall()]
            assert "declined" in names  # today's definitions
        finally:
            stop_embedded_postgres(data)


def test_a_directory_never_made_whole_is_removed_and_what_was_set_aside_kept() -> None:
    """A first start that died left an empty directory: it holds nothing to keep, and the database
    set aside before it stays."""
    with tempfile.TemporaryDirectory(prefix="crossmem-dev-") as directory:
        data, aside = Path(directory) / "pgdata", Path(directory) / "pgdata.old"
        aside.mkdir()
        (aside / "PG_VERSION").write_text("15\n")
        data.mkdir()
        (Path(directory) / "pgdata.schema").write_text("the definitions it was to be made from")
        try:
            people(current_embedded_database(data))
            assert (aside / "PG_VERSION").read_text() == "15\n"
        finally:
            stop_embedded_postgres(data)


def test_a_stale_pid_file_naming_another_program_is_no_running_server() -> None:
    """After a crash and a restart, postmaster.pid names a pid another program has since: the
    database is set aside as any other, even when that program's arguments name postgres. Seen
    failing with `make dev` refused."""
    with tempfile.TemporaryDirectory(prefix="crossmem-dev-") as directory:
        data = Path(directory) / "pgdata"
        data.mkdir()
        (data / "PG_VERSION").write_text("15\n")
        # A program alive and not postgres, though its arguments name it (a `psql postgresql://...`):
        # a shell of its own, not this pytest, whose command line names whatever it was given.
        other = subprocess.Popen(["sh", "-c", "sleep 60; :", "psql-postgresql://localhost/postgres"])
        try:
            (data / "postmaster.pid").write_text(f"{other.pid}\n{data}\n")
            embedded._set_aside(data)
        finally:
            other.kill()
            other.wait()
        assert (Path(directory) / "pgdata.old" / "PG_VERSION").exists() and not data.exists()


def test_a_database_of_other_definitions_left_running_by_a_process_killed_outright_is_stopped_and_set_aside(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Seen failing: `kill -9` of `make dev` leaves its Postgres running with no one using it; after a
    pull that changed the definitions, the next `make dev` refused ("a server (pid N) still runs on it:
    stop it (another `make dev`?)") with no other `make dev` to stop, until the Postgres was killed by hand."""
    with tempfile.TemporaryDirectory(prefix="crossmem-dev-") as directory:
        data, aside = Path(directory) / "pgdata", Path(directory) / "pgdata.old"
        holder = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import sys, pathlib; from core.stores.embedded import current_embedded_database;"
                " current_embedded_database(pathlib.Path(sys.argv[1])); print('up', flush=True); sys.stdin.read()",
                str(data),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        orphan = 0
        try:
            assert holder.stdout is not None and holder.stdout.readline() == "up\n"
            orphan = int((data / "postmaster.pid").read_text().split()[0])
            holder.kill()
            holder.wait(timeout=30)
            monkeypatch.setattr(embedded, "schema_fingerprint", lambda: LATER)
            assert people(current_embedded_database(data)) == []
            assert (aside / "PG_VERSION").exists() and not (aside / "postmaster.pid").exists()
            assert int((data / "postmaster.pid").read_text().split()[0]) != orphan
        finally:
            if holder.poll() is None:
                holder.kill()
                holder.wait(timeout=30)
            stop_embedded_postgres(data)
            if orphan and (aside / "postmaster.pid").exists():  # left running: stop it (fast shutdown)
                os.kill(orphan, signal.SIGINT)
