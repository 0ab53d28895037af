"""Row-level security, database failures, migrations."""

from __future__ import annotations

import logging
import socket
import tempfile
import time
import tomllib
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest

from core.errors import StoreUnavailable
from core.memory.service import Memory
from core.models import Person, Surface
from core.stores.embedded import (
    MIGRATIONS,
    SUPABASE_STANDINS,
    prepare_database,
    start_embedded_postgres,
    stop_embedded_postgres,
)
from core.stores.postgres_store import PostgresStore
from tests.database import SCHEMAS, begin_turn_arguments, begin_turn_sql, fresh_database
from tests.fakes.postgrest import PostgrestStandIn
from tests.helpers import ROOT, as_role, context_limits, free_port


def test_authenticated_reads_only_its_own_rows_and_cannot_write(memory: Memory, database_url: str) -> None:
    owner, other = uuid.uuid4(), uuid.uuid4()
    start = memory.begin_turn(Person(user_id=owner), Surface.TELEGRAM, "private", "p1")
    with as_role(database_url, "authenticated", sub=owner) as connection:
        assert connection.execute("select count(*) from messages").fetchone() == (1,)
        assert connection.execute("select count(*) from conversations").fetchone() == (1,)
    with as_role(database_url, "authenticated", sub=other) as connection:
        for table in ("messages", "conversations", "identities"):
            assert connection.execute(f"select count(*) from {table}").fetchone() == (0,)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            connection.execute(
                "insert into messages (conversation_id, user_id, surface, role, content)"
                " values (%s, %s, 'web', 'user', 'x')",
                (start.conversation_id, owner),
            )
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            connection.execute("update messages set content = 'changed' where user_id = %s", (owner,))
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            arguments = begin_turn_arguments(p_surface="web", p_content="x", p_user_id=other)
            connection.execute(begin_turn_sql(arguments), arguments)


