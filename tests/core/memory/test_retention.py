"""The purge by age on real Postgres, in a database of its own (a purge spans every person):
exactly the old rows go, each batch within its limit, a turn whole, a turn in flight never."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import timedelta

import psycopg
import pytest

from core.errors import TooManyEmptyConversations
from core.memory.retention import PurgeBatch, Retention, describe_age, in_flight_window, parse_age
from core.memory.service import Memory
from core.models import Person, Surface
from core.stores.postgres_store import PostgresStore
from core.stores.supabase_store import SupabaseStore
from tests.database import migrated_database
from tests.fakes.postgrest import PostgrestStandIn
from tests.helpers import context_limits

IN_FLIGHT = timedelta(minutes=2)


@pytest.fixture(scope="module")
def purge_database(postgres_server: str) -> Iterator[str]:
    with migrated_database(postgres_server) as url:
        yield url


@pytest.fixture
def database(purge_database: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(purge_database, autocommit=True) as connection:
        # cascade: and whatever refers to a message (the stop button's rows, say)
        connection.execute("truncate messages, conversations, follow_ups cascade")
        yield connection


@pytest.fixture
def store(purge_database: str) -> Iterator[PostgresStore]:
    store = PostgresStore(purge_database)
    yield store
    store.close()


def said(database: psycopg.Connection, text: str, age: timedelta, reply_age: timedelta | None = None) -> int:
    """A person's message of `age` ago (and its reply, `reply_age` ago), stored as a turn stores them."""
    person = uuid.uuid4()
    row = database.execute(
        """with c as (insert into conversations (user_id, surface) values (%(p)s, 'telegram') returning id)
           insert into messages (conversation_id, user_id, surface, role, content, external_id, created_at)
           select c.id, %(p)s, 'telegram', 'user', %(text)s, %(text)s, now() - %(age)s from c returning id""",
        {"p": person, "text": text, "age": age},
    ).fetchone()
    assert row is not None
    if reply_age is not None:
        database.execute(
            """insert into messages (conversation_id, user_id, surface, role, content, in_reply_to, created_at)
               select conversation_id, user_id, surface, 'assistant', 're: ' || content, id, now() - %s
                 from messages where id = %s""",
            (reply_age, row[0]),
        )
    return int(row[0])


def left(database: psycopg.Connection) -> list[tuple[str, str]]:
    return [
        (role, content)
        for role, content in database.execute("select role, content from messages order by created_at, id")
    ]


def count(database: psycopg.Connection) -> int:
    row = database.execute("select count(*) from messages").fetchone()
    assert row is not None
    return int(row[0])


def test_the_old_turns_go_in_batches_that_each_delete_at_most_the_limit(
    database: psycopg.Connection, store: PostgresStore
) -> None:
    for day in range(100, 107):
        said(database, f"old {day}", timedelta(days=day), reply_age=timedelta(days=day, seconds=-5))
    said(database, "old, never answered", timedelta(days=120))
    said(database, "old, never answered either", timedelta(days=95))
    for day in (1, 30, 89):
        said(database, f"young {day}", timedelta(days=day), reply_age=timedelta(days=day, seconds=-5))
    batches: list[tuple[int, int]] = []
    rows = [count(database)]

    def watch(batch: PurgeBatch) -> None:
        rows.append(count(database))
        batches.append((batch.deleted, batch.total))

    report = Retention(store, batch_size=3, in_flight=IN_FLIGHT).purge(timedelta(days=90), on_batch=watch)

    assert (report.deleted, report.batches, report.dry_run) == (16, 6, False)
    assert batches == [(3, 3), (3, 6), (3, 9), (3, 12), (3, 15), (1, 16)]
    # Each statement deleted exactly what it reported: no cascade past the limit.
    assert [before - after for before, after in zip(rows, rows[1:], strict=False)] == [3, 3, 3, 3, 3, 1]
    assert left(database) == [
        ("user", "young 89"),
        ("assistant", "re: young 89"),
        ("user", "young 30"),
        ("assistant", "re: young 30"),
        ("user", "young 1"),
        ("assistant", "re: young 1"),
    ]


def test_a_dry_run_counts_and_deletes_nothing(database: psycopg.Connection, store: PostgresStore) -> None:
    for day in (91, 92, 93):
        said(database, f"old {day}", timedelta(days=day), reply_age=timedelta(days=day))
    said(database, "young", timedelta(days=2))
    report = Retention(store, batch_size=2, in_flight=IN_FLIGHT).purge(timedelta(days=90), dry_run=True)
    assert (report.deleted, report.batches, report.dry_run) == (6, 0, True)
    assert count(database) == 7


def test_a_turn_goes_whole_a_message_waits_for_its_younger_reply(
    database: psycopg.Connection, store: PostgresStore
) -> None:
    said(database, "asked before the cutoff, answered after", timedelta(hours=25), reply_age=timedelta(hours=23))
    said(database, "whole turn before the cutoff", timedelta(hours=30), reply_age=timedelta(hours=29))
    Retention(store, batch_size=5000, in_flight=IN_FLIGHT).purge(timedelta(hours=24))
    assert left(database) == [
        ("user", "asked before the cutoff, answered after"),
        ("assistant", "re: asked before the cutoff, answered after"),
    ]


