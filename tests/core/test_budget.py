"""A person's budget on real Postgres: turns a minute and a day, tokens a day, across apps."""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta

import psycopg
import pytest

from core.errors import OverBudget
from core.memory import ContextLimits, Memory, TurnBudget
from core.models import Person, Surface
from core.stores.postgres_store import PostgresStore
from tests.helpers import rows


def budgeted(store: PostgresStore, **limits: int) -> Memory:
    return Memory(store, ContextLimits(), TurnBudget(**limits))


def stored(database_url: str, person: uuid.UUID) -> int:
    return int(rows(database_url, "select count(*) from messages where user_id = %s", person)[0][0])


def turn(memory: Memory, person: uuid.UUID, surface: Surface, external_id: str, tokens: int = 0) -> None:
    conversation = memory.create_conversation(person).id if surface is Surface.WEB else None
    start = memory.begin_turn(Person(user_id=person), surface, f"message {external_id}", external_id, conversation)
    assert start.message_id is not None and not start.duplicate
    memory.finish_turn(person, start.message_id, "ok", tokens=tokens)


def test_past_its_turns_a_minute_a_person_is_refused_on_every_app_and_nothing_is_stored(
    store: PostgresStore, database_url: str
) -> None:
    memory, person = budgeted(store, turns_per_minute=3), uuid.uuid4()
    turn(memory, person, Surface.TELEGRAM, "t1")
    turn(memory, person, Surface.WEB, "w1")
    turn(memory, person, Surface.WHATSAPP, "s1")
    before = stored(database_url, person)
    with pytest.raises(OverBudget) as refused:
        memory.begin_turn(Person(user_id=person), Surface.TELEGRAM, "one more", "t2")
    assert stored(database_url, person) == before == 6
    first = rows(database_url, "select min(at) from turn_usage where user_id = %s", person)[0][0]
    assert refused.value.until == first + timedelta(minutes=1)
    assert str(refused.value).startswith("You've written a lot in a short time, so I'm taking a pause.")
    assert "You can write again in " in str(refused.value) and str(refused.value).endswith(" seconds.")
    # Someone else is not limited by this person.
    turn(memory, uuid.uuid4(), Surface.TELEGRAM, "t1-other")


def test_a_redelivery_past_the_budget_is_still_the_same_delivery(store: PostgresStore) -> None:
    memory, person = budgeted(store, turns_per_minute=1), uuid.uuid4()
    turn(memory, person, Surface.TELEGRAM, "only")
    again = memory.begin_turn(Person(user_id=person), Surface.TELEGRAM, "message only", "only")
    assert again.duplicate and again.reply is not None and again.reply.content == "ok"


def test_the_days_turns_and_the_days_tokens(store: PostgresStore, database_url: str) -> None:
    memory, person = budgeted(store, turns_per_day=2), uuid.uuid4()
    turn(memory, person, Surface.TELEGRAM, "d1")
    turn(memory, person, Surface.TELEGRAM, "d2")
    with pytest.raises(OverBudget) as refused:
        memory.begin_turn(Person(user_id=person), Surface.TELEGRAM, "third", "d3")
    first = rows(database_url, "select min(at) from turn_usage where user_id = %s", person)[0][0]
    assert refused.value.until == first + timedelta(days=1)
    assert " after " in str(refused.value) and str(refused.value).endswith(" UTC.")

    memory, person = budgeted(store, tokens_per_day=100), uuid.uuid4()
    turn(memory, person, Surface.WEB, "k1", tokens=60)
    turn(memory, person, Surface.TELEGRAM, "k2", tokens=50)
    assert rows(database_url, "select sum(tokens) from turn_usage where user_id = %s", person) == [(110,)]
    with pytest.raises(OverBudget) as refused:
        memory.begin_turn(Person(user_id=person), Surface.TELEGRAM, "more", "k3")
    # When the first turn's 60 tokens leave the day, 50 remain: under the budget.
    first = rows(
        database_url,
        "select at from turn_usage where message_id = (select min(message_id) from turn_usage where user_id = %s)",
        person,
    )[0][0]
    assert refused.value.until == first + timedelta(days=1)


def test_a_day_later_the_budget_is_back_and_old_counts_are_dropped(store: PostgresStore, database_url: str) -> None:
    memory, person = budgeted(store, turns_per_day=1), uuid.uuid4()
    turn(memory, person, Surface.TELEGRAM, "y1")
    with psycopg.connect(database_url) as connection:
        connection.execute("update turn_usage set at = at - interval '1 day 1 second' where user_id = %s", (person,))
    turn(memory, person, Surface.TELEGRAM, "y2")
    assert rows(database_url, "select count(*) from turn_usage where user_id = %s", person) == [(1,)]


