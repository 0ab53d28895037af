"""What `crossmem doctor` expects of a migrated database: the tables and SQL functions the
migrations leave behind, read from their statements."""

from __future__ import annotations

from pathlib import Path

from core.stores.embedded import MIGRATIONS
from functions.tools.schema_objects import SchemaObject, defined_bodies, defined_objects


def test_what_a_later_migration_drops_is_not_expected_and_what_it_makes_again_is(tmp_path: Path) -> None:
    first, second = tmp_path / "1_first.sql", tmp_path / "2_second.sql"
    first.write_text(
        "create table public.notes (id bigint);\n"
        "create or replace function public.old_name(p int) returns int language sql as $$ select p $$;\n"
        "create function crossmem_private.helper() returns int language sql as $$ select 1 $$;\n"
        "-- create table public.only_in_a_comment (id int);\n"
    )
    second.write_text(
        "drop function if exists public.old_name(int);\n"
        "drop function crossmem_private.helper();\n"
        "create or replace function crossmem_private.helper() returns int language sql as $$ select 2 $$;\n"
        "create table if not exists public.tags (id bigint);\n"
    )
    assert [o for o in defined_objects([first, second]) if o.kind != "column"] == [
        SchemaObject("table", "public", "notes", "1_first.sql"),
        SchemaObject("function", "crossmem_private", "helper", "2_second.sql"),
        SchemaObject("table", "public", "tags", "2_second.sql"),
    ]


def test_the_baseline_defines_every_table_and_the_turns_functions_where_their_file_says() -> None:
    found = {(o.kind, f"{o.schema}.{o.name}"): o.defined_in for o in defined_objects(sorted(MIGRATIONS.glob("*.sql")))}
    assert found[("table", "public.messages")] == "messages.sql"
    assert found[("function", "public.begin_turn")] == "turn.sql"
    assert found[("function", "crossmem_private.store_user_message")] == "turn.sql"
    tables = sorted(name for kind, name in found if kind == "table")
    assert len(tables) == 16 and {
        "public.follow_ups",
        "public.person_languages",
        "public.stopped_generations",
        "crossmem_private.link_confirmation_key",
    } <= set(tables)


def test_a_functions_bodies_are_its_last_definitions_as_written(tmp_path: Path) -> None:
    first, second = tmp_path / "1_first.sql", tmp_path / "2_second.sql"
    first.write_text(
        "create or replace function public.kept(p int) returns int language sql as $$ select p $$;\n"
        "create or replace function public.changed(p int) returns int language sql as $$ select 1 $$;\n"
        "-- create or replace function public.only_in_a_comment() returns int as $$ select 9 $$;\n"
        "create function public.standard(p int) returns int language sql\n    return p;\n"
    )
    second.write_text(
        "create or replace function public.changed(\n"
        "    p int,  -- the first; the second\n"
        "    q int\n"
        ") returns int language plpgsql as $body$\nbegin\n    return p + q; -- $$ is text here\nend\n$body$;\n"
        "create or replace function public.changed(p text) returns int language sql as $$ select 2 $$;\n"
    )
    assert defined_bodies([first, second]) == {
        SchemaObject("function", "public", "kept", "1_first.sql"): {" select p "},
        SchemaObject("function", "public", "changed", "2_second.sql"): {
            "\nbegin\n    return p + q; -- $$ is text here\nend\n",
            " select 2 ",
        },
    }


def test_every_function_of_the_baseline_has_its_body_but_the_sql_standard_ones() -> None:
    migrations = sorted(MIGRATIONS.glob("*.sql"))
    functions = {(o.schema, o.name) for o in defined_objects(migrations) if o.kind == "function"}
    with_bodies = {(o.schema, o.name) for o in defined_bodies(migrations)}
    assert functions - with_bodies == {
        ("crossmem_private", "settled"),
        ("crossmem_private", "quoting"),
        ("public", "surface_has_window"),
    }
    assert with_bodies <= functions