def test_a_message_whose_reply_may_still_be_written_is_never_purged(
    database: psycopg.Connection, store: PostgresStore
) -> None:
    # A model deadline longer than the age: a message of 90 minutes ago may still be answered.
    retention = Retention(store, batch_size=10, in_flight=timedelta(hours=2))
    said(database, "in flight", timedelta(minutes=90))
    said(database, "answered", timedelta(minutes=90), reply_age=timedelta(minutes=89))
    said(database, "past any deadline, never answered (the fallback is not stored)", timedelta(hours=3))
    report = retention.purge(timedelta(hours=1))
    assert report.deleted == 3
    assert left(database) == [("user", "in flight")]
    # Once past the deadline it is an unanswered message like any other.
    database.execute("update messages set created_at = now() - interval '2 hours 1 minute'")
    assert retention.purge(timedelta(hours=1)).deleted == 1


def test_a_batch_of_one_still_finishes(database: psycopg.Connection, store: PostgresStore) -> None:
    for day in (91, 92):
        said(database, f"old {day}", timedelta(days=day), reply_age=timedelta(days=day, seconds=-1))
    report = Retention(store, batch_size=1, in_flight=IN_FLIGHT).purge(timedelta(days=90))
    assert (report.deleted, report.batches, count(database)) == (4, 4, 0)


def test_the_cutoff_reported_is_one_before_which_nothing_is_left(
    database: psycopg.Connection, store: PostgresStore
) -> None:
    # Each batch reads its cutoff off the clock: a message that ages past the age while the purge
    # runs is the next purge's, and the cutoff the purge reports (and `crossmem purge` prints) is
    # the first batch's, not a later one with that message before it.
    for day in (91, 92):
        said(database, f"old {day}", timedelta(days=day))
    said(database, "ages past the cutoff during the purge", timedelta(days=90, seconds=-2))
    report = Retention(store, batch_size=1, in_flight=IN_FLIGHT).purge(
        timedelta(days=90), on_batch=lambda batch: time.sleep(3 if batch.number == 1 else 0)
    )
    assert (report.deleted, report.batches) == (2, 2)
    assert left(database) == [("user", "ages past the cutoff during the purge")]
    row = database.execute("select count(*) from messages where created_at < %s", (report.cutoff,)).fetchone()
    assert row == (0,)


def test_the_purge_through_postgrest_continues_where_each_batch_stopped(
    database: psycopg.Connection, purge_database: str
) -> None:
    for day in (91, 92, 93):
        said(database, f"old {day}", timedelta(days=day), reply_age=timedelta(days=day, seconds=-1))
    said(database, "young", timedelta(days=1))
    stand_in = PostgrestStandIn(purge_database, "service-key")
    store = SupabaseStore(stand_in.url, "service-key")
    try:
        report = Retention(store, batch_size=4, in_flight=IN_FLIGHT).purge(timedelta(days=90))
    finally:
        store.close()
        stand_in.close()
    assert (report.deleted, report.batches, left(database)) == (6, 2, [("user", "young")])


@pytest.mark.parametrize(
    ("text", "age", "shown"),
    [("90d", timedelta(days=90), "90d"), ("36h", timedelta(hours=36), "36h"), (" 7D ", timedelta(days=7), "7d")],
)
def test_ages_are_days_or_hours(text: str, age: timedelta, shown: str) -> None:
    assert parse_age(text) == age and describe_age(age) == shown


@pytest.mark.parametrize("text", ["90", "90m", "0d", "-1d", "1.5d", "d", ""])
def test_other_ages_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not an age like 90d or 36h"):
        parse_age(text)


# An age past a century reached before the year 1 (999999d: Postgres's cutoff in BC, which Python
# cannot read), past Postgres's intervals (99999999h) or past Python's (99999999999d: OverflowError).
@pytest.mark.parametrize("text", ["36501d", "876001h", "999999d", "99999999h", "99999999999d"])
def test_an_age_past_a_century_is_refused(text: str) -> None:
    refused = r"is not an age like 90d or 36h \(a positive number of days or hours, at most 36500d\)"
    with pytest.raises(ValueError, match=refused):
        parse_age(text)


def test_a_century_is_an_age() -> None:
    assert parse_age("36500d") == timedelta(days=36500) and parse_age("876000h") == timedelta(days=36500)


def test_the_in_flight_window_is_the_longest_deadline_and_a_minute() -> None:
    assert in_flight_window(25, 12, 60) == timedelta(seconds=120)


