"""The reply's id, reserved when its turn begins (begin_turn) so the web's stream can name the
reply before its first word, and stored by finish_turn under it; messages ordered, paged and
neighboured by (created_at, id), since a reply drawn early has a lower id than a message stored
during its turn. Real Postgres, directly and through PostgREST's stand-in (as service_role)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from core.memory.service import Memory
from core.models import Person, Surface
from core.stores.postgres_store import PostgresStore
from core.stores.supabase_store import SupabaseStore
from tests.fakes.postgrest import PostgrestStandIn
from tests.helpers import context_limits, rows

SERVICE_KEY = "sb_secret_test_service_role_key"


@pytest.fixture(params=["postgres", "supabase"])
def both(request: pytest.FixtureRequest, database_url: str) -> Iterator[Memory]:
    """The memory over each store: the stand-in calls as service_role, as Supabase does."""
    if request.param == "postgres":
        store = PostgresStore(database_url)
        yield Memory(store, context_limits())
        store.close()
    else:
        stand_in = PostgrestStandIn(database_url, SERVICE_KEY)
        supabase = SupabaseStore(stand_in.url, SERVICE_KEY)
        yield Memory(supabase, context_limits())
        supabase.close()
        stand_in.close()


def replies_of(database_url: str, person: uuid.UUID) -> list[tuple[int, str]]:
    return [
        (int(row[0]), str(row[1]))
        for row in rows(
            database_url, "select id, content from messages where user_id = %s and role = 'assistant'", person
        )
    ]


def test_the_reply_is_stored_under_the_id_its_turn_began_with_once(both: Memory, database_url: str) -> None:
    person, other = uuid.uuid4(), uuid.uuid4()
    chat = both.create_conversation(person, "plans")
    both.create_conversation(other, "theirs")
    start = both.begin_turn(Person(user_id=person), Surface.WEB, "hello", "c-1", chat.id)
    assert start.message_id is not None and start.reply_id is not None and start.reply_id > start.message_id
    assert both.finish_turn(person, start.message_id, "hi there", reply_id=start.reply_id) == start.reply_id
    # A retried finish_turn (its first answer lost) gets the same id back, and stores nothing again.
    assert both.finish_turn(person, start.message_id, "hi there", reply_id=start.reply_id) == start.reply_id
    assert replies_of(database_url, person) == [(start.reply_id, "hi there")]
    # A redelivery starts with the stored reply's id, which its stream names.
    again = both.begin_turn(Person(user_id=person), Surface.WEB, "hello", "c-1", chat.id)
    assert again.duplicate and again.reply_id == start.reply_id
    assert replies_of(database_url, other) == []


def test_two_attempts_at_one_message_name_one_reply_id_and_store_one_reply(memory: Memory, database_url: str) -> None:
    person = uuid.uuid4()
    chat = memory.create_conversation(person, "plans")
    first = memory.begin_turn(Person(user_id=person), Surface.WEB, "hello", "c-1", chat.id, answer_within_s=0)
    # Its time is up: the same message sent again takes it over, naming the reply the first named.
    second = memory.begin_turn(Person(user_id=person), Surface.WEB, "hello", "c-1", chat.id)
    assert second.owed and second.message_id == first.message_id
    assert first.reply_id is not None and second.reply_id == first.reply_id
    assert first.message_id is not None
    assert memory.finish_turn(person, first.message_id, "the first", reply_id=first.reply_id) == first.reply_id
    # The other attempt's words are refused, though under the same id; the same words are a retry.
    assert memory.finish_turn(person, first.message_id, "the second", reply_id=second.reply_id) is None
    assert memory.finish_turn(person, first.message_id, "the first", reply_id=second.reply_id) == first.reply_id
    assert replies_of(database_url, person) == [(first.reply_id, "the first")]


def test_an_ended_attempts_id_is_the_next_ones(memory: Memory, database_url: str) -> None:
    """The web's stream cut off (its attempt ended) named the reply: the message answered again (a
    resume, a Try again) names the same, and the page replaces the cut-off words with the reply."""
    person = uuid.uuid4()
    chat = memory.create_conversation(person, "plans")
    ended = memory.begin_turn(Person(user_id=person), Surface.WEB, "hello", "c-1", chat.id)
    assert ended.message_id is not None and ended.reply_id is not None
    memory.end_attempt(person, ended.message_id, ended.attempt, 0)
    retried = memory.begin_turn(Person(user_id=person), Surface.WEB, "hello", "c-1", chat.id)
    assert retried.owed and retried.reply_id == ended.reply_id
    assert memory.finish_turn(person, ended.message_id, "at last", reply_id=retried.reply_id) == ended.reply_id
    assert replies_of(database_url, person) == [(ended.reply_id, "at last")]


def test_a_reply_with_a_lower_id_than_a_message_stored_during_its_turn_orders_and_pages_by_time(
    memory: Memory, database_url: str
) -> None:
    person, other = uuid.uuid4(), uuid.uuid4()
    chat = memory.create_conversation(person, "plans")
    theirs = memory.create_conversation(other, "theirs")
    memory.begin_turn(Person(user_id=other), Surface.WEB, "their ping", "o-1", theirs.id)
    slow = memory.begin_turn(Person(user_id=person), Surface.WEB, "a slow question", "c-1", chat.id)
    quick = memory.begin_turn(Person(user_id=person), Surface.WEB, "a quick question", "c-2", chat.id)
    assert slow.message_id is not None and quick.message_id is not None
    assert memory.finish_turn(person, quick.message_id, "quick answer", reply_id=quick.reply_id) == quick.reply_id
    assert memory.finish_turn(person, slow.message_id, "slow answer", reply_id=slow.reply_id) == slow.reply_id
    assert slow.reply_id is not None and slow.reply_id < quick.message_id  # stored last, with a lower id
    in_order = ["a slow question", "a quick question", "quick answer", "slow answer"]

    assert [m.content for m in memory.conversation_messages(person, chat.id).messages] == in_order
    assert [m.content for m in memory.person_history(person)] == in_order
    # Paged back one and two at a time, each message once, in order.
    for size in (1, 2):
        paged: list[str] = []
        before: int | None = None
        while True:
            page = memory.conversation_messages(person, chat.id, before, size)
            paged[:0] = [m.content for m in page.messages]
            if not page.has_more:
                break
            before = page.messages[0].id
        assert paged == in_order
    # The next turn reads the thread in the same order, and search's neighbours follow it.
    after = memory.begin_turn(Person(user_id=person), Surface.WEB, "and then?", "c-3", chat.id)
    assert [m.content for m in after.history] == [*in_order, "and then?"]
    hits = memory.search(person, "slow answer", exclude_ids=[slow.message_id])
    assert [found.message.content for found in hits] == ["slow answer", "quick answer"]
    hit = hits[0]
    assert hit.before is not None and hit.before.content == "quick answer"
    assert hit.after is not None and hit.after.content == "and then?"
