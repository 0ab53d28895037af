"""A schedule tool's place among the person's FOLLOW_UPS_PER_PERSON (follow_ups.sql's
reserve_follow_up), against a real Postgres: held for the turn that asked, counted by every other
turn of the person's, and nobody else's."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from core.follow_ups.capability import FollowUpRules, place_holder
from core.memory.export import Export
from core.memory.service import Memory
from core.models import Person, Surface, TurnStart
from core.stores.postgres_store import PostgresStore
from tests.helpers import context_limits, execute, rows

DUE = (datetime.now(UTC) + timedelta(hours=1)).isoformat()


@pytest.fixture
def memory(own_database: str) -> Iterator[Memory]:
    store = PostgresStore(own_database)
    yield Memory(store, context_limits())
    store.close()


def asking(memory: Memory, chat: str, text: str) -> TurnStart:
    start = memory.begin_turn(Person(sender_id=chat), Surface.TELEGRAM, text, f"{chat}-{text}", sender=chat)
    assert start.user_id is not None and start.message_id is not None
    return start


def entry(content: str) -> dict[str, Any]:
    return {"content": content, "due_at": DUE, "timezone": "UTC"}


def test_a_place_is_held_only_on_the_persons_own_message_and_counted_among_their_own(
    memory: Memory, own_database: str
) -> None:
    """Another person naming this person's message holds nothing; another person's follow-ups and
    places never count against this one's (a test fails when either query loses its user_id)."""
    rules = FollowUpRules(max_pending=1)
    mine, theirs = asking(memory, "9001", "remind me"), asking(memory, "9002", "remind me too")
    assert mine.user_id is not None and mine.message_id is not None
    assert theirs.user_id is not None and theirs.message_id is not None
    assert place_holder(memory.store, theirs.user_id, mine.message_id, rules)(1, entry("Not theirs."), []) is False
    assert rows(own_database, "select count(*) from follow_ups") == [(0,)]
    assert place_holder(memory.store, theirs.user_id, theirs.message_id, rules)(1, entry("Theirs."), []) is True
    assert place_holder(memory.store, mine.user_id, mine.message_id, rules)(1, entry("Mine."), []) is True
    assert rows(own_database, "select user_id, content, status from follow_ups order by id") == [
        (theirs.user_id, "Theirs.", "reserved"),
        (mine.user_id, "Mine.", "reserved"),
    ]


def test_a_place_becomes_the_follow_up_its_turn_stores_and_is_freed_by_a_turn_that_stores_none(
    memory: Memory, own_database: str
) -> None:
    """Held, it is the person's last: another turn of theirs is refused one; its own finish stores
    it as scheduled, at the time its turn moved it to. A turn that ended without a reply (a
    fallback) frees it at once; one that died is no longer counted once its time is over."""
    rules = FollowUpRules(max_pending=1)
    first, second = asking(memory, "9101", "remind me"), asking(memory, "9101", "and me")
    assert first.user_id is not None and first.message_id is not None and second.message_id is not None
    assert place_holder(memory.store, first.user_id, first.message_id, rules)(1, entry("Stretch."), []) is True
    assert place_holder(memory.store, first.user_id, second.message_id, rules)(1, entry("Water."), []) is False
    later = (datetime.now(UTC) + timedelta(days=2)).replace(microsecond=0)
    moved = {"schedule": [{"content": "Stretch.", "due_at": later.isoformat(), "timezone": "UTC"}]}
    memory.finish_turn(first.user_id, first.message_id, "Sure.", follow_ups=moved, max_follow_ups=1)
    assert rows(own_database, "select content, due_at, status from follow_ups") == [("Stretch.", later, "pending")]

    execute(own_database, "delete from follow_ups")
    assert place_holder(memory.store, first.user_id, second.message_id, rules)(1, entry("Water."), []) is True
    memory.end_attempt(first.user_id, second.message_id, second.attempt, 0)
    assert rows(own_database, "select count(*) from follow_ups") == [(0,)]

    third = asking(memory, "9101", "once more")
    assert third.message_id is not None
    assert place_holder(memory.store, first.user_id, third.message_id, rules)(1, entry("Walk."), []) is True
    execute(own_database, "update follow_ups set claimed_until = clock_timestamp() - interval '1 second'")
    assert place_holder(memory.store, first.user_id, first.message_id, rules)(1, entry("Stretch."), []) is True
    assert rows(own_database, "select content, status from follow_ups") == [("Stretch.", "reserved")]


