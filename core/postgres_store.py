"""`PostgresStore`: the memory's SQL functions over psycopg 3 (the only module importing it).

Connections are kept between calls, so a warm serverless instance reuses them. Each call
runs one `select public.fn(...)` in autocommit: one round trip. Prepared statements are
switchable off for Supabase's transaction pooler (port 6543), which cannot keep them.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from core.errors import ConfigurationError, StoreUnavailable
from core.store import JsonScalar, check_function

# Supabase's own bookkeeping of applied migrations; `supabase db push` reads the same table.
_MIGRATIONS_TABLE = """
create schema if not exists supabase_migrations;
create table if not exists supabase_migrations.schema_migrations (
    version text primary key,
    statements text[],
    name text
);
"""


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


class PostgresStore:
    def __init__(
        self,
        conninfo: str,
        *,
        connect_timeout_s: int = 2,
        prepared_statements: bool = True,
        max_connections: int = 8,
    ) -> None:
        self._conninfo = conninfo
        self._connect_timeout_s = connect_timeout_s
        self._prepared_statements = prepared_statements
        self._slots = threading.BoundedSemaphore(max_connections)
        self._idle: list[psycopg.Connection[Any]] = []
        self._lock = threading.Lock()

    def call(self, function: str, arguments: Mapping[str, JsonScalar]) -> Any:
        check_function(function)
        query = _call_query(function, tuple(arguments))
        if not self._slots.acquire(timeout=self._connect_timeout_s):
            raise StoreUnavailable("every database connection is busy")
        try:
            connection = self._take_connection()
            try:
                row = connection.execute(query, dict(arguments)).fetchone()
            except psycopg.Error as exc:
                self._put_back(connection)
                raise StoreUnavailable(f"{function} failed: {type(exc).__name__}") from exc
            self._put_back(connection)
            return row[0] if row else None
        finally:
            self._slots.release()

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
        with self._lock:
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()

    def _connect(self) -> psycopg.Connection[Any]:
        try:
            connection = psycopg.connect(self._conninfo, autocommit=True, connect_timeout=self._connect_timeout_s)
        except psycopg.Error as exc:
            raise StoreUnavailable(f"cannot connect to the database: {type(exc).__name__}") from exc
        if not self._prepared_statements:
            connection.prepare_threshold = None
        return connection

    def _take_connection(self) -> psycopg.Connection[Any]:
        with self._lock:
            while self._idle:
                connection = self._idle.pop()
                if not connection.closed:
                    return connection
        return self._connect()

    def _put_back(self, connection: psycopg.Connection[Any]) -> None:
        if connection.closed or connection.broken:
            connection.close()
            return
        with self._lock:
            self._idle.append(connection)
