"""Follow-ups said on time (issue #21): the scheduled job, every minute, against a real Postgres.

`PEOPLE` Telegram people hold `BACKGROUND` pending follow-ups due days ahead (the table a busy
deployment has), and `DUE` more fall due at random moments over `WINDOW_MIN` minutes. The job
(core/follow_ups/delivery.py, the code `memory_digest` runs) is run once a minute of a clock the
bench moves, sending through the fake Bot API (tests/fakes/telegram_api.py) over HTTP.

- `delivery_lag_s_p95`: from a follow-up's due time to its `sendMessage`: the wait for the next
  run (simulated minutes) plus the real time that run took to reach it (claims, sends, stores).
- `claim_ms_max`: the longest `claim_due_follow_ups` (a batch of 50) with 100,000 pending,
  over the minute runs and then `BURST_CLAIMS` claims with all 100,000 due at once.

`make bench` runs this part last, in a database the other parts have filled (20,000 conversations
of the context-load part among them): every follow-up is seeded on one of this part's own chats,
found by its chat id, and the seed fails at once when it did not store every one it was given.

`python -m bench.follow_ups` runs this part alone and updates `follow_ups` in bench/results.json.
"""

from __future__ import annotations

import logging
import os
import random
import statistics
import time
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import uuid4

import psycopg

from bench.results import run_alone
from core.follow_ups.delivery import LEASE_S, FollowUpDelivery
from core.stores.store import JsonScalar, MemoryStore
from functions import runtime
from tests.fakes.anthropic_api import FakeAnthropic
from tests.fakes.telegram_api import FakeTelegram
from tests.helpers import BOT_TOKEN, production_settings

PEOPLE = 1000
BACKGROUND = 100_000
DUE = 300
WINDOW_MIN = 30
JOB_EVERY = timedelta(seconds=60)
BATCH = 50
BURST_CLAIMS = 20
START = datetime(2026, 12, 2, 17, 0, tzinfo=UTC)
FIRST_CHAT = 910_000_000

SEED = """
with people as (
    select n, gen_random_uuid() as user_id from generate_series(1, %(people)s) n
), chats as (
    insert into identities (surface, external_id, user_id)
    select 'telegram', (%(first_chat)s + n)::text, user_id from people
    returning external_id, user_id
)
insert into conversations (user_id, surface) select user_id, 'telegram' from chats
"""
# The n-th follow-up goes to chat first_chat + 1 + (n - 1) mod people: one this part made.
FOLLOW_UPS = """
insert into follow_ups (user_id, conversation_id, surface, sender, content, due_at, timezone, next_attempt_at)
select c.user_id, c.id, 'telegram', i.external_id, %(prefix)s || s.n, s.due, 'Europe/Madrid', s.due
  from unnest(%(due)s::timestamptz[]) with ordinality s(due, n)
  join identities i
    on i.surface = 'telegram' and i.external_id = (%(first_chat)s + 1 + (s.n - 1) %% %(people)s)::text
  join conversations c on c.user_id = i.user_id and c.surface = 'telegram'
"""


class TimedStore:
    """The store, with the time each claim took."""

    def __init__(self, inner: MemoryStore) -> None:
        self.inner = inner
        self.claims_ms: list[float] = []

    def call(self, function: str, arguments: Mapping[str, JsonScalar]) -> Any:
        began = time.perf_counter()
        answer = self.inner.call(function, arguments)
        if function == "claim_due_follow_ups":
            self.claims_ms.append((time.perf_counter() - began) * 1000)
        return answer

    def close(self) -> None:
        self.inner.close()


class MovedClock:
    def __init__(self, at: datetime) -> None:
        self.at = at

    def __call__(self) -> datetime:
        return self.at


