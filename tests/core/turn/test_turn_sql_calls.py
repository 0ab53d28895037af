"""The turn's SQL, call by call (issue 33): the functions begin_turn and finish_turn call, as
Postgres counts them (track_functions, within the turn's transaction), so that what a turn costs
the server does not grow back unseen (docs/benchmarks.md, The floor)."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg

from tests.database import begin_turn_arguments, begin_turn_sql

CALLED = "select f.schemaname || '.' || f.funcname, f.calls from pg_stat_xact_user_functions f"
# Called, and planned again at each call: a `language sql` function with a `set` clause is never
# inlined, and has no plan kept for the session as a plpgsql one has.
PLANNED_AT_EACH_CALL = """
select p.oid::regprocedure::text
  from pg_proc p join pg_language l on l.oid = p.prolang join pg_namespace n on n.oid = p.pronamespace
 where l.lanname = 'sql' and p.proconfig is not null and n.nspname || '.' || p.proname = any(%s)
"""

WARM_TURNS = 6


def finish_turn_sql(**given: object) -> tuple[str, dict[str, object]]:
    arguments: dict[str, object] = {
        "p_content": "the reply",
        "p_delivered": True,
        "p_unsent_from": None,
        "p_attempt": None,
        "p_tokens": 0,
        "p_user_content": None,
        "p_reserved": 0,
        "p_language": None,
        "p_declined": None,
        "p_merged": None,
        **given,
    }
    named = ", ".join(f"{name} => %({name})s" for name in arguments)
    return f"select public.finish_turn({named})", arguments


def counted(connection: psycopg.Connection[Any]) -> dict[str, int]:
    return {name: calls for name, calls in connection.execute(CALLED).fetchall()}


def warm_turn_calls(database_url: str) -> tuple[dict[str, int], list[str]]:
    """A person's Telegram turn on a connection past its first few (the first made their
    conversation; a plpgsql statement's first five plans are custom ones, whose constant arguments
    are folded at plan time, which counts as calls), in one transaction: the calls it made, and
    those of them planned again at each call."""
    person = uuid.uuid4()

    def begin(connection: psycopg.Connection[Any]) -> dict[str, Any]:
        arguments = begin_turn_arguments(p_user_id=person, p_external_id=uuid.uuid4().hex, p_attempt=uuid.uuid4())
        row = connection.execute(begin_turn_sql(arguments), arguments).fetchone()
        assert row is not None
        answer: dict[str, Any] = row[0]
        return answer

    with psycopg.connect(database_url) as connection:
        for _ in range(WARM_TURNS):
            begin(connection)
        connection.commit()
        connection.execute("set local track_functions = 'all'")
        started = begin(connection)
        query, arguments = finish_turn_sql(
            p_user_id=person, p_user_message_id=started["message_id"], p_reply_id=started["reply_id"]
        )
        connection.execute(query, arguments)
        calls = counted(connection)
        replanned = [row[0] for row in connection.execute(PLANNED_AT_EACH_CALL, (list(calls),)).fetchall()]
        connection.rollback()
    return calls, replanned


def test_no_function_of_a_turn_is_planned_again_at_each_call(database_url: str) -> None:
    calls, replanned = warm_turn_calls(database_url)
    # Both messages' search words (their generated column), and no quoting: it is inlined.
    assert calls["public.begin_turn"] == calls["public.finish_turn"] == 1
    assert calls["crossmem_private.searchable"] == 2 and "crossmem_private.quoting" not in calls
    assert replanned == []


def test_a_turn_that_learned_no_language_reads_the_persons_language_once(database_url: str) -> None:
    calls, _ = warm_turn_calls(database_url)
    # begin_turn answers it; finish_turn, told none, has nothing to keep and nothing to answer
    assert calls["crossmem_private.remember_language"] == 1


def begin_once(database_url: str, **given: object) -> dict[str, Any]:
    arguments = begin_turn_arguments(**given)
    with psycopg.connect(database_url, autocommit=True) as connection:
        row = connection.execute(begin_turn_sql(arguments), arguments).fetchone()
    assert row is not None
    answer: dict[str, Any] = row[0]
    return answer


def test_a_delivery_is_found_by_its_key_and_its_own_attempt_told_apart(database_url: str) -> None:
    """stored_delivery's one probe: the key finds the message, its attempt says whose it is."""
    person, key, attempt = uuid.uuid4(), uuid.uuid4().hex, uuid.uuid4()
    first = begin_once(database_url, p_user_id=person, p_external_id=key, p_attempt=attempt)
    again = begin_once(database_url, p_user_id=person, p_external_id=key, p_attempt=attempt)
    other = begin_once(database_url, p_user_id=person, p_external_id=key, p_attempt=uuid.uuid4())
    assert (again["duplicate"], again["message_id"], again["owed"]) == (False, first["message_id"], False)
    assert (other["duplicate"], other["message_id"]) == (True, first["message_id"])


def test_a_delivery_without_a_key_is_found_by_its_attempt(database_url: str) -> None:
    person, attempt = uuid.uuid4(), uuid.uuid4()
    first = begin_once(database_url, p_user_id=person, p_attempt=attempt)
    again = begin_once(database_url, p_user_id=person, p_attempt=attempt)
    other = begin_once(database_url, p_user_id=person, p_attempt=uuid.uuid4())
    assert (again["duplicate"], again["message_id"]) == (False, first["message_id"])
    assert other["duplicate"] is False and other["message_id"] != first["message_id"]


def test_a_delivery_without_an_attempt_is_never_taken_for_its_own(database_url: str) -> None:
    person, key = uuid.uuid4(), uuid.uuid4().hex
    first = begin_once(database_url, p_user_id=person, p_external_id=key)
    again = begin_once(database_url, p_user_id=person, p_external_id=key)
    assert (first["duplicate"], again["duplicate"], again["message_id"]) == (False, True, first["message_id"])
