"""Memory notes end to end: `crossmem digest`, the next turn's request, `memory_digest`,
`GET /memory` and `crossmem history`, with the real functions, Postgres and the SDK's fake."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

import functions.digest
from core.model.prompt import NOTES_PREAMBLE
from core.models import Surface
from core.turn.capabilities import DEFAULT_SYSTEM_PROMPT
from core.turn.request import Outcome, TurnRequest, TurnResult
from functions import runtime
from functions.tools.cli import main
from tests.database import migrated_database
from tests.fakes.anthropic_api import FakeAnthropic
from tests.helpers import JWT_SECRET, app_client, bearer

CACHE = {"type": "ephemeral"}
# memory_digest's answer when it found nothing to do (the tests set what they expect it to do).
NOTHING_DONE = {
    "owed_answered": 0,
    "owed_failed": 0,
    "follow_ups_sent": 0,
    "follow_ups_retried": 0,
    "follow_ups_held": 0,
    "follow_ups_given_up": 0,
    "follow_ups_released": 0,
    "follow_ups_unrecorded": 0,
    "updated": 0,
    "failed": 0,
    "memory_notes": True,
    "purged": 0,
    "purged_notes": 0,
    "usage_expired": 0,
}


@pytest.fixture
def notes_env(environment: pytest.MonkeyPatch, postgres_server: str) -> Iterator[pytest.MonkeyPatch]:
    """A small window (4 messages, stepping by 2), on a database of this test's own, so a
    digest of everyone due sees only this test's people."""
    with migrated_database(postgres_server) as url:
        environment.setenv("DATABASE_URL", url)
        environment.setenv("CONTEXT_MAX_MESSAGES", "4")
        environment.setenv("CONTEXT_WINDOW_STEP", "2")
        runtime.reset()
        yield environment
        runtime.reset()


def telegram(text: str, sender: str = "5151") -> TurnResult:
    # A deadline no slow first turn (the SDK imported cold) runs into: the fallback is not stored.
    return runtime.turns().run(TurnRequest(Surface.TELEGRAM, text, uuid.uuid4().hex, sender_id=sender, deadline_s=30))


def paused(user: uuid.UUID | None) -> None:
    """The person stopped writing six minutes ago: past the prompt cache's lifetime, so due.
    (Their whole thread moves back in time, and what the notes cover with it.)"""
    with psycopg.connect(runtime.settings().database_url.get_secret_value()) as connection:  # type: ignore[union-attr]
        for table, column in (("messages", "created_at"), ("memory_notes", "covered_until_at")):
            connection.execute(
                f"update {table} set {column} = {column} - interval '6 minutes' where user_id = %s", (user,)
            )


