"""bench/turn_floor.py's floor: the turn's two functions with the schema's arguments, one row each."""

from __future__ import annotations

import time
import uuid

import psycopg
import pytest

from bench.memory_core import cpu_seconds, cpu_split, ours_secondary_turn, postgres_cpu_seconds
from bench.turn_floor import lay_floor
from core.errors import ConfigurationError
from core.memory.service import Memory
from core.stores.postgres_store import PostgresStore
from tests.database import migrated_database, with_database
from tests.helpers import context_limits, count, rows

SIGNATURES = (
    "select p.proname, pg_get_function_arguments(p.oid), pg_get_function_result(p.oid) from pg_proc p"
    " where p.pronamespace = 'public'::regnamespace and p.proname in ('begin_turn', 'finish_turn')"
    " order by p.proname"
)


def test_the_floor_keeps_the_turns_arguments_and_stores_one_row_a_call(postgres_server: str, database_url: str) -> None:
    with migrated_database(postgres_server) as floor_url:
        lay_floor(floor_url)
        assert rows(floor_url, SIGNATURES) == rows(database_url, SIGNATURES)
        assert len(rows(floor_url, SIGNATURES)) == 2  # one function each, no overload beside it
        store = PostgresStore(floor_url)
        try:
            ours_secondary_turn(Memory(store, context_limits()), uuid.uuid4())
            ours_secondary_turn(Memory(store, context_limits()), uuid.uuid4())
        finally:
            store.close()
        assert count(floor_url, "select count(*) from public.floor_turn_rows") == 4
        assert count(floor_url, "select count(*) from public.messages") == 0


def test_the_floor_is_laid_only_in_a_database_the_benchmarks_made(postgres_server: str) -> None:
    with pytest.raises(ConfigurationError, match="the floor replaces the turn's functions"):
        lay_floor(with_database(postgres_server, "postgres"))
    assert count(postgres_server, "select count(*) from pg_tables where tablename = 'floor_turn_rows'") == 0


def test_a_fresh_databases_uri_names_it_whatever_the_servers_uri_said() -> None:
    """libpq lets a `dbname` in the query win over the path: it is dropped, the rest kept."""
    server = "postgresql://postgres@127.0.0.1:5432/postgres?dbname=deployed&sslmode=disable&host=/run/pg"
    assert with_database(server, "crossmem_test_1") == (
        "postgresql://postgres@127.0.0.1:5432/crossmem_test_1?sslmode=disable&host=/run/pg"
    )


def test_a_turns_cpu_is_split_between_the_python_postgres_and_the_rest() -> None:
    before = {"client": 1.0, "postgres": 2.0, "machine": 10.0}
    after = {"client": 1.5, "postgres": 3.25, "machine": 12.0}
    assert cpu_split(before, after, 1_000) == {"client": 500.0, "postgres": 1250.0, "other": 250.0, "total": 2000.0}
    # the machine's ticks are coarser than this process's own clock: never a negative rest
    assert cpu_split(before, {**after, "machine": 11.5}, 1_000)["other"] == 0.0
    assert cpu_split({}, {}, 10) == {"client": 0.0, "postgres": 0.0, "other": 0.0, "total": 0.0}


def test_the_cpu_of_this_process_and_of_postgres_is_read_where_each_is_spent(database_url: str) -> None:
    """A process's CPU is read while it lives: the backend's is lost once its connection closes
    (the benchmarks' connections stay open while they measure)."""
    with psycopg.connect(database_url) as connection:
        backend = connection.info.backend_pid
        before, backend_before = cpu_seconds(), postgres_cpu_seconds()[backend]
        burned = time.thread_time()
        while time.thread_time() - burned < 0.2:
            pass
        started = time.monotonic()  # a backend's pace differs from host to host: it works until 0.2 s are spent
        while postgres_cpu_seconds()[backend] - backend_before < 0.2 and time.monotonic() - started < 30:
            connection.execute("select count(*) from generate_series(1, 1000000)")
        after, backend_after = cpu_seconds(), postgres_cpu_seconds()[backend]
    assert after["client"] - before["client"] >= 0.2
    assert backend_after - backend_before >= 0.2  # this test's backend, among the ones summed, did the work
    assert after["machine"] - before["machine"] >= 0.4
    assert after["postgres"] >= backend_after  # the reading of every running backend holds this one's
