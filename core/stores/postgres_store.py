"""`PostgresStore`: the memory's SQL functions over psycopg 3 (the only module importing it).

Connections are kept between calls in a psycopg_pool pool, so a warm serverless instance
reuses them. Each call runs one `select public.fn(...)` in autocommit: one round trip.
Prepared statements are switchable off for Supabase's transaction pooler (port 6543),
which cannot keep them.

A call goes to libpq through psycopg's `pgconn` (its documented low-level connection), not
through a cursor: its arguments are JSON scalars, sent as text for the server to type from the
function's signature, and its answer is one JSON value, read with `json.loads`. A cursor's
adapters and its non-blocking wait cost about three times libpq's own call in client CPU (issue
33, docs/benchmarks.md's turn CPU); libpq's blocking call releases the GIL as the wait does.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import pq, sql
from psycopg.adapt import Transformer
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import ConnectionPool, PoolTimeout

from core.errors import ConfigurationError, StoreUnavailable
from core.stores.store import JsonScalar, check_function, final_error

# Supabase's own bookkeeping of applied migrations; `supabase db push` reads the same table.
_MIGRATIONS_TABLE = """
create schema if not exists supabase_migrations;
create table if not exists supabase_migrations.schema_migrations (
    version text primary key,
    statements text[],
    name text
);
"""

# What a Supabase project has before any migration and the migrations use (the roles they grant to,
# the auth.uid() their policies call), that this database lacks: on a plain Postgres, each until
# infra/local/supabase_standins.sql has run. The roles are the cluster's, the function the database's.
_SUPABASE_PARTS_MISSING = """
select part from unnest(array[
    case when to_regrole('anon') is null then 'role anon' end,
    case when to_regrole('authenticated') is null then 'role authenticated' end,
    case when to_regrole('service_role') is null then 'role service_role' end,
    case when to_regprocedure('auth.uid()') is null then 'function auth.uid()' end
]) as part where part is not null
"""


# A statement is prepared on a connection at its sixth use there, as psycopg's own
# prepare_threshold (5) does: a call that runs once costs no round trip to prepare.
PREPARE_AFTER_USES = 5

# Idle connections are closed after this long, before a pooler or a NAT drops them
# (Supabase's pooler, PgBouncer's client_idle_timeout, cloud NATs: minutes, not seconds).
MAX_IDLE_S = 120.0


# The types whose answer is read as JSON; any other (a `text`, a `void`) as psycopg reads it.
_JSON_TYPES = frozenset({114, 3802})  # json, jsonb
_NO_SUCH_STATEMENT = b"26000"  # invalid_sql_statement_name


@dataclass(frozen=True)
class _Call:
    query: bytes
    statement: bytes  # its prepared statement's name on a connection


@functools.lru_cache(maxsize=64)
def _call_query(function: str, names: tuple[str, ...]) -> _Call:
    """`select public.fn(a => $1, ...)`, composed (and quoted) once per function and argument names."""
    query = (
        sql.SQL("select public.{}({})")
        .format(
            sql.Identifier(function),
            sql.SQL(", ").join(
                sql.SQL("{} => ").format(sql.Identifier(name)) + sql.SQL(f"${at}")
                for at, name in enumerate(names, start=1)
            ),
        )
        .as_string(None)
        .encode()
    )
    return _Call(query, b"crossmem_" + hashlib.blake2s(query, digest_size=8).hexdigest().encode())


def _parameter(value: JsonScalar) -> bytes | None:
    """An argument as libpq's text; its type is the function's parameter's (sent as unknown)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return b"true" if value else b"false"
    if isinstance(value, str):
        if "\x00" in value:  # as psycopg refuses it: libpq would cut the text there
            raise psycopg.DataError("PostgreSQL text fields cannot contain NUL (0x00) bytes")
        return value.encode()
    return repr(value).encode()


# libpq ends a URI's user part at its first '@': the rest of a password holding one unescaped is
# taken for the host, which every connection error then quotes, past the logs' mask (no `user:`).
UNESCAPED_AT = "an '@' of its password is written %40 (else the password's end is taken for the host)"