def offline_digest(environment: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """`crossmem digest` without a model key: the offline extractive notes."""
    environment.delenv("ANTHROPIC_API_KEY")
    runtime.reset()
    capsys.readouterr()
    assert main(["digest", *args]) == 0
    environment.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    runtime.reset()
    return capsys.readouterr().out


def test_crossmem_digest_writes_notes_the_next_turn_carries_after_the_system_prompt(
    notes_env: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic, capsys: pytest.CaptureFixture[str]
) -> None:
    first = telegram("My sister's name is Ana")
    for text in ("The appointment moved to Friday", "Thanks"):
        telegram(text)
    assert first.user_id is not None
    assert offline_digest(notes_env, capsys, "--user", str(first.user_id)) == "updated 0 people\n"  # mid-conversation
    paused(first.user_id)
    assert offline_digest(notes_env, capsys, "--user", str(first.user_id)) == "updated 1 person\n"

    result = telegram("What is my sister's name?")
    assert result.outcome is Outcome.ANSWERED and result.figures.round_trips == 2
    system = fake_anthropic.requests[-1]["system"]
    assert system[0] == {"type": "text", "text": DEFAULT_SYSTEM_PROMPT, "cache_control": CACHE}
    assert system[1]["cache_control"] == CACHE and system[1]["text"].startswith(NOTES_PREAMBLE)
    notes = system[1]["text"].removeprefix(NOTES_PREAMBLE).splitlines()
    assert [line.split("] ", 1)[1] for line in notes] == ["My sister's name is Ana"]
    assert notes[0].startswith("- [telegram · ")
    sent = [m["content"][0]["text"] for m in fake_anthropic.requests[-1]["messages"]]
    assert not any("My sister's name is Ana" in text for text in sent)  # it left the window: only the notes hold it
    breakpoints = sum("cache_control" in block for block in system) + sum(
        "cache_control" in m["content"][-1] for m in fake_anthropic.requests[-1]["messages"]
    )
    assert breakpoints == 3

    paused(first.user_id)
    assert offline_digest(notes_env, capsys) == "updated 1 person\n"  # this turn pushed two more out
    assert offline_digest(notes_env, capsys) == "updated 0 people\n"  # and nothing else is due


def test_memory_notes_false_sends_no_notes(
    notes_env: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic, capsys: pytest.CaptureFixture[str]
) -> None:
    for text in ("My sister's name is Ana", "b", "c"):
        said = telegram(text, sender="6161")
    paused(said.user_id)
    assert offline_digest(notes_env, capsys, "--user", str(said.user_id)) == "updated 1 person\n"
    notes_env.setenv("MEMORY_NOTES", "false")
    runtime.reset()
    telegram("d", sender="6161")
    # One block, no notes; and the prompt does not say the agent sees notes.
    without_notes = DEFAULT_SYSTEM_PROMPT.replace("the thread, and your notes.", "the thread.")
    assert without_notes != DEFAULT_SYSTEM_PROMPT
    assert [block["text"] for block in fake_anthropic.requests[-1]["system"]] == [without_notes]
    capsys.readouterr()
    assert main(["digest"]) == 0
    assert capsys.readouterr().out == "updated 0 people (MEMORY_NOTES is false)\n"


def test_memory_digest_given_a_secret_refuses_without_it_and_does_nothing(
    notes_env: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic
) -> None:
    for text in ("My sister's name is Ana", "b", "c"):
        said = telegram(text, sender="7171")
    paused(said.user_id)
    # Served without Cloud Run's IAM (crossmem dev, another host), DIGEST_SECRET guards it.
    notes_env.setenv("DIGEST_SECRET", "digest-secret-for-tests")
    digest = app_client("memory_digest")
    for headers in ({}, {"X-Digest-Secret": "wrong"}, {"X-Digest-Secret": ""}):
        refused = digest.post("/", headers=headers)
        assert refused.status_code == 401 and refused.get_json()["error"] == "unauthorized"
    assert digest.get("/", headers={"X-Digest-Secret": "digest-secret-for-tests"}).status_code == 405
    with psycopg.connect(runtime.settings().database_url.get_secret_value()) as connection:  # type: ignore[union-attr]
        assert connection.execute("select count(*) from memory_notes").fetchone() == (0,)
        assert fake_anthropic.requests[-1]["model"] == "claude-sonnet-5-5"  # no digest model was asked
        fake_anthropic.answer = lambda body: "- [telegram · 2026-11-30] Sister's name is Ana."
        answered = digest.post("/", headers={"X-Digest-Secret": "digest-secret-for-tests"})
        assert answered.status_code == 200
        assert answered.get_json() == {**NOTHING_DONE, "updated": 1, "memory_notes": True}
        row = connection.execute("select revision, content from memory_notes where user_id = %s", (said.user_id,))
        assert row.fetchone() == (1, "- [telegram · 2026-11-30] Sister's name is Ana.")
    body = fake_anthropic.requests[-1]
    assert body["model"] == "claude-haiku-5-5" and body["max_tokens"] == 800 + 2048


def test_the_notes_have_what_is_left_of_the_budget_after_the_owed_replies_and_the_follow_ups(
    notes_env: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic
) -> None:
    """The owed replies may take half of DIGEST_TIME_BUDGET and the follow-ups a quarter: the notes
    had the whole budget again after them, so a model that hung took the run past the function's
    timeout (300 s of 240), and the purge after them never ran (a review's finding). Here the steps
    before them spent it all: the person stays due, for the next run, and the model is not asked."""
    for text in ("My sister's name is Ana", "b", "c"):
        said = telegram(text, sender="7272")
    paused(said.user_id)
    digest = app_client("memory_digest")
    clock = iter([0.0, 240.0])  # the job's start, then the notes' turn: the steps before spent 240 s
    notes_env.setattr(functions.digest, "monotonic", lambda: next(clock))
    asked = len(fake_anthropic.requests)
    answered = digest.post("/")
    assert (answered.status_code, answered.get_json()) == (200, {**NOTHING_DONE, "memory_notes": True})
    assert len(fake_anthropic.requests) == asked
    notes_env.setattr(functions.digest, "monotonic", time.monotonic)
    fake_anthropic.answer = lambda body: "- [telegram · 2026-11-30] Sister's name is Ana."
    assert digest.post("/").get_json() == {**NOTHING_DONE, "updated": 1, "memory_notes": True}


def test_get_memory_and_crossmem_history_show_the_notes(
    notes_env: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic, capsys: pytest.CaptureFixture[str]
) -> None:
    notes_env.setenv("SUPABASE_JWT_SECRET", JWT_SECRET)
    person = uuid.uuid4()
    web = app_client("web_chat")
    empty = web.get("/memory", headers=bearer(person))
    assert empty.status_code == 200
    assert empty.get_json() == {"notes": "", "written_at": None, "covered_until": None}
    for text in ("My sister's name is Ana", "b", "c"):
        assert web.post("/", json={"message": text}, headers=bearer(person)).status_code == 200
    paused(person)
    offline_digest(notes_env, capsys, "--user", str(person))
    web = app_client("web_chat")
    shown = web.get("/memory", headers=bearer(person)).get_json()
    assert shown["notes"].startswith("- [web · ") and shown["notes"].endswith("] My sister's name is Ana")
    assert shown["written_at"] is not None and shown["covered_until"] is not None
    refused = web.post("/memory", headers=bearer(person))  # GET reads the notes, DELETE forgets
    assert refused.status_code == 405 and refused.headers["Allow"] == "DELETE, GET"
    assert web.get("/memory", headers=bearer(uuid.uuid4())).get_json()["notes"] == ""

    assert main(["history", "--user", str(person)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("notes (written ") and ", covering the thread up to " in lines[0]
    assert lines[1].startswith("  - [web · ") and lines[1].endswith("] My sister's name is Ana")
    assert lines[2] == "" and lines[3].endswith("user: My sister's name is Ana")


def test_memory_digest_purges_by_age_when_retention_is_set_and_the_budgets_old_counts_always(
    notes_env: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic, postgres_server: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The purge takes the old writer's two messages and the line of their notes about that day
    (the other line stays): the answer and the log line count both, as `crossmem purge` says them."""
    caplog.set_level(logging.INFO, logger="crossmem.retention")
    with migrated_database(postgres_server) as database:  # a purge spans everyone: a database of its own
        notes_env.setenv("DATABASE_URL", database)
        notes_env.setenv("TURNS_PER_DAY", "300")  # a budget on, as deployed: each turn is counted
        runtime.reset()
        old = telegram("An old message, kept past its retention", sender="7272")
        recent = telegram("A message of today", sender="7373")
        with psycopg.connect(database) as connection:
            connection.execute(
                "update messages set created_at = created_at - interval '3 days' where user_id = %s", (old.user_id,)
            )
            # The budget's counts live a day, whoever they belong to: the old writer's turn, a note
            # they had transcribed, and the day a chat left behind when it was unlinked and never
            # wrote again (links.sql); none of them will write again to drop their own.
            connection.execute("update turn_usage set at = at - interval '25 hours' where user_id = %s", (old.user_id,))
            connection.execute(
                "insert into voice_usage (user_id, message_id, seconds, at)"
                " values (%s, 1, 40, now() - interval '2 days')",
                (old.user_id,),
            )
            connection.execute(
                "insert into turn_usage (message_id, user_id, at)"
                " values (-1, crossmem_private.unlinked_person('telegram', '7474'), now() - interval '30 hours')"
            )
            kept = f"- [telegram · {datetime.now(UTC):%Y-%m-%d}] likes tea"
            connection.execute(
                "insert into memory_notes (user_id, content, written_at) values (%s, %s, now())",
                (old.user_id, f"- [telegram · {datetime.now(UTC) - timedelta(days=5):%Y-%m-%d}] an old line\n{kept}"),
            )
        notes_env.setenv("MEMORY_NOTES", "false")
        notes_env.setenv("MESSAGE_RETENTION_DAYS", "2")
        # As deployed: no DIGEST_SECRET, no header (Cloud Run checked the scheduler's OIDC token).
        answered = app_client("memory_digest").post("/")
        assert answered.status_code == 200
        assert answered.get_json() == {
            **NOTHING_DONE,
            "memory_notes": False,
            "purged": 2,
            "purged_notes": 1,
            "usage_expired": 3,
        }
        [line] = [record for record in caplog.records if record.name == "crossmem.retention"]
        assert (line.levelname, line.getMessage(), vars(line)["messages"], vars(line)["notes"]) == (
            "INFO",
            "purged",
            2,
            1,
        )
        with psycopg.connect(database) as connection:
            left = connection.execute("select user_id, count(*) from messages group by user_id").fetchall()
            counted = connection.execute("select user_id, count(*) from turn_usage group by user_id").fetchall()
            assert connection.execute("select count(*) from voice_usage").fetchone() == (0,)
        assert left == [(recent.user_id, 2)]
        assert counted == [(recent.user_id, 1)]
        with psycopg.connect(database) as connection:
            assert connection.execute("select content from memory_notes").fetchall() == [(kept,)]
        runtime.reset()


def test_an_extra_tool_that_cannot_load_leaves_the_owed_messages_and_the_jobs_other_steps_run(
    notes_env: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic, postgres_server: str, caplog: pytest.LogCaptureFixture
) -> None:
    """EXTRA_TOOLS naming a module that is not there: the turn cannot be built, so the owed messages
    wait (logged); the purge, which needs no tool, still runs."""
    with migrated_database(postgres_server) as database:  # a purge spans everyone: a database of its own
        notes_env.setenv("DATABASE_URL", database)
        runtime.reset()
        old = telegram("An old message, kept past its retention", sender="7575")
        with psycopg.connect(database) as connection:
            connection.execute(
                "update messages set created_at = created_at - interval '3 days' where user_id = %s", (old.user_id,)
            )
        notes_env.setenv("MEMORY_NOTES", "false")
        notes_env.setenv("MESSAGE_RETENTION_DAYS", "2")
        notes_env.setenv("EXTRA_TOOLS", "no_such_module:tool")
        runtime.reset()
        answered = app_client("memory_digest").post("/")
        assert answered.status_code == 200
        assert answered.get_json() == {**NOTHING_DONE, "memory_notes": False, "purged": 2}  # no notes to purge
        assert [(r.message, r.error) for r in caplog.records if r.name == "crossmem.digest"] == [  # type: ignore[attr-defined]
            (
                "owed messages not answered: the turn is misconfigured",
                "EXTRA_TOOLS: no_such_module:tool could not be loaded "
                "(ModuleNotFoundError: not installed, or not on PYTHONPATH)",
            )
        ]
        runtime.reset()


def test_memory_digest_answers_what_it_did_when_expiring_old_counts_fails(notes_env: pytest.MonkeyPatch) -> None:
    """The last step, housekeeping, meets a database that will not give it a lock in time (a
    migration, a VACUUM FULL): the run's answer still comes, with null for that step."""
    database = runtime.settings().database_url.get_secret_value()  # type: ignore[union-attr]
    # Built by libpq's rules, not by appending: the URI may already carry a query (the embedded
    # server's `?host=<socket directory>`).
    notes_env.setenv("DATABASE_URL", make_conninfo(database, options="-c lock_timeout=300"))
    runtime.reset()
    with psycopg.connect(database) as holder:
        holder.execute("lock table voice_usage in access exclusive mode")
        answered = app_client("memory_digest").post("/", headers={"X-Digest-Secret": "digest-secret-for-tests"})
    assert answered.status_code == 200
    assert answered.get_json() == {**NOTHING_DONE, "usage_expired": None}


def test_memory_digest_answers_null_for_a_purge_the_database_fails_and_the_next_run_purges(
    notes_env: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The purge meets a database that will not give it the notes' lock in time (a migration, a
    VACUUM FULL): the run's answer still comes, with null for the purge and its notes (what it
    deleted is rolled back with it), logged; the next run purges."""
    database = runtime.settings().database_url.get_secret_value()  # type: ignore[union-attr]
    notes_env.setenv("DATABASE_URL", make_conninfo(database, options="-c lock_timeout=300"))
    notes_env.setenv("MEMORY_NOTES", "false")
    notes_env.setenv("MESSAGE_RETENTION_DAYS", "2")
    runtime.reset()
    person = uuid.uuid4()
    with psycopg.connect(database) as connection:
        connection.execute("insert into conversations (user_id, surface) values (%s, 'telegram')", (person,))
        connection.execute(
            "insert into messages (conversation_id, user_id, surface, role, content, external_id, created_at)"
            " select id, user_id, 'telegram', 'user', 'an old message', 'old-1', now() - interval '3 days'"
            " from conversations where user_id = %s",
            (person,),
        )
    digest = app_client("memory_digest")
    with psycopg.connect(database) as holder:
        holder.execute("lock table memory_notes in access exclusive mode")
        answered = digest.post("/", headers={"X-Digest-Secret": "digest-secret-for-tests"})
    assert answered.status_code == 200
    assert answered.get_json() == {**NOTHING_DONE, "memory_notes": False, "purged": None, "purged_notes": None}
    [line] = [r for r in caplog.records if r.name == "crossmem.retention"]
    assert (line.levelname, line.getMessage(), vars(line)["step"], vars(line)["error"]) == (
        "ERROR",
        "housekeeping failed; the next run tries again",
        "purge",
        "purge_messages failed: LockNotAvailable",
    )
    with psycopg.connect(database) as connection:
        assert connection.execute("select count(*) from messages where user_id = %s", (person,)).fetchone() == (1,)
    again = digest.post("/", headers={"X-Digest-Secret": "digest-secret-for-tests"})
    assert again.get_json() == {**NOTHING_DONE, "memory_notes": False, "purged": 1}
    runtime.reset()


def test_memory_digest_answers_what_it_did_when_the_notes_cannot_be_claimed(
    notes_env: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic, caplog: pytest.LogCaptureFixture
) -> None:
    """The digest's claim meets a database that will not give it the notes' lock in time (a
    migration, a VACUUM FULL): that step is logged and skipped, the steps after it still run, and
    the run's answer comes (it was a 503, housekeeping skipped). The next run digests."""
    database = runtime.settings().database_url.get_secret_value()  # type: ignore[union-attr]
    notes_env.setenv("DATABASE_URL", make_conninfo(database, options="-c lock_timeout=300"))
    runtime.reset()
    for text in ("My sister's name is Ana", "b", "c"):
        person = telegram(text, sender="8686").user_id
    paused(person)
    digest = app_client("memory_digest")
    with psycopg.connect(database) as holder:
        holder.execute("lock table memory_notes in access exclusive mode")
        answered = digest.post("/", headers={"X-Digest-Secret": "digest-secret-for-tests"})
    assert answered.status_code == 200
    assert answered.get_json() == NOTHING_DONE  # without MESSAGE_RETENTION_DAYS the purge needs no lock
    assert [(r.levelname, r.getMessage(), vars(r)["error"]) for r in caplog.records if r.name == "crossmem.digest"] == [
        (
            "ERROR",
            "the notes could not be claimed; the next run digests",
            "claim_memory_digests failed: LockNotAvailable",
        )
    ]
    fake_anthropic.answer = lambda body: "- [telegram · 2026-11-30] Sister's name is Ana."
    again = digest.post("/", headers={"X-Digest-Secret": "digest-secret-for-tests"})
    assert again.get_json() == {**NOTHING_DONE, "updated": 1}
    with psycopg.connect(database) as connection:
        notes = connection.execute("select content from memory_notes where user_id = %s", (person,)).fetchone()
    assert notes == ("- [telegram · 2026-11-30] Sister's name is Ana.",)
    runtime.reset()
