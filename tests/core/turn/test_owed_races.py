"""The scheduled job and a redelivery reaching the same owed message at once: one takes it over,
the other is told it is being answered (two connections on the real database)."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import psycopg

from core.memory.service import Memory
from core.models import Person, Surface
from core.stores.postgres_store import PostgresStore
from tests.database import begin_turn_arguments, begin_turn_sql, migrated_database
from tests.helpers import context_limits, execute, rows


def begin(
    connection: psycopg.Connection[Any],
    external_id: str,
    attempt: str,
    within: int = 60,
    turns_per_minute: int = 0,
    sender: str = "race-777",
) -> Any:
    arguments = begin_turn_arguments(
        p_surface="telegram",
        p_content="hi",
        p_external_id=external_id,
        p_sender_id=sender,
        p_attempt=attempt,
        p_answer_within_seconds=within,
        p_sender=sender,
        p_turns_per_minute=turns_per_minute,
    )
    row = connection.execute(begin_turn_sql(arguments), arguments).fetchone()
    assert row is not None
    return row[0]


def test_a_redelivery_waits_for_the_jobs_claim_and_does_not_take_the_message_over_too(own_database: str) -> None:
    """The claim reads everyone's owed messages: a database of the test's own, where the session's
    could hold more than its limit, older, of other tests (and has them claimed)."""
    database_url = own_database
    external_id = f"upd-{uuid.uuid4().hex[:8]}"
    with psycopg.connect(database_url, autocommit=True) as first:
        stored = begin(first, external_id, str(uuid.uuid4()))
    execute(
        database_url, "update messages set answer_by = now() - interval '1 minute' where id = %s", stored["message_id"]
    )
    job = psycopg.connect(database_url)  # the claim's transaction, held open
    claimed = job.execute(
        "select public.claim_owed_replies('telegram', 600, 60, 100, '', 0, 0, 0, 24, 40, 24, 0, 0, 0)"
    ).fetchone()
    assert claimed is not None
    assert stored["message_id"] in [item["message_id"] for item in claimed[0]]
    redelivered: dict[str, Any] = {}
    redelivery = psycopg.connect(database_url, autocommit=True)
    thread = threading.Thread(target=lambda: redelivered.update(row=begin(redelivery, external_id, str(uuid.uuid4()))))
    thread.start()
    thread.join(1.0)  # it waits for the job's row lock
    job.commit()
    thread.join()
    job.close()
    redelivery.close()
    row = redelivered["row"]
    assert (row["duplicate"], row.get("owed", False)) == (True, False)
    assert row["answer_by"] is not None  # still being answered, by the job: ask again later


def test_the_job_never_claims_a_message_that_has_a_reply_and_reads_only_its_persons_notes(
    postgres_server: str,
) -> None:
    """Issue 30, finding 9: the claim's "no reply yet" rule and its notes filter had no test. Two
    people's messages, both past their attempt's time: the one with a stored reply is not owed, the
    other is, with its own person's notes and never the other's."""
    with migrated_database(postgres_server) as url:
        store = PostgresStore(url)
        try:
            memory = Memory(store, context_limits())
            answered, owed = uuid.uuid4(), uuid.uuid4()
            first = memory.begin_turn(Person(user_id=answered), Surface.TELEGRAM, "hi", "has-reply", sender="101")
            second = memory.begin_turn(Person(user_id=owed), Surface.TELEGRAM, "hello?", "no-reply", sender="202")
            assert first.message_id is not None and second.message_id is not None
            memory.finish_turn(answered, first.message_id, "hi!")
            execute(url, "update messages set answer_by = now() - interval '1 second' where role = 'user'")
            for who, notes in ((answered, "- the other person's secret"), (owed, "- likes tea")):
                execute(
                    url,
                    "insert into memory_notes (user_id, content, revision, written_at) values (%s, %s, 1, now())",
                    who,
                    notes,
                )
            claimed = memory.claim_owed_replies([Surface.TELEGRAM], 600, 30, limit=10)
            assert [(c.sender, c.start.message_id) for c in claimed] == [("202", second.message_id)]
            # The owed answer is made from this person's notes only.
            assert claimed[0].start.notes == "- likes tea"
        finally:
            store.close()


def test_a_message_the_job_has_tried_goes_behind_and_so_does_its_person(postgres_server: str) -> None:
    """Issue 30, finding 2: the claim took the longest owed first, so a message the job kept
    failing was taken before a newer one every run. One person has a message the job tried once
    (owed longest) and a newer one, another person one message owed the shortest: the other
    person's goes first, then the untried one, then the tried one; each claim counts its try."""
    with migrated_database(postgres_server) as url:
        store = PostgresStore(url)
        try:
            memory = Memory(store, context_limits())
            failing, other = uuid.uuid4(), uuid.uuid4()
            stored = [
                memory.begin_turn(Person(user_id=who), Surface.TELEGRAM, text, key, sender=sender).message_id
                for who, text, key, sender in (
                    (failing, "an essay", "tried-once", "301"),
                    (failing, "and another", "not-tried", "301"),
                    (other, "hello?", "other-person", "302"),
                )
            ]
            tried, untried, others = stored
            for message_id, ago in ((tried, "1 minute"), (untried, "20 seconds"), (others, "1 second")):
                execute(url, "update messages set answer_by = now() - %s::interval where id = %s", ago, message_id)
            execute(url, "update messages set owed_tries = 1 where id = %s", tried)
            claimed = memory.claim_owed_replies([Surface.TELEGRAM], 600, 0, limit=3)
            assert [(c.start.message_id, c.tries) for c in claimed] == [(others, 1), (untried, 1), (tried, 2)]
            # A person the run has had its share of is skipped.
            execute(url, "update messages set answer_by = now() - interval '1 second' where role = 'user'")
            skipped = memory.claim_owed_replies([Surface.TELEGRAM], 600, 0, limit=3, skip_users=[failing])
            assert [c.start.message_id for c in skipped] == [others]
        finally:
            store.close()


