"""The database under test: TEST_DATABASE_URL's server, or the embedded wheel.

Each test run gets a database of its own, made like a Supabase project (stand-ins, then
migrations) and dropped at the end, so runs never see each other's rows. The one test that needs
a server over TCP (the Supabase CLI's push: it cannot use the embedded server's socket) takes
TEST_SUPABASE_PUSH_DATABASE_URL's, so a run on the embedded wheel (a fresh machine's, CI's) still
pushes to a real server when one is at hand.

A connection string made from another (another database, an added option) is made with
psycopg.conninfo, never by pasting strings: the embedded server's URI already has a query
(`?host=<socket directory>`), and a password may hold any character.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from core.stores.embedded import prepare_database, start_embedded_postgres, stop_embedded_postgres

# The project's schemas: `public` (what PostgREST serves) and the private one its functions are
# built from. The catalog below reads both.
SCHEMAS = ["public", "crossmem_private"]

# A database's schema as the catalogs describe it: what a migration path could get wrong.
CATALOG = {
    "schemas": "select nspname, coalesce(nspacl::text, '') from pg_namespace where nspname = any(%(schemas)s)",
    "relations": """select c.relnamespace::regnamespace::text, c.relname, c.relkind, c.relrowsecurity,
                           c.relforcerowsecurity, coalesce(c.relacl::text, '')
                      from pg_class c where c.relnamespace::regnamespace::text = any(%(schemas)s)""",
    "columns": """select a.attrelid::regclass::text, a.attnum, a.attname, format_type(a.atttypid, a.atttypmod),
                         a.attnotnull, coalesce(pg_get_expr(d.adbin, d.adrelid), ''), a.attidentity,
                         coalesce(a.attacl::text, '')
                    from pg_attribute a
                    join pg_class c on c.oid = a.attrelid
                    left join pg_attrdef d on d.adrelid = a.attrelid and d.adnum = a.attnum
                   where c.relnamespace::regnamespace::text = any(%(schemas)s) and a.attnum > 0
                     and not a.attisdropped""",
    "constraints": """select conrelid::regclass::text, conname, pg_get_constraintdef(oid)
                        from pg_constraint where connamespace::regnamespace::text = any(%(schemas)s)""",
    "indexes": "select schemaname, tablename, indexname, indexdef from pg_indexes where schemaname = any(%(schemas)s)",
    "policies": """select schemaname, tablename, policyname, permissive, roles::text, cmd, qual, with_check
                     from pg_policies where schemaname = any(%(schemas)s)""",
    "functions": """select p.oid::regprocedure::text, pg_get_functiondef(p.oid), coalesce(p.proacl::text, '')
                      from pg_proc p where p.pronamespace::regnamespace::text = any(%(schemas)s)""",
    "triggers": """select t.tgrelid::regclass::text, t.tgname, pg_get_triggerdef(t.oid)
                     from pg_trigger t join pg_class c on c.oid = t.tgrelid
                    where not t.tgisinternal and c.relnamespace::regnamespace::text = any(%(schemas)s)""",
}


def catalog(url: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every table, column (type, default, order), index, constraint, policy, grant, function
    (body and privileges) and trigger of the project's schemas, sorted."""
    with psycopg.connect(url) as connection:
        return {
            name: sorted(connection.execute(query, {"schemas": SCHEMAS}).fetchall()) for name, query in CATALOG.items()
        }


# The databases the tests and benchmarks make and drop: nothing else is named so.
SCRATCH_PREFIX = "crossmem_test_"


def with_database(conninfo: str, database: str) -> str:
    """The same server's connection string naming `database`, in the form it was given (the
    Supabase CLI takes only a URI). A `dbname` in a URI's query, which libpq lets win over its
    path, is dropped: a fresh database's connection string can reach no other database."""
    if not conninfo.startswith(("postgresql://", "postgres://")):
        return make_conninfo(conninfo, dbname=database)
    uri = urlsplit(conninfo)
    query = [(name, value) for name, value in parse_qsl(uri.query, keep_blank_values=True) if name != "dbname"]
    return urlunsplit(uri._replace(path="/" + quote(database), query=urlencode(query, safe="/", quote_via=quote)))


def _create(admin: psycopg.Connection[Any], name: str, template: str | None) -> None:
    """Create a database; a copy of `template` waits for the template's last session to end (the
    store that migrated it has closed its connections, whose backends may still be exiting)."""
    if template is None:
        admin.execute(f'create database "{name}"')
        return
    for attempt in range(50):
        try:
            admin.execute(f'create database "{name}" template "{template}"')
            return
        except psycopg.errors.ObjectInUse:
            if attempt == 49:
                raise
            time.sleep(0.05)


