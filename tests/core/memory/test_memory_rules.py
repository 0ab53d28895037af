"""The memory's rules on the real database: races, windows, limits, privacy."""

from __future__ import annotations

import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.memory_core import fill
from bench.web_window import store_conversation
from core.errors import EmptyMessage, MessageTooLong, TooManyEmptyConversations
from core.memory.service import Memory
from core.models import Person, Surface, TurnStart
from core.stores.postgres_store import PostgresStore
from tests.helpers import context_limits, count, execute, messages_read, rows


def test_fifty_concurrent_first_messages_make_one_conversation(memory: Memory, database_url: str) -> None:
    who = Person(sender_id=f"race-{uuid.uuid4().hex}")
    with ThreadPoolExecutor(max_workers=50) as pool:
        starts = list(pool.map(lambda i: memory.begin_turn(who, Surface.TELEGRAM, f"message {i}", f"u{i}"), range(50)))
    assert not any(start.degraded or start.duplicate for start in starts)
    user_ids = {start.user_id for start in starts}
    assert len(user_ids) == 1
    user_id = user_ids.pop()
    assert count(database_url, "select count(*) from conversations where user_id = %s", user_id) == 1
    assert count(database_url, "select count(*) from messages where user_id = %s", user_id) == 50
    assert count(database_url, "select count(*) from identities where user_id = %s", user_id) == 1


def test_two_new_conversations_for_the_last_empty_place_take_turns(memory: Memory, database_url: str) -> None:
    """The count and the insert of one call are not interleaved with another's: the second waits
    for the first to commit, then sees its conversation and is refused."""
    person = uuid.uuid4()
    outcome: dict[str, object] = {}

    def second() -> None:
        try:
            outcome["made"] = memory.create_conversation(person, "second", 1)
        except TooManyEmptyConversations as refused:
            outcome["refused"] = refused.most

    with psycopg.connect(database_url) as first:
        first.execute("select public.create_conversation(%s, 'first', 1)", (person,))  # not committed yet
        racer = threading.Thread(target=second)
        racer.start()
        racer.join(timeout=0.5)
        assert racer.is_alive()  # waiting for the first call's transaction
        first.commit()
    racer.join(timeout=10)
    assert outcome == {"refused": 1}
    assert rows(database_url, "select title from conversations where user_id = %s", person) == [("first",)]


def test_one_delivery_five_times_concurrently_is_stored_once(memory: Memory, database_url: str) -> None:
    who = Person(sender_id=f"dup-{uuid.uuid4().hex}")
    memory.begin_turn(who, Surface.WHATSAPP, "warm up", "SM-first")  # the conversation exists
    with ThreadPoolExecutor(max_workers=5) as pool:
        starts = list(pool.map(lambda _: memory.begin_turn(who, Surface.WHATSAPP, "hola", "SM-same"), range(5)))
    assert sorted(start.duplicate for start in starts) == [False, True, True, True, True]
    assert len({start.message_id for start in starts}) == 1
    assert (
        count(
            database_url,
            "select count(*) from messages where external_id = 'SM-same' and user_id = %s",
            starts[0].user_id,
        )
        == 1
    )


def test_messages_outside_the_window_are_not_context(memory: Memory, database_url: str) -> None:
    person = uuid.uuid4()
    first = memory.begin_turn(Person(user_id=person), Surface.TELEGRAM, "long ago", "old")
    with psycopg.connect(database_url, autocommit=True) as connection:
        connection.execute(
            "update messages set created_at = now() - interval '25 hours' where id = %s", (first.message_id,)
        )
    start = memory.begin_turn(Person(user_id=person), Surface.WHATSAPP, "today", "new")
    assert [m.content for m in start.history] == ["today"]


def test_the_window_start_moves_in_steps(store: PostgresStore) -> None:
    memory = Memory(store, context_limits(max_messages=6, window_step=4))
    person = Person(user_id=uuid.uuid4())
    firsts, sizes = [], []
    for index in range(12):
        # each attempt over at once (answer_within_s=0): an unanswered message whose attempt may still
        # answer it is no other turn's (context.sql)
        start = memory.begin_turn(person, Surface.TELEGRAM, f"m{index}", f"e{index}", answer_within_s=0)
        firsts.append(start.history[0].content)
        sizes.append(len(start.history))
    # 1..6 fit; then the start jumps by 4 at a time and holds there.
    assert sizes == [1, 2, 3, 4, 5, 6, 3, 4, 5, 6, 3, 4]
    assert firsts == ["m0"] * 6 + ["m4"] * 4 + ["m8"] * 2