def test_zero_turns_each_limit_off(store: PostgresStore, database_url: str) -> None:
    memory, person = budgeted(store), uuid.uuid4()
    for index in range(15):
        turn(memory, person, Surface.TELEGRAM, f"free-{index}")
    assert rows(database_url, "select count(*) from turn_usage where user_id = %s", person) == [(0,)]


def test_two_instances_racing_for_the_last_allowed_turn_store_exactly_one(
    store: PostgresStore, database_url: str
) -> None:
    for _ in range(4):  # rounds: a race that passes once by luck would not pass every time
        person = uuid.uuid4()
        memory = budgeted(store, turns_per_minute=3)
        turn(memory, person, Surface.TELEGRAM, "r1")
        turn(memory, person, Surface.WEB, "r2")
        outcomes = race_last_turn(database_url, person)
        assert sorted(outcomes) == ["refused", "stored"]
        assert stored(database_url, person) == 5  # two turns of two messages, and one more message


def race_last_turn(database_url: str, person: uuid.UUID) -> list[str]:
    barrier = threading.Barrier(2)
    outcomes: list[str] = []

    def send(surface: Surface) -> None:
        instance = PostgresStore(database_url)  # each racer is an instance of its own
        try:
            memory = budgeted(instance, turns_per_minute=3)
            memory.list_conversations(person)  # connect before the start line
            barrier.wait()
            try:
                memory.begin_turn(Person(user_id=person), surface, "the last one", f"last-{surface.value}")
                outcomes.append("stored")
            except OverBudget:
                outcomes.append("refused")
        finally:
            instance.close()

    threads = [threading.Thread(target=send, args=(surface,)) for surface in (Surface.TELEGRAM, Surface.WHATSAPP)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes


def test_the_days_tokens_reached_exactly_are_the_limit_and_one_below_is_not(
    store: PostgresStore, database_url: str
) -> None:
    """Issue 30, finding 9: TOKENS_PER_DAY reached exactly must refuse; one token under must pass.
    A second person's tokens count for them alone."""
    memory, person, other = budgeted(store, tokens_per_day=100), uuid.uuid4(), uuid.uuid4()
    turn(memory, other, Surface.TELEGRAM, "other-1", tokens=500)
    turn(memory, person, Surface.TELEGRAM, "b1", tokens=99)
    turn(memory, person, Surface.WEB, "b2", tokens=1)  # 99 < 100: this turn may start
    assert rows(database_url, "select sum(tokens) from turn_usage where user_id = %s", person) == [(100,)]
    with pytest.raises(OverBudget):
        memory.begin_turn(Person(user_id=person), Surface.TELEGRAM, "at the limit", "b3")
    assert stored(database_url, person) == 4


def test_an_attempt_that_ends_leaves_alone_a_message_another_attempt_took_over(
    store: PostgresStore, database_url: str
) -> None:
    """Issue 30, finding 9: `end_attempt` must touch only its own attempt. An earlier attempt that
    gives up after a redelivery (or the job) took the message over must not make it owed at once,
    or a third attempt would answer it beside the one now running."""
    memory, person = budgeted(store, tokens_per_day=1000), uuid.uuid4()
    start = memory.begin_turn(Person(user_id=person), Surface.TELEGRAM, "are you there?", "taken-over")
    assert start.message_id is not None and start.attempt is not None
    later = uuid.uuid4()
    with psycopg.connect(database_url) as connection:
        connection.execute(
            "update messages set attempt = %s, answer_by = now() + interval '1 hour' where id = %s",
            (later, start.message_id),
        )
    memory.end_attempt(person, start.message_id, start.attempt, 7)
    assert rows(
        database_url,
        "select attempt, answer_by > now() + interval '59 minutes' from messages where id = %s",
        start.message_id,
    ) == [(later, True)]
    # Its own attempt's end does make it owed at once; its tokens count either way.
    memory.end_attempt(person, start.message_id, later, 5)
    assert rows(database_url, "select answer_by <= now() from messages where id = %s", start.message_id) == [(True,)]
    assert rows(database_url, "select tokens from turn_usage where message_id = %s", start.message_id) == [(12,)]
