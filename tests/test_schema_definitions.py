"""The schema in one place: infra/supabase/schemas/ defines every object once, the migrations
derive from it (the baseline links to it), and a database built from either is the same one."""

from __future__ import annotations

import json
import tomllib
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from core.models import Surface
from core.stores.embedded import MIGRATIONS, SUPABASE_STANDINS, prepare_database
from tests.database import begin_turn_arguments, begin_turn_sql, catalog, fresh_database
from tests.helpers import rows

SUPABASE = Path(__file__).resolve().parent.parent / "infra" / "supabase"
DEFINITIONS = SUPABASE / "schemas"


def definition_files() -> list[Path]:
    """config.toml's `[db.migrations] schema_paths`: the definitions, in the order they apply."""
    config = tomllib.loads((SUPABASE / "config.toml").read_text())
    return [(SUPABASE / path).resolve() for path in config["db"]["migrations"]["schema_paths"]]


def build_from_definitions(url: str, edited: dict[str, str] | None = None) -> None:
    """A database made from the definitions; `edited` gives some files' text as edited (by name)."""
    edited = edited or {}
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute(SUPABASE_STANDINS.read_text())
        for path in definition_files():
            with connection.transaction():
                connection.execute(edited.get(path.name, path.read_text()))


@pytest.fixture(scope="module")
def two_databases(postgres_server: str) -> Iterator[tuple[str, str]]:
    """One database built from the definitions, one from the migrations."""
    with fresh_database(postgres_server) as defined, fresh_database(postgres_server) as migrated:
        build_from_definitions(defined)
        prepare_database(migrated)
        yield defined, migrated


def differences(left: dict[str, list[tuple[Any, ...]]], right: dict[str, list[tuple[Any, ...]]]) -> list[str]:
    found = []
    for kind in left:
        only_left = set(left[kind]) - set(right[kind])
        only_right = set(right[kind]) - set(left[kind])
        found += [f"{kind}, definitions only: {row}" for row in sorted(only_left, key=str)]
        found += [f"{kind}, migrations only: {row}" for row in sorted(only_right, key=str)]
    return found


def test_the_definitions_and_the_migrations_make_the_same_database(two_databases: tuple[str, str]) -> None:
    defined, migrated = catalog(two_databases[0]), catalog(two_databases[1])
    assert differences(defined, migrated) == []
    assert defined == migrated
    # The comparison reads something: every kind of object the project has is there.
    assert all(defined[kind] for kind in defined), [kind for kind in defined if not defined[kind]]


def test_the_comparison_sees_one_function_changed_in_one_place(postgres_server: str) -> None:
    with fresh_database(postgres_server) as defined, fresh_database(postgres_server) as changed:
        build_from_definitions(defined)
        build_from_definitions(changed)
        assert differences(catalog(defined), catalog(changed)) == []
        with psycopg.connect(changed, autocommit=True) as connection:
            # The same signature and grants, another body: what a migration that copied a
            # function and changed one line of it, or forgot one, would leave.
            connection.execute(
                """create or replace function public.window_keeps(p_total bigint, p_limit integer, p_step integer)
                   returns integer language sql immutable set search_path = '' as $$ select 0 $$"""
            )
        found = differences(catalog(defined), catalog(changed))
        assert found and all(line.startswith("functions, ") and "window_keeps" in line for line in found)
        with psycopg.connect(changed, autocommit=True) as connection:
            connection.execute("grant select on public.link_attempts to authenticated")
        assert any(line.startswith("relations, ") for line in differences(catalog(defined), catalog(changed)))


def test_the_baseline_links_to_every_definition_in_their_order() -> None:
    migrations = sorted(MIGRATIONS.glob("*.sql"))
    baseline = [path for path in migrations if path.is_symlink()]
    assert [path.resolve() for path in baseline] == definition_files()
    assert sorted(DEFINITIONS.glob("*.sql")) == sorted(definition_files())
    # What comes after the baseline is written by hand, small, and only after it.
    later = migrations[len(baseline) :]
    assert migrations[: len(baseline)] == baseline
    assert not any(path.is_symlink() for path in later)