@pytest.mark.parametrize("web", [False, True], ids=["every conversation", "one conversation"])
def test_the_window_walks_its_index_in_order_whatever_plan_it_keeps(
    memory: Memory, database_url: str, web: bool
) -> None:
    """context_window's statements, planned once for a session (a generic plan: made without
    knowing the person, nor whether one conversation or all are read), walk an index in its order:
    none reads the rows through a bitmap and sorts them newest first, as one statement serving both
    windows did (225 -> 141 µs a call: docs/benchmarks.md)."""
    person = uuid.uuid4()
    conversation = memory.create_conversation(person).id if web else None
    for index in range(3):
        surface = Surface.WEB if web else Surface.TELEGRAM
        memory.begin_turn(Person(user_id=person), surface, f"m{index}", f"e{index}", conversation, answer_within_s=0)
    # Others' messages and the statistics a live database keeps: with a handful of rows any plan reads them all.
    fill(database_url, 1_600, per_person=40)
    plans: list[str] = []
    with psycopg.connect(database_url, autocommit=True) as connection:
        connection.add_notice_handler(lambda notice: plans.append(notice.message_primary or ""))
        connection.execute("load 'auto_explain'")
        for setting in (
            "auto_explain.log_min_duration = 0",
            "auto_explain.log_nested_statements = on",
            "auto_explain.log_level = notice",
            "plan_cache_mode = force_generic_plan",
        ):
            connection.execute(f"set {setting}")
        window = connection.execute(
            "select public.context_window(%s, %s, '-infinity', now(), 9223372036854775807, 40, 24, null)",
            (person, conversation),
        ).fetchone()
    assert window is not None and window[0][4] == ["m0", "m1", "m2"]
    read = [plan for plan in plans if "from public.messages m" in plan]
    assert len(read) == 2  # the count, then the rows
    rows = read[1]
    assert "Index Scan using messages_by" in rows and "Bitmap" not in rows, rows
    assert "Sort Key: m.created_at DESC" not in rows, rows


def test_empty_and_too_long_messages_are_refused_and_store_nothing(memory: Memory, database_url: str) -> None:
    person = uuid.uuid4()
    with pytest.raises(MessageTooLong, match="100000 characters"):
        memory.begin_turn(Person(user_id=person), Surface.TELEGRAM, "x" * 100_000, "long")
    with pytest.raises(EmptyMessage):
        memory.begin_turn(Person(user_id=person), Surface.TELEGRAM, " \x00 \n", "empty")
    assert count(database_url, "select count(*) from messages where user_id = %s", person) == 0
    assert count(database_url, "select count(*) from conversations where user_id = %s", person) == 0


turns = st.lists(st.tuples(st.integers(0, 19), st.sampled_from(list(Surface)), st.booleans()), min_size=1, max_size=40)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(turns=turns)
def test_every_context_is_the_persons_own_recent_window(store: PostgresStore, database_url: str, turns: list) -> None:
    limits = context_limits(max_messages=5, window_step=2)
    memory = Memory(store, limits)
    people = [uuid.uuid4() for _ in range(20)]
    web_conversations = {person: memory.create_conversation(person).id for person in people}
    # Every person also has one message from before the window, which must never show.
    with psycopg.connect(database_url, autocommit=True) as connection:
        for person in people:
            start = memory.begin_turn(Person(user_id=person), Surface.TELEGRAM, "stale", f"stale-{person}")
            connection.execute(
                "update messages set created_at = now() - interval '30 hours' where id = %s", (start.message_id,)
            )
    for index, (who, surface, reply) in enumerate(turns):
        person = people[who]
        start = memory.begin_turn(
            Person(user_id=person),
            surface,
            f"{person} says {index}",
            f"t{index}",
            web_conversations[person] if surface is Surface.WEB else None,
            answer_within_s=0,  # its attempt over: the next turn reads it (context.sql)
        )
        assert start.message_id is not None and start.user_id == person
        context = start.history if surface.is_secondary else start.prepend + start.history
        with psycopg.connect(database_url) as connection:
            own = {
                row[0]: row[1]
                for row in connection.execute("select id, created_at from messages where user_id = %s", (person,))
            }
        assert all(message.id in own for message in context)
        assert all(str(person) in message.content or message.content.startswith("reply") for message in context)
        horizon = datetime.now(UTC) - timedelta(hours=limits.window_hours)
        order = [(message.created_at, message.id) for message in context]
        if surface.is_secondary:
            assert order == sorted(order)
            assert len(context) <= limits.max_messages
            assert all(message.created_at >= horizon for message in context)
            window = sorted((at, id_) for id_, at in own.items() if at >= horizon and id_ <= start.message_id)
            assert order == window[len(window) - len(context) :]
        else:
            assert len(start.prepend) <= limits.web_prepend and len(start.history) <= limits.max_messages
            assert all(message.created_at >= horizon for message in start.prepend)
            assert all(message.conversation_id == web_conversations[person] for message in start.history)
        assert context[-1].id == start.message_id
        if reply:
            memory.finish_turn(person, start.message_id, f"reply {index}")