def _password_in_host(parameters: dict[str, Any]) -> bool:
    """Whether a host name holds an '@' (a socket's directory may: it is a path)."""
    hosts = str(parameters.get("host") or "").split(",")
    return any("@" in host and not host.startswith("/") for host in hosts)


def parsed(conninfo: str) -> str:
    """The connection string, once it parses: a mistyped one (`postgres:S3cret@host/x`, a missing
    scheme, a password's unescaped '@') is a ConfigurationError naming DATABASE_URL and quoting
    nothing of it, raised before any connection is tried, so no pool retries it (and logs it) on
    every turn."""
    try:
        parameters = conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError:
        raise ConfigurationError(
            "DATABASE_URL is not a connection string: write it as postgresql://USER:PASSWORD@HOST:PORT/DATABASE"
        ) from None
    if _password_in_host(parameters):
        raise ConfigurationError(f"DATABASE_URL is not a connection string: {UNESCAPED_AT}")
    return conninfo


def conninfo_problem(conninfo: str) -> str | None:
    """What psycopg says is wrong with a connection string (quoting it, password and all: a log
    line or `crossmem doctor` masks it), or that a password's '@' was left unescaped (quoting
    nothing); None when it parses. A URI's password is masked here: psycopg may quote it alone
    (`unexpected spaces found in "Top Secret"`), with no `user:` before it for a mask to find."""
    try:
        parameters = conninfo_to_dict(conninfo)
    except psycopg.Error as exc:
        # The password as libpq reads it, to its first '@' or '/' ('#' and '?' included, where
        # urllib would end it), past its first ':' (before a '/', taken for a port).
        _, separator, rest = conninfo.partition("://")
        password = re.split("[@/]", rest, maxsplit=1)[0].partition(":")[2] if separator else ""
        said = str(exc).strip()
        return said.replace(f'"{password}"', '"***"') if password else said
    return UNESCAPED_AT if _password_in_host(parameters) else None


def connect(conninfo: str, connect_timeout_s: int) -> psycopg.Connection[Any]:
    """One autocommit connection outside any pool, the driver's error as it is (`crossmem doctor`)."""
    return psycopg.connect(conninfo, connect_timeout=connect_timeout_s, autocommit=True)


