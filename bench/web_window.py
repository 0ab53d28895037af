"""A web turn in a conversation of months (`python -m bench.web_window`): the whole turn (its two
calls through `Memory`, the day's tokens counted as TOKENS_PER_DAY's default counts them) in a web
conversation of `lengths` stored messages, ours beside the seed's web turn in the same
conversation, interleaved, p50 ms; and ours at the longest over ours at the shortest
(`ratios.web_turn_5k_over_50`).

The web's window counts its conversation from the first message (the stepped window's rule), so
a turn counted every message of it, and its rows could be read whole when the planner took the
conversation for an average one; the conversation now keeps a count up to a mark
(context.sql's conversation_length). With `--save`, the figures go to bench/results.json under
`web_turn_ms_p50`, and the ratio beside the others.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
import uuid
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import psycopg

from bench.memory_core import REPLY_TEXT, USER_TEXT, ms, seed_answer
from bench.results import RESULTS, bench_database, save
from bench.seed import SeedPattern
from core.memory.service import Memory, TurnBudget, TurnEstimate
from core.models import Person, Surface
from core.stores.postgres_store import PostgresStore
from functions.runtime import context_limits
from functions.settings import Settings

LENGTHS = (50, 5_000)


def store_conversation(
    database_url: str, person: uuid.UUID, conversation: uuid.UUID, length: int, apart: timedelta = timedelta(minutes=1)
) -> None:
    """`length` messages of a web conversation, `apart` from one another, the newest now ("message
    1 of ...", the person's first; the tests use it too)."""
    with psycopg.connect(database_url, autocommit=True) as connection:
        connection.execute(
            "insert into messages (conversation_id, user_id, surface, role, content, created_at)"
            " select %(conversation)s, %(person)s, 'web', case when n %% 2 = 1 then 'user' else 'assistant' end,"
            "        'message ' || n || ' of a long conversation, long enough to look like a real one',"
            "        now() - (%(length)s - n) * %(apart)s"
            "   from generate_series(1, %(length)s) n",
            {"conversation": conversation, "person": person, "length": length, "apart": apart},
        )


def measure(database_url: str, lengths: Sequence[int] = LENGTHS, turns: int = 200) -> dict[str, Any]:
    """p50 ms of a whole web turn, ours and the seed's, in a conversation of each length."""
    defaults = Settings.defaults()
    # The day's tokens as a deployment counts them (TOKENS_PER_DAY, on by default: its estimate
    # reads the window too); no turn limits, which 200 turns a minute would meet.
    budget = TurnBudget(tokens_per_day=defaults.tokens_per_day, reply_tokens=defaults.anthropic_max_tokens)
    memory = Memory(PostgresStore(database_url), context_limits(defaults), budget)
    seed = SeedPattern(database_url)
    figures: dict[str, dict[str, float]] = {}
    for length in lengths:
        person = uuid.uuid4()
        conversation = memory.create_conversation(person).id
        store_conversation(database_url, person, conversation, length)
        with psycopg.connect(database_url, autocommit=True) as connection:
            connection.execute("analyze messages")  # as autovacuum would after the conversation grew
        for _ in range(6):  # warm: statements prepared, the conversation's mark set
            web_turn(memory, person, conversation)
            seed.web_turn(person, conversation, USER_TEXT, seed_answer)
        ours, theirs = [], []
        for _ in range(turns):
            began = time.perf_counter()
            web_turn(memory, person, conversation)
            ours.append(time.perf_counter() - began)
            began = time.perf_counter()
            seed.web_turn(person, conversation, USER_TEXT, seed_answer)
            theirs.append(time.perf_counter() - began)
        figures[str(length)] = {"ours": ms(statistics.median(ours)), "seed": ms(statistics.median(theirs))}
    memory.store.close()
    seed.close()
    return figures


def web_turn(memory: Memory, person: uuid.UUID, conversation: uuid.UUID) -> None:
    """A whole web turn's two calls, its tokens reserved and settled as a turn does."""
    start = memory.begin_turn(
        Person(user_id=person), Surface.WEB, USER_TEXT, uuid.uuid4().hex, conversation, estimate=TurnEstimate(1_500)
    )
    assert start.message_id is not None and not start.degraded and start.reserved_tokens > 0
    memory.finish_turn(person, start.message_id, REPLY_TEXT, tokens=2_000, reserved=start.reserved_tokens)


def ratio(figures: dict[str, dict[str, float]]) -> float:
    """Ours in the longest conversation over ours in the shortest (the lengths in the order measured)."""
    ours = [by_length["ours"] for by_length in figures.values()]
    return round(ours[-1] / ours[0], 2)


def main() -> None:
    with bench_database() as database_url:
        figures = measure(database_url)
    if "--save" in sys.argv[1:]:
        save("web_turn_ms_p50", figures)
        save("ratios", {**json.loads(RESULTS.read_text()).get("ratios", {}), "web_turn_5k_over_50": ratio(figures)})
    print(json.dumps({"web_turn_ms_p50": figures, "web_turn_5k_over_50": ratio(figures)}))


if __name__ == "__main__":
    main()
