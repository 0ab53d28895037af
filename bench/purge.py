"""`crossmem purge`'s batched deletion on a table of 1,000,000 messages.

Half a million turns (a message and its reply five seconds later) of 20,000 people, spread
evenly over 180 days, in a database of their own; then `Retention.purge` (the code behind
`crossmem purge --older-than 90d`) with the default batch. Each call is one statement in its
own transaction: the longest one is the figure that matters (how long the purge can hold
locks or delay a turn), beside the rows deleted per second over the whole purge.

    python -m bench.purge    # this measurement alone, merged into bench/results.json
"""

from __future__ import annotations

import json
import statistics
import time
from datetime import timedelta
from typing import Any

import psycopg

from bench.results import bench_database, save
from core.memory.retention import PurgeBatch, Retention, in_flight_window
from core.stores.postgres_store import PostgresStore
from tests.database import migrated_database

MESSAGES = 1_000_000
PEOPLE = 20_000
DAYS = 180
AGE = timedelta(days=90)
BATCH = 5000

FILL = """
with people as (
    insert into conversations (user_id, surface, title)
    select gen_random_uuid(), 'telegram', '[Telegram]' from generate_series(1, %(people)s)
    returning id, user_id
), numbered as (
    select id, user_id, row_number() over () as person from people
)
insert into messages (conversation_id, user_id, surface, role, content, external_id, created_at)
select p.id, p.user_id, 'telegram', 'user',
       'a message of a person, long enough to look like a real one, number ' || n,
       (p.person * %(turns)s + n)::text,
       now() - ((p.person * %(turns)s + n) * %(minutes_apart)s %% (%(days)s * 24 * 60)) * interval '1 minute'
  from numbered p cross join generate_series(1, %(turns)s) n
"""

REPLIES = """
insert into messages (conversation_id, user_id, surface, role, content, in_reply_to, created_at)
select conversation_id, user_id, surface, 'assistant', 'a reply of the assistant, a little longer than the message',
       id, created_at + interval '5 seconds'
  from messages
"""

LEFT_BEHIND = """
select count(*) from messages m
 where m.created_at < %(cutoff)s
   and not exists (select from messages r where r.in_reply_to = m.id and r.created_at >= %(cutoff)s)
"""


def fill(database_url: str, messages: int = MESSAGES, people: int = PEOPLE) -> int:
    turns = messages // 2 // people
    # A minute apart, wrapping around the DAYS (1,000,000 messages); further apart when fewer, so
    # a small table spans the DAYS too and the purge still has old messages to delete.
    minutes_apart = max(1, DAYS * 24 * 60 // (turns * people))
    with psycopg.connect(database_url, autocommit=True) as connection:
        connection.execute(FILL, {"people": people, "turns": turns, "days": DAYS, "minutes_apart": minutes_apart})
        connection.execute(REPLIES)
        connection.execute("vacuum (analyze) conversations")  # as autovacuum would after a bulk load
        connection.execute("vacuum (analyze) messages")
        row = connection.execute("select count(*) from messages").fetchone()
    assert row is not None
    return int(row[0])


def run(database_url: str, messages: int = MESSAGES, people: int = PEOPLE, batch: int = BATCH) -> dict[str, Any]:
    """Measure on a fresh database beside `database_url`'s (dropped afterwards)."""
    with migrated_database(database_url) as url:
        stored = fill(url, messages, people)
        store = PostgresStore(url)
        batches: list[PurgeBatch] = []
        retention = Retention(store, batch_size=batch, in_flight=in_flight_window(25, 12, 60))
        began = time.perf_counter()
        report = retention.purge(AGE, on_batch=batches.append)
        elapsed = time.perf_counter() - began
        store.close()
        with psycopg.connect(url) as connection:
            left = connection.execute("select count(*) from messages").fetchone()
            old = connection.execute(LEFT_BEHIND, {"cutoff": report.cutoff}).fetchone()
        assert left is not None and old is not None
        # The right rows: nothing older than the age is left but a message whose reply is younger.
        assert (left[0], old[0]) == (stored - report.deleted, 0), (left, old, stored, report)
        assert report.deleted > 0 and max(done.deleted for done in batches) <= batch
    return {
        "purge_max_statement_ms": round(report.longest_statement_s * 1000, 1),
        "purge_rows_per_s": round(report.deleted / elapsed),
        "purge_setup": {
            "messages": stored,
            "deleted": report.deleted,
            "batch": batch,
            "batches": report.batches,
            "older_than_days": AGE.days,
            "statement_ms_p50": round(statistics.median(batch.seconds for batch in batches) * 1000, 1),
        },
    }


def main() -> None:
    with bench_database() as database_url:
        figures = run(database_url)
    for key, value in figures.items():
        save(key, value)
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