def test_every_foreign_key_is_indexed_where_it_points_from(two_databases: tuple[str, str]) -> None:
    """Deleting a row (a purge, forgetting) looks up the rows that point at it: without an index on
    the referencing column, each deleted row scans the whole table (a purge of 1M rows never ends)."""
    with psycopg.connect(two_databases[0]) as connection:
        unindexed = connection.execute(
            """select c.conrelid::regclass::text, a.attname
                 from pg_constraint c
                 join pg_attribute a on a.attrelid = c.conrelid and a.attnum = c.conkey[1]
                where c.contype = 'f' and c.connamespace = 'public'::regnamespace
                  and not exists (select from pg_index i
                                   where i.indrelid = c.conrelid and i.indkey[0] = c.conkey[1])
                order by 1, 2"""
        ).fetchall()
    assert unindexed == []


# The surfaces are defined once (surfaces.sql). A fifth one (Signal, say) is this edit of that
# file, and no other, as SMS was.
SIGNAL = [
    ("in ('web', 'telegram', 'whatsapp', 'sms')", "in ('web', 'telegram', 'whatsapp', 'sms', 'signal')"),
    ("when 'sms' then '[SMS]'", "when 'sms' then '[SMS]'\n               when 'signal' then '[Signal]'"),
]


def surfaces_sql_with(edits: list[tuple[str, str]]) -> dict[str, str]:
    text = (DEFINITIONS / "surfaces.sql").read_text()
    for old, new in edits:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    return {"surfaces.sql": text}


def signal_turn(connection: psycopg.Connection[Any], sender: str, content: str, sid: str) -> dict[str, Any]:
    arguments = begin_turn_arguments(
        p_surface="signal", p_sender_id=sender, p_sender=sender, p_content=content, p_external_id=sid
    )
    row = connection.execute(begin_turn_sql(arguments), arguments).fetchone()
    assert row is not None
    return dict(row[0])


def test_a_fourth_surface_is_an_edit_of_surfaces_sql_alone(postgres_server: str) -> None:
    with fresh_database(postgres_server) as url:
        build_from_definitions(url, surfaces_sql_with(SIGNAL))
        with psycopg.connect(url, autocommit=True) as connection:
            first = signal_turn(connection, "+34600111222", "hola por signal", "SM1")
            other = signal_turn(connection, "+34600999888", "otra persona", "SM2")
            due = (datetime.now(UTC) + timedelta(days=2)).isoformat()
            follow_up = {"schedule": [{"content": "el viernes", "due_at": due, "timezone": "UTC"}]}
            connection.execute(
                "select public.finish_turn_follow_ups(%s, %s, 'te aviso el viernes', true, null, null, 10, null, %s,"
                " 5, 0, null, null, null, null)",
                (first["user_id"], first["message_id"], json.dumps(follow_up)),
            )
            person = first["user_id"]
            assert rows(url, "select surface, title from public.conversations where user_id = %s", person) == [
                ("signal", "[Signal]")
            ]
            assert rows(
                url, "select surface, title from public.conversations where user_id = %s", other["user_id"]
            ) == [("signal", "[Signal]")]
            assert rows(
                url, "select surface, role, content from public.messages where user_id = %s order by id", person
            ) == [
                ("signal", "user", "hola por signal"),
                ("signal", "assistant", "te aviso el viernes"),
            ]
            assert rows(url, "select surface, external_id from public.identities where user_id = %s", person) == [
                ("signal", "+34600111222")
            ]
            assert rows(url, "select surface, sender, content from public.follow_ups where user_id = %s", person) == [
                ("signal", "+34600111222", "el viernes")
            ]
            # A wrong code, a link to a web account, a forget request: each table of chats takes it.
            wrong = connection.execute(
                "select public.redeem_link_code('signal', '+34600999888', %s, 5, false, true, null, null, null)",
                ("0" * 64,),
            ).fetchone()
            assert wrong is not None and wrong[0] == {"status": "invalid", "language": None}
            web_person = uuid.uuid4()
            linked = connection.execute(
                "select public.link_identity(%s, 'signal', '+34600111222')", (web_person,)
            ).fetchone()
            assert linked is not None and linked[0]["status"] == "linked" and linked[0]["moved_messages"] == 2
            requested = connection.execute(
                "select public.forget_request('signal', false, null, '+34600111222', 5, null, 5, null)"
            ).fetchone()
            assert requested is not None and requested[0]["status"] == "requested"
            assert rows(url, "select surface, external_id from public.link_attempts") == [("signal", "+34600999888")]
            assert rows(url, "select surface from public.forget_requests where user_id = %s", web_person) == [
                ("signal",)
            ]
            forgotten = connection.execute(
                "select public.forget_request('signal', true, null, '+34600111222', 5, null, 5, null)"
            ).fetchone()
            assert forgotten is not None and forgotten[0]["status"] == "forgotten"
            assert rows(
                url, "select surface, external_id from public.forgotten_deliveries where user_id = %s", web_person
            ) == [("signal", "SM1")]
            # The other Signal sender keeps everything.
            assert rows(url, "select surface, content from public.messages where user_id = %s", other["user_id"]) == [
                ("signal", "otra persona")
            ]


