"""The purge by age reaches the memory notes, on real Postgres (a database of its own: a purge spans
every person): each line whose day is over before the cutoff goes, every other line stays byte for
byte, what the notes cover stays, and nothing purged comes back."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest

from core.memory.digest import DigestJob, ExtractiveDigester, read_notes
from core.memory.retention import PurgeBatch, Retention
from core.stores.postgres_store import PostgresStore
from tests.database import migrated_database
from tests.helpers import digest_limits

IN_FLIGHT = timedelta(minutes=2)
RETENTION = timedelta(days=30)
# Everything outside the window at once: a thread of old messages is digested whole.
LIMITS = digest_limits(max_messages=4, window_step=2, window_hours=24, idle_s=0)
# Every column of a person's notes: a purge that must leave them alone changes none.
NOTES_ROW = "select * from memory_notes where user_id = %s"


@pytest.fixture(scope="module")
def purge_database(postgres_server: str) -> Iterator[str]:
    with migrated_database(postgres_server) as url:
        yield url


@pytest.fixture
def database(purge_database: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(purge_database, autocommit=True) as connection:
        connection.execute("truncate messages, conversations, memory_notes cascade")
        yield connection


@pytest.fixture
def store(purge_database: str) -> Iterator[PostgresStore]:
    store = PostgresStore(purge_database)
    yield store
    store.close()


def said(database: psycopg.Connection, person: uuid.UUID, text: str, age: timedelta) -> datetime:
    """The person's message of `age` ago, answered five seconds later, as a turn stores them."""
    database.execute(
        "insert into conversations (user_id, surface) values (%s, 'telegram') on conflict do nothing", (person,)
    )
    row = database.execute(
        """insert into messages (conversation_id, user_id, surface, role, content, external_id, created_at)
           select id, user_id, 'telegram', 'user', %s, %s, now() - %s
             from conversations where user_id = %s and surface = 'telegram' returning id, created_at""",
        (text, text, age, person),
    ).fetchone()
    assert row is not None
    database.execute(
        """insert into messages (conversation_id, user_id, surface, role, content, in_reply_to, created_at)
           select conversation_id, user_id, surface, 'assistant', 'noted', id, created_at + interval '5 seconds'
             from messages where id = %s""",
        (row[0],),
    )
    created: datetime = row[1]
    return created.astimezone(UTC)


def noted(database: psycopg.Connection, person: uuid.UUID, content: str, covered: timedelta | None = None) -> None:
    """Notes written as a digest writes them, covering up to a message of `covered` ago (or nothing)."""
    database.execute(
        """insert into memory_notes (user_id, content, covered_until_at, covered_until_id, revision, written_at)
           values (%s, %s, now() - %s::interval, case when %s::interval is null then null else 1 end, 1, now())""",
        (person, content, covered, covered),
    )


def content_of(database: psycopg.Connection, person: uuid.UUID) -> str:
    row = database.execute("select content from memory_notes where user_id = %s", (person,)).fetchone()
    assert row is not None
    return str(row[0])


def day(age: timedelta) -> str:
    return f"{datetime.now(UTC) - age:%Y-%m-%d}"