def test_indexes_policies_and_triggers_are_expected_on_their_tables_less_what_a_later_migration_drops(
    tmp_path: Path,
) -> None:
    first, second = tmp_path / "1_first.sql", tmp_path / "2_second.sql"
    first.write_text(
        "create table public.notes (id bigint, user_id uuid);\n"
        "create unique index notes_once\n    on public.notes (id);\n"
        "create index if not exists notes_by_user on only public.notes (user_id);\n"
        "create policy notes_owner_reads on public.notes for select using (true);\n"
        "create trigger notes_touch after insert or update of user_id on public.notes\n"
        "    for each row execute function crossmem_private.touch();\n"
        "-- create index only_in_a_comment on public.notes (id);\n"
    )
    second.write_text(
        "drop index if exists public.notes_by_user;\n"
        "drop policy if exists notes_owner_reads on public.notes;\n"
        "create policy notes_owner_reads on public.notes for select using (false);\n"
        "drop trigger notes_touch on public.notes;\n"
    )
    assert [o for o in defined_objects([first, second]) if o.kind != "column"] == [
        SchemaObject("table", "public", "notes", "1_first.sql"),
        SchemaObject("index", "public", "notes_once", "1_first.sql", "notes"),
        SchemaObject("policy", "public", "notes_owner_reads", "2_second.sql", "notes"),
    ]
    assert [str(o) for o in defined_objects([first]) if o.kind != "column"][1:] == [
        "index public.notes_once (1_first.sql)",
        "index public.notes_by_user (1_first.sql)",
        "policy notes_owner_reads on public.notes (1_first.sql)",
        "trigger notes_touch on public.notes (1_first.sql)",
    ]


def test_the_baseline_defines_each_policy_where_access_sql_does_and_each_trigger_on_its_table() -> None:
    found = [o for o in defined_objects(sorted(MIGRATIONS.glob("*.sql"))) if o.kind in ("policy", "trigger")]
    assert {o.defined_in for o in found if o.kind == "policy"} == {"access.sql"}
    assert len([o for o in found if o.kind == "policy"]) == 11
    assert sorted(str(o) for o in found if o.kind == "trigger") == [
        "trigger follow_ups_follow_their_conversation on public.conversations (follow_ups.sql)",
        "trigger follow_ups_follow_their_messages on public.messages (follow_ups.sql)",
        "trigger identities_merge_memory_notes on public.identities (memory_notes.sql)",
    ]


def test_a_tables_columns_are_expected_as_listed_less_what_a_later_migration_drops(tmp_path: Path) -> None:
    first, second = tmp_path / "1_first.sql", tmp_path / "2_second.sql"
    first.write_text(
        "create table public.notes (\n"
        "    id bigint generated always as identity primary key,\n"
        "    user_id uuid not null references public.people (id) on delete cascade,  -- a, b\n"
        "    kind text not null check (kind in ('a', 'b')),\n"
        "    constraint notes_once unique (user_id, kind),\n"
        "    primary key (id)\n"
        ");\n"
        "alter table public.notes enable row level security;\n"
    )
    second.write_text(
        "alter table public.notes add column if not exists written_at timestamptz, drop column kind,\n"
        "    add constraint notes_written check (written_at is not null);\n"
    )
    columns = [str(o) for o in defined_objects([first, second]) if o.kind == "column"]
    assert columns == [
        "column public.notes.id (1_first.sql)",
        "column public.notes.user_id (1_first.sql)",
        "column public.notes.written_at (2_second.sql)",
    ]


def test_the_baseline_expects_every_column_of_its_tables() -> None:
    columns = [o for o in defined_objects(sorted(MIGRATIONS.glob("*.sql"))) if o.kind == "column"]
    messages = [o.name for o in columns if o.on_table == "messages"]
    assert messages[:3] == ["id", "conversation_id", "user_id"] and messages[-1] == "search_text"
    assert {o.on_table for o in columns} == {
        o.name for o in defined_objects(sorted(MIGRATIONS.glob("*.sql"))) if o.kind == "table"
    }
