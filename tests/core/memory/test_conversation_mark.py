"""The web's window counts its conversation from a mark (context.sql's conversation_length): the
window is the rule's (stepped_tail over every message of the conversation up to the turn's) through
ties, changed settings, late replies and owed messages; a purge racing a turn loses neither its
reset nor its batch. Several of these were found by a review, each failing before its fix."""

from __future__ import annotations

import random
import threading
import time
import uuid
from datetime import timedelta
from typing import Any

import psycopg

from bench.web_window import store_conversation
from core.memory.service import Memory
from core.models import Person, Role, Surface
from core.stores.postgres_store import PostgresStore
from core.turn.context import ContextItem, stepped_tail
from tests.helpers import context_limits, rows

LIMIT, STEP = 5, 3


def thread_of(database_url: str, conversation: uuid.UUID) -> list[ContextItem]:
    return [
        ContextItem(Role(role), content, Surface.WEB)
        for role, content in rows(
            database_url,
            "select role, content from messages where conversation_id = %s order by created_at, id",
            conversation,
        )
    ]


def mark_of(database_url: str, conversation: uuid.UUID) -> tuple[int | None, int]:
    """(counted, how many messages there really are up to and including the mark)."""
    [(counted, real)] = rows(
        database_url,
        """select c.counted, (select count(*) from messages m where m.conversation_id = c.id
                                and (m.created_at, m.id) <= (c.counted_at, c.counted_id))
             from conversations c where c.id = %s""",
        conversation,
    )
    return counted, real


def talk(memory: Memory, person: uuid.UUID, conversation: uuid.UUID, turns: range) -> None:
    """A web turn for each index, answered: `u<index>`, `r<index>`."""
    for index in turns:
        start = memory.begin_turn(Person(user_id=person), Surface.WEB, f"u{index}", f"w{index}", conversation)
        assert start.message_id is not None
        memory.finish_turn(person, start.message_id, f"r{index}")


def someone_waits_for_a_lock(database_url: str, seconds: float = 20) -> None:
    """Until a session of this database waits for a row another holds."""
    deadline = time.monotonic() + seconds
    while not rows(
        database_url,
        "select 1 from pg_stat_activity where datname = current_database() and wait_event_type = 'Lock'",
    ):
        assert time.monotonic() < deadline, "nobody waited for the lock"
        time.sleep(0.01)


def test_ties_changed_settings_and_messages_stored_between_turns_keep_the_rule(
    store: PostgresStore, database_url: str
) -> None:
    choose = random.Random(3)
    person = uuid.uuid4()
    conversation = Memory(store, context_limits()).create_conversation(person).id
    with psycopg.connect(database_url, autocommit=True) as connection:
        # 150 messages of one instant (ties on created_at), then the turns
        connection.execute(
            "insert into messages (conversation_id, user_id, surface, role, content, created_at)"
            " select %s, %s, 'web', 'assistant', 't' || n, now() - interval '1 hour' from generate_series(1, 150) n",
            (conversation, person),
        )
    wrong = []
    for index in range(120):
        limit, step = choose.choice([(5, 3), (8, 2), (3, 3), (12, 5), (40, 24), (4, 4)])
        memory = Memory(store, context_limits(max_messages=limit, window_step=step, web_prepend=0))
        # its attempt over at once: one left unanswered is read by the next turn (one whose attempt
        # may still answer it is no other turn's: context.sql), so the window is the whole stepped tail
        start = memory.begin_turn(
            Person(user_id=person), Surface.WEB, f"m{index}", f"e{index}", conversation, answer_within_s=0
        )
        assert start.message_id is not None
        want = [item.content for item in stepped_tail(thread_of(database_url, conversation), limit, step)]
        if [message.content for message in start.history] != want:
            wrong.append((index, limit, step))
        if choose.random() < 0.9:
            memory.finish_turn(person, start.message_id, f"r{index}")
        if choose.random() < 0.2:  # a follow-up said between turns
            with psycopg.connect(database_url, autocommit=True) as connection:
                connection.execute(
                    "insert into messages (conversation_id, user_id, surface, role, content)"
                    " values (%s, %s, 'web', 'assistant', %s)",
                    (conversation, person, f"f{index}"),
                )
    assert wrong == []


def test_replies_stored_after_later_questions_keep_the_rule(store: PostgresStore, database_url: str) -> None:
    """A reply's id is drawn when its turn begins and it is stored when the turn ends: later
    questions come first in (created_at, id)."""
    choose = random.Random(11)
    person = uuid.uuid4()
    memory = Memory(store, context_limits(max_messages=6, window_step=4, web_prepend=0))
    conversation = memory.create_conversation(person).id
    open_turns: list[Any] = []
    wrong = []
    for index in range(200):
        if open_turns and choose.random() < 0.5:
            start = open_turns.pop(choose.randrange(len(open_turns)))
            memory.finish_turn(person, start.message_id, f"r{start.message_id}", reply_id=start.reply_id)
            continue
        start = memory.begin_turn(
            Person(user_id=person), Surface.WEB, f"m{index}", f"e{index}", conversation, answer_within_s=0
        )
        want = [item.content for item in stepped_tail(thread_of(database_url, conversation), 6, 4)]
        if [message.content for message in start.history] != want:
            wrong.append(index)
        open_turns.append(start)
    assert wrong == []


