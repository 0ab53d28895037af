"""A write after a send that committed, its answer lost with the connection (StoreUnavailable, not
final), is called again by retried_call with the same arguments: it must change nothing twice
(tokens counted once, the reservation given back once, one reply, the delivery record as the first
call left it)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from core.errors import StoreUnavailable
from core.memory.service import Memory, TurnEstimate
from core.models import Delivery, Person, Sent, Surface
from core.stores.postgres_store import PostgresStore
from core.stores.store import JsonScalar
from tests.helpers import context_limits, rows, turn_budget

DAY, OUTPUT, INPUT = 50_000, 2_000, 2_000


class CommitsThenLoses:
    """The real store; the named functions' next call commits and its answer is lost."""

    def __init__(self, store: PostgresStore, losing: set[str]) -> None:
        self.store, self.losing, self.calls = store, losing, []  # type: ignore[var-annotated]

    def call(self, function: str, arguments: Mapping[str, JsonScalar]) -> Any:
        self.calls.append(function)
        answer = self.store.call(function, arguments)
        if function in self.losing:
            self.losing.discard(function)
            raise StoreUnavailable(f"{function} failed: OperationalError")
        return answer

    def close(self) -> None:
        self.store.close()


@pytest.fixture
def store(own_database: str) -> Iterator[PostgresStore]:
    store = PostgresStore(own_database)
    yield store
    store.close()


def memory_of(store: Any) -> Memory:
    return Memory(store, context_limits(), turn_budget(tokens_per_day=DAY, reply_tokens=OUTPUT))


def test_finish_turn_committed_then_retried_counts_once(store: PostgresStore, own_database: str) -> None:
    person = uuid.uuid4()
    memory = memory_of(store)
    start = memory.begin_turn(
        Person(user_id=person), Surface.TELEGRAM, "hello", "retried-1", sender="1", estimate=TurnEstimate(INPUT)
    )
    assert start.message_id is not None and start.reserved_tokens > 0
    losing = CommitsThenLoses(store, {"finish_turn"})
    reply_id = memory_of(losing).finish_turn(
        person,
        start.message_id,
        "FALLBACK",
        delivered=False,
        unsent_from=1,
        attempt=start.attempt,
        tokens=123,
        reserved=start.reserved_tokens,
        retry_for_s=30,
    )
    assert losing.calls == ["finish_turn", "finish_turn"] and reply_id is not None
    assert rows(own_database, "select tokens, reserved from turn_usage where message_id = %s", start.message_id) == [
        (123, 0)
    ]
    assert rows(own_database, "select content, unsent_from from messages where in_reply_to = %s", start.message_id) == [
        ("FALLBACK", 1)
    ]


def test_record_delivery_committed_then_retried_records_once(store: PostgresStore, own_database: str) -> None:
    person = uuid.uuid4()
    memory = memory_of(store)
    start = memory.begin_turn(Person(user_id=person), Surface.TELEGRAM, "hello", "retried-2", sender="2")
    assert start.message_id is not None
    reply_id = memory.finish_turn(
        person, start.message_id, "a b c", delivered=False, unsent_from=0, attempt=start.attempt
    )
    assert reply_id is not None
    losing = CommitsThenLoses(store, {"record_delivery"})
    memory_of(losing).record_delivery(person, reply_id, start.attempt, Sent(Delivery.OWED, 2), retry_for_s=30)
    assert losing.calls == ["record_delivery", "record_delivery"]
    assert rows(own_database, "select delivered_at is null, unsent_from from messages where id = %s", reply_id) == [
        (True, 2)
    ]
    losing.losing.add("record_delivery")
    memory_of(losing).record_delivery(person, reply_id, start.attempt, Sent(Delivery.DELIVERED, 3), retry_for_s=30)
    assert rows(own_database, "select delivered_at is not null, unsent_from from messages where id = %s", reply_id) == [
        (True, None)
    ]
