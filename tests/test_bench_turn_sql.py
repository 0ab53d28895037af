"""bench/turn_sql.py's variants: each part it takes out is out, and a turn still runs without it."""

from __future__ import annotations

import uuid

import pytest

from bench import turn_sql
from bench.memory_core import ours_secondary_turn
from core.memory.service import Memory
from core.stores.postgres_store import PostgresStore
from tests.database import migrated_database
from tests.helpers import context_limits, count, rows

FOREIGN_KEYS = "select count(*) from pg_constraint where conrelid = 'public.messages'::regclass and contype = 'f'"
SEARCH_WORDS = (
    "select count(*) from pg_attribute where attrelid = 'public.messages'::regclass and attname = 'search_text'"
    " and not attisdropped"
)


@pytest.mark.parametrize("part", [*turn_sql.WITHOUT, turn_sql.EVERY_PART])
def test_a_part_taken_out_is_out_and_the_turn_still_runs(postgres_server: str, part: str) -> None:
    every = part == turn_sql.EVERY_PART
    with migrated_database(postgres_server) as url:
        person = uuid.uuid4()
        store = PostgresStore(url)
        try:
            ours_secondary_turn(Memory(store, context_limits()), person)  # a message the window would read
            turn_sql.take_out(url, part)
            ours_secondary_turn(Memory(store, context_limits()), person)
        finally:
            store.close()
        window = rows(
            url,
            "select public.context_window(%s, null, '-infinity', 'infinity', 9223372036854775807, 40, 10, null)::text",
            person,
        )[0][0]
        out = {
            "the window (no message read)": window == "[]",
            "the search words (column and index)": count(url, SEARCH_WORDS) == 0,
            "the messages' foreign keys": count(url, FOREIGN_KEYS) == 0,
            "the conversation's updated_at": "touched as" not in definition(url, "public.finish_turn"),
            "the person's language": "person_languages" not in definition(url, "crossmem_private.remember_language"),
            "the follow-ups read": "follow_ups_of" not in definition(url, "crossmem_private.turn_follow_ups"),
            "the forgotten deliveries' check": "forgotten_deliveries"
            not in definition(url, "crossmem_private.delivery_forgotten"),
        }
        assert set(out) == set(turn_sql.WITHOUT)
        assert out == {each: every or each == part for each in turn_sql.WITHOUT}
        assert count(url, "select count(*) from public.messages") == 4  # both turns stored their two messages


def definition(url: str, function: str) -> str:
    return str(rows(url, "select pg_get_functiondef(%s::regproc)", function)[0][0])
