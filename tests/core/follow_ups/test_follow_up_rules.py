"""The database's rules for the follow-ups a turn writes (issue 30, finding 9): each test fails
when its one rule is broken, and the privacy ones have a second person whose rows must not move.
`finish_turn_follow_ups` is called as the turn calls it, on the real database."""

from __future__ import annotations

import json
import logging
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from core.memory.service import Memory
from core.models import Person, Surface
from core.stores.postgres_store import PostgresStore
from tests.database import migrated_database
from tests.helpers import FailingStore, messages_read, rows

IN_AN_HOUR = (datetime.now(UTC) + timedelta(hours=1)).isoformat()


def asked(memory: Memory, person: uuid.UUID, text: str = "remind me") -> int:
    """A web message of `person`'s, stored by begin_turn: what follow-ups are asked in."""
    start = memory.begin_turn(Person(user_id=person), Surface.WEB, text, f"web-{uuid.uuid4().hex}")
    assert start.message_id is not None
    return start.message_id


def finish(
    store: PostgresStore,
    person: uuid.UUID,
    message_id: int,
    changes: dict[str, Any],
    reply: str = "Done.",
    max_pending: int = 2,
) -> dict[str, Any]:
    """The turn's second round trip with what its tools decided, at FOLLOW_UPS_PER_PERSON 2."""
    answer: dict[str, Any] = store.call(
        "finish_turn_follow_ups",
        {
            "p_user_id": str(person),
            "p_user_message_id": message_id,
            "p_content": reply,
            "p_delivered": True,
            "p_unsent_from": None,
            "p_attempt": None,
            "p_tokens": 10,
            "p_user_content": None,
            "p_follow_ups": json.dumps(changes),
            "p_max_pending": max_pending,
            "p_reserved": 0,
            "p_reply_id": None,
            "p_language": None,
            "p_declined": None,
            "p_merged": None,
        },
    )
    return answer


def schedule(*contents: str) -> dict[str, Any]:
    return {"schedule": [{"content": text, "due_at": IN_AN_HOUR, "timezone": "UTC"} for text in contents]}


def contents_of(database_url: str, person: uuid.UUID) -> list[tuple[str, str]]:
    return rows(database_url, "select content, status from follow_ups where user_id = %s order by id", person)


def test_a_retried_finish_turn_follow_ups_schedules_nothing_twice(
    store: PostgresStore, memory: Memory, database_url: str
) -> None:
    """The once-per-turn key (`follow_ups_once_per_turn`): the same call again, as the store
    retries it after a connection died with its answer, finds the reply and adds no follow-up."""
    person = uuid.uuid4()
    message = asked(memory, person)
    first = finish(store, person, message, schedule("Water the plants.", "Call mum."), max_pending=20)
    again = finish(store, person, message, schedule("Water the plants.", "Call mum."), max_pending=20)
    assert again["reply_id"] == first["reply_id"] is not None
    assert (len(first["scheduled"]), again["scheduled"], again["refused"]) == (2, [], 0)
    assert contents_of(database_url, person) == [("Water the plants.", "pending"), ("Call mum.", "pending")]


def test_no_follow_up_is_written_when_the_reply_is_refused(
    store: PostgresStore, memory: Memory, database_url: str
) -> None:
    """A second attempt at a message already answered stores no reply (finish_turn refuses it):
    what its model scheduled is not written either."""
    person = uuid.uuid4()
    message = asked(memory, person)
    assert memory.finish_turn(person, message, "The first attempt's answer.") is not None
    late = finish(store, person, message, schedule("Water the plants."), reply="A second answer.")
    assert late == {"reply_id": None}
    assert contents_of(database_url, person) == []


def test_the_database_holds_follow_ups_per_person_exactly_at_the_limit(
    store: PostgresStore, memory: Memory, database_url: str
) -> None:
    """FOLLOW_UPS_PER_PERSON (2 here), counted in the database whatever the model's tool said: one
    pending and two asked, the second is refused (it would be the third); at the limit, one more
    is refused; a second person at the limit takes nothing from the first's."""
    person, other = uuid.uuid4(), uuid.uuid4()
    finish(store, other, asked(memory, other), schedule("Other's first.", "Other's second."))
    finish(store, person, asked(memory, person), schedule("First."))
    answer = finish(store, person, asked(memory, person), schedule("Second.", "Third."))
    assert (len(answer["scheduled"]), answer["refused"]) == (1, 1)
    past = finish(store, person, asked(memory, person), schedule("Fourth."))
    assert (past["scheduled"], past["refused"]) == ([], 1)
    assert contents_of(database_url, person) == [("First.", "pending"), ("Second.", "pending")]
    assert contents_of(database_url, other) == [("Other's first.", "pending"), ("Other's second.", "pending")]