def test_a_purge_of_30_days_leaves_the_notes_only_the_line_of_5_days_ago_byte_for_byte(
    database: psycopg.Connection, store: PostgresStore
) -> None:
    """Digested from the thread itself (the extractive digest, whose lines are tagged as the
    model's are asked to be): the lines of 100 and 50 days ago go with their messages; the notes
    still cover what they covered, so the next digest has nothing to do."""
    person, other = uuid.uuid4(), uuid.uuid4()
    thread = {
        100: "my sister's name is Ana",
        50: "remember: the flat's code is 4711 · ñandú — 🦩",
        5: "I moved to  Valparaíso · «la casa azul» — 🦩  ",
    }
    days = {age: said(database, person, text, timedelta(days=age)) for age, text in thread.items()}
    assert DigestJob(store, ExtractiveDigester(800), LIMITS).run(person).updated == 1
    line = {age: f"- [telegram · {days[age]:%Y-%m-%d}] {' '.join(thread[age].split())}" for age in thread}
    assert content_of(database, person) == "\n".join([line[100], line[50], line[5]])
    covered = database.execute(
        "select covered_until_at, covered_until_id, revision from memory_notes where user_id = %s", (person,)
    ).fetchone()
    # Another person, their notes' days within the retention, their digest under way: untouched.
    noted(database, other, f"- [web · {day(timedelta(days=29))}] likes tea\n- [web] no day", timedelta(days=2))
    database.execute(
        "update memory_notes set claim = gen_random_uuid(), claimed_until = now() + interval '1 minute'"
        " where user_id = %s",
        (other,),
    )
    theirs = database.execute(NOTES_ROW, (other,)).fetchone()

    report = Retention(store, batch_size=100, in_flight=IN_FLIGHT).purge(RETENTION)

    assert (report.deleted, report.notes) == (4, 1)
    assert content_of(database, person) == line[5]
    assert read_notes(store, person).content == line[5]
    assert covered is not None
    after = database.execute(
        "select covered_until_at, covered_until_id, revision from memory_notes where user_id = %s", (person,)
    ).fetchone()
    assert after == (covered[0], covered[1], covered[2] + 1)
    assert DigestJob(store, ExtractiveDigester(800), LIMITS).run(person).updated == 0  # nothing to digest again
    assert content_of(database, person) == line[5]
    assert database.execute(NOTES_ROW, (other,)).fetchone() == theirs


def test_a_dry_run_counts_the_notes_and_changes_nothing(database: psycopg.Connection, store: PostgresStore) -> None:
    people = [uuid.uuid4() for _ in range(3)]
    for person in people[:2]:
        noted(
            database,
            person,
            f"- [telegram · {day(timedelta(days=100))}] old\n- [telegram · {day(timedelta(days=5))}] new",
        )
    noted(database, people[2], f"- [telegram · {day(timedelta(days=5))}] new")
    before = [database.execute(NOTES_ROW, (person,)).fetchone() for person in people]

    report = Retention(store, batch_size=1, in_flight=IN_FLIGHT).purge(RETENTION, dry_run=True)

    assert (report.deleted, report.notes, report.batches, report.dry_run) == (0, 2, 0, True)
    assert [database.execute(NOTES_ROW, (person,)).fetchone() for person in people] == before


def test_the_notes_go_a_batch_of_people_at_a_time_until_none_holds_an_expired_line(
    database: psycopg.Connection, store: PostgresStore
) -> None:
    """Their messages long gone (an earlier purge, a longer retention then): the batches go on for
    the notes alone, a fortieth of the batch's size in people each (2 of 80), no person twice."""
    for _ in range(5):
        noted(
            database, uuid.uuid4(), f"- [sms · {day(timedelta(days=40))}] old\n- [sms · {day(timedelta(days=1))}] new"
        )
    batches: list[tuple[int, int]] = []

    def watch(batch: PurgeBatch) -> None:
        batches.append((batch.deleted, batch.notes))

    report = Retention(store, batch_size=80, in_flight=IN_FLIGHT).purge(RETENTION, on_batch=watch)

    assert (report.deleted, report.notes, report.batches) == (0, 5, 3)
    assert batches == [(0, 2), (0, 2), (0, 1)]
    contents = database.execute("select content, revision from memory_notes").fetchall()
    assert contents == [(f"- [sms · {day(timedelta(days=1))}] new", 2)] * 5
    assert Retention(store, batch_size=80, in_flight=IN_FLIGHT).purge(RETENTION).batches == 0


