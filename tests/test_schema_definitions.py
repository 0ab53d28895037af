"""The schema in one place: infra/supabase/schemas/ defines every object once, the migrations
derive from it (the baseline links to it), and a database built from either is the same one."""

from __future__ import annotations

import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from core.stores.embedded import MIGRATIONS, SUPABASE_STANDINS, prepare_database
from tests.database import catalog, fresh_database

SUPABASE = Path(__file__).resolve().parent.parent / "infra" / "supabase"
DEFINITIONS = SUPABASE / "schemas"


def definition_files() -> list[Path]:
    """config.toml's `[db.migrations] schema_paths`: the definitions, in the order they apply."""
    config = tomllib.loads((SUPABASE / "config.toml").read_text())
    return [(SUPABASE / path).resolve() for path in config["db"]["migrations"]["schema_paths"]]


def build_from_definitions(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute(SUPABASE_STANDINS.read_text())
        for path in definition_files():
            with connection.transaction():
                connection.execute(path.read_text())


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