ENDED = "update messages set answer_by = now() - interval '1 second' where id = %s"  # its attempt, without a reply
CLAIM = "select public.claim_owed_replies('telegram', 600, 60, 100, '', 0, 0, 0, 24, 40, 24, 0, 0, 0)"


def claimed_ids(connection: psycopg.Connection[Any]) -> list[int]:
    row = connection.execute(CLAIM).fetchone()
    assert row is not None
    return [item["message_id"] for item in row[0]]


def owed_first(database_url: str) -> int:
    """A person's message whose attempt ended without a reply (the fallback): owed."""
    with psycopg.connect(database_url, autocommit=True) as connection:
        stored = begin(connection, "owed-first", str(uuid.uuid4()))
    execute(database_url, ENDED, stored["message_id"])
    return int(stored["message_id"])


def test_the_job_leaves_an_owed_message_to_the_later_turn_of_its_person_that_answers_it(own_database: str) -> None:
    """The person wrote again after a fallback: that turn reads the owed message and answers both
    (merged; finish_turn then marks it answered). The job claimed it meanwhile and answered it
    again: two answers to one question. It leaves it while that turn runs, and claims it once the
    turn ended without an answer."""
    first = owed_first(own_database)
    with psycopg.connect(own_database, autocommit=True) as connection:
        later = begin(connection, "owed-later", str(uuid.uuid4()))
        assert claimed_ids(connection) == []
        execute(own_database, ENDED, later["message_id"])
        assert sorted(claimed_ids(connection)) == [first, later["message_id"]]


def test_a_turn_beginning_while_the_job_claims_an_owed_message_waits_and_reads_it_marked(own_database: str) -> None:
    """The claim and the person's next message at once: the turn waits for the claim (the person's
    owed lock, begin_turn's), then reads the claimed message as answered separately, by the job; not
    as owed, merged and answered by both."""
    first = owed_first(own_database)
    job = psycopg.connect(own_database)  # the claim's transaction, held open
    assert claimed_ids(job) == [first]
    began: dict[str, Any] = {}
    turn = psycopg.connect(own_database, autocommit=True)
    thread = threading.Thread(target=lambda: began.update(row=begin(turn, "claimed-meanwhile", str(uuid.uuid4()))))
    thread.start()
    thread.join(1.0)
    assert thread.is_alive()  # waiting for the claim
    job.commit()
    thread.join()
    job.close()
    turn.close()
    history = began["row"]["history"]
    assert (history[0], history[6]) == ([first, began["row"]["message_id"]], [first])


def test_the_job_leaves_the_owed_messages_of_a_person_whose_turn_is_beginning(own_database: str) -> None:
    """The other way round: a turn reading the person's owed message (its begin_turn not committed
    yet) holds their owed lock; the claim passes the person over, and the turn answers it."""
    first = owed_first(own_database)
    with psycopg.connect(own_database) as turn, psycopg.connect(own_database, autocommit=True) as job:
        began = begin(turn, "beginning", str(uuid.uuid4()))
        assert began["history"][0] == [first, began["message_id"]] and began["history"][6] is None
        assert claimed_ids(job) == []


