"""`PostgresStore`: the memory's SQL functions over psycopg 3 (the only module importing it).

Connections are kept between calls in a psycopg_pool pool, so a warm serverless instance
reuses them. Each call runs one `select public.fn(...)` in autocommit: one round trip.
Prepared statements are switchable off for Supabase's transaction pooler (port 6543),
which cannot keep them.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import ConnectionPool, PoolTimeout

from core.errors import ConfigurationError, StoreUnavailable
from core.stores.store import JsonScalar, check_function

# Supabase's own bookkeeping of applied migrations; `supabase db push` reads the same table.
_MIGRATIONS_TABLE = """
create schema if not exists supabase_migrations;
create table if not exists supabase_migrations.schema_migrations (
    version text primary key,
    statements text[],
    name text
);
"""


# Idle connections are closed after this long, before a pooler or a NAT drops them
# (Supabase's pooler, PgBouncer's client_idle_timeout, cloud NATs: minutes, not seconds).
MAX_IDLE_S = 120.0


@functools.lru_cache(maxsize=64)
def _call_query(function: str, names: tuple[str, ...]) -> str:
    """`select public.fn(a => %(a)s, ...)`, composed (and quoted) once per function and argument names."""
    return (
        sql.SQL("select public.{}({})")
        .format(
            sql.Identifier(function),
            sql.SQL(", ").join(
                sql.SQL("{} => {}").format(sql.Identifier(name), sql.Placeholder(name)) for name in names
            ),
        )
        .as_string(None)
    )


def parsed(conninfo: str) -> str:
    """The connection string, once it parses: a mistyped one (`postgres:S3cret@host/x`, a missing
    scheme) is a ConfigurationError naming DATABASE_URL and quoting nothing of it, raised before
    any connection is tried, so no pool retries it (and logs it) on every turn."""
    try:
        conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError:
        raise ConfigurationError(
            "DATABASE_URL is not a connection string: write it as postgresql://USER:PASSWORD@HOST:PORT/DATABASE"
        ) from None
    return conninfo


class PostgresStore:
    """The SQL functions over a small psycopg_pool pool, opened at the first call.

    The healthy path costs one round trip a call: connections are handed out unchecked
    (a `check` would cost a round trip each time). Instead, a call whose connection turns
    out dead (a database restart, a pooler's idle timeout) is retried once on a fresh one,
    and the pool's other idle connections are dropped with it. Errors that leave the
    connection alive (a bad argument, a timeout inside the database) are never retried.
    """

    def __init__(
        self,
        conninfo: str,
        *,
        connect_timeout_s: int = 2,
        prepared_statements: bool = True,
        max_connections: int = 8,
        max_idle_s: float = MAX_IDLE_S,
    ) -> None:
        self._conninfo = parsed(conninfo)
        self._connect_timeout_s = connect_timeout_s
        self._prepared_statements = prepared_statements
        self._pool: ConnectionPool[psycopg.Connection[Any]] = ConnectionPool(
            self._conninfo,
            kwargs=self._connection_options(),
            min_size=0,
            max_size=max_connections,
            open=False,
            timeout=connect_timeout_s,
            max_idle=max_idle_s,
            # A failed connection attempt is retried in the background (after 1 s, then
            # backing off) for as long as a call waits for it; after that the next call
            # starts again, so the pool follows the database's return within a second.
            reconnect_timeout=connect_timeout_s,
            num_workers=1,
        )
        self._open_lock = threading.Lock()
        self._opened = False

    def call(self, function: str, arguments: Mapping[str, JsonScalar]) -> Any:
        check_function(function)
        query = _call_query(function, tuple(arguments))
        try:
            try:
                return self._run(query, arguments)
            except _DeadConnection:
                return self._run(query, arguments)
        except (_DeadConnection, psycopg.Error) as exc:
            cause = exc.__cause__ if isinstance(exc, _DeadConnection) else exc
            raise StoreUnavailable(f"{function} failed: {type(cause).__name__}") from exc

    def _run(self, query: str, arguments: Mapping[str, JsonScalar]) -> Any:
        pool = self._open_pool()
        try:
            connection = pool.getconn()
        except PoolTimeout as exc:
            raise StoreUnavailable("no database connection within the connect timeout") from exc
        try:
            row = connection.execute(query, dict(arguments)).fetchone()
        except psycopg.Error as exc:
            if connection.broken or connection.closed:
                # Its idle siblings of the same age (a restart, a pooler's idle timeout) are
                # dead too: drop them before this one is returned and replaced by a fresh one.
                pool.drain()
                raise _DeadConnection() from exc
            raise
        finally:
            pool.putconn(connection)
        return row[0] if row else None

    def apply_migrations(self, directory: Path) -> list[str]:
        """Apply each `<version>_<name>.sql` not applied yet, in order; return the versions applied."""
        migrations = sorted(directory.glob("*.sql"))
        if not migrations:  # "up to date" here would hide a broken install
            raise ConfigurationError(f"no migrations found in {directory}")
        applied: list[str] = []
        with self._connect() as connection:
            connection.execute(_MIGRATIONS_TABLE)
            done = {row[0] for row in connection.execute("select version from supabase_migrations.schema_migrations")}
            for path in migrations:
                version, _, name = path.stem.partition("_")
                if version in done:
                    continue
                with connection.transaction():
                    connection.execute(path.read_text())
                    connection.execute(
                        "insert into supabase_migrations.schema_migrations (version, name) values (%s, %s)",
                        (version, name),
                    )
                applied.append(version)
        return applied

    def run_script(self, script: str) -> None:
        """Run a trusted SQL script from the repository (the local Supabase stand-ins)."""
        with self._connect() as connection:
            connection.execute(script)

    def close(self) -> None:
        with self._open_lock:
            if self._opened:
                self._pool.close()
                self._opened = False

    def _open_pool(self) -> ConnectionPool[psycopg.Connection[Any]]:
        """Opened at the first call, not at construction: an instance that never
        touches the database (a stranger, a bad request) never connects."""
        if not self._opened:
            with self._open_lock:
                if not self._opened:
                    self._pool.open()
                    self._opened = True
        return self._pool

    def _connection_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {"autocommit": True, "connect_timeout": self._connect_timeout_s}
        if not self._prepared_statements:
            options["prepare_threshold"] = None
        return options

    def _connect(self) -> psycopg.Connection[Any]:
        """A connection of its own, outside the pool, for migrations and scripts."""
        try:
            return psycopg.connect(self._conninfo, **self._connection_options())
        except psycopg.Error as exc:
            raise StoreUnavailable(f"cannot connect to the database: {type(exc).__name__}") from exc


class _DeadConnection(Exception):
    """The connection a call ran on is gone (not the call's own error)."""