def test_a_long_web_conversation_steps_as_the_rule_says(store: PostgresStore, database_url: str) -> None:
    """The web counts its conversation from the first message through the conversation's mark
    (context.sql's conversation_length), which moves every few turns: the window is the rule's
    (stepped_tail, over every message of the conversation) at every turn, replies included."""
    from core.models import Role
    from core.turn.context import ContextItem, stepped_tail

    limit, step = 5, 3
    memory = Memory(store, context_limits(max_messages=limit, window_step=step))
    person = uuid.uuid4()
    conversation = memory.create_conversation(person).id
    items: list[ContextItem] = []
    marks = set()
    for index in range(40):
        start = memory.begin_turn(Person(user_id=person), Surface.WEB, f"m{index}", f"w{index}", conversation)
        assert start.message_id is not None
        items.append(ContextItem(Role.USER, f"m{index}", Surface.WEB))
        assert [m.content for m in start.history] == [i.content for i in stepped_tail(items, limit, step)]
        memory.finish_turn(person, start.message_id, f"r{index}")
        items.append(ContextItem(Role.ASSISTANT, f"r{index}", Surface.WEB))
        marks.add(rows(database_url, "select counted from conversations where id = %s", conversation)[0][0])
    assert len(marks) > 10  # the mark moved all along (and the window stayed the rule's)


def web_turn_reads(
    database_url: str, conversations: dict[int, tuple[uuid.UUID, uuid.UUID]], limit: int, step: int
) -> dict[int, int]:
    """The rows of `messages` a web begin_turn read in each conversation (its transaction's
    statistics, read before and after: a session's add up until it reports them), with the budget
    on (TOKENS_PER_DAY's default) and generic plans, made once in one session for every
    conversation: an autovacuum's analyze of the shared database between two sessions could plan
    them apart."""
    reads = {}
    with psycopg.connect(database_url) as connection:
        connection.execute("set plan_cache_mode = force_generic_plan")
        connection.commit()
        for length, (person, conversation) in conversations.items():
            before = messages_read(connection)
            connection.execute(
                """select public.begin_turn(
                       p_surface => 'web', p_content => 'and now?', p_external_id => %s, p_user_id => %s,
                       p_sender_id => null, p_conversation_id => %s, p_window_hours => 24, p_max_messages => %s,
                       p_window_step => %s, p_web_prepend => 2, p_attempt => gen_random_uuid(),
                       p_turns_per_minute => 0, p_turns_per_day => 0, p_tokens_per_day => 2000000,
                       p_answer_within_seconds => 60, p_sender => null, p_sender_alias => null, p_opts_out => false,
                       p_platform_ref => null, p_reply_ref => null, p_quoted => null,
                       p_input_tokens => 0, p_output_tokens => 1024, p_requests => 1, p_language => null)""",
                (uuid.uuid4().hex, person, conversation, limit, step),
            )
            reads[length] = messages_read(connection) - before
            connection.rollback()
    return reads


def test_a_web_turn_reads_as_many_rows_in_a_conversation_of_months_as_in_one_of_a_day(
    store: PostgresStore, database_url: str
) -> None:
    """The web's window counts its conversation from the first message: without the conversation's
    mark, a turn read every message of it (context.sql's conversation_length); the other apps'
    latest messages put before it were looked for among the person's messages of the day, each of
    this conversation's read to find none (turn.sql's turn_context); and the budget's estimate of
    the window read the conversation whole in a generic plan (turn_input_tokens)."""
    limit, step = 6, 4
    memory = Memory(store, context_limits(max_messages=limit, window_step=step, web_prepend=2))
    conversations, marks = {}, {}
    for length in (20, 2_000):
        person = uuid.uuid4()
        conversation = memory.create_conversation(person).id
        store_conversation(database_url, person, conversation, length)
        first = memory.begin_turn(Person(user_id=person), Surface.WEB, "first", uuid.uuid4().hex, conversation)
        assert first.history[-2].content.startswith(f"message {length} ") and first.history[-1].content == "first"
        conversations[length] = (person, conversation)
        marks[length] = rows(database_url, "select counted from conversations where id = %s", conversation)
    # Others' messages, and the statistics a live database keeps, these conversations' among them
    # (fill's analyze): made here, not left to an autovacuum that may or may not have analyzed a
    # young session database this test's conversation was most of (its plans then read 26 rows).
    fill(database_url, 1_600, per_person=40)
    reads = web_turn_reads(database_url, conversations, limit, step)
    # as many, give or take the row at the mark (generic plans read from it); 2,014 against 19 before
    assert abs(reads[2_000] - reads[20]) <= 1 and reads[2_000] <= 4 * limit, (reads, marks)


