"""bench/turn_cpu.py's comparison is fair: its calls alone store what a turn's two calls store, with
the turn's own arguments, for the person they name and nobody else."""

from __future__ import annotations

import uuid

from bench.memory_core import REPLY_TEXT, USER_TEXT, ours_secondary_turn
from bench.turn_cpu import BareCalls, RecordingStore
from core.memory.service import Memory
from core.stores.postgres_store import PostgresStore
from tests.helpers import context_limits, rows

STORED = "select role, content, delivered_at is not null from public.messages where user_id = %s order by id"


def test_the_calls_alone_store_a_message_and_its_reply_as_a_turn_does(database_url: str) -> None:
    store = RecordingStore(PostgresStore(database_url))
    memory = Memory(store, context_limits())
    try:
        ours_secondary_turn(memory, uuid.uuid4())  # the arguments the calls alone replay
        bare = BareCalls(database_url, store.calls["begin_turn"], store.calls["finish_turn"])
        person, other = uuid.uuid4(), uuid.uuid4()
        bare.turn(person)
        bare.turn(person)
        ours_secondary_turn(memory, other)
        bare.close()
    finally:
        store.close()
    a_turn = [("user", USER_TEXT, False), ("assistant", REPLY_TEXT, True)]
    assert rows(database_url, STORED, person) == a_turn * 2
    assert rows(database_url, STORED, other) == a_turn