# The server the Supabase CLI push test uses (tests/test_supabase_push.py); docs/testing.md.
SUPABASE_PUSH_VARIABLE = "TEST_SUPABASE_PUSH_DATABASE_URL"


def over_tcp(conninfo: str) -> bool:
    """Whether libpq reaches this server over TCP (a host name or address, not a socket directory)."""
    parameters = conninfo_to_dict(conninfo)
    host = str(parameters.get("host") or "")
    return bool(parameters.get("hostaddr")) or (host != "" and not host.startswith("/"))


def supabase_push_server() -> str | None:
    """The server the Supabase CLI pushes to: TEST_SUPABASE_PUSH_DATABASE_URL's, else
    TEST_DATABASE_URL's when that one is reached over TCP; None when there is none."""
    dedicated = os.environ.get(SUPABASE_PUSH_VARIABLE)
    if dedicated:
        return dedicated
    shared = os.environ.get("TEST_DATABASE_URL")
    return shared if shared and over_tcp(shared) else None


@contextmanager
def server_url() -> Iterator[str]:
    configured = os.environ.get("TEST_DATABASE_URL")
    if configured:
        yield configured
        return
    with tempfile.TemporaryDirectory(prefix="crossmem-pg-") as directory:
        data = Path(directory) / "data"
        try:
            yield start_embedded_postgres(data, delete_on_exit=True)
        finally:
            stop_embedded_postgres(data)


@contextmanager
def fresh_database(server: str, template: str | None = None) -> Iterator[str]:
    """A new database of `server` (a copy of `template`, else empty), dropped after."""
    name = f"{SCRATCH_PREFIX}{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server, autocommit=True) as admin:
        _create(admin, name, template)
    url = with_database(server, name)
    try:
        yield url
    finally:
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(f'drop database if exists "{name}" with (force)')


@contextmanager
def migrated_database(server: str) -> Iterator[str]:
    """A fresh database of `server` with the schema: a copy of this process's migrated template
    (`_migrated_template`), which costs a third of migrating each one anew."""
    with fresh_database(server, template=_migrated_template(server)) as url:
        yield url


# The template each process copies its migrated databases from, by server: made on first use,
# dropped when the process ends (a server stopped by then, the embedded one, goes with its data).
_TEMPLATES: dict[str, str] = {}


def _migrated_template(server: str) -> str:
    if server not in _TEMPLATES:
        name = f"{SCRATCH_PREFIX}template_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(f'create database "{name}"')
        prepare_database(with_database(server, name))
        _TEMPLATES[server] = name
        atexit.register(_drop_template, server, name)
    return _TEMPLATES[server]


def _drop_template(server: str, name: str) -> None:
    with contextlib.suppress(psycopg.Error), psycopg.connect(server, autocommit=True, connect_timeout=2) as admin:
        admin.execute(f'drop database if exists "{name}" with (force)')


def begin_turn_arguments(**given: object) -> dict[str, object]:
    """Every argument of the SQL begin_turn (it has no defaults: those live in the settings),
    with the settings' defaults, and `given` over them: for tests that call it directly."""
    arguments: dict[str, object] = {
        "p_surface": "telegram",
        "p_content": "hello",
        "p_external_id": None,
        "p_user_id": None,
        "p_sender_id": None,
        "p_conversation_id": None,
        "p_window_hours": 24,
        "p_max_messages": 40,
        "p_window_step": 24,
        "p_web_prepend": 8,
        "p_attempt": None,
        "p_turns_per_minute": 0,
        "p_turns_per_day": 0,
        "p_tokens_per_day": 0,
        "p_answer_within_seconds": 60,
        "p_sender": None,
        "p_sender_alias": None,
        "p_opts_out": False,
        "p_platform_ref": None,
        "p_reply_ref": None,
        "p_quoted": None,
        "p_input_tokens": 0,
        "p_output_tokens": 0,
        "p_requests": 0,
        "p_language": None,
    }
    return {**arguments, **given}


def begin_turn_sql(arguments: dict[str, object]) -> str:
    """`select public.begin_turn(name => %(name)s, ...)` for these arguments."""
    named = ", ".join(f"{name} => %({name})s" for name in arguments)
    return f"select public.begin_turn({named})"