def test_the_follow_ups_a_turn_cancels_free_their_places(memory: Memory, own_database: str) -> None:
    """At the limit, a turn that cancels one of the person's and schedules another holds its place."""
    rules = FollowUpRules(max_pending=1)
    start = asking(memory, "9201", "swap it")
    assert start.user_id is not None and start.message_id is not None
    execute(
        own_database,
        "insert into follow_ups (user_id, conversation_id, surface, content, due_at, next_attempt_at)"
        " values (%s, %s, 'telegram', 'Old.', now() + interval '1 hour', now() + interval '1 hour')",
        start.user_id,
        start.conversation_id,
    )
    [(old,)] = rows(own_database, "select id from follow_ups")
    reserve = place_holder(memory.store, start.user_id, start.message_id, rules)
    assert reserve(1, entry("New."), []) is False
    assert reserve(1, entry("New."), [old]) is True
    changes = {"cancel": [old], "schedule": [entry("New.")]}
    memory.finish_turn(start.user_id, start.message_id, "Done.", follow_ups=changes, max_follow_ups=1)
    assert rows(own_database, "select content, status from follow_ups") == [("New.", "pending")]


def test_a_place_its_turn_never_ended_is_in_no_reader_of_the_persons_follow_ups(
    memory: Memory, own_database: str
) -> None:
    """A turn that died holding a place (its instance gone before its end: nothing frees it) leaves
    a `reserved` row until the person's next place. It is no follow-up: not in their list (GET
    /follow-ups, `crossmem follow-ups`), nor in forgetting's "I'll cancel N reminders", nor in the
    export, nor counted against their limit; neither is a place a turn still running holds (which
    counts). Another person's pending one is in none of this person's."""
    rules = FollowUpRules(max_pending=2)
    running, died = asking(memory, "9301", "remind me"), asking(memory, "9301", "and this")
    other = asking(memory, "9302", "mine")
    assert died.user_id is not None and died.message_id is not None and running.message_id is not None
    assert other.user_id is not None and other.message_id is not None
    theirs = {"schedule": [entry("Theirs.")]}
    memory.finish_turn(other.user_id, other.message_id, "Sure.", follow_ups=theirs, max_follow_ups=1)
    assert place_holder(memory.store, died.user_id, running.message_id, rules)(1, entry("Walk."), []) is True
    assert place_holder(memory.store, died.user_id, died.message_id, rules)(1, entry("Stretch."), []) is True
    execute(
        own_database,
        "update follow_ups set claimed_until = clock_timestamp() - interval '1 second' where content = 'Stretch.'",
    )  # its turn died: its time is over

    listed = memory.store.call("follow_ups_with_apps", {"p_user_id": str(died.user_id)})
    assert listed == {"follow_ups": [], "apps": []}
    asked = memory.store.call(
        "forget_request",
        {
            "p_surface": "telegram",
            "p_confirm": False,
            "p_user_id": str(died.user_id),
            "p_sender_id": "9301",
            "p_window_minutes": 10,
            "p_code": None,
            "p_max_attempts": 0,
            "p_sender_alias": None,
        },
    )
    assert (asked["status"], asked["follow_ups"]) == ("requested", 0)
    record = json.loads("".join(Export(memory.store, lambda: datetime.now(UTC)).pieces(died.user_id)))
    assert record["follow_ups"] == []
    assert rows(own_database, "select content, status from follow_ups order by id") == [
        ("Theirs.", "pending"),
        ("Walk.", "reserved"),
        ("Stretch.", "reserved"),
    ]
    # The limit of 2: the running turn's place and this one; the dead place is not a third.
    later = asking(memory, "9301", "one more")
    assert later.message_id is not None
    water = {"schedule": [entry("Water.")]}
    finished = memory.store.call(
        "finish_turn_follow_ups",
        {
            "p_user_id": str(died.user_id),
            "p_user_message_id": later.message_id,
            "p_content": "Sure.",
            "p_delivered": True,
            "p_unsent_from": None,
            "p_attempt": str(later.attempt),
            "p_tokens": 0,
            "p_user_content": None,
            "p_follow_ups": json.dumps(water),
            "p_max_pending": 2,
            "p_reserved": 0,
            "p_reply_id": later.reply_id,
            "p_language": None,
            "p_declined": None,
            "p_merged": None,
        },
    )
    assert (len(finished["scheduled"]), finished["refused"]) == (1, 0)


def test_an_attempt_that_lost_its_message_frees_none_of_the_places_the_one_holding_it_took(
    memory: Memory, own_database: str
) -> None:
    """A first attempt whose time ran out ends after the scheduled job took its message over
    (another attempt) and that attempt's tool held a place: the place stays the holder's, counted,
    so no other turn of the person's takes the last one from under it."""
    rules = FollowUpRules(max_pending=1)
    stale = asking(memory, "9201", "remind me")
    assert stale.user_id is not None and stale.message_id is not None
    execute(own_database, "update messages set attempt = gen_random_uuid() where id = %s", stale.message_id)
    assert place_holder(memory.store, stale.user_id, stale.message_id, rules)(1, entry("Stretch."), []) is True
    memory.end_attempt(stale.user_id, stale.message_id, stale.attempt, 0)
    assert rows(own_database, "select content, status from follow_ups") == [("Stretch.", "reserved")]
    other = asking(memory, "9201", "and me")
    assert other.message_id is not None
    assert place_holder(memory.store, stale.user_id, other.message_id, rules)(1, entry("Water."), []) is False
