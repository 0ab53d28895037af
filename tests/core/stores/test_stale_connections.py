"""Pooled connections that die while idle (a database restart, a pooler's idle timeout),
and a call whose answer is lost after it committed: nothing is lost, nothing doubled."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from bench.latency_proxy import LatencyProxy, postgres_target, through_proxy
from core.errors import StoreUnavailable
from core.identity.policy import IdentityPolicy
from core.memory.service import Memory
from core.model.llm import AnthropicModel
from core.models import Person, Surface
from core.stores.postgres_store import PostgresStore
from core.stores.store import final_error
from core.turn.request import Outcome, TurnRequest, TurnSettings
from core.turn.turns import Turns
from tests.database import begin_turn_arguments
from tests.fakes.anthropic_api import FakeAnthropic
from tests.helpers import context_limits

APPLICATION = "crossmem-stale-test"


@pytest.fixture
def proxy(database_url: str) -> Iterator[LatencyProxy]:
    with LatencyProxy(postgres_target(database_url)) as running:
        yield running


@pytest.fixture
def proxied_store(database_url: str, proxy: LatencyProxy) -> Iterator[PostgresStore]:
    store = PostgresStore(make_conninfo(through_proxy(database_url, proxy.port), application_name=APPLICATION))
    yield store
    store.close()


def kill_idle_connections(database_url: str) -> int:
    """What a restart or a pooler's idle timeout does to the pool: every idle connection dies."""
    with psycopg.connect(database_url, autocommit=True) as admin:
        # A backend shows 'idle' a moment after its answer has left: under load that moment can
        # outlast the client's next step, so wait for every one of the pool's to show it.
        while admin.execute(
            "select count(*) from pg_stat_activity where application_name = %s and state <> 'idle'", (APPLICATION,)
        ).fetchone() != (0,):
            time.sleep(0.01)
        killed = admin.execute(
            "select count(*) filter (where pg_terminate_backend(pid)) from pg_stat_activity"
            " where application_name = %s and state = 'idle'",
            (APPLICATION,),
        ).fetchone()
        while admin.execute(
            "select count(*) from pg_stat_activity where application_name = %s", (APPLICATION,)
        ).fetchone() != (0,):
            pass  # pg_terminate_backend only signals; wait until the backends are gone
    assert killed is not None
    return int(killed[0])


def open_idle_connections(store: PostgresStore, memory: Memory, database_url: str, at_least: int) -> None:
    """Concurrent calls until the pool holds `at_least` connections, as a busy instance's would,
    and then until every connection the pool has asked for is open and idle in it (one it grew
    for a waiting call may still be opening in the background: killed or not, by chance)."""
    with ThreadPoolExecutor(max_workers=8) as threads:
        for _ in range(50):
            list(threads.map(lambda _: memory.list_conversations(uuid.uuid4()), range(16)))
            with psycopg.connect(database_url) as admin:
                row = admin.execute("select count(*) from pg_stat_activity where application_name = %s", (APPLICATION,))
                if (row.fetchone() or (0,))[0] >= at_least:
                    break
        else:
            raise AssertionError(f"the pool never held {at_least} connections")
    while (stats := store._open_pool().get_stats())["pool_size"] != stats["pool_available"]:
        time.sleep(0.01)


def wait_until_the_proxy_let_go(proxy: LatencyProxy) -> None:
    """The killed connections' ends reach the proxy's threads a moment after the backends are
    gone (later on a loaded host): until then, what the pool sends on them (the turn's first
    try, the closing message of each one it drops) would be forwarded and counted, or not."""
    while proxy.open_connections:
        time.sleep(0.01)