# A pooled connection whose database went silent mid-call (a host gone, a partition: no reset ever
# comes) fails within seconds instead of holding the turn for the kernel's quarter of an hour: what
# it sent unacknowledged for 10 s (tcp_user_timeout), or no answer to three keepalive probes after
# 5 s of waiting (about 11 s). A live database answers both at once, however long its query.
SILENCE_LIMITS = {
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 3,
    "tcp_user_timeout": 10_000,
}


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
        # Each connection's uses of each statement, for preparing it (a connection is one
        # thread's at a time; the map is shared, so it is reached under the lock).
        self._uses: weakref.WeakKeyDictionary[psycopg.Connection[Any], dict[bytes, int]] = weakref.WeakKeyDictionary()

    def call(self, function: str, arguments: Mapping[str, JsonScalar]) -> Any:
        check_function(function)
        call = _call_query(function, tuple(arguments))
        try:
            parameters = [_parameter(value) for value in arguments.values()]
            try:
                return self._run(call, parameters)
            except _DeadConnection:
                return self._run(call, parameters)
        except (_DeadConnection, psycopg.Error) as exc:
            cause = exc.__cause__ if isinstance(exc, _DeadConnection) else exc
            final = isinstance(exc, psycopg.Error) and final_error(exc.sqlstate)
            raise StoreUnavailable(f"{function} failed: {type(cause).__name__}", final=final) from exc

    def _run(self, call: _Call, parameters: list[bytes | None]) -> Any:
        pool = self._open_pool()
        try:
            connection = pool.getconn()
        except PoolTimeout as exc:
            raise StoreUnavailable("no database connection within the connect timeout") from exc
        try:
            result = self._execute(connection, call, parameters)
            if result.status != pq.ExecStatus.TUPLES_OK:
                raise psycopg.errors.error_from_result(result, encoding=connection.info.encoding)
        except psycopg.Error as exc:
            if connection.broken or connection.closed:
                # Its idle siblings of the same age (a restart, a pooler's idle timeout) are
                # dead too: drop them before this one is returned and replaced by a fresh one.
                pool.drain()
                raise _DeadConnection() from exc
            raise
        finally:
            pool.putconn(connection)
        if result.ntuples == 0:
            return None
        value = result.get_value(0, 0)
        if value is None:
            return None
        if result.ftype(0) in _JSON_TYPES:
            return json.loads(value)
        loader = Transformer(connection)  # a `text` or a `void` answer, as psycopg reads it
        loader.set_pgresult(result)
        return loader.load_row(0, tuple)[0]

    def _execute(
        self, connection: psycopg.Connection[Any], call: _Call, parameters: list[bytes | None]
    ) -> pq.abc.PGresult:
        """One round trip, as psycopg's cursor would make it: an unnamed statement, prepared on
        this connection at its sixth use (one round trip more, once), then run by its name."""
        pgconn = connection.pgconn
        if not self._prepared_statements:
            return pgconn.exec_params(call.query, parameters)
        with self._open_lock:
            uses = self._uses.setdefault(connection, {})
        used = uses.get(call.statement, 0)
        if used < PREPARE_AFTER_USES:
            uses[call.statement] = used + 1
            return pgconn.exec_params(call.query, parameters)
        if used == PREPARE_AFTER_USES:
            prepared = pgconn.prepare(call.statement, call.query)
            if prepared.status != pq.ExecStatus.COMMAND_OK:
                raise psycopg.errors.error_from_result(prepared, encoding=connection.info.encoding)
            uses[call.statement] = used + 1
        # A None is a NULL, as for exec_params (psycopg's stub leaves it out of exec_prepared's type).
        result = pgconn.exec_prepared(call.statement, parameters)  # type: ignore[arg-type]
        if result.error_field(pq.DiagnosticField.SQLSTATE) == _NO_SUCH_STATEMENT:
            # Deallocated behind our back (a DISCARD ALL): this call fails, the next starts over.
            uses[call.statement] = 0
        return result

    def apply_migrations(self, directory: Path) -> list[str]:
        """Apply each `<version>_<name>.sql` not applied yet, in order; return the versions applied."""
        migrations = sorted(directory.glob("*.sql"))
        if not migrations:  # "up to date" here would hide a broken install
            raise ConfigurationError(f"no migrations found in {directory}")
        applied: list[str] = []
        doing = "the bookkeeping of migrations (supabase_migrations.schema_migrations)"
        with self._connect() as connection:
            try:
                connection.execute(_MIGRATIONS_TABLE)
                done = {
                    row[0] for row in connection.execute("select version from supabase_migrations.schema_migrations")
                }
                for path in migrations:
                    version, _, name = path.stem.partition("_")
                    if version in done:
                        continue
                    doing = f"migration {path.stem}"
                    with connection.transaction():
                        connection.execute(path.read_text())
                        connection.execute(
                            "insert into supabase_migrations.schema_migrations (version, name) values (%s, %s)",
                            (version, name),
                        )
                    applied.append(version)
            except psycopg.Error as exc:  # refused (each migration whole or not at all): said, not a traceback
                raise StoreUnavailable(f"{doing} failed: {type(exc).__name__}") from exc
        return applied

    def supabase_parts_missing(self) -> list[str]:
        """What a Supabase project provides and the migrations use, that this database lacks."""
        with self._connect() as connection:
            return [row[0] for row in connection.execute(_SUPABASE_PARTS_MISSING)]

    def run_script(self, script: str, name: str = "the script") -> None:
        """Run a trusted SQL script from the repository (the local Supabase stand-ins), named `name`
        in the error that says the database refused it."""
        with self._connect() as connection:
            try:
                connection.execute(script)
            except psycopg.Error as exc:
                raise StoreUnavailable(f"{name} failed: {type(exc).__name__}") from exc

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
        options: dict[str, Any] = {"autocommit": True, "connect_timeout": self._connect_timeout_s, **SILENCE_LIMITS}
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
