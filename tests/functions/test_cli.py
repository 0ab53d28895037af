"""`crossmem` commands, run in-process against the real database and a fake Bot API."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC
from pathlib import Path

import psycopg
import pytest

from core.models import Person, Surface
from core.stores.embedded import MIGRATIONS
from functions import runtime
from functions.tools.cli import main
from tests.database import fresh_database, migrated_database, with_database
from tests.fakes.telegram_api import FakeTelegram
from tests.helpers import DEFAULT, ENGLISH_MENU, PRIVATE, SPANISH_MENU, TELEGRAM_SECRET, as_owner, count, free_port

ROOT = Path(__file__).resolve().parents[2]


def test_migrate_applies_once_then_reports_up_to_date(
    postgres_server: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: object
) -> None:
    monkeypatch.chdir(str(tmp_path))
    with fresh_database(postgres_server) as url:
        monkeypatch.setenv("DATABASE_URL", url)
        assert main(["migrate", "--supabase-standins"]) == 0
        versions = [path.stem.split("_")[0] for path in sorted(MIGRATIONS.glob("*.sql"))]
        assert f"applied {len(versions)} migration(s): {', '.join(versions)}" in capsys.readouterr().out
        assert main(["migrate"]) == 0
        assert "up to date" in capsys.readouterr().out


def test_migrate_up_to_date_on_a_database_made_from_older_definitions_says_so(
    postgres_server: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: object
) -> None:
    """Its baseline recorded as applied, a function as an earlier checkout defined it: migrate said
    "up to date" and exited 0, as `make db-push` says "Remote database is up to date."."""
    monkeypatch.chdir(str(tmp_path))
    with migrated_database(postgres_server) as url:
        monkeypatch.setenv("DATABASE_URL", url)
        with psycopg.connect(url, autocommit=True) as connection:
            connection.execute(
                """create or replace function public.window_keeps(p_total bigint, p_limit integer, p_step integer)
                   returns integer language sql immutable set search_path = '' as $$ select 0 $$"""
            )
        assert main(["migrate"]) == 1
    said, complained = capsys.readouterr()
    assert said == "applied 0 migration(s); up to date\n"
    assert complained == (
        "crossmem migrate: made from other definitions than these: 1 SQL function(s) differ from their "
        "definition in infra/supabase/schemas/: function public.window_keeps (context.sql); a push runs no "
        "migration recorded as applied: bring the database across "
        "(docs/deploy.md#a-database-made-from-older-definitions)\n"
    )


def test_migrate_names_the_generated_column_a_differing_function_computes(
    postgres_server: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: object
) -> None:
    """Pushed from 8826baf, whose crossmem_private.searchable made no words of Japanese: migrate named
    the function alone, and its `create or replace` was taken (same arguments) while every stored
    messages.search_text kept the old words: an old "東京に行きます" was never found by "東京"."""
    monkeypatch.chdir(str(tmp_path))
    with migrated_database(postgres_server) as url:
        monkeypatch.setenv("DATABASE_URL", url)
        with psycopg.connect(url, autocommit=True) as connection:
            connection.execute(
                """create or replace function crossmem_private.searchable(p_text text) returns tsvector
                   language plpgsql immutable parallel safe set search_path = '' as $$
                   begin return pg_catalog.to_tsvector('pg_catalog.simple'::regconfig, p_text); end $$"""
            )
        assert main(["migrate"]) == 1
    assert capsys.readouterr().err == (
        "crossmem migrate: made from other definitions than these: 1 SQL function(s) differ from their "
        "definition in infra/supabase/schemas/: function crossmem_private.searchable (messages.sql; the generated "
        "column public.messages.search_text calls it: drop the column and its indexes before the function, add "
        "them again after it, or its rows keep what the old function computed); a push runs no migration "
        "recorded as applied: bring the database across (docs/deploy.md#a-database-made-from-older-definitions)\n"
    )


def test_migrate_up_to_date_names_what_the_definitions_have_and_the_database_lacks(
    postgres_server: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: object
) -> None:
    """Pushed from a checkout before a function and an index were added, no function changed since:
    migrate said "up to date" and exited 0 (the doctor named them); beside a changed function it
    named that one alone, and whoever ran the statements it named left the new ones out."""
    monkeypatch.chdir(str(tmp_path))
    with migrated_database(postgres_server) as url:
        monkeypatch.setenv("DATABASE_URL", url)
        with psycopg.connect(url, autocommit=True) as connection:
            connection.execute("drop function public.record_delivery")
            connection.execute("drop index public.follow_ups_reserved")
        assert main(["migrate"]) == 1
        said, complained = capsys.readouterr()
        assert said == "applied 0 migration(s); up to date\n"
        assert complained == (
            "crossmem migrate: partly migrated: 2 of what the migrations define is missing: function "
            "public.record_delivery (turn.sql), index public.follow_ups_reserved (follow_ups.sql); create each "
            "again from its definition in infra/supabase/schemas/ (docs/deploy.md#a-partly-migrated-database)\n"
        )
        with psycopg.connect(url, autocommit=True) as connection:
            connection.execute(
                """create or replace function public.window_keeps(p_total bigint, p_limit integer, p_step integer)
                   returns integer language sql immutable set search_path = '' as $$ select 0 $$"""
            )
        assert main(["migrate"]) == 1
    assert capsys.readouterr().err == (
        "crossmem migrate: made from other definitions than these: 1 SQL function(s) differ from their "
        "definition in infra/supabase/schemas/: function public.window_keeps (context.sql); 2 missing: function "
        "public.record_delivery (turn.sql), index public.follow_ups_reserved (follow_ups.sql); a push runs no "
        "migration recorded as applied: bring the database across "
        "(docs/deploy.md#a-database-made-from-older-definitions)\n"
    )


def test_migrate_on_a_plain_postgres_refuses_before_applying_anything(
    postgres_server: str,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: object,
) -> None:
    """Seen failing: without --supabase-standins, it applied and recorded the first 13 migrations, then
    stopped at the one granting to Supabase's roles (`schema "auth" does not exist`), the database left
    half migrated. (`database_url`, migrated with the stand-ins, has made the cluster's roles: a fresh
    database lacks only the auth schema's function.)"""
    monkeypatch.chdir(str(tmp_path))
    with fresh_database(postgres_server) as url:
        monkeypatch.setenv("DATABASE_URL", url)
        assert main(["migrate"]) == 1
        with psycopg.connect(url) as connection:
            schemas = connection.execute(
                "select nspname from pg_namespace where nspname not like 'pg\\_%' and nspname <> 'information_schema'"
            ).fetchall()
            relations = connection.execute("select count(*) from pg_class where relnamespace = 'public'::regnamespace")
            assert (schemas, relations.fetchone()) == ([("public",)], (0,))
    assert capsys.readouterr() == (
        "",
        "crossmem migrate: this Postgres is not a Supabase project: it has no function auth.uid(); nothing was "
        "applied. Run `crossmem migrate --supabase-standins` to first create the roles and auth schema Supabase "
        "provides\n",
    )


def test_migrate_with_the_standins_on_a_database_that_has_supabases_parts_leaves_them_as_they_are(
    postgres_server: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: object
) -> None:
    """On a Supabase project the stand-ins replaced its own auth.uid() (and a role that does not own
    it, as a project's, was refused: "must be owner of function uid"): they run only where a part
    is missing."""
    monkeypatch.chdir(str(tmp_path))
    supabases = "select nullif(current_setting('request.jwt.claim.sub', true), '')::uuid -- the project's own"
    with migrated_database(postgres_server) as url:
        monkeypatch.setenv("DATABASE_URL", url)
        with psycopg.connect(url, autocommit=True) as connection:
            connection.execute(
                f"create or replace function auth.uid() returns uuid language sql stable as $$ {supabases} $$"
            )
        assert main(["migrate", "--supabase-standins"]) == 0
        with psycopg.connect(url) as connection:
            body = connection.execute("select prosrc from pg_proc where oid = 'auth.uid()'::regprocedure").fetchone()
    assert body == (f" {supabases} ",)
    assert capsys.readouterr().out == "applied 0 migration(s); up to date\n"


def test_migrate_that_the_database_refuses_says_which_migration_and_why_in_one_line(
    postgres_server: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: object
) -> None:
    """Seen failing with a traceback: a database already holding an object of the same name, a role
    without the right to create (the stand-ins' `permission denied for database`)."""
    monkeypatch.chdir(str(tmp_path))
    with fresh_database(postgres_server) as url:
        monkeypatch.setenv("DATABASE_URL", url)
        with psycopg.connect(url, autocommit=True) as connection:
            connection.execute("create domain public.surface as integer")
        assert main(["migrate", "--supabase-standins"]) == 1
        with psycopg.connect(url) as connection:
            recorded = connection.execute("select count(*) from supabase_migrations.schema_migrations").fetchone()
    assert recorded == (0,)
    assert capsys.readouterr() == (
        "",
        'crossmem migrate: migration 20261202000001_baseline_surfaces failed: type "surface" already exists\n',
    )


def test_migrate_says_why_it_cannot_connect_and_masks_the_password(
    postgres_server: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: object
) -> None:
    """It said "cannot connect to the database: OperationalError" for a database that does not
    exist, a server that does not answer and a password refused alike."""
    monkeypatch.chdir(str(tmp_path))
    missing = with_database(postgres_server, "crossmem_test_no_such_database")
    monkeypatch.setenv("DATABASE_URL", missing)
    assert main(["migrate"]) == 1
    said = capsys.readouterr().err
    assert said.startswith("crossmem migrate: cannot connect to the database: connection failed: ")
    assert said.endswith('database "crossmem_test_no_such_database" does not exist\n') and said.count("\n") == 1
    monkeypatch.setenv("DATABASE_URL", f"postgresql://postgres:hunter2-password@127.0.0.1:{free_port()}/postgres")
    assert main(["migrate"]) == 1
    said = capsys.readouterr().err
    assert said.startswith("crossmem migrate: cannot connect to the database: connection failed: ")
    assert "Connection refused" in said and "hunter2" not in said and said.count("\n") == 1


def test_migrate_without_a_database_url_says_so(
    monkeypatch: pytest.MonkeyPatch, tmp_path: object, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(str(tmp_path))
    monkeypatch.delenv("DATABASE_URL", raising=False)
    assert main(["migrate"]) == 2
    assert "DATABASE_URL" in capsys.readouterr().err


def test_history_prints_a_persons_thread_over_every_surface(
    environment: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    person = uuid.uuid4()
    memory = runtime.memory()
    for surface, text in ((Surface.TELEGRAM, "from telegram"), (Surface.WHATSAPP, "from whatsapp")):
        start = memory.begin_turn(Person(user_id=person), surface, text, uuid.uuid4().hex)
        assert start.message_id is not None
        memory.finish_turn(person, start.message_id, f"reply to {text}")
    capsys.readouterr()
    assert main(["history", "--user", str(person)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("] ", 1)[1] for line in lines] == [
        "user: from telegram",
        "assistant: reply to from telegram",
        "user: from whatsapp",
        "assistant: reply to from whatsapp",
    ]
    assert main(["history", "--user", str(person), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(row["surface"], row["role"]) for row in rows][:2] == [("telegram", "user"), ("telegram", "assistant")]


def test_history_says_its_times_in_utc_whatever_the_database_sessions_zone(
    environment: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], database_url: str
) -> None:
    """It printed the session's clock (PGTZ, the server's TimeZone: Tokyo's here) with no zone named."""
    person = uuid.uuid4()
    start = runtime.memory().begin_turn(Person(user_id=person), Surface.TELEGRAM, "when was this?", uuid.uuid4().hex)
    with psycopg.connect(database_url) as connection:
        at = connection.execute("select created_at from messages where id = %s", (start.message_id,)).fetchone()
    assert at is not None
    environment.setenv("PGTZ", "Asia/Tokyo")
    runtime.reset()
    capsys.readouterr()
    assert main(["history", "--user", str(person)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"{at[0].astimezone(UTC):%Y-%m-%d %H:%M} UTC [telegram] user: when was this?"
    ]


def test_a_command_stops_at_a_wrong_setting_it_reads_and_names_it(
    environment: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The store's own settings are said as what they are, not as a store that could not be set up
    (which a function answers without memory); another surface's wrong setting stops nothing here."""
    person = str(uuid.uuid4())
    environment.setenv("TWILIO_API_BASE", "twilio")
    assert main(["history", "--user", person]) == 0
    environment.setenv("DATABASE_POOL_SIZE", "0")
    runtime.reset()
    capsys.readouterr()
    assert main(["history", "--user", person]) == 1
    assert capsys.readouterr().err == (
        "crossmem history: invalid configuration: DATABASE_POOL_SIZE: Input should be greater than or equal to 1\n"
    )


def test_a_command_on_a_database_url_that_does_not_parse_says_why(
    environment: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Seen failing: `crossmem history`, `forget`, `export`, `purge` on a DATABASE_URL that does not
    parse ended in "the memory store could not be set up: ConfigurationError", the reason only in a
    JSON log line above it (migrate said it)."""
    environment.setenv("DATABASE_URL", "postgres:S3cret@db.example.com/postgres")
    for command in (["history", "--user", str(uuid.uuid4())], ["purge", "--older-than", "30d", "--dry-run"]):
        runtime.reset()
        assert main(command) == 1
        assert capsys.readouterr().err.splitlines()[-1] == (
            f"crossmem {command[0]}: the memory store could not be set up: DATABASE_URL is not a connection "
            "string: write it as postgresql://USER:PASSWORD@HOST:PORT/DATABASE"
        )


def test_a_command_that_cannot_reach_the_database_says_why_as_migrate_does(
    environment: pytest.MonkeyPatch, postgres_server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Seen failing: a database that does not exist, a server refusing connections, a host unknown: each
    ended in "no database connection within the connect timeout" (as if slow), the driver's reason only
    in the pool's JSON warnings above it."""
    environment.setenv("DATABASE_URL", with_database(postgres_server, "crossmem_test_no_such_database"))
    person = str(uuid.uuid4())
    assert main(["export", "--user", person]) == 1
    said = capsys.readouterr().err.splitlines()[-1]
    assert said.startswith("crossmem export: cannot connect to the database: connection failed: ")
    assert said.endswith('database "crossmem_test_no_such_database" does not exist')
    environment.setenv("DATABASE_URL", f"postgresql://postgres:hunter2-password@127.0.0.1:{free_port()}/postgres")
    runtime.reset()
    assert main(["forget", "--user", person, "--yes"]) == 1
    said = capsys.readouterr().err.splitlines()[-1]
    assert said.startswith("crossmem forget: cannot connect to the database: connection failed: ")
    assert "Connection refused" in said and "hunter2" not in said


def test_a_command_on_a_database_never_migrated_says_to_migrate_it(
    environment: pytest.MonkeyPatch, postgres_server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Seen failing: "crossmem history: person_history failed: UndefinedFunction", and nothing said of
    what to do."""
    with fresh_database(postgres_server) as url:
        environment.setenv("DATABASE_URL", url)
        for command in (["history", "--user", str(uuid.uuid4())], ["purge", "--older-than", "30d", "--dry-run"]):
            runtime.reset()
            assert main(command) == 1
            function = {"history": "person_history", "purge": "purge_messages"}[command[0]]
            assert capsys.readouterr().err == (
                f"crossmem {command[0]}: {function} failed: UndefinedFunction: the database lacks what this "
                "checkout calls (not migrated, or migrated from an older checkout): run `crossmem migrate`, "
                "which names what is missing\n"
            )


def test_identities_under_the_owner_policy_lists_the_owners_configured_chats_and_numbers(
    environment: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # It said "no linked chats or numbers" for the owner, whose Telegram and WhatsApp were answered.
    owner, someone = uuid.uuid4(), uuid.uuid4()
    as_owner(environment, owner, telegram="4242,77", whatsapp="+34600111222")
    assert main(["identities", "--user", str(owner)]) == 0
    assert capsys.readouterr().out == (
        "IDENTITY_POLICY=owner telegram 4242\nIDENTITY_POLICY=owner telegram 77\n"
        "IDENTITY_POLICY=owner whatsapp +34600111222\n"
    )
    assert main(["identities", "--user", str(owner), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == [
        {"surface": "telegram", "external_id": "4242", "linked_at": None},
        {"surface": "telegram", "external_id": "77", "linked_at": None},
        {"surface": "whatsapp", "external_id": "+34600111222", "linked_at": None},
    ]
    assert main(["identities", "--user", str(someone)]) == 0  # anyone else: only their links
    assert capsys.readouterr().out == "no linked chats or numbers\n"


def test_telegram_set_webhook_and_info_go_through_the_bot_api(
    environment: pytest.MonkeyPatch, fake_telegram: FakeTelegram, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        main(
            [
                "telegram",
                "set-webhook",
                "--url",
                "https://advisor.example.com/telegram_webhook",
                "--drop-pending-updates",
            ]
        )
        == 0
    )
    (method, payload), *menus = fake_telegram.calls
    assert method == "setWebhook"
    assert payload["url"] == "https://advisor.example.com/telegram_webhook"
    assert payload["secret_token"] == TELEGRAM_SECRET and payload["drop_pending_updates"] is True
    assert "message" in payload["allowed_updates"] and "my_chat_member" in payload["allowed_updates"]
    # Then the command menu "/" shows in private chats: the default one in English, one for
    # Spanish; and none in groups, where the bot does not talk.
    assert menus == [
        ("setMyCommands", {"commands": ENGLISH_MENU, "scope": PRIVATE}),
        ("deleteMyCommands", {"scope": DEFAULT}),
        ("setMyCommands", {"commands": SPANISH_MENU, "scope": PRIVATE, "language_code": "es"}),
        ("deleteMyCommands", {"scope": DEFAULT, "language_code": "es"}),
    ]
    assert capsys.readouterr().out == (
        "webhook set to https://advisor.example.com/telegram_webhook\n"
        "command menu set: /start, /help, /link, /unlink, /forget (en, es)\n"
    )
    assert main(["telegram", "info"]) == 0
    assert json.loads(capsys.readouterr().out)["pending_update_count"] == 0
    fake_telegram.down = True
    assert main(["telegram", "info"]) == 1
    err = capsys.readouterr().err
    assert "getWebhookInfo" in err and "TEST-token" not in err  # the token never reaches the terminal


def test_a_menu_telegram_refuses_is_said_and_the_webhook_stays_set(
    environment: pytest.MonkeyPatch, fake_telegram: FakeTelegram, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_telegram.fail_with("gateway", times=1, method="setMyCommands")
    assert main(["telegram", "set-webhook", "--url", "https://advisor.example.com/telegram_webhook"]) == 1
    assert [method for method, _ in fake_telegram.calls] == [
        "setWebhook",
        "deleteMyCommands",
        "setMyCommands",
        "deleteMyCommands",
    ]
    assert fake_telegram.calls[2][1] == {"commands": SPANISH_MENU, "scope": PRIVATE, "language_code": "es"}
    said = capsys.readouterr()
    assert said.out == "webhook set to https://advisor.example.com/telegram_webhook\n"
    assert said.err == (
        "crossmem telegram set-webhook: the webhook is set, but the default menu (en) was not set "
        "(setMyCommands: HTTP 502); run it again\n"
    )
    # Run again, it sets both.
    assert main(["telegram", "set-webhook", "--url", "https://advisor.example.com/telegram_webhook"]) == 0
    assert fake_telegram.menus == {("all_private_chats", ""): ENGLISH_MENU, ("all_private_chats", "es"): SPANISH_MENU}


@pytest.mark.parametrize("port_from", ["environment", ".env"])
def test_say_reads_port_like_dev_and_names_the_url_it_could_not_reach(port_from: str, tmp_path: Path) -> None:
    port = free_port()
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(ROOT), "HOME": str(tmp_path)}
    if port_from == "environment":
        env["PORT"] = str(port)
    else:
        (tmp_path / ".env").write_text(f"PORT={port}\n")
    done = say_hello(env, tmp_path)
    assert done.returncode == 1 and done.stdout == ""
    assert f"could not reach the dev server at http://127.0.0.1:{port} " in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(("command", "port"), [("dev", "-1"), ("dev", "0"), ("say", "99999"), ("say", "-1")])
def test_a_port_that_is_no_tcp_port_is_a_usage_error(
    command: str, port: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`dev --port 99999` served on 34463 (the port modulo 65536) under a banner saying 99999, and
    `dev --port -1` ended in a traceback (OverflowError: bind(): port must be 0-65535)."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exited:
        main([command, "--port", port, *(["--surface", "telegram", "hello?"] if command == "say" else [])])
    assert exited.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"Error: Invalid value for '--port': {port} is not in the range 1<=x<=65535."
    )


def test_a_port_setting_that_is_no_tcp_port_is_refused_as_configuration(tmp_path: Path) -> None:
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(ROOT), "HOME": str(tmp_path), "PORT": "70000"}
    done = say_hello(env, tmp_path)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == "crossmem say: invalid configuration: PORT: Input should be less than or equal to 65535\n"


def say_hello(env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """`crossmem say --surface telegram hello?` in its own process, from `cwd`."""
    command = [sys.executable, "-m", "functions.tools.cli", "say", "--surface", "telegram", "hello?"]
    return subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=60)


# The commands that delete or move a person's memory: asked first, and a purge counts first.


class Terminal(io.StringIO):
    """An operator at a terminal, who will type what it holds."""

    def isatty(self) -> bool:
        return True


@pytest.fixture
def two_threads(environment: pytest.MonkeyPatch, postgres_server: str) -> Iterator[tuple[str, uuid.UUID, uuid.UUID]]:
    """A database of its own (a purge spans everyone): a web person with a message a day for 100 days
    (0.5 to 99.5 days old: none on a boundary), and a Telegram chat 7373 with 4 messages of its own
    person. Yields (url, the web person, the chat's person)."""
    person, chat_person = uuid.uuid4(), uuid.uuid4()
    with migrated_database(postgres_server) as url:
        environment.setenv("DATABASE_URL", url)
        runtime.reset()
        with psycopg.connect(url, autocommit=True) as connection:
            connection.execute(
                """with c as (insert into conversations (user_id, surface) values (%s, 'web') returning id, user_id)
                   insert into messages (conversation_id, user_id, surface, role, content, created_at)
                   select c.id, c.user_id, 'web', 'user', 'said ' || age || ' days ago',
                          now() - (age - 0.5) * interval '1 day'
                     from c cross join generate_series(1, 100) age""",
                (person,),
            )
            connection.execute(
                "insert into identities (surface, external_id, user_id) values ('telegram', '7373', %s)", (chat_person,)
            )
            connection.execute(
                """with c as (insert into conversations (user_id, surface) values (%s, 'telegram')
                              returning id, user_id)
                   insert into messages (conversation_id, user_id, surface, role, content)
                   select c.id, c.user_id, 'telegram', 'user', 'chat message ' || n
                     from c cross join generate_series(1, 4) n""",
                (chat_person,),
            )
        yield url, person, chat_person


def messages_of(url: str, person: uuid.UUID) -> int:
    return count(url, "select count(*) from messages where user_id = %s", person)


def test_a_purge_typed_9d_for_90d_says_how_many_it_will_delete_before_it_asks_and_a_no_deletes_nothing(
    two_threads: tuple[str, uuid.UUID, uuid.UUID], environment: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    url, person, chat_person = two_threads
    environment.setattr("sys.stdin", Terminal("n\n"))
    assert main(["purge", "--older-than", "9d"]) == 1
    said = capsys.readouterr().out
    count_line, question = said.split("\n", 1)
    assert count_line.startswith("91 message(s) older than 9d (before ") and count_line.endswith(" will be deleted.")
    assert question.startswith("91 message(s) older than 9d") and question.endswith(" Delete them? [y/N] ")
    assert (messages_of(url, person), messages_of(url, chat_person)) == (100, 4)

    environment.setattr("sys.stdin", Terminal("y\n"))
    assert main(["purge", "--older-than", "90d"]) == 0
    said = capsys.readouterr().out
    assert said.startswith("10 message(s) older than 90d (before ")
    assert said.splitlines()[-1].startswith("purged 10 message(s) older than 90d")
    assert (messages_of(url, person), messages_of(url, chat_person)) == (90, 4)


def test_forget_and_link_at_a_terminal_act_only_on_a_yes_and_without_one_touch_nothing(
    two_threads: tuple[str, uuid.UUID, uuid.UUID], environment: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    url, person, chat_person = two_threads
    link = ["link", "--user", str(person), "--surface", "telegram", "--external-id", "7373"]
    # no, Enter (the default is no), end of input, and anything else: asked once, never again
    for answer in ("n\n", "\n", "", "maybe\ny\n"):
        for command in (["forget", "--user", str(person)], link):
            environment.setattr("sys.stdin", Terminal(answer))
            assert main(command) == 1
    said, complained = capsys.readouterr()
    assert complained.splitlines() == ["crossmem forget: not done", "crossmem link: not done"] * 4
    assert said.count(f"Erase {person}: every conversation, message, link code and identity? [y/N] ") == 4
    assert said.count(f"Join telegram 7373 to {person}, moving its messages there? [y/N] ") == 4
    assert (messages_of(url, person), messages_of(url, chat_person)) == (100, 4)

    environment.setattr("sys.stdin", Terminal("y\n"))
    assert main(link) == 0
    assert capsys.readouterr().out.endswith(f"linked: telegram 7373 -> {person} (4 message(s) moved)\n")
    assert (messages_of(url, person), messages_of(url, chat_person)) == (104, 0)
    environment.setattr("sys.stdin", Terminal("yes\n"))
    assert main(["forget", "--user", str(person)]) == 0
    assert (messages_of(url, person), messages_of(url, chat_person)) == (0, 0)


def test_without_a_terminal_the_deleting_commands_need_yes(
    two_threads: tuple[str, uuid.UUID, uuid.UUID], environment: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    url, person, chat_person = two_threads
    environment.setattr("sys.stdin", io.StringIO("y\n"))  # a pipe: its "y" is not an operator's
    assert main(["forget", "--user", str(person)]) == 1
    assert main(["purge", "--older-than", "9d"]) == 1
    assert main(["link", "--user", str(person), "--surface", "telegram", "--external-id", "7373"]) == 1
    forget_line, purge_line, link_line = capsys.readouterr().err.splitlines()
    assert forget_line == (
        f"crossmem forget: Erase {person}: every conversation, message, link code and identity? "
        "Not done: run it again with --yes"
    )
    assert purge_line.startswith("crossmem purge: 91 message(s) older than 9d (before ")
    assert purge_line.endswith(" UTC) will be deleted. Delete them? Not done: run it again with --yes")
    assert link_line == (
        f"crossmem link: Join telegram 7373 to {person}, moving its messages there? Not done: run it again with --yes"
    )
    assert (messages_of(url, person), messages_of(url, chat_person)) == (100, 4)
    assert main(["forget", "--user", str(chat_person), "--yes"]) == 0
    assert (messages_of(url, person), messages_of(url, chat_person)) == (100, 0)


HELP_LINES = [
    ("migrate", "apply infra/supabase/migrations to DATABASE_URL (idempotent)"),
    ("history", "print a person's latest messages over every surface"),
    ("follow-ups", "list a person's pending follow-ups, each on the clock it was asked on"),
    ("digest", "write the memory notes of every person who is due, now"),
    ("identities", "list the chats and numbers linked to a person, on every surface but the web"),
    ("link", "join a chat or number to a person, without a code"),
    ("unlink", "let a linked chat or number go (the person keeps its messages)"),
    ("forget", "erase a person: every conversation, message and identity"),
    ("purge", "delete messages older than an age, and the memory-note lines about them, in batches of PURGE_BATCH"),
    ("export", "write everything held of a person as JSON (an access request)"),
    ("search", "search a person's messages on every surface, as the agent can"),
    ("dev", "serve every function, the demo page and /healthz on 127.0.0.1"),
    ("say", "send a signed message from another app (--surface) to the dev server"),
    ("telegram", "set up Telegram's webhook through the Bot API"),
    ("deploy", "deploy serverless.yml's functions as 2nd-gen functions with gcloud"),
    ("doctor", "check the live deployment: database, secrets, URLs, webhooks, model, scheduled job"),
]


def test_help_lists_every_command_in_its_order_with_its_whole_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    listing = capsys.readouterr().out.split("\nCommands:\n", 1)[1]
    assert " ".join(listing.split()) == " ".join(f"{name} {line}" for name, line in HELP_LINES)
    assert main(["telegram", "--help"]) == 0
    listing = capsys.readouterr().out.split("\nCommands:\n", 1)[1]
    assert " ".join(listing.split()) == (
        "set-webhook point the bot at URL, with the secret token, and set its command menu info print getWebhookInfo"
    )


def test_a_usage_error_exits_2_naming_its_option_before_anything_runs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["history", "--user", "00000000-0000-4000-8000-00000000d3e0", "--limit", "many"])
    assert exited.value.code == 2
    assert (
        capsys.readouterr().err.splitlines()[-1]
        == "Error: Invalid value for '--limit': 'many' is not a valid integer range."
    )
    with pytest.raises(SystemExit) as exited:  # refused before it reaches the database
        main(["history", "--user", "00000000-0000-4000-8000-00000000d3e0", "--limit", "-1"])
    assert exited.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "Error: Invalid value for '--limit': -1 is not in the range 1<=x<=10000."
    )
    with pytest.raises(SystemExit) as exited:
        main(
            [
                "link",
                "--user",
                "00000000-0000-4000-8000-00000000d3e0",
                "--surface",
                "web",
                "--external-id",
                "1",
                "--yes",
            ]
        )
    assert exited.value.code == 2
    refused = "Invalid value for '--surface': 'web' is not one of 'telegram', 'whatsapp', 'sms'."
    assert refused in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        main(["forget", "--user", "not-a-uuid", "--yes"])
    assert exited.value.code == 2
    refused = "Error: Invalid value for '--user': 'not-a-uuid' is not a user id (a uuid)"
    assert capsys.readouterr().err.splitlines()[-1] == refused


@pytest.mark.parametrize(
    ("surface", "external_id", "refused"),
    [
        ("telegram", "abc", "'abc' is not a Telegram user id (digits)"),
        ("telegram", "@somebody", "'@somebody' is not a Telegram user id (digits)"),
        ("whatsapp", "hello", "'hello' is not a WhatsApp number (+digits) or BSUID"),
        ("sms", "  ", "'  ' is not an SMS number (+digits)"),
    ],
)
def test_link_and_unlink_refuse_an_id_that_is_none_of_its_surfaces(
    two_threads: tuple[str, uuid.UUID, uuid.UUID],
    capsys: pytest.CaptureFixture[str],
    surface: str,
    external_id: str,
    refused: str,
) -> None:
    """A Telegram "abc" was linked (an identity no message can ever come from), a WhatsApp "hello"
    ended in "link_identity failed: InvalidParameterValue"."""
    url, person, _ = two_threads
    for command in (
        ["link", "--user", str(person), "--surface", surface, "--external-id", external_id, "--yes"],
        ["unlink", "--surface", surface, "--external-id", external_id],
    ):
        with pytest.raises(SystemExit) as exited:
            main(command)
        assert exited.value.code == 2
        assert capsys.readouterr().err.splitlines()[-1] == f"Error: Invalid value for '--external-id': {refused}"
    assert count(url, "select count(*) from identities where user_id = %s", person) == 0


def test_unlink_removes_an_identity_an_earlier_release_linked_in_no_form_of_its_surface(
    two_threads: tuple[str, uuid.UUID, uuid.UUID], capsys: pytest.CaptureFixture[str]
) -> None:
    """Before link checked the form, `crossmem link --external-id abc` linked a Telegram "abc";
    `crossmem identities` lists it, and unlink must still take it away (it said it was no id)."""
    url, person, _ = two_threads
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute(
            "insert into identities (surface, external_id, user_id, linked_at) values ('telegram', 'abc', %s, now())",
            (person,),
        )
    assert main(["unlink", "--surface", "telegram", "--external-id", "abc"]) == 0
    assert capsys.readouterr().out == "unlinked 1 identity\n"
    assert count(url, "select count(*) from identities where user_id = %s", person) == 0