def test_the_budgets_counts_older_than_a_day_go_in_batches_whoever_they_belong_to(
    database: psycopg.Connection, store: PostgresStore
) -> None:
    database.execute("truncate turn_usage, voice_usage")
    gone, kept = uuid.uuid4(), uuid.uuid4()
    database.execute(
        "insert into turn_usage (message_id, user_id, at)"
        " select n, %s, now() - interval '1 day 1 minute' from generate_series(1, 5) n",
        (gone,),
    )
    database.execute(
        "insert into turn_usage (message_id, user_id, at) values (6, %s, now() - interval '23 hours')", (kept,)
    )
    database.execute(
        "insert into voice_usage (user_id, message_id, seconds, at)"
        " values (%s, 1, 30, now() - interval '2 days'), (%s, 6, 30, now())",
        (gone, kept),
    )
    assert Retention(store, batch_size=2, in_flight=IN_FLIGHT).expire_usage() == 6
    assert database.execute("select user_id, message_id from turn_usage").fetchall() == [(kept, 6)]
    assert database.execute("select user_id, message_id from voice_usage").fetchall() == [(kept, 6)]
    assert Retention(store, batch_size=2, in_flight=IN_FLIGHT).expire_usage() == 0


def test_the_expiry_skips_the_old_counts_a_turn_holds_and_never_waits_for_them(
    database: psycopg.Connection, purge_database: str
) -> None:
    """A turn deleting its person's old counts (newest first, by its index) while the job deletes
    everyone's (in table order): a job that waited could deadlock with it."""
    database.execute("truncate turn_usage, voice_usage")
    person = uuid.uuid4()
    database.execute(
        "insert into turn_usage (message_id, user_id, at)"
        " select n, %s, now() - make_interval(hours => 30 - n) from generate_series(1, 3) n",
        (person,),
    )
    turn = psycopg.connect(purge_database)
    try:
        turn.execute("select from turn_usage where message_id = 2 for update")
        with psycopg.connect(purge_database, autocommit=True) as job:
            job.execute("set lock_timeout = '2s'")  # a job that waited would fail here
            expired = job.execute("select public.expire_usage(10)").fetchone()
    finally:
        turn.rollback()
        turn.close()
    assert expired == ({"turn_usage": 2, "voice_usage": 0},)
    assert database.execute("select message_id from turn_usage").fetchall() == [(2,)]


def test_a_purge_counts_a_web_conversation_whole_again(database: psycopg.Connection, store: PostgresStore) -> None:
    """The web's window counts its conversation from a mark (context.sql's conversation_length); a
    purge deletes messages before it, so it sets the mark back and the next window is the rule's
    over what is left."""
    from core.memory.service import Memory
    from core.models import Person, Role, Surface
    from core.turn.context import ContextItem, stepped_tail
    from tests.helpers import context_limits

    limit, step = 5, 3
    memory = Memory(store, context_limits(max_messages=limit, window_step=step, web_prepend=0))
    person = uuid.uuid4()
    conversation = memory.create_conversation(person).id
    database.execute(
        "insert into messages (conversation_id, user_id, surface, role, content, in_reply_to, created_at)"
        " select %s, %s, 'web', 'assistant', 'old ' || n, null, now() - n * interval '1 day'"
        "   from generate_series(1, 20) n",
        (conversation, person),
    )
    start = memory.begin_turn(Person(user_id=person), Surface.WEB, "before", "w-before", conversation)
    assert start.message_id is not None
    memory.finish_turn(person, start.message_id, "answered")
    marked = database.execute("select counted from conversations where id = %s", (conversation,)).fetchone()
    assert marked == (21 - limit,)

    Retention(store, batch_size=100, in_flight=IN_FLIGHT).purge(timedelta(days=10, hours=12))

    assert database.execute("select counted from conversations where id = %s", (conversation,)).fetchone() == (None,)
    after = memory.begin_turn(Person(user_id=person), Surface.WEB, "after", "w-after", conversation)
    left_then = [ContextItem(Role.ASSISTANT, f"old {n}", Surface.WEB) for n in range(10, 0, -1)] + [
        ContextItem(Role.USER, "before", Surface.WEB),
        ContextItem(Role.ASSISTANT, "answered", Surface.WEB),
        ContextItem(Role.USER, "after", Surface.WEB),
    ]
    assert [m.content for m in after.history] == [i.content for i in stepped_tail(left_then, limit, step)]


def test_a_conversation_whose_messages_were_purged_is_not_an_empty_one(
    database: psycopg.Connection, store: PostgresStore
) -> None:
    """EMPTY_CONVERSATIONS_PER_PERSON counts the web conversations never written in: a person whose
    old conversations lost their messages to the purge may still start new ones."""
    memory, person = Memory(store, context_limits()), uuid.uuid4()
    for title in ("trip", "work"):
        conversation = memory.create_conversation(person, title, 2)
        start = memory.begin_turn(Person(user_id=person), Surface.WEB, f"the {title}", f"m-{title}", conversation.id)
        assert start.message_id is not None
        memory.finish_turn(person, start.message_id, "noted")
    database.execute("update messages set created_at = now() - interval '100 days' where user_id = %s", (person,))
    assert Retention(store, batch_size=50, in_flight=IN_FLIGHT).purge(timedelta(days=90)).deleted == 4
    assert count(database) == 0
    memory.create_conversation(person, "", 2)
    memory.create_conversation(person, "", 2)
    with pytest.raises(TooManyEmptyConversations):
        memory.create_conversation(person, "", 2)