def seed(database_url: str, due: list[datetime], people: int = PEOPLE, background: int = BACKGROUND) -> None:
    """`people` Telegram people; `background` follow-ups 2 to 30 days ahead; the `due` ones."""
    rng = random.Random(21)
    later = [START + timedelta(days=2, seconds=rng.randrange(28 * 86400)) for _ in range(background)]
    with psycopg.connect(database_url) as connection:
        connection.execute(SEED, {"people": people, "first_chat": FIRST_CHAT})
        for prefix, at in (("Later ", later), ("Due ", due)):
            stored = connection.execute(
                FOLLOW_UPS, {"prefix": prefix, "due": at, "people": people, "first_chat": FIRST_CHAT}
            ).rowcount
            assert stored == len(at), f"{stored} of {len(at)} follow-ups ({prefix.strip()}) seeded"
        connection.execute("analyze follow_ups")


def run(
    database_url: str,
    people: int = PEOPLE,
    background: int = BACKGROUND,
    due: int = DUE,
    window_min: int = WINDOW_MIN,
    burst_claims: int = BURST_CLAIMS,
) -> dict[str, Any]:
    rng = random.Random(2026)
    due_at = sorted(START + timedelta(seconds=rng.uniform(0, window_min * 60)) for _ in range(due))
    due_of = {f"Due {n}": at for n, at in enumerate(due_at, start=1)}
    seed(database_url, due_at, people, background)
    anthropic, telegram = FakeAnthropic(), FakeTelegram(BOT_TOKEN)
    saved = dict(os.environ)
    os.environ.update(production_settings(database_url, anthropic, telegram))
    quiet = logging.getLogger("crossmem.follow_ups")
    level = quiet.level
    quiet.setLevel(logging.WARNING)  # a line per follow-up sent is the job's log, not the bench's
    lags: list[float] = []
    runs = 0
    try:
        runtime.reset()
        store = TimedStore(runtime.store())
        clock = MovedClock(START)
        delivery = FollowUpDelivery(store, runtime.surfaces(), runtime.identity(), now=clock, batch=BATCH)
        while len(lags) < due and runs <= window_min + 2:
            before = len(telegram.calls)
            began = time.monotonic()
            delivery.run(time_budget_s=45)
            for (method, payload), at in zip(telegram.calls[before:], telegram.times[before:], strict=True):
                if method == "sendMessage":
                    waited = (clock.at - due_of[payload["text"]]).total_seconds()
                    lags.append(waited + at - began)
            runs += 1
            clock.at += JOB_EVERY
        during_runs = list(store.claims_ms)
        # Then every one of the 100,000 due at once: the claim takes the oldest 50 of them.
        clock.at = START + timedelta(days=40)
        for _ in range(burst_claims):
            store.call(
                "claim_due_follow_ups",
                {"p_now": clock.at.isoformat(), "p_limit": BATCH, "p_lease_seconds": LEASE_S, "p_claim": str(uuid4())},
            )
    finally:
        quiet.setLevel(level)
        runtime.reset()
        os.environ.clear()
        os.environ.update(saved)
        anthropic.close()
        telegram.close()
    assert len(lags) == due, f"{len(lags)} of {due} follow-ups sent"
    burst = store.claims_ms[len(during_runs) :]
    return {
        "delivery_lag_s_p95": round(statistics.quantiles(lags, n=20)[-1], 1),
        "delivery_lag_s_p50": round(statistics.median(lags), 1),
        "delivery_lag_s_max": round(max(lags), 1),
        "claim_ms_max": round(max(store.claims_ms), 1),
        "claim_ms_p50": round(statistics.median(store.claims_ms), 1),
        "claim_ms_max_all_due": round(max(burst), 1),
        "setup": {
            "due": due,
            "over_minutes": window_min,
            "pending": background,
            "people": people,
            "job_every_s": int(JOB_EVERY.total_seconds()),
            "job_runs": runs,
            "batch": BATCH,
            "claims": len(store.claims_ms),
        },
    }


def main() -> None:
    run_alone("follow_ups", run)


if __name__ == "__main__":
    main()