def test_an_owed_web_message_answered_after_the_mark_passed_it_has_the_window_up_to_it(
    store: PostgresStore, database_url: str
) -> None:
    memory = Memory(store, context_limits(max_messages=LIMIT, window_step=STEP, web_prepend=0))
    person = uuid.uuid4()
    conversation = memory.create_conversation(person).id
    talk(memory, person, conversation, range(3))
    owed = memory.begin_turn(Person(user_id=person), Surface.WEB, "lost", "w-lost", conversation, answer_within_s=0)
    assert owed.message_id is not None and owed.attempt is not None
    memory.end_attempt(person, owed.message_id, owed.attempt, 0)
    talk(memory, person, conversation, range(3, 12))  # the person goes on; the mark moves past the owed message
    [(passed,)] = rows(
        database_url,
        "select (c.counted_at, c.counted_id) > (m.created_at, m.id) from conversations c, messages m"
        " where c.id = %s and m.id = %s",
        conversation,
        owed.message_id,
    )
    assert passed

    again = memory.begin_turn(Person(user_id=person), Surface.WEB, "lost", "w-lost", conversation)

    assert again.owed and again.message_id == owed.message_id
    thread = thread_of(database_url, conversation)
    up_to = thread[: [item.content for item in thread].index("lost") + 1]
    assert [m.content for m in again.history] == [item.content for item in stepped_tail(up_to, LIMIT, STEP)]


def test_a_purge_committed_while_a_turn_moves_the_mark_keeps_its_reset(store: PostgresStore, database_url: str) -> None:
    memory = Memory(store, context_limits(max_messages=LIMIT, window_step=STEP, web_prepend=0))
    person = uuid.uuid4()
    conversation = memory.create_conversation(person).id
    store_conversation(database_url, person, conversation, 20, apart=timedelta(days=1))
    talk(memory, person, conversation, range(2))  # the first turn sets the mark, the second brings 8 after it
    purge = psycopg.connect(database_url)
    # deletes old 11 to 20 and sets the mark back, not committed yet
    purge.execute("select public.purge_messages(%s, 120, 1000, false, null, null)", (10 * 86400 + 43200,))
    started: dict[str, Any] = {}
    turn = threading.Thread(
        target=lambda: started.setdefault(
            "turn", memory.begin_turn(Person(user_id=person), Surface.WEB, "u2", "w2", conversation)
        )
    )
    turn.start()  # its count moves the mark: its write waits for the purge's
    someone_waits_for_a_lock(database_url)
    purge.commit()
    purge.close()
    turn.join()
    memory.finish_turn(person, started["turn"].message_id, "r2")

    counted, real = mark_of(database_url, conversation)
    assert counted is None or counted == real, (counted, real)
    after = memory.begin_turn(Person(user_id=person), Surface.WEB, "u3", "w3", conversation)
    want = [item.content for item in stepped_tail(thread_of(database_url, conversation), LIMIT, STEP)]
    assert [message.content for message in after.history] == want


def test_a_purge_and_a_turn_storing_its_transcript_do_not_deadlock(store: PostgresStore, database_url: str) -> None:
    """The purge's foreign keys' actions (a reply's `replied_to` set to null) lock messages at the end
    of its delete; finish_turn locks its message (the transcript), then the conversation. The
    purge resets the marks after its delete: it takes them in the turn's order."""
    memory = Memory(store, context_limits(max_messages=3, window_step=2, web_prepend=0))
    person = uuid.uuid4()
    with psycopg.connect(database_url, autocommit=True) as connection:
        [(conversation,)] = connection.execute(
            "insert into conversations (user_id, surface) values (%s, 'telegram') returning id", (person,)
        ).fetchall()
        [(old,)] = connection.execute(
            "insert into messages (conversation_id, user_id, surface, role, content, created_at)"
            " values (%s, %s, 'telegram', 'user', 'old question', now() - interval '20 days') returning id",
            (conversation, person),
        ).fetchall()
        connection.execute(
            "insert into messages (conversation_id, user_id, surface, role, content, in_reply_to, created_at)"
            " values (%s, %s, 'telegram', 'assistant', 'old answer', %s, now() - interval '20 days')",
            (conversation, person, old),
        )
        connection.execute(
            "insert into messages (conversation_id, user_id, surface, role, content, created_at)"
            " select %s, %s, 'telegram', 'user', 'x' || n, now() - interval '1 hour' + n * interval '1 s'"
            "   from generate_series(1, 10) n",
            (conversation, person),
        )
        # a voice note of the person's that replies to the old question
        [(voice,)] = connection.execute(
            "insert into messages (conversation_id, user_id, surface, role, content, replied_to)"
            " values (%s, %s, 'telegram', 'user', '[voice note]', %s) returning id",
            (conversation, person, old),
        ).fetchall()
    memory.begin_turn(Person(user_id=person), Surface.WEB, "from the web", "w1", conversation)  # the mark
    assert mark_of(database_url, conversation)[0] is not None
    finish = psycopg.connect(database_url)
    finish.execute("select public.rewrite_user_message(%s, %s, 'the transcript')", (person, voice))
    errors: list[str] = []

    def purge() -> None:
        try:
            with psycopg.connect(database_url, autocommit=True) as connection:
                connection.execute("select public.purge_messages(%s, 120, 1000, false, null, null)", (10 * 86400,))
        except psycopg.Error as error:
            errors.append(f"purge: {error.sqlstate}")

    purging = threading.Thread(target=purge)
    purging.start()
    someone_waits_for_a_lock(database_url)  # the purge waits for the voice note
    try:
        finish.execute(
            "select public.finish_turn(%s, %s, 'reply', true, null, null, 0, null, 0, null, null, null, null)",
            (person, voice),
        )
        finish.commit()
    except psycopg.Error as error:
        errors.append(f"finish_turn: {error.sqlstate}")
    purging.join()
    finish.close()
    assert errors == []
    assert rows(database_url, "select count(*) from messages where id = %s", old) == [(0,)]