def test_anon_sees_nothing_and_calls_nothing(memory: Memory, database_url: str) -> None:
    memory.begin_turn(Person(user_id=uuid.uuid4()), Surface.TELEGRAM, "private", "p1")
    with as_role(database_url, "anon") as connection:
        for table in ("messages", "conversations", "identities"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                connection.execute(f"select count(*) from {table}")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            connection.execute("select public.person_history(gen_random_uuid(), 100)")


def test_every_table_has_row_level_security_and_every_function_is_the_service_roles(database_url: str) -> None:
    with psycopg.connect(database_url) as connection:
        without_rls = connection.execute(
            "select c.relname from pg_class c join pg_namespace n on n.oid = c.relnamespace"
            " where n.nspname = 'public' and c.relkind = 'r' and not c.relrowsecurity"
        ).fetchall()
        callable_by_others = connection.execute(
            "select p.proname, r.rolname from pg_proc p join pg_namespace n on n.oid = p.pronamespace"
            " cross join pg_roles r where n.nspname = 'public' and r.rolname in ('anon', 'authenticated')"
            " and has_function_privilege(r.oid, p.oid, 'execute')"
        ).fetchall()
        tables = connection.execute("select count(*) from pg_tables where schemaname = 'public'").fetchone()
    assert without_rls == [] and callable_by_others == []
    # conversations, messages, identities, link_codes, link_attempts, forget_requests, forgotten_deliveries
    assert tables is not None and tables[0] >= 7


# Every privilege anon and authenticated hold in the project's schemas, however they hold it (a
# grant of their own, PUBLIC's): on each schema, relation (table, partitioned table, view,
# materialized view, foreign table), column the relation's privilege does not already give,
# sequence and function.
PRIVILEGES_HELD = """
with api(role) as (values ('anon'), ('authenticated')),
     project as (select oid, nspname from pg_namespace where nspname = any(%(schemas)s))
select a.role, 'schema ' || n.nspname, w.privilege
  from api a cross join project n cross join unnest(array['USAGE', 'CREATE']) w(privilege)
 where has_schema_privilege(a.role, n.oid, w.privilege)
union all
select a.role, c.oid::regclass::text, w.privilege
  from api a cross join pg_class c
 cross join unnest(array['SELECT', 'INSERT', 'UPDATE', 'DELETE', 'TRUNCATE', 'REFERENCES', 'TRIGGER']) w(privilege)
 where c.relnamespace in (select oid from project) and c.relkind in ('r', 'p', 'v', 'm', 'f')
   and has_table_privilege(a.role, c.oid, w.privilege)
union all
select a.role, c.oid::regclass::text || '.' || t.attname, w.privilege
  from api a cross join pg_class c join pg_attribute t on t.attrelid = c.oid and t.attnum > 0 and not t.attisdropped
 cross join unnest(array['SELECT', 'INSERT', 'UPDATE', 'REFERENCES']) w(privilege)
 where c.relnamespace in (select oid from project) and c.relkind in ('r', 'p', 'v', 'm', 'f')
   and has_column_privilege(a.role, c.oid, t.attnum, w.privilege)
   and not has_table_privilege(a.role, c.oid, w.privilege)
union all
select a.role, c.oid::regclass::text, w.privilege
  from api a cross join pg_class c cross join unnest(array['USAGE', 'SELECT', 'UPDATE']) w(privilege)
 where c.relnamespace in (select oid from project) and c.relkind = 'S'
   and has_sequence_privilege(a.role, c.oid, w.privilege)
union all
select a.role, p.oid::regprocedure::text, 'EXECUTE'
  from api a cross join pg_proc p
 where p.pronamespace in (select oid from project) and has_function_privilege(a.role, p.oid, 'EXECUTE')
"""


def test_anon_holds_nothing_and_authenticated_reads_its_tables_and_nothing_else(database_url: str) -> None:
    """Every privilege of the API roles in the project's schemas, from the catalog: a TRUNCATE or
    an INSERT granted, a column's grant, a view, the private schema's usage, a function anyone may
    call fails here (the tests above look at tables' SELECT and functions only). What remains is
    PostgREST's way into `public` and the tables a person reads their own rows of."""
    with psycopg.connect(database_url) as connection:
        held = sorted(connection.execute(PRIVILEGES_HELD, {"schemas": SCHEMAS}).fetchall())
    readable = [
        "conversations",
        "follow_ups",
        "identities",
        "link_codes",
        "memory_notes",
        "merged_people",
        "messages",
        "person_languages",
        "person_timezones",
        "turn_usage",
        "voice_usage",
    ]
    assert held == sorted(
        [
            ("anon", "schema public", "USAGE"),
            ("authenticated", "schema public", "USAGE"),
            *[("authenticated", table, "SELECT") for table in readable],
        ]
    )


def test_no_security_definer_function_takes_its_search_path_from_the_caller(database_url: str) -> None:
    """The functions run as their caller (service_role); one that ran as its owner and took the
    caller's search_path would run whatever the caller put first on it."""
    with psycopg.connect(database_url) as connection:
        definers = connection.execute(
            "select p.oid::regprocedure::text, coalesce(p.proconfig, '{}') from pg_proc p"
            " where p.pronamespace::regnamespace::text = any(%s) and p.prosecdef order by 1",
            (SCHEMAS,),
        ).fetchall()
    assert [name for name, config in definers if not any(c.startswith("search_path=") for c in config)] == []


def test_every_table_authenticated_reads_is_read_through_one_policy_on_its_own_person(database_url: str) -> None:
    """A table `authenticated` may select from has exactly one policy, for select, to it alone, and
    its condition is the row's person being the token's (merged_people: the person merged into).
    A policy widened to `using (true)` on any of them fails here (a privacy review's mutants: three
    of them had no test that read the table as a second person)."""
    with psycopg.connect(database_url) as connection:
        readable = connection.execute(
            "select table_name from information_schema.role_table_grants"
            " where table_schema = 'public' and grantee = 'authenticated' and privilege_type = 'SELECT'"
            " order by 1"
        ).fetchall()
        policies = connection.execute(
            "select tablename, cmd, roles::text, permissive, qual, with_check from pg_policies"
            " where schemaname = 'public' order by 1"
        ).fetchall()
    own = "(user_id = ( SELECT auth.uid() AS uid))"
    merged = "(into_user_id = ( SELECT auth.uid() AS uid))"
    tables = [table for (table,) in readable]
    assert len(tables) == 11
    assert policies == [
        (table, "SELECT", "{authenticated}", "PERMISSIVE", merged if table == "merged_people" else own, None)
        for table in tables
    ]


def test_begin_turns_parts_are_out_of_reach_of_anon_and_authenticated(database_url: str) -> None:
    """The parts live in a schema PostgREST does not serve, and only service_role may run them:
    never callable over /rest/v1/rpc, not even by a signed-in person's token."""
    config = tomllib.loads((ROOT / "infra" / "supabase" / "config.toml").read_text())
    assert "crossmem_private" not in config["api"]["schemas"] + config["api"]["extra_search_path"]
    with psycopg.connect(database_url) as connection:
        parts = connection.execute(
            "select p.oid::regprocedure::text, p.proname, p.pronargs from pg_proc p"
            " where p.pronamespace = 'crossmem_private'::regnamespace order by 1"
        ).fetchall()
        granted = connection.execute(
            "select r.rolname, has_schema_privilege(r.oid, 'crossmem_private', 'usage'),"
            "       bool_or(has_function_privilege(r.oid, p.oid, 'execute'))"
            "  from pg_roles r cross join pg_proc p"
            " where p.pronamespace = 'crossmem_private'::regnamespace"
            "   and r.rolname in ('anon', 'authenticated', 'service_role') group by r.rolname, r.oid order by 1"
        ).fetchall()
    assert len(parts) >= 6  # the person, the delivery, the reply, the budget, the conversation, ...
    assert granted == [("anon", False, False), ("authenticated", False, False), ("service_role", True, True)]
    for role in ("anon", "authenticated"):
        with as_role(database_url, role, sub=uuid.uuid4()) as connection:
            for _, name, arguments in parts:
                nulls = ", ".join(["null"] * arguments)
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    connection.execute(f"select crossmem_private.{name}({nulls})")
    with as_role(database_url, "service_role") as connection:
        arguments = begin_turn_arguments(p_user_id=uuid.uuid4(), p_external_id="private-parts")
        started = connection.execute(begin_turn_sql(arguments), arguments).fetchone()
    assert started is not None and started[0]["duplicate"] is False


def test_the_key_of_the_sms_link_digits_is_out_of_every_tokens_reach(database_url: str) -> None:
    """A person reads their own link codes; the digits a code gives an SMS number are drawn from a
    key they must not read, or they could link someone else's number to their account by forging it."""
    person = uuid.uuid4()
    with psycopg.connect(database_url, autocommit=True) as connection:
        connection.execute("select public.create_link_code(%s, %s, 10, '')", (person, "c" * 64))
        [(key,)] = connection.execute("select key from crossmem_private.link_confirmation_key").fetchall()
        digits = connection.execute(
            "select crossmem_private.link_confirmation(%s, 'sms', '+34600111222')", ("c" * 64,)
        ).fetchone()
    assert key is not None and digits is not None and len(digits[0]) == 6 and digits[0].isdecimal()
    with psycopg.connect(database_url, autocommit=True) as connection:  # drawn from the key: a new key, new digits
        connection.execute("update crossmem_private.link_confirmation_key set key = gen_random_uuid()")
        redrawn = connection.execute(
            "select crossmem_private.link_confirmation(%s, 'sms', '+34600111222')", ("c" * 64,)
        ).fetchone()
    assert redrawn is not None and redrawn[0] != digits[0]  # one chance in a million
    with as_role(database_url, "authenticated", sub=person) as connection:
        [row] = connection.execute("select * from public.link_codes").fetchall()  # their own code, whole
        assert str(key) not in repr(row)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            connection.execute("select key from crossmem_private.link_confirmation_key")


def test_link_codes_and_attempts_are_no_ones_to_read_but_their_own(database_url: str) -> None:
    owner, other = uuid.uuid4(), uuid.uuid4()
    with psycopg.connect(database_url, autocommit=True) as connection:
        connection.execute("select public.create_link_code(%s, repeat('a', 64), 10, '')", (owner,))
        connection.execute(
            "select public.redeem_link_code('telegram', '99', repeat('b', 64), 5, true, true, null, null, null)"
        )
    with as_role(database_url, "authenticated", sub=owner) as connection:
        assert connection.execute("select count(*) from link_codes").fetchone() == (1,)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            connection.execute("select count(*) from link_attempts")
    with as_role(database_url, "authenticated", sub=other) as connection:
        assert connection.execute("select count(*) from link_codes").fetchone() == (0,)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            connection.execute(
                "select public.redeem_link_code('telegram', '99', repeat('a', 64), 5, true, true, null, null, null)"
            )


def test_service_role_runs_the_turn_functions(database_url: str) -> None:
    person = uuid.uuid4()
    with as_role(database_url, "service_role") as connection:
        arguments = begin_turn_arguments(p_surface="telegram", p_content="hi", p_external_id="x", p_user_id=person)
        row = connection.execute(begin_turn_sql(arguments), arguments).fetchone()
        assert row is not None and row[0]["duplicate"] is False


def test_unreachable_database_degrades_to_empty_context(caplog: pytest.LogCaptureFixture) -> None:
    port = free_port()  # nothing listens there: connection refused
    store = PostgresStore(f"postgresql://postgres@127.0.0.1:{port}/postgres")
    memory = Memory(store, context_limits())
    try:
        with caplog.at_level(logging.ERROR, logger="crossmem"):
            start = memory.begin_turn(Person(user_id=uuid.uuid4()), Surface.TELEGRAM, "hello", "u1")
            assert start.degraded and start.history == [] and start.message_id is None
            assert memory.finish_turn(uuid.uuid4(), 1, "reply") is None
    finally:
        store.close()  # its pool's worker would try again, and log, after the test
    messages = [record.getMessage() for record in caplog.records]
    assert any("begin_turn failed" in message for message in messages)
    assert any("finish_turn failed" in message for message in messages)


def test_a_server_that_never_answers_degrades_within_the_connect_timeout() -> None:
    silent = socket.create_server(("127.0.0.1", 0))  # accepts TCP, never speaks Postgres
    port = silent.getsockname()[1]
    store = PostgresStore(f"postgresql://postgres@127.0.0.1:{port}/postgres", connect_timeout_s=2)
    try:
        memory = Memory(store, context_limits())
        began = time.monotonic()
        start = memory.begin_turn(Person(user_id=uuid.uuid4()), Surface.TELEGRAM, "hello", "u1")
        elapsed = time.monotonic() - began
    finally:
        store.close()  # before the server goes: its pool's worker would log the closed connection after the test
        silent.close()
    assert start.degraded
    assert elapsed < 4.0, f"took {elapsed:.1f} s with a 2 s connect timeout"


def test_server_stopped_mid_conversation(caplog: pytest.LogCaptureFixture) -> None:
    with tempfile.TemporaryDirectory(prefix="crossmem-stop-") as directory:
        url = start_embedded_postgres(Path(directory) / "data", delete_on_exit=True)
        prepare_database(url)
        store = PostgresStore(url)
        memory = Memory(store, context_limits())
        person = Person(user_id=uuid.uuid4())
        first = memory.begin_turn(person, Surface.TELEGRAM, "before", "a")
        assert not first.degraded and first.message_id is not None
        stop_embedded_postgres(Path(directory) / "data")  # stop the server under us
        try:
            with caplog.at_level(logging.ERROR, logger="crossmem"):
                second = memory.begin_turn(person, Surface.TELEGRAM, "after", "b")
                assert second.degraded and second.history == []
                assert first.user_id is not None
                assert memory.finish_turn(first.user_id, first.message_id, "late reply") is None
        finally:
            # Closed here: its pool's worker would go on trying to reconnect, and log it once
            # pytest has closed its output ("--- Logging error ---" in CI's log).
            store.close()
        ours = [record for record in caplog.records if record.name.startswith("crossmem")]  # not psycopg.pool's
        assert sum("failed" in record.getMessage() for record in ours) == 2


def schema_snapshot(url: str) -> list[tuple[object, ...]]:
    with psycopg.connect(url) as connection:
        return connection.execute(
            """
            select 'column', table_name || '.' || column_name || ':' || data_type from information_schema.columns
             where table_schema = 'public'
            union all select 'index', indexdef from pg_indexes where schemaname = 'public'
            union all select 'policy', tablename || ':' || policyname from pg_policies where schemaname = 'public'
            union all select 'function', p.oid::regprocedure::text || coalesce(array_to_string(p.proacl, ','), '')
              from pg_proc p join pg_namespace n on n.oid = p.pronamespace where n.nspname = 'public'
            union all select 'migration', version from supabase_migrations.schema_migrations
            union all select 'default privileges', defaclrole::regrole::text || ' '
                   || coalesce(defaclnamespace::regnamespace::text, '') || ' ' || defaclobjtype::text
                   || coalesce(array_to_string(defaclacl, ','), '')
              from pg_default_acl
            order by 1, 2
            """
        ).fetchall()


def test_migrations_apply_to_an_empty_database_and_again_change_nothing(postgres_server: str) -> None:
    with fresh_database(postgres_server) as url:
        store = PostgresStore(url)
        store.run_script(SUPABASE_STANDINS.read_text())
        applied = store.apply_migrations(MIGRATIONS)
        assert applied == [path.stem.split("_")[0] for path in sorted(MIGRATIONS.glob("*.sql"))]
        before = schema_snapshot(url)
        assert store.apply_migrations(MIGRATIONS) == []
        store.run_script(SUPABASE_STANDINS.read_text())
        assert schema_snapshot(url) == before
        assert any(kind == "policy" for kind, _ in before)
        store.close()


def test_an_unreachable_postgrest_degrades_the_same_way(caplog: pytest.LogCaptureFixture) -> None:
    from core.stores.supabase_store import SupabaseStore

    port = free_port()
    memory = Memory(SupabaseStore(f"http://127.0.0.1:{port}", "sb_secret_key", timeout_s=2), context_limits())
    with caplog.at_level(logging.ERROR, logger="crossmem"):
        start = memory.begin_turn(Person(sender_id="tg-1"), Surface.TELEGRAM, "hello", "u1")
        assert start.degraded and start.history == []
        assert memory.finish_turn(uuid.uuid4(), 1, "reply") is None
    assert sum("failed" in record.getMessage() for record in caplog.records) == 2
    assert "sb_secret_key" not in caplog.text
    with pytest.raises(StoreUnavailable) as away:
        memory.store.call("person_history", {"p_user_id": str(uuid.uuid4()), "p_limit": 1})
    assert not away.value.final  # it may pass: finish_turn's retries go on


def test_postgrest_passing_on_the_databases_error_is_final(database_url: str) -> None:
    """PostgREST answers a function's error with its SQLSTATE as the code: asking again cannot
    change it, and the store says so (finish_turn's retries stop at it)."""
    from core.stores.supabase_store import SupabaseStore

    stand_in = PostgrestStandIn(database_url, "sb_secret_key")
    store = SupabaseStore(stand_in.url, "sb_secret_key")
    try:
        with pytest.raises(StoreUnavailable, match="begin_turn failed: APIError") as refused:
            store.call("begin_turn", begin_turn_arguments(p_surface="web", p_content="no person"))
    finally:
        store.close()
        stand_in.close()
    assert refused.value.final


def test_no_api_role_may_touch_a_sequence(memory: Memory, database_url: str) -> None:
    memory.begin_turn(Person(user_id=uuid.uuid4()), Surface.TELEGRAM, "first", "s1")
    with psycopg.connect(database_url, autocommit=True) as admin:
        sequences = [
            row[0]
            for row in admin.execute(
                "select c.oid::regclass::text from pg_class c join pg_namespace n on n.oid = c.relnamespace"
                " where c.relkind = 'S' and n.nspname = 'public' order by 1"
            )
        ]
    assert sequences == ["follow_ups_id_seq", "messages_id_seq"]
    for role in ("anon", "authenticated"):
        for sequence in sequences:
            with as_role(database_url, role, sub=uuid.uuid4()) as connection:
                for call in (f"select setval('public.{sequence}', 1)", f"select nextval('public.{sequence}')"):
                    with pytest.raises(psycopg.errors.InsufficientPrivilege):
                        connection.execute(call)
    second = memory.begin_turn(Person(user_id=uuid.uuid4()), Surface.TELEGRAM, "second", "s2")
    assert second.degraded is False and second.message_id is not None


# What Supabase's default privileges in `public` give the API roles on each table, sequence and
# function the migrations' role makes: everything (a project made before 30 May 2026; the
# stand-ins make those), or nothing, not even to service_role (the Data API's "Default privileges
# for new entities" unchecked: projects made since, and every project's new objects from 30
# October 2026). The migrations must leave the same database after either.
SUPABASE_DEFAULTS = {
    "granted to the API roles": "",
    "granted to none": """
        alter default privileges in schema public revoke all on tables from anon, authenticated, service_role;
        alter default privileges in schema public revoke all on sequences from anon, authenticated, service_role;
        alter default privileges in schema public revoke all on functions from anon, authenticated, service_role;
    """,
}


@contextmanager
def supabase_project(server: str, defaults: str, migrations: Path = MIGRATIONS) -> Iterator[str]:
    """A new database made like a Supabase project with these defaults, then migrated."""
    with fresh_database(server) as url:
        store = PostgresStore(url)
        try:
            store.run_script(SUPABASE_STANDINS.read_text() + SUPABASE_DEFAULTS[defaults])
            store.apply_migrations(migrations)
        finally:
            store.close()
        yield url


@pytest.mark.parametrize("defaults", SUPABASE_DEFAULTS)
def test_a_turn_through_postgrest_runs_whatever_supabases_defaults(postgres_server: str, defaults: str) -> None:
    """PostgREST runs the functions as service_role; begin_turn and finish_turn draw the messages'
    ids from their sequence, which only Supabase's defaults granted it (with none, every turn over
    SUPABASE_URL was answered without memory: permission denied for sequence messages_id_seq)."""
    from core.stores.supabase_store import SupabaseStore

    person = uuid.uuid4()
    with supabase_project(postgres_server, defaults) as url:
        stand_in = PostgrestStandIn(url, "sb_secret_key")
        store = SupabaseStore(stand_in.url, "sb_secret_key")
        try:
            memory = Memory(store, context_limits())
            start = memory.begin_turn(Person(user_id=person), Surface.TELEGRAM, "remember the blue door", "d1")
            assert start.degraded is False and start.message_id is not None
            memory.finish_turn(person, start.message_id, "noted")
            history = store.call("person_history", {"p_user_id": str(person), "p_limit": 10})
        finally:
            store.close()
            stand_in.close()
    assert [(message["role"], message["content"]) for message in history] == [
        ("user", "remember the blue door"),
        ("assistant", "noted"),
    ]


# A migration after the baseline, as docs/deploy.md's step 2 has one written: its objects and
# nothing about who may use them (access.sql, which revoked everything, ran before they existed).
LATER_MIGRATION = """
create table public.later_notes (user_id uuid not null, body text);
alter table public.later_notes enable row level security;
create view public.later_words as select m.user_id, m.content from public.messages m;
create sequence public.later_numbers;
create function public.later_count(p_user_id uuid) returns bigint language sql stable set search_path = ''
    as $$ select count(*) from public.messages m where m.user_id = p_user_id $$;
create table crossmem_private.later_keys (key uuid);
create function crossmem_private.later_part() returns integer language sql immutable set search_path = ''
    as $$ select 1 $$;
"""
LATER_OBJECTS = {
    "has_table_privilege": (
        ["public.later_notes", "public.later_words", "crossmem_private.later_keys"],
        ["SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER"],
    ),
    "has_sequence_privilege": (["public.later_numbers"], ["USAGE", "SELECT", "UPDATE"]),
    "has_function_privilege": (["public.later_count(uuid)", "crossmem_private.later_part()"], ["EXECUTE"]),
}


def later_privileges(url: str, role: str) -> list[tuple[str, str]]:
    """Each (object, privilege) of the later migration's that `role` holds, however it holds it
    (a grant of its own, PUBLIC's), in order."""
    held = []
    with psycopg.connect(url) as connection:
        for check, (names, privileges) in LATER_OBJECTS.items():
            for name in names:
                for privilege in privileges:
                    row = connection.execute(f"select {check}(%s, %s, %s)", (role, name, privilege)).fetchone()
                    if row is not None and row[0]:
                        held.append((name, privilege))
    return held


@pytest.mark.parametrize("defaults", SUPABASE_DEFAULTS)
def test_what_a_later_migration_makes_is_the_service_roles_alone(
    postgres_server: str, tmp_path: Path, defaults: str
) -> None:
    """access.sql's revokes and grants reach what exists when it runs. What a later migration
    makes took Supabase's defaults (every privilege to anon and authenticated: its view was every
    person's messages to the anon key over PostgREST; or none to service_role: its table out of
    the functions' reach) and Postgres's (PUBLIC executes every new function). Whatever the
    project's defaults, it is service_role's alone, as the baseline's is."""
    migrations = tmp_path / "migrations"
    migrations.mkdir()
    for path in sorted(MIGRATIONS.glob("*.sql")):
        (migrations / path.name).symlink_to(path.resolve())
    (migrations / "20261208000001_later.sql").write_text(LATER_MIGRATION)
    person = uuid.uuid4()
    with supabase_project(postgres_server, defaults, migrations) as url:
        store = PostgresStore(url)
        try:
            Memory(store, context_limits()).begin_turn(Person(user_id=person), Surface.TELEGRAM, "mine", "l1")
        finally:
            store.close()
        assert later_privileges(url, "anon") == [] and later_privileges(url, "authenticated") == []
        assert later_privileges(url, "service_role") == [
            ("public.later_notes", "SELECT"),
            ("public.later_notes", "INSERT"),
            ("public.later_notes", "UPDATE"),
            ("public.later_notes", "DELETE"),
            ("public.later_words", "SELECT"),
            ("public.later_words", "INSERT"),
            ("public.later_words", "UPDATE"),
            ("public.later_words", "DELETE"),
            ("crossmem_private.later_keys", "SELECT"),
            ("public.later_numbers", "USAGE"),
            ("public.later_count(uuid)", "EXECUTE"),
            ("crossmem_private.later_part()", "EXECUTE"),
        ]
        for role in ("anon", "authenticated"):
            with as_role(url, role, sub=uuid.uuid4()) as connection:
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    connection.execute("select * from public.later_words")
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    connection.execute("select public.later_count(%s)", (person,))
        with as_role(url, "service_role") as connection:
            assert connection.execute("select public.later_count(%s)", (person,)).fetchone() == (1,)
            connection.execute("insert into public.later_notes values (%s, 'kept')", (person,))
            assert connection.execute("select count(*) from public.later_notes").fetchone() == (1,)
