"""Follow-ups held outside WhatsApp's 24-hour window (follow_ups.sql), through the real SQL on real
Postgres. A WhatsApp message takes the held follow-ups an earlier message of its person took and no
answer said (turn_follow_ups): it locks that message's row, skipping one another session holds, so
it waits on no lock of anyone's and touches no answered message (sessions in threads, a third one
ordering them). One the job would hold after the person wrote (in the thread or not) is not held."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from core.memory.service import Memory
from core.models import Delivery, Person, Sent, Surface, TurnStart
from core.stores.postgres_store import PostgresStore
from core.stores.store import JsonScalar
from core.surfaces.whatsapp import say_follow_up
from tests.database import begin_turn_arguments, begin_turn_sql
from tests.helpers import answered_once_with_held, context_limits, execute, hold_a_follow_up, rows


@pytest.fixture
def memory(own_database: str) -> Iterator[Memory]:
    store = PostgresStore(own_database)
    yield Memory(store, context_limits())
    store.close()


def whatsapp_begin(url: str, number: str, external_id: str, per_minute: int = 0) -> Any:
    """begin_turn of a WhatsApp message of `number`, on a connection of its own."""
    arguments = begin_turn_arguments(
        p_surface="whatsapp",
        p_content="hello?",
        p_external_id=external_id,
        p_sender_id=number,
        p_sender=number,
        p_attempt=str(uuid.uuid4()),
        p_turns_per_minute=per_minute,
    )
    with psycopg.connect(url, autocommit=True) as connection:
        row = connection.execute(begin_turn_sql(arguments), arguments).fetchone()
        assert row is not None
        return row[0]


WAITING = "select count(*) from pg_stat_activity where datname = current_database() and wait_event_type = 'Lock'"


def waiting_on_a_lock(url: str, sessions: int) -> None:
    """Until `sessions` sessions of this database wait on a lock (the server's other databases are
    other tests'), at most 20 s: a thread of a loaded machine takes its time to connect."""
    deadline = time.monotonic() + 20
    while rows(url, WAITING)[0][0] < sessions:
        if time.monotonic() > deadline:
            raise AssertionError(f"fewer than {sessions} sessions wait on a lock")
        time.sleep(0.05)


def in_a_thread(work: Callable[[], object], failures: list[BaseException]) -> threading.Thread:
    def kept() -> None:
        try:
            work()
        except BaseException as exc:
            failures.append(exc)

    thread = threading.Thread(target=kept)
    thread.start()
    return thread


def owed_with_its_own_held(memory: Memory, url: str, number: str, *said: tuple[str, str]) -> list[int]:
    """Messages of `number` (external id, follow-up it took), each unanswered, its attempt dead."""
    first = memory.begin_turn(Person(sender_id=number), Surface.WHATSAPP, "hi", f"SM{number}-0", sender=number)
    assert first.user_id is not None and first.message_id is not None
    memory.finish_turn(first.user_id, first.message_id, "hello", attempt=first.attempt)
    taken: list[int] = []
    for external_id, follow_up in said:
        hold_a_follow_up(url, first, number, follow_up)
        start = memory.begin_turn(Person(sender_id=number), Surface.WHATSAPP, "and?", external_id, sender=number)
        assert start.message_id is not None and [s.content for s in start.delivered_first] == [follow_up]
        taken.append(start.message_id)
    execute(url, "update messages set answer_by = now() - interval '1 minute' where id = any(%s)", taken)
    return taken


def holding_the_budget(url: str, user_id: uuid.UUID) -> psycopg.Connection[Any]:
    """A session holding the person's budget lock (a third turn of theirs, a moment): the turns
    after it wait on it, in the order they came."""
    connection = psycopg.connect(url)
    connection.execute("select pg_advisory_xact_lock(hashtextextended('budget/' || %s, 0))", (str(user_id),))
    return connection


def test_a_new_message_and_the_redelivery_of_an_owed_one_both_go_on(memory: Memory, own_database: str) -> None:
    """The owed message's redelivery locks it, then waits on the budget's lock, which the new message
    took before it reached the owed message's row: the new message skips that row (its follow-up
    stays with the redelivery), and neither waits on the other (a review's finding: a deadlock)."""
    url, number = own_database, "+34600002004"
    [owed] = owed_with_its_own_held(memory, url, number, ("SM-nr-7", "Two."))
    [(person,)] = rows(url, "select user_id from messages where id = %s", owed)
    budget = holding_the_budget(url, person)
    failures: list[BaseException] = []
    answers: list[Any] = []
    new = in_a_thread(lambda: answers.append(whatsapp_begin(url, number, "SM-nr-new", per_minute=12)), failures)
    waiting_on_a_lock(url, 1)
    redelivery = in_a_thread(lambda: answers.append(whatsapp_begin(url, number, "SM-nr-7", per_minute=12)), failures)
    waiting_on_a_lock(url, 2)
    budget.commit()
    budget.close()
    new.join(10)
    redelivery.join(10)
    assert failures == []
    assert sorted(said["content"] for answer in answers for said in answer["delivered_first"]) == ["Two."]


def test_two_owed_messages_redelivered_at_once_each_say_their_own(memory: Memory, own_database: str) -> None:
    """Two unanswered messages, each with the follow-up it took, redelivered together: each locks its
    own, and neither waits on the other's (a review's finding: a deadlock)."""
    url, number = own_database, "+34600002002"
    five, _ = owed_with_its_own_held(memory, url, number, ("SM-two-5", "One."), ("SM-two-7", "Two."))
    [(person,)] = rows(url, "select user_id from messages where id = %s", five)
    budget = holding_the_budget(url, person)
    failures: list[BaseException] = []
    answers: list[Any] = []
    threads = [
        in_a_thread(lambda external=external: answers.append(whatsapp_begin(url, number, external, 12)), failures)
        for external in ("SM-two-5", "SM-two-7")
    ]
    waiting_on_a_lock(url, 2)
    budget.commit()
    budget.close()
    for thread in threads:
        thread.join(10)
    assert failures == []
    assert sorted(said["content"] for answer in answers for said in answer["delivered_first"]) == ["One.", "Two."]


def test_forgetting_while_a_message_arrives_goes_on(memory: Memory, own_database: str) -> None:
    """Forgetting deletes the person's messages (locking them), then waits (here on a session holding
    the follow-up its `on delete set null` updates); a message arriving meanwhile locks no answered
    message, so neither waits on the other (a review's finding: a deadlock, the message lost)."""
    url, number = own_database, "+34600002001"
    first = answered_once_with_held(memory, url, number)
    second = memory.begin_turn(Person(sender_id=number), Surface.WHATSAPP, "ok", "SM-fg-2", sender=number)
    assert second.message_id is not None
    memory.finish_turn(first.user_id, second.message_id, "fine", attempt=second.attempt)
    holder = psycopg.connect(url)
    holder.execute("select 1 from follow_ups where user_id = %s for update", (first.user_id,))
    failures: list[BaseException] = []

    def forget() -> None:
        with psycopg.connect(url, autocommit=True) as connection:
            connection.execute("select public.forget_conversations(%s, null)", (first.user_id,))

    forgetting = in_a_thread(forget, failures)
    waiting_on_a_lock(url, 1)
    arriving = in_a_thread(lambda: whatsapp_begin(url, number, "SM-fg-3"), failures)
    arriving.join(10)
    assert not arriving.is_alive()  # it waited on nothing the forgetting holds
    holder.commit()
    holder.close()
    forgetting.join(10)
    assert failures == [] and not forgetting.is_alive()


def test_a_turn_locks_none_of_the_persons_answered_messages(memory: Memory, own_database: str) -> None:
    """Forty answered messages that each said a held follow-up first (they keep `said_with`: a
    redelivery's TwiML repeats them): a new message's turn, its transaction still open, holds a
    lock on none of them (a review's finding: it locked each, a write a row, on every turn)."""
    url, number = own_database, "+34600002003"
    first = memory.begin_turn(Person(sender_id=number), Surface.WHATSAPP, "hi", "SM-hot-0", sender=number)
    assert first.user_id is not None and first.message_id is not None
    memory.finish_turn(first.user_id, first.message_id, "hello", attempt=first.attempt)
    for at in range(40):
        hold_a_follow_up(url, first, number, f"Reminder {at}.")
        start = memory.begin_turn(
            Person(sender_id=number), Surface.WHATSAPP, f"m{at}", f"SM-hot-{at + 1}", sender=number
        )
        assert start.message_id is not None and len(start.delivered_first) == 1
        memory.finish_turn(first.user_id, start.message_id, "ok", attempt=start.attempt)
    arguments = begin_turn_arguments(
        p_surface="whatsapp",
        p_content="new",
        p_external_id="SM-hot-new",
        p_sender_id=number,
        p_sender=number,
        p_attempt=str(uuid.uuid4()),
    )
    with psycopg.connect(url) as turn, psycopg.connect(url, autocommit=True) as other:
        turn.execute(begin_turn_sql(arguments), arguments)
        locked = other.execute(
            "select count(*) from messages m where m.user_id = %s and m.role = 'user'"
            " and m.id not in (select id from messages for no key update skip locked)",
            (first.user_id,),
        ).fetchone()
        turn.rollback()
    assert locked == (0,)


def test_a_follow_up_the_job_would_hold_after_the_person_wrote_is_sent_at_the_next_run(
    memory: Memory, own_database: str
) -> None:
    """The job claims a follow-up due outside the window (the person's last WhatsApp message 25 hours
    old); the person writes before the job decides, so their turn does not take it (it is being
    sent). Held, only their message after the next would say it: it is pending again at once, its
    attempt not counted, and the next run claims it, inside the window now (a review's finding)."""
    url, number = own_database, "+34600440002"
    first = memory.begin_turn(Person(sender_id=number), Surface.WHATSAPP, "hi", "SM-w-1", sender=number)
    assert first.user_id is not None and first.message_id is not None
    memory.finish_turn(first.user_id, first.message_id, "hello", attempt=first.attempt)
    execute(url, "update messages set created_at = created_at - interval '25 hours'")
    execute(
        url,
        "insert into follow_ups (user_id, conversation_id, surface, sender, content, due_at, next_attempt_at)"
        " values (%s, %s, 'whatsapp', %s, 'Call mum.', now() - interval '1 minute', now() - interval '1 minute')",
        first.user_id,
        first.conversation_id,
        number,
    )
    store, now, claim = memory.store, datetime.now(UTC), str(uuid.uuid4())
    claiming = {"p_now": now.isoformat(), "p_limit": 50, "p_lease_seconds": 300, "p_claim": claim}
    [row] = store.call("claim_due_follow_ups", claiming)["claimed"]
    written = memory.begin_turn(Person(sender_id=number), Surface.WHATSAPP, "morning", "SM-w-2", sender=number)
    assert written.delivered_first == [] and written.message_id is not None
    memory.finish_turn(first.user_id, written.message_id, "Good morning!", attempt=written.attempt)
    assert store.call("try_follow_up", {"p_id": row["id"], "p_claim": claim, "p_now": now.isoformat()})["ok"]
    _, outcome = say_follow_up(None, None)(number, row, now)
    assert outcome == "held"  # on what the claim saw
    finishing = {"p_id": row["id"], "p_claim": claim, "p_outcome": outcome, "p_retry_at": None}
    store.call(
        "finish_follow_up",
        {
            **finishing,
            "p_unsent_from": None,
            "p_seen_at": row["window_opened_at"],
            "p_said_as": None,
            "p_held_until": None,
        },
    )
    assert rows(url, "select status, attempts from follow_ups") == [("pending", 0)]
    later = {**claiming, "p_now": (now + timedelta(minutes=1)).isoformat(), "p_claim": str(uuid.uuid4())}
    [again] = store.call("claim_due_follow_ups", later)["claimed"]
    said: list[tuple[str, str, int]] = []

    def free_form(to: str, text: str, first_part: int) -> Sent:
        said.append((to, text, first_part))
        return Sent(Delivery.DELIVERED, 1)

    assert say_follow_up(free_form, None)(number, again, now + timedelta(minutes=1))[1] == "sent"
    assert said == [(f"whatsapp:{number}", "Call mum.", 0)]


def test_a_follow_up_the_job_would_hold_after_a_message_outside_the_thread_is_pending_again(
    own_database: str,
) -> None:
    """Two people whose last WhatsApp message is two days old each have a reminder due; the job's
    claim sees both windows closed. Before it records them held, the second sends a message the
    thread does not keep (wrote_outside_thread): their window is open again, so theirs is pending at
    once, not held until a message after this one. The first's stays held."""
    with psycopg.connect(own_database, autocommit=True) as db:
        people = {"+34611000601": uuid.uuid4(), "+34611000602": uuid.uuid4()}
        for number, person in people.items():
            db.execute(
                "with chat as (insert into conversations (user_id, surface) values (%(person)s, 'whatsapp')"
                "              returning id),"
                " said as (insert into messages (conversation_id, user_id, surface, role, content, sender, created_at)"
                "          select id, %(person)s, 'whatsapp', 'user', 'remind me', %(number)s,"
                "                 now() - interval '2 days' from chat)"
                " insert into follow_ups (user_id, conversation_id, surface, sender, content, due_at, next_attempt_at)"
                " select %(person)s, id, 'whatsapp', %(number)s, 'Stretch.', now(), now() from chat",
                {"person": person, "number": number},
            )
            db.execute(
                "insert into identities (surface, external_id, user_id) values ('whatsapp', %s, %s)", (number, person)
            )
        claim = uuid.uuid4()
        [(claimed,)] = db.execute(
            "select public.claim_due_follow_ups(now() + interval '1 minute', 50, 360, %s)", (claim,)
        ).fetchall()
        assert len(claimed["claimed"]) == 2
        db.execute("select public.wrote_outside_thread(null, 'whatsapp', '+34611000602', false)")
        for row in claimed["claimed"]:
            [(finished,)] = db.execute(
                "select public.finish_follow_up(%s, %s, 'held', now(), null, %s, null, null)",
                (row["id"], claim, row["window_opened_at"]),
            ).fetchall()
            assert finished == {"done": True, "message_id": None}
        assert rows(own_database, "select sender, status from follow_ups order by sender") == [
            ("+34611000601", "held"),
            ("+34611000602", "pending"),
        ]


def test_follow_ups_are_left_to_the_job_only_for_the_person_whose_message_took_them(
    memory: Memory, own_database: str
) -> None:
    """send_follow_ups_later, named with another person, changes nothing of this person's; named
    with theirs, the follow-up is pending at once with all its tries, out of the thread until sent."""
    url, number = own_database, "+34600440003"
    answered_once_with_held(memory, url, number)
    execute(url, "update follow_ups set attempts = 6")  # held at its last try
    start = memory.begin_turn(Person(sender_id=number), Surface.WHATSAPP, "and?", "SM-again-2", sender=number)
    stranger = memory.begin_turn(Person(sender_id="+34600440004"), Surface.WHATSAPP, "hey", "SM-again-3")
    assert start.user_id is not None and start.message_id is not None and stranger.user_id is not None
    taken = "select status, said_with is not null, attempts, next_attempt_at <= clock_timestamp() from follow_ups"
    in_the_thread = "select count(*) from messages where content = 'Stretch now.'"
    memory.store.call("send_follow_ups_later", later_arguments(stranger.user_id, start))
    assert rows(url, taken) == [("sent", True, 6, True)]
    memory.store.call("send_follow_ups_later", later_arguments(start.user_id, start))
    assert rows(url, taken) == [("pending", False, 0, True)] and rows(url, in_the_thread) == [(0,)]


def test_leaving_follow_ups_to_the_job_while_their_conversation_is_forgotten_goes_on(
    memory: Memory, own_database: str
) -> None:
    """send_follow_ups_later waits for the conversation a third session holds a moment; forgetting
    takes the messages and the follow-up meanwhile, then waits for the conversation too: the first
    skips what forgetting holds, and both succeed (a review's finding: a deadlock)."""
    url, number = own_database, "+34600440005"
    answered_once_with_held(memory, url, number)
    start = memory.begin_turn(Person(sender_id=number), Surface.WHATSAPP, "and?", "SM-fg-11", sender=number)
    assert start.user_id is not None and start.message_id is not None
    [taken] = start.delivered_first
    failures: list[BaseException] = []
    later = {"p_user_id": str(start.user_id), "p_message_id": start.message_id, "p_ids": f"[{taken.id}]"}
    forgetting = {"p_user_id": str(start.user_id), "p_conversation_id": None}
    with psycopg.connect(url) as holder:  # holds the conversation a moment, so the two meet
        holder.execute("select from conversations where id = %s for key share", (start.conversation_id,))
        threads = []
        for waiting, (function, arguments) in enumerate(
            (("send_follow_ups_later", later), ("forget_conversations", forgetting)), start=1
        ):
            threads.append(in_a_thread(lambda f=function, a=arguments: memory.store.call(f, a), failures))
            waiting_on_a_lock(url, waiting)
        holder.rollback()
    for thread in threads:
        thread.join(10)
    assert failures == [] and rows(url, "select count(*) from follow_ups") == [(0,)]


def answered_with_a_taken_follow_up(memory: Memory, url: str, number: str) -> tuple[Any, int, str]:
    """A WhatsApp message of `number` that took a held follow-up and was answered: its start, the
    follow-up's id, and the number's identity key."""
    first = memory.begin_turn(Person(sender_id=number), Surface.WHATSAPP, "hi", f"SM{number}-a", sender=number)
    assert first.user_id is not None and first.message_id is not None
    memory.finish_turn(first.user_id, first.message_id, "hello", attempt=first.attempt)
    hold_a_follow_up(url, first, number)
    start = memory.begin_turn(Person(sender_id=number), Surface.WHATSAPP, "and?", f"SM{number}-b", sender=number)
    assert start.user_id is not None and start.message_id is not None
    memory.finish_turn(start.user_id, start.message_id, "Sure.", attempt=start.attempt)
    [taken] = start.delivered_first
    [(key,)] = rows(url, "select external_id from identities where surface = 'whatsapp'")
    return start, taken.id, key


def test_a_link_committed_while_leaving_follow_ups_to_the_job_waits_is_seen(memory: Memory, own_database: str) -> None:
    """The number is being linked into a web account (the follow-up moves to it) as its answer
    leaves the follow-up to the job: it waits for the link, then finds the follow-up under the
    account (a review's finding: it looked under the person it began with, and lost it)."""
    url = own_database
    start, follow_up, key = answered_with_a_taken_follow_up(memory, url, "+34600770001")
    later = {"p_user_id": str(start.user_id), "p_message_id": start.message_id, "p_ids": f"[{follow_up}]"}
    failures: list[BaseException] = []
    answers: list[Any] = []
    web = uuid.uuid4()
    with psycopg.connect(url) as linker:  # the link, not committed yet
        linker.execute("select link_identity(%s, 'whatsapp', %s)", (web, key))
        leaving = in_a_thread(lambda: answers.append(memory.store.call("send_follow_ups_later", later)), failures)
        waiting_on_a_lock(url, 1)
        linker.commit()
    leaving.join(10)
    assert failures == [] and answers == [{"pending": 1}]
    assert rows(url, "select user_id, status from follow_ups") == [(web, "pending")]


def test_leaving_follow_ups_to_the_job_while_the_number_is_linked_goes_on(memory: Memory, own_database: str) -> None:
    """A link moves the conversation, its follow-ups, then its messages, while leaving a follow-up to
    the job waits for the conversation: it reads whose the follow-up is after the link, and both
    succeed, the follow-up left to the job under the account (a review's finding: a deadlock)."""
    url = own_database
    start, follow_up, key = answered_with_a_taken_follow_up(memory, url, "+34600770002")
    later = {"p_user_id": str(start.user_id), "p_message_id": start.message_id, "p_ids": f"[{follow_up}]"}
    failures: list[BaseException] = []

    def link() -> None:
        with psycopg.connect(url, autocommit=True) as connection:
            connection.execute("select link_identity(%s, 'whatsapp', %s)", (uuid.uuid4(), key))

    with psycopg.connect(url) as holder:  # holds the conversation a moment, so the two meet
        holder.execute("select from conversations where id = %s for key share", (start.conversation_id,))
        leaving = in_a_thread(lambda: memory.store.call("send_follow_ups_later", later), failures)
        waiting_on_a_lock(url, 1)
        linking = in_a_thread(link, failures)
        waiting_on_a_lock(url, 2)
        holder.rollback()
    leaving.join(10)
    linking.join(10)
    assert failures == [] and not linking.is_alive() and not leaving.is_alive()
    assert rows(url, "select status from follow_ups") == [("pending",)]


def test_leaving_two_follow_ups_to_the_job_while_their_conversation_is_forgotten_goes_on(
    memory: Memory, own_database: str
) -> None:
    """Two follow-ups left to the job as the conversation is forgotten, which reaches them newest
    message first: this waits for the conversation, then takes only what no one holds, so neither
    waits on the other for ever (a review's finding: a deadlock, this one taking the oldest first)."""
    url, number = own_database, "+34600880002"
    first = answered_once_with_held(memory, url, number, "One.")
    hold_a_follow_up(url, first, number, "Two.")
    start = memory.begin_turn(Person(sender_id=number), Surface.WHATSAPP, "and?", "SM-two-b", sender=number)
    assert start.user_id is not None and start.message_id is not None
    one, two = (said.id for said in start.delivered_first)
    later = {"p_user_id": str(start.user_id), "p_message_id": start.message_id, "p_ids": f"[{one}, {two}]"}
    forgetting = {"p_user_id": str(start.user_id), "p_conversation_id": None}
    failures: list[BaseException] = []
    with psycopg.connect(url) as holder:  # holds the conversation a moment, so the two meet
        holder.execute("select from conversations where id = %s for key share", (start.conversation_id,))
        leaving = in_a_thread(lambda: memory.store.call("send_follow_ups_later", later), failures)
        waiting_on_a_lock(url, 1)
        forget = in_a_thread(lambda: memory.store.call("forget_conversations", forgetting), failures)
        waiting_on_a_lock(url, 2)
        holder.rollback()
    leaving.join(10)
    forget.join(10)
    assert failures == [] and rows(url, "select count(*) from follow_ups") == [(0,)]
    assert rows(url, "select count(*) from messages") == [(0,)]


def test_a_thread_message_taken_out_before_its_conversations_count_mark_has_it_counted_again(
    memory: Memory, own_database: str
) -> None:
    """A WhatsApp message took a held follow-up and was never answered; web turns in the same
    conversation moved its count mark (conversations.counted) past the follow-up's thread message.
    The person's next message takes the follow-up over and leaves it to the job, whose thread
    message goes: the mark goes with it, as after a purge (a review's finding: it went on counting
    the message, and the web's window stepped one off)."""
    url, number = own_database, "+34600990003"
    first = answered_once_with_held(memory, url, number)
    old = memory.begin_turn(Person(sender_id=number), Surface.WHATSAPP, "and?", "SM-c-2", sender=number)
    assert old.message_id is not None and len(old.delivered_first) == 1
    execute(url, "update messages set answer_by = now() - interval '1 minute' where id = %s", old.message_id)
    for turn in range(6):  # the web, in the same conversation: a window of 2, a step of 1
        arguments = begin_turn_arguments(
            p_surface="web",
            p_content=f"web {turn}",
            p_user_id=str(first.user_id),
            p_conversation_id=str(first.conversation_id),
            p_attempt=str(uuid.uuid4()),
            p_max_messages=2,
            p_window_step=1,
            p_web_prepend=0,
        )
        with psycopg.connect(url, autocommit=True) as connection:
            row = connection.execute(begin_turn_sql(arguments), arguments).fetchone()
        assert row is not None and first.user_id is not None
        memory.finish_turn(first.user_id, row[0]["message_id"], f"reply {turn}", attempt=uuid.UUID(row[0]["attempt"]))
    assert rows(url, "select counted is not null from conversations where id = %s", first.conversation_id) == [(True,)]
    start = memory.begin_turn(Person(sender_id=number), Surface.WHATSAPP, "hello?", "SM-c-3", sender=number)
    assert start.user_id is not None and start.message_id is not None and len(start.delivered_first) == 1
    left = start.delivered_first  # an answer with no room for it
    memory.finish_turn(start.user_id, start.message_id, "Sure.", attempt=start.attempt, said_later=left)
    assert rows(url, "select counted from conversations where id = %s", first.conversation_id) == [(None,)]


def later_arguments(person: uuid.UUID, start: TurnStart) -> dict[str, JsonScalar]:
    """send_follow_ups_later's arguments for the follow-ups `start` took, named with `person`."""
    ids = json.dumps([said.id for said in start.delivered_first])
    return {"p_user_id": str(person), "p_message_id": start.message_id, "p_ids": ids}
