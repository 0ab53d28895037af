"""PostgresStore's calls through libpq (issue 33): one round trip each, a statement prepared on a
connection at its sixth use there (one round trip more, once) and never behind a transaction
pooler, every answer read as psycopg read it, and a NUL refused before it is sent."""

from __future__ import annotations

import uuid

import pytest

from bench.latency_proxy import LatencyProxy, postgres_target, through_proxy
from core.errors import StoreUnavailable
from core.stores.postgres_store import PREPARE_AFTER_USES, PostgresStore
from tests.helpers import rows

PREPARED = "select name from pg_prepared_statements where position('list_conversations' in statement) > 0"


def round_trips_of_calls(database_url: str, *, prepared_statements: bool, calls: int) -> list[int]:
    with LatencyProxy(postgres_target(database_url)) as proxy:
        store = PostgresStore(through_proxy(database_url, proxy.port), prepared_statements=prepared_statements)
        try:
            nobody = {"p_user_id": str(uuid.uuid4()), "p_reply_id": 1, "p_attempt": None, "p_delivered": True}
            nobody["p_unsent_from"] = None
            store.call("record_delivery", nobody)  # connect
            counted = []
            for _ in range(calls):
                proxy.reset()
                assert (
                    store.call(
                        "list_conversations",
                        {"p_user_id": str(uuid.uuid4()), "p_limit": 5, "p_before_at": None, "p_before_id": None},
                    )
                    == []
                )
                counted.append(proxy.round_trips)
            return counted
        finally:
            store.close()


def test_a_statement_is_prepared_at_its_sixth_use_on_a_connection_in_one_round_trip_more(database_url: str) -> None:
    counted = round_trips_of_calls(database_url, prepared_statements=True, calls=PREPARE_AFTER_USES + 3)
    assert counted == [1, 1, 1, 1, 1, 2, 1, 1]


def test_behind_a_transaction_pooler_no_statement_is_ever_prepared(database_url: str) -> None:
    counted = round_trips_of_calls(database_url, prepared_statements=False, calls=PREPARE_AFTER_USES + 3)
    assert counted == [1] * (PREPARE_AFTER_USES + 3)


def test_the_prepared_statement_lives_on_the_connection_that_ran_the_call(database_url: str) -> None:
    store = PostgresStore(database_url, max_connections=1)
    try:
        for _ in range(PREPARE_AFTER_USES + 1):
            store.call(
                "list_conversations",
                {"p_user_id": str(uuid.uuid4()), "p_limit": 5, "p_before_at": None, "p_before_id": None},
            )
        assert rows(database_url, PREPARED) == []  # the pool's connection holds it, not another
        connection = store._pool.getconn()
        try:
            names = [row[0] for row in connection.execute(PREPARED).fetchall()]
        finally:
            store._pool.putconn(connection)
        assert len(names) == 1 and names[0].startswith("crossmem_")
    finally:
        store.close()


def test_a_statement_deallocated_behind_the_stores_back_fails_one_call_and_is_prepared_again(
    database_url: str,
) -> None:
    store = PostgresStore(database_url, max_connections=1)
    arguments = {"p_user_id": str(uuid.uuid4()), "p_limit": 5, "p_before_at": None, "p_before_id": None}
    try:
        for _ in range(PREPARE_AFTER_USES + 1):
            store.call("list_conversations", arguments)
        connection = store._pool.getconn()
        connection.execute("deallocate all")
        store._pool.putconn(connection)
        with pytest.raises(StoreUnavailable, match="list_conversations failed: InvalidSqlStatementName"):
            store.call("list_conversations", arguments)
        answers = [store.call("list_conversations", arguments) for _ in range(PREPARE_AFTER_USES + 2)]
        assert answers == [[]] * (PREPARE_AFTER_USES + 2)
    finally:
        store.close()


def test_answers_are_read_as_psycopg_read_them_json_text_and_void(database_url: str) -> None:
    store = PostgresStore(database_url)
    try:
        person = str(uuid.uuid4())
        conversation = store.call("create_conversation", {"p_user_id": person, "p_title": "plans", "p_max_empty": 0})
        assert (conversation["title"], conversation["surface"]) == ("plans", "web")
        listed = store.call(
            "list_conversations", {"p_user_id": person, "p_limit": 5, "p_before_at": None, "p_before_id": None}
        )
        assert [item["id"] for item in listed] == [conversation["id"]]
        # a `void` function's answer: the empty text, as psycopg gives it
        settled = store.call(
            "settle_voice_seconds", {"p_user_id": person, "p_message_id": 1, "p_reserved": 0, "p_heard": 0}
        )
        assert settled == ""
    finally:
        store.close()


def test_a_nul_in_an_argument_is_refused_before_it_is_sent(database_url: str) -> None:
    store = PostgresStore(database_url)
    try:
        with pytest.raises(StoreUnavailable, match="create_conversation failed: DataError"):
            store.call("create_conversation", {"p_user_id": str(uuid.uuid4()), "p_title": "a\x00b", "p_max_empty": 0})
    finally:
        store.close()