def test_a_turn_and_the_claim_meeting_at_the_budgets_lock_do_not_deadlock(own_database: str) -> None:
    """With a budget on, begin_turn took the budget's lock and then the person's owed lock, and the
    claim its owed lock and then the budget's: a turn in its budget check while the claim took the
    owed lock deadlocked with it, and one of them failed (a review's finding). A third session
    holds the budget's lock, as another turn of the person's checking it, so that they meet so: the
    turn waits for it first, the claim second."""
    first = owed_first(own_database)
    person = rows(own_database, "select user_id::text from messages where id = %s", first)[0][0]
    results: dict[str, Any] = {}

    def waiting() -> int:
        """Sessions of this database waiting for an advisory lock (the server's others are other tests')."""
        query = (
            "select count(*) from pg_locks l join pg_stat_activity a on a.pid = l.pid"
            " where not l.granted and l.locktype = 'advisory' and a.datname = current_database()"
        )
        return int(rows(own_database, query)[0][0])

    def turn() -> None:
        with psycopg.connect(own_database, autocommit=True) as connection:
            try:
                results["turn"] = begin(connection, "budget-meeting", str(uuid.uuid4()), turns_per_minute=100)
            except psycopg.Error as exc:
                results["turn"] = exc

    def claim() -> None:
        with psycopg.connect(own_database, autocommit=True) as connection:
            try:
                row = connection.execute(CLAIM.replace("'', 0, 0, 0,", "'', 100, 0, 0,")).fetchone()
                assert row is not None
                results["claim"] = [item["message_id"] for item in row[0]]
            except psycopg.Error as exc:
                results["claim"] = exc

    with psycopg.connect(own_database) as holder:
        holder.execute("select pg_advisory_xact_lock(hashtextextended('budget/' || %s, 0))", (person,))
        turning, claiming = threading.Thread(target=turn), threading.Thread(target=claim)
        turning.start()
        while waiting() == 0:  # the turn waits for the budget's lock
            time.sleep(0.02)
        claiming.start()
        claiming.join(1.0)  # the claim passes the person over, or waits for the budget's lock after the turn
        holder.commit()
    turning.join(20)
    claiming.join(20)
    assert results["claim"] == []  # the turn reads the owed message, and answers it
    began = results["turn"]
    assert (began["history"][0], began["history"][6]) == ([first, began["message_id"]], None)


def test_a_redelivery_of_an_owed_message_leaves_it_to_the_later_turn_of_its_person_that_answers_it(
    own_database: str,
) -> None:
    """Telegram delivers the owed message again while the person's next turn, which read it merged,
    is being answered: the redelivery took it over and answered it too, two answers to one question
    (as the job did: a review's finding). It is told to ask again once that turn's time is up, when
    the message is answered with it, or owed again."""
    first = owed_first(own_database)
    with psycopg.connect(own_database, autocommit=True) as connection:
        later = begin(connection, "owed-later", str(uuid.uuid4()))
        assert later["history"][0] == [first, later["message_id"]] and later["history"][6] is None
        again = begin(connection, "owed-first", str(uuid.uuid4()))
    later_by = rows(own_database, "select to_json(answer_by) #>> '{}' from messages where id = %s", later["message_id"])
    assert (again["duplicate"], again.get("owed", False), again["reply"]) == (True, False, None)
    assert again["answer_by"] == later_by[0][0]


def test_a_redelivery_of_an_owed_message_while_the_next_turn_begins_waits_for_it(own_database: str) -> None:
    """The redelivery and the person's next message at the same moment: the next turn's begin_turn,
    not committed yet, reads the owed message merged; the redelivery waits for it (the person's owed
    lock, taken alone to take a message over) and then leaves the message to it. Seen failing: not
    seeing that turn's message yet, the redelivery took it over, and both answered it."""
    first = owed_first(own_database)
    turn = psycopg.connect(own_database)  # the next turn's begin_turn, its transaction held open
    later = begin(turn, "owed-later", str(uuid.uuid4()))
    assert later["history"][0] == [first, later["message_id"]] and later["history"][6] is None
    redelivered: dict[str, Any] = {}
    redelivery = psycopg.connect(own_database, autocommit=True)
    thread = threading.Thread(target=lambda: redelivered.update(row=begin(redelivery, "owed-first", str(uuid.uuid4()))))
    thread.start()
    thread.join(1.0)
    assert thread.is_alive()  # waiting for the next turn's begin_turn
    turn.commit()
    thread.join()
    turn.close()
    redelivery.close()
    row = redelivered["row"]
    assert (row["duplicate"], row.get("owed", False), row["reply"]) == (True, False, None)


def test_another_persons_message_being_answered_holds_back_neither_the_job_nor_a_redelivery(
    own_database: str,
) -> None:
    """Only the person's own later message answers their owed one: another person's, in flight at
    the same moment, leaves the redelivery to take it over, and the job to claim it."""
    first = owed_first(own_database)
    with psycopg.connect(own_database, autocommit=True) as connection:
        other = begin(connection, "other-person", str(uuid.uuid4()), sender="race-888")
        assert other["user_id"] != rows(own_database, "select user_id::text from messages where id = %s", first)[0][0]
        again = begin(connection, "owed-first", str(uuid.uuid4()))
        assert (again["duplicate"], again["owed"], again["message_id"]) == (False, True, first)
        execute(own_database, ENDED, first)
        assert claimed_ids(connection) == [first]