def test_a_digest_that_read_the_purged_lines_cannot_write_them_back(
    database: psycopg.Connection, store: PostgresStore
) -> None:
    """Its claim goes with the lines (its write finds none); a person waiting after a failed digest
    keeps their wait."""
    digesting, waiting = uuid.uuid4(), uuid.uuid4()
    old, new = f"- [web · {day(timedelta(days=60))}] old", f"- [web · {day(timedelta(days=3))}] new"
    noted(database, digesting, f"{old}\n{new}", timedelta(days=3))
    noted(database, waiting, f"{old}\n{new}", timedelta(days=3))
    claim = uuid.uuid4()
    database.execute(
        "update memory_notes set claim = %s, claimed_until = now() + interval '1 minute' where user_id = %s",
        (claim, digesting),
    )
    database.execute(
        "update memory_notes set claimed_until = now() + interval '1 hour', failures = 3 where user_id = %s",
        (waiting,),
    )
    wait = database.execute("select claimed_until from memory_notes where user_id = %s", (waiting,)).fetchone()

    assert Retention(store, batch_size=10, in_flight=IN_FLIGHT).purge(RETENTION).notes == 2

    written = store.call(
        "write_memory_notes",
        {
            "p_user_id": str(digesting),
            "p_claim": str(claim),
            "p_content": f"{old}\n{new}",
            "p_covered_at": None,
            "p_covered_id": None,
        },
    )
    assert written == {"written": False, "revision": None}
    assert content_of(database, digesting) == new
    row = database.execute("select claim, claimed_until from memory_notes where user_id = %s", (digesting,)).fetchone()
    assert row == (None, None)
    assert database.execute(
        "select content, claim, claimed_until from memory_notes where user_id = %s", (waiting,)
    ).fetchone() == (new, None, wait[0] if wait else None)


NO_DAY = "\n".join(
    [
        "- [telegram] no day in the tag",
        "- [telegram · Sat 21:40] a day no year places",
        "- [telegram · 28 Nov] another",
        "- [whatsapp · 2026-02-30] a day no calendar has",
        "- [web] moving on 2020-01-01: a day in the words, not the tag",
        "a line without a tag",
    ]
)


def test_a_line_without_a_day_goes_once_everything_the_notes_cover_is_older_than_the_cutoff(
    database: psycopg.Connection, store: PostgresStore
) -> None:
    """It can only be about a message the notes cover: all of them purged, it goes; any kept, it
    stays; notes that cover nothing (a link's fold) keep it. A blank line is about nothing."""
    covering_old, covering_young, covering_none = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    dated = f"- [sms · {day(timedelta(days=2))}] dated"
    noted(database, covering_old, f"{NO_DAY}\n\n{dated}\n", timedelta(days=31))
    noted(database, covering_young, NO_DAY, timedelta(days=29))
    noted(database, covering_none, NO_DAY)

    assert Retention(store, batch_size=10, in_flight=IN_FLIGHT).purge(RETENTION).notes == 1

    assert content_of(database, covering_old) == f"\n{dated}\n"
    assert content_of(database, covering_young) == NO_DAY
    assert content_of(database, covering_none) == NO_DAY


def test_a_line_dated_after_the_notes_were_written_goes_with_the_messages_they_cover(
    database: psycopg.Connection, store: PostgresStore
) -> None:
    """A model may tag a line with the day of what it is about ("the dentist on ...", two months
    ahead) rather than the day it was said: no message was said then, so the line goes as one
    without a day does, once everything the notes cover is older than the cutoff (by its date it
    outlived the purge of its messages by two months); notes covering a message within the
    retention keep it."""
    covering_old, covering_young = uuid.uuid4(), uuid.uuid4()
    ahead = f"- [sms · {day(-timedelta(days=60))}] the dentist on that day"
    past = f"- [sms · {day(timedelta(days=32))}] said 32 days ago"
    noted(database, covering_old, f"{ahead}\n{past}", timedelta(days=31))
    noted(database, covering_young, ahead, timedelta(days=29))

    assert Retention(store, batch_size=10, in_flight=IN_FLIGHT).purge(RETENTION).notes == 1

    assert content_of(database, covering_old) == ""
    assert content_of(database, covering_young) == ahead