def test_a_turns_cancel_deletes_only_its_own_persons_follow_up(
    store: PostgresStore, memory: Memory, database_url: str
) -> None:
    """The cancel a turn's tools decided names ids: another person's id among them cancels
    nothing of theirs; the person's own is cancelled."""
    person, other = uuid.uuid4(), uuid.uuid4()
    [theirs] = finish(store, other, asked(memory, other), schedule("Other's."))["scheduled"]
    [mine] = finish(store, person, asked(memory, person), schedule("Mine."))["scheduled"]
    answer = finish(store, person, asked(memory, person), {"cancel": [theirs, mine]})
    assert answer["cancelled"] == 1
    assert contents_of(database_url, person) == []
    assert contents_of(database_url, other) == [("Other's.", "pending")]


def test_a_persons_pending_follow_ups_are_only_theirs(store: PostgresStore, memory: Memory) -> None:
    """`follow_ups_of`, what begin_turn gives the model's list tool and what GET /follow-ups
    shows: a second person's pending follow-up is never among them."""
    person, other = uuid.uuid4(), uuid.uuid4()
    finish(store, other, asked(memory, other), schedule("Other's."))
    finish(store, person, asked(memory, person), schedule("Mine."))
    listed = store.call("follow_ups_of", {"p_user_id": str(person)})
    assert [item["content"] for item in listed] == ["Mine."]
    start = memory.begin_turn(Person(user_id=person), Surface.WEB, "what's pending?", f"web-{uuid.uuid4().hex}")
    assert [f.content for f in start.follow_ups] == ["Mine."]


def claim_reads(database_url: str, person: uuid.UUID, length: int) -> tuple[int, list[dict[str, Any]]]:
    """The rows of `messages` the job's claim read, by an index or a scan (its own transaction's
    statistics, rolled back) when one Telegram follow-up of `person`'s, who wrote `length` messages
    there and never one on WhatsApp, is due; and what it claimed."""
    with psycopg.connect(database_url) as connection:
        [(conversation,)] = connection.execute(
            "insert into conversations (user_id, surface) values (%s, 'telegram') returning id", (person,)
        ).fetchall()
        connection.execute(
            "insert into messages (conversation_id, user_id, surface, role, content, sender, created_at)"
            " select %(conversation)s, %(person)s, 'telegram', 'user', 'message ' || n, '4242',"
            "        now() - (%(length)s - n) * interval '1 minute'"
            "   from generate_series(1, %(length)s) n",
            {"conversation": conversation, "person": person, "length": length},
        )
        connection.execute(
            "insert into follow_ups (user_id, conversation_id, surface, sender, content, due_at, next_attempt_at)"
            " values (%s, %s, 'telegram', '4242', 'Stretch.', now(), now())",
            (person, conversation),
        )
        connection.execute("analyze messages")
        connection.execute("select pg_stat_clear_snapshot()")
        before = messages_read(connection)
        [(answer,)] = connection.execute(
            "select public.claim_due_follow_ups(now() + interval '1 minute', 50, 60, gen_random_uuid())"
        ).fetchall()
        after = messages_read(connection)
        connection.rollback()
    return after - before, answer["claimed"]


def test_a_follow_up_claim_reads_as_many_rows_for_a_person_of_months_as_for_one_of_a_day(postgres_server: str) -> None:
    """Each claimed follow-up comes with the person's last WhatsApp message (WhatsApp's 24-hour
    window), which was looked for whatever the follow-up's app: for a person who never wrote on
    WhatsApp, every message they ever wrote was read at each claim."""
    with migrated_database(postgres_server) as database_url:  # its others' messages are no other test's
        with psycopg.connect(database_url, autocommit=True) as connection:  # others' messages: a plan by index
            connection.execute(
                "with people as (select gen_random_uuid() as person from generate_series(1, 200)),"
                " chats as (insert into conversations (user_id, surface) select person, 'telegram' from people"
                "           returning id, user_id)"
                " insert into messages (conversation_id, user_id, surface, role, content, sender)"
                " select c.id, c.user_id, 'telegram', 'user', 'hello ' || n, '1' from chats c, generate_series(1, 50) n"
            )
        reads = {}
        for length in (20, 2_000):
            person = uuid.uuid4()
            reads[length], [claimed] = claim_reads(database_url, person, length)
            assert (claimed["user_id"], claimed["surface"], claimed["last_sender"]) == (str(person), "telegram", "4242")
            assert claimed["window_opened_at"] is None
        assert reads[2_000] == reads[20] <= 2, reads


def follow_ups_read(connection: psycopg.Connection[Any]) -> tuple[int, int]:
    """The scans of `follow_ups` `connection`'s transaction has made so far, and the rows it read
    (by an index or a scan)."""
    found = connection.execute(
        "select seq_scan, idx_tup_fetch + seq_tup_read from pg_stat_xact_user_tables"
        " where relid = 'public.follow_ups'::regclass"
    ).fetchone()
    assert found is not None
    return int(found[0]), int(found[1])