def test_idle_connections_killed_the_next_turn_keeps_its_memory_and_stores_its_message(
    proxied_store: PostgresStore, proxy: LatencyProxy, database_url: str
) -> None:
    memory = Memory(proxied_store, context_limits())
    person = Person(user_id=uuid.uuid4())
    first = memory.begin_turn(person, Surface.TELEGRAM, "my dentist moved to Friday", "u1")
    assert first.user_id is not None and first.message_id is not None
    memory.finish_turn(first.user_id, first.message_id, "noted")

    proxy.reset()
    healthy = memory.begin_turn(person, Surface.TELEGRAM, "and the budget is 900", "u2")
    assert healthy.message_id is not None
    memory.finish_turn(first.user_id, healthy.message_id, "noted too")
    assert (proxy.statements, proxy.round_trips) == (2, 2)

    open_idle_connections(proxied_store, memory, database_url, at_least=3)
    assert kill_idle_connections(database_url) >= 3
    wait_until_the_proxy_let_go(proxy)
    proxy.reset()
    after = memory.begin_turn(person, Surface.TELEGRAM, "when is the dentist?", "u3")
    assert not after.degraded and not after.duplicate and after.message_id is not None
    assert [message.content for message in after.history] == [
        "my dentist moved to Friday",
        "noted",
        "and the budget is 900",
        "noted too",
        "when is the dentist?",
    ]
    assert memory.finish_turn(first.user_id, after.message_id, "Friday") is not None
    # The turn's two statements ran on a fresh connection: the one tried first was dead (what
    # was sent on it reached nothing) and the pool dropped its dead siblings. It replaces them
    # in the background: their handshakes, done or not by now, are not statements.
    assert proxy.statements == 2
    stored = memory.person_history(first.user_id)
    assert [message.content for message in stored][-2:] == ["when is the dentist?", "Friday"]


def test_a_turn_whose_begin_turn_committed_but_whose_answer_was_lost_asks_the_model_once(
    proxied_store: PostgresStore, proxy: LatencyProxy, database_url: str
) -> None:
    fake = FakeAnthropic()
    try:
        model = AnthropicModel(
            api_key="sk-ant-test", model="claude-test-1", max_tokens=100, base_url=fake.url, max_retries=0
        )
        settings = TurnSettings(system_prompt="be brief", fallback_reply="FALLBACK", stranger_reply="NO")
        turns = Turns(Memory(proxied_store, context_limits()), lambda: model, IdentityPolicy("auto"), settings)
        person = uuid.uuid4()
        warm = turns.run(TurnRequest(Surface.WHATSAPP, "warm up", "SM-warm", user_id=person, deadline_s=30))
        assert warm.outcome is Outcome.ANSWERED

        proxy.lose_next_answer()  # begin_turn commits; its answer never arrives
        result = turns.run(TurnRequest(Surface.WHATSAPP, "is this stored once?", "SM-lost", user_id=person))
    finally:
        fake.close()
    assert result.outcome is Outcome.ANSWERED
    assert result.reply == "Claude heard: " + fake.requests[-1]["messages"][-1]["content"][0]["text"]
    assert len(fake.requests) == 2  # warm-up and this turn: the retry did not ask again
    with psycopg.connect(database_url) as connection:
        rows = connection.execute(
            "select role, content from messages where user_id = %s order by created_at, id", (person,)
        ).fetchall()
    assert rows == [
        ("user", "warm up"),
        ("assistant", "Claude heard: " + fake.requests[0]["messages"][-1]["content"][0]["text"]),
        ("user", "is this stored once?"),
        ("assistant", result.reply),
    ]


def test_a_web_first_message_whose_answer_was_lost_lands_in_one_conversation(
    proxied_store: PostgresStore, proxy: LatencyProxy, database_url: str
) -> None:
    memory = Memory(proxied_store, context_limits())
    person = Person(user_id=uuid.uuid4())
    memory.list_conversations(uuid.uuid4())  # a warm connection
    proxy.lose_next_answer()
    start = memory.begin_turn(person, Surface.WEB, "a new conversation, no client id", None)
    assert not start.degraded and not start.duplicate
    assert [message.content for message in start.history] == ["a new conversation, no client id"]
    assert person.user_id is not None
    assert [conversation.id for conversation in memory.list_conversations(person.user_id).conversations] == [
        start.conversation_id
    ]


def test_a_finish_turn_whose_answer_was_lost_returns_the_reply_it_stored(
    proxied_store: PostgresStore, proxy: LatencyProxy
) -> None:
    memory = Memory(proxied_store, context_limits())
    start = memory.begin_turn(Person(user_id=uuid.uuid4()), Surface.TELEGRAM, "hello", "u1")
    assert start.user_id is not None and start.message_id is not None
    proxy.lose_next_answer()
    reply_id = memory.finish_turn(start.user_id, start.message_id, "hi")
    assert reply_id is not None
    assert [(m.id, m.content) for m in memory.person_history(start.user_id)] == [
        (start.message_id, "hello"),
        (reply_id, "hi"),
    ]