def test_notes_folded_in_keep_the_lines_of_days_after_the_ones_they_join_were_written(
    database: psycopg.Connection, store: PostgresStore
) -> None:
    """A link folds a person's notes into another's, written 40 days ago: the folded lines' days
    are after that but not after the folded notes were written, so they are still their lines' days
    (the fold keeps the later writing): a purge of 30 days drops the line of 32 days ago, and keeps
    the one of 2 days ago."""
    into, folded = uuid.uuid4(), uuid.uuid4()
    recent = f"- [telegram · {day(timedelta(days=2))}] said 2 days ago"
    noted(database, into, f"- [web · {day(timedelta(days=32))}] said 32 days ago", timedelta(days=31))
    database.execute("update memory_notes set written_at = now() - interval '40 days' where user_id = %s", (into,))
    noted(database, folded, recent, timedelta(days=1))
    database.execute("select public.fold_memory_notes(%s, %s)", (folded, into))

    assert Retention(store, batch_size=10, in_flight=IN_FLIGHT).purge(RETENTION).notes == 1

    assert content_of(database, into) == recent


@pytest.mark.parametrize(
    ("line", "expires"),
    [
        ("- [telegram · 2026-11-28] Sister's name is Ana.", "2026-11-29 12:00+00:00"),
        ("- [telegram · 2026-11-28 09:12] as the model may copy the message's tag", "2026-11-29 12:00+00:00"),
        ("- [telegram · 2026-11-28, web · 2026-12-03] merged from two days: the first", "2026-11-29 12:00+00:00"),
        ("- [sms · 2024-02-29] a leap day", "2024-03-01 12:00+00:00"),
        ("- [sms · 2023-02-29] no such day: as no day", "2026-01-10 08:00+00:00"),
        ("- [sms · 2024-13-01] no month 13", "2026-01-10 08:00+00:00"),
        ("- [sms · 0000-01-01] no year 0", "2026-01-10 08:00+00:00"),
        ("- [sms · 2026-12-11] written on the 10th at 12:00 UTC, the 11th at UTC+14", "2026-12-12 12:00+00:00"),
        ("- [sms · 2026-12-12] after the notes were written, anywhere: as no day", "2026-01-10 08:00+00:00"),
        ("- [sms · 2027-03-01] the dentist: the day of what it is about", "2026-01-10 08:00+00:00"),
        ("   ", None),
    ],
)
def test_a_line_expires_when_its_day_is_over_in_every_time_zone(
    database: psycopg.Connection, line: str, expires: str | None
) -> None:
    """The day is on the person's clock, whatever their zone: it is over everywhere at 12:00 UTC the
    next day (UTC-12). A line with no readable day, or a day after the notes were written (here on
    10 December at 12:00 UTC) on every clock, expires with the notes' coverage (here 08:00)."""
    row = database.execute(
        "select (crossmem_private.notes_at_cutoff(%s, '2026-01-10 08:00+00', '2026-12-10 12:00+00', '-infinity'))"
        ".first_line_expires_at",
        (line,),
    ).fetchone()
    assert row == (None if expires is None else datetime.fromisoformat(expires),)


def test_the_pg_cron_job_the_design_shows_purges_a_batch_with_the_notes(database: psycopg.Connection) -> None:
    """docs/design.md's job for a deployment without the digest, run as written: it once named three
    of the function's six arguments, which no function matched."""
    design = (Path(__file__).parents[3] / "docs" / "design.md").read_text(encoding="utf-8")
    job = re.search(r"select cron\.schedule\('crossmem-purge', '[^']*', \$\$\n(.*?)\n\$\$\);", design, re.DOTALL)
    assert job is not None
    person = uuid.uuid4()
    said(database, person, "said long ago", timedelta(days=100))
    noted(database, person, f"- [telegram · {day(timedelta(days=100))}] said long ago\n- [web] no day")
    row = database.execute(job[1]).fetchone()
    assert row is not None and (row[0]["deleted"], row[0]["notes"]) == (2, 1)
    assert content_of(database, person) == "- [web] no day"