def test_the_claim_gives_up_the_holds_past_their_week_by_index_a_batch_a_run(postgres_server: str) -> None:
    """Holds for an opt-in that never came are given up by the job's claim once their week is
    over (`held_until`). Among 20,000 follow-ups due next month, 20,000 sent, 2,000 held with no
    end (WhatsApp's window) and 2,000 held for an opt-in within their week, the claim reads the 60
    past it by their index, never a scan of follow_ups, and gives up its batch of them (50) a run,
    the oldest first; the next run the other 10; nothing else moves."""
    with migrated_database(postgres_server) as database_url:  # the job's claim reads everyone's
        with psycopg.connect(database_url, autocommit=True) as connection:
            connection.execute(
                "with people as (select gen_random_uuid() as person from generate_series(1, 1000)),"
                " chats as (insert into conversations (user_id, surface) select person, 'sms' from people"
                "           returning id, user_id)"
                " insert into follow_ups (user_id, conversation_id, surface, sender, content, due_at,"
                "                         next_attempt_at, status, held_until)"
                " select c.user_id, c.id, 'sms', '+34600000000', 'Stretch.', now() + interval '30 days',"
                "        now() + interval '30 days', k.status, k.held_until"
                "   from (select c.*, row_number() over () as n from chats c) c"
                "   cross join generate_series(1, 44) s"
                "   cross join lateral (select case when s <= 20 then 'pending' when s <= 40 then 'sent'"
                "                                   else 'held' end as status,"
                "                              case when s between 43 and 44 then now() + interval '3 days'"
                "                              end as held_until) k"
            )
            connection.execute(
                "insert into follow_ups (user_id, conversation_id, surface, sender, content, due_at,"
                "                        next_attempt_at, status, held_until)"
                " select c.user_id, c.id, 'sms', '+34600000000', 'Call mum ' || n, now() - interval '8 days',"
                "        now() - interval '8 days', 'held', now() - n * interval '1 minute'"
                "   from (select * from conversations limit 1) c, generate_series(1, 60) n"
            )
            connection.execute("analyze follow_ups")
        with psycopg.connect(database_url) as connection:
            connection.execute("select pg_stat_clear_snapshot()")
            before = follow_ups_read(connection)
            [(first,)] = connection.execute(
                "select public.claim_due_follow_ups(now(), 50, 60, gen_random_uuid())"
            ).fetchall()
            after = follow_ups_read(connection)
            connection.commit()
        scans, read = after[0] - before[0], after[1] - before[1]
        assert (scans, first["claimed"]) == (0, [])
        # Each found by the index, then updated by its key, and the claim's other statements' few
        # (104 on the embedded server, 100 here); without the index, over 24,000.
        assert read <= 4 * 50, read
        expired = rows(database_url, "select id from follow_ups where content like 'Call mum %%' order by held_until")
        assert first["expired"] == sorted(row[0] for row in expired[:50])
        [(second,)] = rows(database_url, "select public.claim_due_follow_ups(now(), 50, 60, gen_random_uuid())")
        assert second["expired"] == sorted(row[0] for row in expired[50:])
        assert rows(
            database_url, "select status, held_until < now(), count(*) from follow_ups group by 1, 2 order by 1, 2"
        ) == [
            ("given_up", True, 60),
            ("held", False, 2_000),
            ("held", None, 2_000),
            ("pending", None, 20_000),
            ("sent", None, 20_000),
        ]


def test_a_reply_that_cannot_be_stored_logs_the_follow_ups_it_loses(
    store: PostgresStore, memory: Memory, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The agent said "I'll remind you", and finish_turn failed for good: the log said only that the
    reply is not stored, so no one could tell a reminder was promised and will never come. It now
    counts what was lost (never its words)."""
    person = uuid.uuid4()
    message = asked(memory, person)
    failing = Memory(FailingStore(store, {"finish_turn_follow_ups"}), memory.limits)
    changes = {"schedule": schedule("Take the pills.")["schedule"], "cancel": [7, 8], "timezone": "Europe/Madrid"}
    with caplog.at_level(logging.ERROR, logger="crossmem.memory"):
        assert failing.finish_turn(person, message, "I'll remind you.", follow_ups=changes, max_follow_ups=2) is None
    [record] = [r for r in caplog.records if r.getMessage().startswith("finish_turn failed")]
    assert record.follow_ups_not_recorded == {"schedule": 1, "cancel": 2}  # type: ignore[attr-defined]
    assert "Take the pills." not in caplog.text
    assert contents_of(database_url, person) == []
