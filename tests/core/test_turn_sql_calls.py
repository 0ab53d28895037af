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


def finish_turn_sql(**given: object) -> tuple[str, dict[str, object]]:
    arguments: dict[str, object] = {
        "p_content": "the reply",
        "p_delivered": True,
        "p_tokens": 0,
        "p_user_content": None,
        "p_reserved": 0,
        "p_language": None,
        **given,
    }
    named = ", ".join(f"{name} => %({name})s" for name in arguments)
    return f"select public.finish_turn({named})", arguments


def counted(connection: psycopg.Connection[Any]) -> dict[str, int]:
    return {name: calls for name, calls in connection.execute(CALLED).fetchall()}


def second_turn_calls(database_url: str, **finish: object) -> tuple[dict[str, int], dict[str, int], list[str]]:
    """A person's second Telegram turn (the first made their conversation), in one transaction:
    the calls begin_turn made, those finish_turn made, and those planned again at each call."""
    person = uuid.uuid4()

    def begin(connection: psycopg.Connection[Any]) -> dict[str, Any]:
        arguments = begin_turn_arguments(p_user_id=person, p_external_id=uuid.uuid4().hex, p_attempt=uuid.uuid4())
        row = connection.execute(begin_turn_sql(arguments), arguments).fetchone()
        assert row is not None
        answer: dict[str, Any] = row[0]
        return answer

    with psycopg.connect(database_url) as connection:
        begin(connection)
        connection.commit()
        connection.execute("set local track_functions = 'all'")
        started = begin(connection)
        began = counted(connection)
        query, arguments = finish_turn_sql(
            p_user_id=person, p_user_message_id=started["message_id"], p_reply_id=started["reply_id"], **finish
        )
        connection.execute(query, arguments)
        after = counted(connection)
        replanned = [row[0] for row in connection.execute(PLANNED_AT_EACH_CALL, (list(after),)).fetchall()]
        connection.rollback()
    finished = {name: calls - began.get(name, 0) for name, calls in after.items() if calls > began.get(name, 0)}
    return began, finished, replanned


def test_no_function_of_a_turn_is_planned_again_at_each_call(database_url: str) -> None:
    began, finished, replanned = second_turn_calls(database_url)
    assert "public.begin_turn" in began and "crossmem_private.searchable" in began
    assert replanned == []


def test_finish_turn_calls_only_what_the_turn_brought(database_url: str) -> None:
    _, finished, _ = second_turn_calls(database_url)
    # The reply's search words (its generated column) are the one call: no language heard, no
    # transcript, nothing reserved nor spent.
    words = {"crossmem_private.searchable": 1, "extensions.unaccent": 1}
    assert finished == {"public.finish_turn": 1, **words}
    _, finished, _ = second_turn_calls(database_url, p_language="es", p_tokens=120, p_user_content="[voice] hola")
    assert finished == {
        "public.finish_turn": 1,
        "crossmem_private.remember_language": 1,
        "public.rewrite_user_message": 1,
        "crossmem_private.searchable": 2,  # the rewritten message's words, and the reply's
        "extensions.unaccent": 2,
        "crossmem_private.settle_turn_tokens": 1,
    }
