"""The client's CPU a turn, part by part (`python -m bench.turn_cpu`): what our Python, psycopg and
the pool add around the turn's two SQL calls, on a real database, no proxy.

Three whole figures, interleaved over the same people (CPU µs a turn, `time.process_time`, the
median of `rounds` rounds of `turns`):

- `bare_calls`: begin_turn and finish_turn with nothing around them: the same arguments and server
  work as a turn's, sent as prepared statements through libpq (psycopg's `pgconn`), the answer
  left as text (only the message id read out of it, by the database);
- `memory_calls`: the same two calls through `Memory.begin_turn` and `finish_turn` (the arguments,
  the pool, psycopg's cursor and adapters, the JSON, the records);
- `whole_turn`: `Turns.run` of a Telegram turn with a model that answers at once (the context, the
  model's worker thread, the result, the log line's check).

`around_calls` is whole_turn less bare_calls: the issue 33 figure (under 250 µs). Waiting for the
database costs CPU too on this machine (the kernel putting the thread to sleep and waking it:
150 to 200 µs a wait on a busy virtual machine), which the bare calls pay as the turn does, so it
is not counted around them. The `parts` are each step replayed alone in a loop on the last turn's
real data (its begin_turn answer and window), the CPU µs one turn spends on it; what no part
names is `rest` (psycopg's cursor and adapters, the turn's own steps, and the wake-ups of the
model's thread). The log line is not in `whole_turn` (the benchmarks write none: no handler
listens at INFO) and is shown apart, as a function writes it.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any
from zoneinfo import ZoneInfo

import psycopg

from bench.memory_core import PEOPLE_PER_DRIVER, USER_TEXT, InstantModel, ours_secondary_turn, people
from bench.results import bench_database, save
from core.identity.policy import IdentityPolicy
from core.memory.service import Memory, turn_start
from core.models import Surface
from core.stores.postgres_store import PostgresStore
from core.stores.store import JsonScalar
from core.turn.capabilities import DEFAULT_SYSTEM_PROMPT
from core.turn.context import build_model_messages
from core.turn.request import TurnFigures, TurnRequest, TurnSettings
from core.turn.turns import Turns
from functions.logs import JsonLineFormatter
from functions.runtime import context_limits
from functions.settings import Settings

MICROSECONDS = 1_000_000


class RecordingStore:
    """A PostgresStore that keeps the last arguments and answer of each function: what the bare
    calls replay, and the parts are timed on."""

    def __init__(self, store: PostgresStore) -> None:
        self.store = store
        self.calls: dict[str, dict[str, JsonScalar]] = {}
        self.answers: dict[str, Any] = {}

    def call(self, function: str, arguments: Mapping[str, JsonScalar]) -> Any:
        self.calls[function] = dict(arguments)
        self.answers[function] = answer = self.store.call(function, arguments)
        return answer

    def close(self) -> None:
        self.store.close()


class BareCalls:
    """begin_turn and finish_turn as prepared statements on one libpq connection: the turn's two
    calls with nothing of ours around them."""

    def __init__(self, database_url: str, begin: Mapping[str, JsonScalar], finish: Mapping[str, JsonScalar]) -> None:
        self.connection = psycopg.connect(database_url, autocommit=True)
        self.begin_names, self.finish_names = list(begin), list(finish)
        self.begin_arguments = [_text(value) for value in begin.values()]
        self.finish_arguments = [_text(value) for value in finish.values()]
        pgconn = self.connection.pgconn
        columns = "r->>'message_id', r->>'reply_id', r::text"
        pgconn.prepare(b"bare_begin", _bare_query("begin_turn", self.begin_names, columns))
        pgconn.prepare(b"bare_finish", _bare_query("finish_turn", self.finish_names, "r::text"))
        self._user = self.begin_names.index("p_user_id")
        self._external = self.begin_names.index("p_external_id")
        self._attempt = self.begin_names.index("p_attempt")
        self._finish_user = self.finish_names.index("p_user_id")
        self._finish_message = self.finish_names.index("p_user_message_id")
        self._finish_reply = self.finish_names.index("p_reply_id")  # the id this begin_turn drew for it

    def turn(self, person: uuid.UUID) -> None:
        pgconn, user = self.connection.pgconn, str(person).encode()
        begin = self.begin_arguments
        begin[self._user], begin[self._external] = user, uuid.uuid4().hex.encode()
        begin[self._attempt] = str(uuid.uuid4()).encode()
        started = pgconn.exec_prepared(b"bare_begin", begin)
        finish = self.finish_arguments
        finish[self._finish_user], finish[self._finish_message] = user, started.get_value(0, 0)
        finish[self._finish_reply] = started.get_value(0, 1)
        finished = pgconn.exec_prepared(b"bare_finish", finish)
        assert started.status == finished.status == psycopg.pq.ExecStatus.TUPLES_OK, pgconn.get_error_message()

    def close(self) -> None:
        self.connection.close()


def _text(value: JsonScalar) -> bytes | None:
    if value is None:
        return None
    return str(value).encode()


def _bare_query(function: str, names: list[str], columns: str) -> bytes:
    named = ", ".join(f"{name} => ${at}" for at, name in enumerate(names, start=1))
    return f"select {columns} from public.{function}({named}) r".encode()


def cpu_us(work: Callable[[], object], times: int) -> float:
    """CPU µs of one `work()`, over `times` of them."""
    began = time.process_time()
    for _ in range(times):
        work()
    return (time.process_time() - began) / times * MICROSECONDS


def median_us(work: Callable[[], object], times: int, rounds: int) -> float:
    return round(statistics.median(cpu_us(work, times) for _ in range(rounds)), 1)


@contextmanager
def log_line_to_nowhere() -> Iterator[logging.Logger]:
    """The turn's logger as a function sets it up (functions/logs.py's JSON lines), writing to /dev/null."""
    with open(os.devnull, "w") as nowhere:
        logger = logging.Logger("crossmem.turn", logging.INFO)
        handler = logging.StreamHandler(nowhere)
        handler.setFormatter(JsonLineFormatter())
        logger.addHandler(handler)
        yield logger


def measure(
    database_url: str, turns: int = 1_000, rounds: int = 5, people_per_driver: int = PEOPLE_PER_DRIVER
) -> dict[str, Any]:
    store = RecordingStore(PostgresStore(database_url))
    memory = Memory(store, context_limits(Settings.defaults()))
    settings = TurnSettings(DEFAULT_SYSTEM_PROMPT, "fallback", "no")
    turn = Turns(memory, InstantModel, IdentityPolicy("auto"), settings)
    speakers = people(people_per_driver)

    def whole() -> None:
        turn.run(TurnRequest(Surface.TELEGRAM, USER_TEXT, uuid.uuid4().hex, user_id=next(speakers), deadline_s=30))

    for _ in range(2 * people_per_driver):  # warm: singletons exist, statements prepared
        whole()
    bare = BareCalls(database_url, store.calls["begin_turn"], store.calls["finish_turn"])
    measured: dict[str, Callable[[], None]] = {
        "bare_calls": lambda: bare.turn(next(speakers)),
        "memory_calls": lambda: ours_secondary_turn(memory, next(speakers)),
        "whole_turn": whole,
    }
    for work in measured.values():
        for _ in range(people_per_driver):
            work()
    figures: dict[str, list[float]] = {name: [] for name in measured}
    for _ in range(rounds):  # interleaved rounds: the machine's load moves all three alike
        for name, work in measured.items():
            figures[name].append(cpu_us(work, turns))
    whole_figures = {name: round(statistics.median(values), 1) for name, values in figures.items()}
    parts = replayed_parts(store, ZoneInfo(settings.timezone), turns, rounds)
    bare.close()
    store.close()
    around = round(whole_figures["whole_turn"] - whole_figures["bare_calls"], 1)
    named = sum(value for name, value in parts.items() if name != "log_line")
    return {
        **whole_figures,
        "around_calls": around,
        "parts": {**parts, "rest": round(around - named, 1)},
        "setup": {"turns": turns, "rounds": rounds, "history": len(turn_start(store.answers["begin_turn"]).history)},
    }


def replayed_parts(store: RecordingStore, zone: ZoneInfo, turns: int, rounds: int) -> dict[str, float]:
    """Each step of a turn alone, on the last turn's data: CPU µs a turn."""
    answer = store.answers["begin_turn"]
    text = json.dumps(answer)
    start = turn_start(answer)
    pool = store.store._pool  # the pool's own cost: a connection taken and given back
    executor = ThreadPoolExecutor(max_workers=1)
    model = InstantModel()
    record = logging.LogRecord("crossmem.turn", logging.INFO, __file__, 0, "turn", (), None)
    record.__dict__.update(surface="telegram", outcome="answered", user_id=str(start.user_id), **vars(TurnFigures()))

    def pool_twice() -> None:
        for _ in range(2):
            pool.putconn(pool.getconn())

    def model_thread() -> None:
        executor.submit(model.reply, "", [], 30.0).result(timeout=30.0)

    with log_line_to_nowhere() as logger:
        parts = {
            "pool": median_us(pool_twice, turns, rounds),
            "json": median_us(lambda: json.loads(text), turns, rounds),
            "records": median_us(lambda: turn_start(answer), turns, rounds),
            "context": median_us(lambda: build_model_messages(start.history, annotate=True, zone=zone), turns, rounds),
            "model_thread": median_us(model_thread, turns, rounds),
            "log_line": median_us(lambda: logger.handle(record), turns, rounds),
        }
    executor.shutdown()
    return parts


def table(figures: dict[str, Any]) -> str:
    rows = [
        ("the two calls alone (libpq, prepared)", figures["bare_calls"]),
        ("the two calls through Memory", figures["memory_calls"]),
        ("the whole turn (Turns.run)", figures["whole_turn"]),
        ("**around the two calls** (whole turn less the calls alone)", figures["around_calls"]),
        *((f"- {name}", value) for name, value in figures["parts"].items()),
    ]
    lines = ["| CPU µs a turn | |", "|---|---:|"]
    lines += [f"| {name} | {value} |" for name, value in rows]
    return "\n".join(lines)


def main() -> None:
    """Printed; with `--save`, written to bench/results.json under `turn_cpu`, the rest kept."""
    with bench_database() as database_url:
        figures = measure(database_url)
    if "--save" in sys.argv[1:]:
        save("turn_cpu", figures)
    print(table(figures))
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