def test_without_that_edit_no_table_takes_the_surface(database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as connection:
        with pytest.raises(psycopg.errors.CheckViolation, match="surface_known"):
            signal_turn(connection, "+15550001111", "hola por signal", "SM-unknown")
        with pytest.raises(psycopg.errors.CheckViolation, match="chat_surface_not_web"):
            connection.execute(
                "insert into public.identities (surface, external_id, user_id) values ('web', 'x', %s)", (uuid.uuid4(),)
            )
    # The turn stored nothing: its identity went with the transaction that failed.
    assert rows(database_url, "select count(*) from public.identities where external_id = '+15550001111'") == [(0,)]
    assert rows(database_url, "select count(*) from public.messages where external_id = 'SM-unknown'") == [(0,)]


def test_a_surface_listed_without_a_title_fails_at_its_first_conversation(postgres_server: str) -> None:
    """Half the edit is never half working: the conversation's title is `not null`."""
    with fresh_database(postgres_server) as url:
        build_from_definitions(url, surfaces_sql_with(SIGNAL[:1]))
        with (
            psycopg.connect(url, autocommit=True) as connection,
            pytest.raises(psycopg.errors.NotNullViolation, match='"title"'),
        ):
            signal_turn(connection, "+34600111222", "hola por signal", "SM1")
        assert rows(url, "select count(*) from public.messages") == [(0,)]


def test_every_surface_python_knows_is_listed_and_every_chat_has_a_title_and_its_window(database_url: str) -> None:
    listed = [
        value
        for (value,) in rows(
            database_url,
            r"""select (regexp_matches(pg_get_constraintdef(c.oid), '''(\w+)''', 'g'))[1]
                  from pg_constraint c where c.contypid = 'public.surface'::regtype and c.conname = 'surface_known'""",
        )
    ]
    assert sorted(listed) == sorted(surface.value for surface in Surface)
    titles = dict(rows(database_url, "select s, public.conversation_title(s) from unnest(%s::text[]) s", listed))
    assert titles == {"web": None, "telegram": "[Telegram]", "whatsapp": "[WhatsApp]", "sms": "[SMS]"}
    # where follow-ups wait for the person's window (WhatsApp's 24 hours): named here alone in the SQL
    windows = dict(rows(database_url, "select s, public.surface_has_window(s) from unnest(%s::text[]) s", listed))
    assert windows == {"web": False, "telegram": False, "whatsapp": True, "sms": False}