def test_an_error_that_leaves_the_connection_alive_is_not_retried(
    proxied_store: PostgresStore, proxy: LatencyProxy
) -> None:
    nobodys = {"p_user_id": str(uuid.uuid4()), "p_limit": 50, "p_before_at": None, "p_before_id": None}
    proxied_store.call("list_conversations", nobodys)  # a warm connection
    proxy.reset()
    with pytest.raises(StoreUnavailable, match="begin_turn failed: InvalidParameterValue") as refused:
        proxied_store.call("begin_turn", begin_turn_arguments(p_surface="web", p_content="no person"))
    assert refused.value.final  # asking again cannot change it (finish_turn's retries stop at it)
    assert proxy.round_trips == 1
    assert proxied_store.call("list_conversations", nobodys) == []
    assert proxy.round_trips == 2  # and the connection stays in use


def test_the_pool_opens_nothing_until_the_first_call(database_url: str, proxy: LatencyProxy) -> None:
    store = PostgresStore(through_proxy(database_url, proxy.port))
    assert proxy.connections == 0
    assert (
        store.call(
            "list_conversations",
            {"p_user_id": str(uuid.uuid4()), "p_limit": 50, "p_before_at": None, "p_before_id": None},
        )
        == []
    )
    assert proxy.connections == 1
    store.close()


def test_a_pooled_connection_gives_up_on_a_silent_database_within_seconds(store: PostgresStore) -> None:
    """A reliability review's finding: a database gone silent on a pooled connection (a host gone, no
    reset) held a turn for as long as the kernel waits, a quarter of an hour. What bounds it lives in
    the socket (no proxy here can stop a kernel acknowledging), so the test reads what libpq was
    given on the connections the calls run on: keepalives after 5 s idle, every 2 s, three lost, and
    10 s for unacknowledged data."""
    store.call("person_history", {"p_user_id": "00000000-0000-0000-0000-000000000000", "p_limit": 1})
    with store._open_pool().connection() as connection:
        given = {option.keyword.decode(): option.val for option in connection.pgconn.info}
    assert {
        key: given[key] for key in ("keepalives", "keepalives_idle", "keepalives_interval", "keepalives_count")
    } == {
        "keepalives": b"1",
        "keepalives_idle": b"5",
        "keepalives_interval": b"2",
        "keepalives_count": b"3",
    }
    assert given["tcp_user_timeout"] == b"10000"


def test_a_database_away_is_a_failure_that_may_pass(database_url: str) -> None:
    """No connection to be had (the database away): asking again later may work, so finish_turn's
    retries go on (not `final`); so for the errors PostgreSQL answers when a connection is lost,
    the server is restarting or a conflict rolled a transaction back, by their SQLSTATE class."""
    store = PostgresStore("postgresql://postgres@127.0.0.1:1/nothing", connect_timeout_s=1)
    try:
        with pytest.raises(StoreUnavailable) as away:
            store.call(
                "list_conversations",
                {"p_user_id": str(uuid.uuid4()), "p_limit": 50, "p_before_at": None, "p_before_id": None},
            )
        assert not away.value.final
    finally:
        store.close()
    passing = [None, "08006", "40001", "53300", "57P01", "57014", "58030", "26000", "42P05"]
    final = ["22P02", "23505", "P0001", "42883"]
    assert [final_error(sqlstate) for sqlstate in passing + final] == [False] * 9 + [True] * 4


def test_a_statement_deallocated_behind_the_stores_back_does_not_stop_finish_turns_tries(database_url: str) -> None:
    """A pooler's DISCARD ALL drops finish_turn's prepared statement: that call fails (26000), the
    next starts over, so finish_turn tries again and the reply is stored (a review's finding: it
    was taken for an error that would come again, and the reply left unstored)."""
    store = PostgresStore(database_url, max_connections=1)
    memory = Memory(store, context_limits())
    try:
        starts = [
            memory.begin_turn(Person(user_id=uuid.uuid4()), Surface.TELEGRAM, f"hi {n}", uuid.uuid4().hex)
            for n in range(8)
        ]
        for start in starts[:7]:  # finish_turn prepared on the one connection at its sixth use
            assert start.user_id is not None and start.message_id is not None
            assert memory.finish_turn(start.user_id, start.message_id, "reply") is not None
        with store._open_pool().connection() as connection:
            connection.execute("deallocate all")
        last = starts[7]
        assert last.user_id is not None and last.message_id is not None
        assert memory.finish_turn(last.user_id, last.message_id, "reply", retry_for_s=10.0) is not None
    finally:
        store.close()
