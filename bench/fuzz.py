"""Fuzzing with figures: at least 10,000 hostile and fuzzed requests through each function,
as functions_framework builds it, on a fresh database with the real SDKs against the
local fakes (tests/helpers.py holds the cases).

- `cases`: requests sent.
- `status_500`: answers with a 5xx status (every configuration here is complete, so not
  even a 503 is expected).
- `stored_unauthenticated`: messages stored while a case without valid credentials ran.
- `reached_turn`: cases during which the model was asked (the fake Anthropic API received
  a request): the message was stored by begin_turn and its context sent.
- `authenticated`: cases with valid credentials; `unexpected_status`: answers outside the
  exact statuses the README gives for the case.

`python -m bench.fuzz` runs this part alone and updates its key in bench/results.json.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from bench.results import run_alone
from functions import runtime
from tests.fakes.anthropic_api import FakeAnthropic
from tests.fakes.jwks import FakeJwks
from tests.fakes.telegram_api import FakeTelegram
from tests.helpers import (
    BOT_TOKEN,
    STRATEGIES,
    TARGETS,
    Case,
    app_client,
    production_settings,
    send,
    settings_for_fuzzing,
)

CASES = 10_200


@contextmanager
def fuzzing_environment(database_url: str) -> Iterator[tuple[FakeAnthropic, FakeJwks]]:
    anthropic, telegram, jwks = FakeAnthropic(), FakeTelegram(BOT_TOKEN), FakeJwks()
    saved = dict(os.environ)
    # The tests' production-like configuration (the budget off: the fuzzer writes as a few
    # people thousands of times a minute; the budget has tests of its own).
    os.environ.update({**production_settings(database_url, anthropic, telegram), **settings_for_fuzzing(jwks.url)})
    try:
        yield anthropic, jwks
    finally:
        runtime.reset()
        os.environ.clear()
        os.environ.update(saved)
        for fake in (anthropic, telegram, jwks):
            fake.close()


def stored_messages(connection: psycopg.Connection[Any]) -> int:
    row = connection.execute("select count(*) from messages").fetchone()
    assert row is not None
    return int(row[0])


def run(database_url: str, cases: int = CASES) -> dict[str, int]:
    figures: Counter[str] = Counter()
    with fuzzing_environment(database_url) as (anthropic, jwks), psycopg.connect(database_url, autocommit=True) as db:
        clients = {target: app_client(target) for target in TARGETS}
        runtime.settings()
        logging.getLogger("crossmem").setLevel(logging.ERROR)  # not 10,000 turn lines

        def tally(case: Case) -> None:
            asked = len(anthropic.requests)
            before = None if case.authenticated else stored_messages(db)
            status = send(clients[case.target], case).status_code
            figures["cases"] += 1
            figures["authenticated"] += case.authenticated
            figures["status_500"] += status >= 500
            figures["unexpected_status"] += status not in case.expected
            figures["reached_turn"] += len(anthropic.requests) > asked
            if before is not None:
                figures["stored_unauthenticated"] += stored_messages(db) - before

        per_target = -(-cases // len(TARGETS))
        for target in TARGETS:
            print(f"  {target}: {per_target} cases ...", flush=True)
            fuzzer(target, jwks, per_target, tally)()
    keys = ("cases", "status_500", "stored_unauthenticated", "reached_turn", "authenticated", "unexpected_status")
    return {key: figures[key] for key in keys}


def fuzzer(target: str, jwks: FakeJwks, examples: int, tally: Callable[[Case], None]) -> Callable[[], None]:
    @given(data=st.data())
    @settings(
        max_examples=examples,
        phases=[Phase.generate],
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    def fuzz(data: st.DataObject) -> None:
        tally(data.draw(STRATEGIES[target](jwks)))

    return fuzz  # type: ignore[no-any-return]


def main() -> None:
    run_alone("fuzz", run)


if __name__ == "__main__":
    main()