def index_fetches(connection: psycopg.Connection[Any]) -> int:
    """The rows of `messages` `connection` has fetched through an index so far (its statistics add
    up across its transactions until it reports them: read them before and after)."""
    [(fetched,)] = connection.execute(
        "select idx_tup_fetch from pg_stat_xact_user_tables where relid = 'public.messages'::regclass"
    ).fetchall()
    return int(fetched)


def page_reads(
    database_url: str, conversations: dict[int, tuple[uuid.UUID, uuid.UUID]]
) -> dict[int, tuple[tuple[int, int], list[int], list[int]]]:
    """The rows of `messages` each conversation's first two pages of 10 fetched through an index,
    and their ids. The statistics are the messages' as they are now (an analyze), and one session
    plans one generic plan for every conversation: two sessions, an autovacuum's analyze of the
    shared database between them, planned them apart (a scan by the statistics of a table of a few
    rows, then the index)."""
    execute(database_url, "analyze messages")
    found = {}
    with psycopg.connect(database_url) as connection:
        connection.execute("set plan_cache_mode = force_generic_plan")
        connection.commit()
        for length, (person, conversation) in conversations.items():
            reads, pages, before = [], [], None
            for _ in range(2):
                fetched = index_fetches(connection)
                [(page,)] = connection.execute(
                    "select public.conversation_messages(%s, %s, %s, 10)", (person, conversation, before)
                ).fetchall()
                reads.append(index_fetches(connection) - fetched)
                connection.rollback()
                pages.append([message["id"] for message in page["messages"]])
                before = pages[-1][0]
            found[length] = ((reads[0], reads[1]), pages[0], pages[1])
    return found


def test_a_page_of_a_conversation_of_months_reads_what_a_page_of_a_day_reads(memory: Memory, database_url: str) -> None:
    """GET /conversations/<id>/messages: each page read the whole conversation and sorted it."""
    conversations = {}
    for length in (30, 3_000):
        person = uuid.uuid4()
        conversation = memory.create_conversation(person).id
        store_conversation(database_url, person, conversation, length)
        conversations[length] = (person, conversation)
    reads = {}
    for length, (read, ids, older) in page_reads(database_url, conversations).items():
        assert len(ids) == len(older) == 10 and older[-1] < ids[0]
        reads[length] = read
    assert reads[3_000] == reads[30], reads


@pytest.mark.parametrize(("limit", "step"), [(5, 8), (1, 1), (3, 100)])
def test_a_step_longer_than_the_window_never_empties_it(store: PostgresStore, limit: int, step: int) -> None:
    from core.models import Role
    from core.turn.context import ContextItem, stepped_tail

    memory = Memory(store, context_limits(max_messages=limit, window_step=step))
    person = Person(user_id=uuid.uuid4())
    items = []
    for index in range(12):
        start = memory.begin_turn(person, Surface.TELEGRAM, f"m{index}", f"e{index}", answer_within_s=0)
        items.append(ContextItem(Role.USER, f"m{index}", Surface.TELEGRAM))
        assert 1 <= len(start.history) <= limit
        assert start.history[-1].content == f"m{index}"
        assert [m.content for m in start.history] == [i.content for i in stepped_tail(items, limit, step)]


def test_attempts_storing_one_reply_at_once_store_it_once_and_each_is_told_its_id(
    memory: Memory, database_url: str
) -> None:
    """Attempts of one message (a Try again beside a stream the tab left, a job's claim beside a late
    turn) store its reply under the one id its begin_turn drew: racing on that id as on the one
    reply, none fails; each is told the stored reply's id, and the reply is stored once."""

    def store_reply(start: TurnStart, barrier: threading.Barrier) -> int | None:
        assert start.user_id is not None and start.message_id is not None
        barrier.wait()
        return memory.finish_turn(
            start.user_id, start.message_id, "Told.", attempt=uuid.uuid4(), reply_id=start.reply_id
        )

    for _ in range(20):
        start = memory.begin_turn(Person(user_id=uuid.uuid4()), Surface.WEB, "Tell me", uuid.uuid4().hex)
        assert start.reply_id is not None
        barrier = threading.Barrier(6)
        with ThreadPoolExecutor(max_workers=6) as pool:
            stored = list(pool.map(store_reply, [start] * 6, [barrier] * 6))
        assert stored == [start.reply_id] * 6
        assert rows(database_url, "select id from messages where in_reply_to = %s", start.message_id) == [
            (start.reply_id,)
        ]
