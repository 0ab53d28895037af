"""Every message answered exactly once (issue #23), tried as the world behaves: an instance
killed mid-turn, a web client that hangs up mid-stream, a budget dodged with a reused client
id, a platform that never redelivers. Real functions, real Postgres, the real SDKs at fakes."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import httpx
import pytest
from flask.testing import FlaskClient
from werkzeug.serving import make_server

from core.channels.splitting import split_message
from core.channels.telegram_bot import TelegramBot, TelegramChannel
from core.models import Surface
from core.surfaces.whatsapp import WHATSAPP_LIMIT
from core.turn.request import TurnRequest, TurnSettings
from core.turn.turns import Turns
from functions import runtime
from functions.telegram import REPLY_DEADLINE_S
from tests.database import migrated_database
from tests.fakes.anthropic_api import FakeAnthropic, echo_last_message
from tests.fakes.telegram_api import FakeTelegram
from tests.fakes.twilio_api import FakeTwilio
from tests.helpers import (
    BOT_TOKEN,
    JWT_SECRET,
    MAIN,
    PUBLIC_BASE_URL,
    TELEGRAM_HEADERS,
    TWILIO_TOKEN,
    app_client,
    bearer,
    execute,
    form,
    free_port,
    messages_of,
    production_settings,
    rows,
    signed,
    stored_turn,
    update,
)

ACCOUNT_SID = "AC" + "0" * 32
BUSINESS = "whatsapp:+14155238886"
DIGEST = {"X-Digest-Secret": "digest-secret-for-tests"}


def pass_the_deadline(database_url: str, external_id: str) -> None:
    """The clock moves past the time its attempt had to answer in."""
    execute(
        database_url,
        "update messages set answer_by = clock_timestamp() - interval '1 second' where external_id = %s",
        external_id,
    )


@pytest.fixture
def fake_twilio() -> Iterator[FakeTwilio]:
    server = FakeTwilio(ACCOUNT_SID, TWILIO_TOKEN)
    yield server
    server.close()


# An instance killed mid-turn.


def test_a_turn_killed_between_its_round_trips_is_answered_once_by_its_redelivery(
    environment: pytest.MonkeyPatch,
    database_url: str,
    fake_anthropic: FakeAnthropic,
    fake_telegram: FakeTelegram,
    tmp_path: Path,
) -> None:
    """A real functions-framework process takes the update, stores it, asks the model, and is
    killed (SIGKILL) while the model thinks: no reply, nothing sent. Telegram redelivers."""
    fake_anthropic.behaviour, fake_anthropic.slow_s = "slow", 20.0
    fake_anthropic.answer = lambda body: "Your flight leaves at 9:40."
    port = free_port()
    env = {**os.environ, **production_settings(database_url, fake_anthropic, fake_telegram)}
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "functions-framework"), "--target", "telegram_webhook"]
        + ["--source", MAIN, "--port", str(port)],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    delivery = update("What time is my flight tomorrow?")
    update_id = str(delivery["update_id"])
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
                break
            except OSError:
                time.sleep(0.1)

        def deliver() -> None:
            with contextlib.suppress(httpx.HTTPError):  # the instance dies under it: no answer
                httpx.post(f"http://127.0.0.1:{port}/", json=delivery, headers=TELEGRAM_HEADERS, timeout=30)

        threading.Thread(target=deliver, daemon=True).start()
        for _ in range(200):
            if fake_anthropic.requests:
                break
            time.sleep(0.05)
        assert len(fake_anthropic.requests) == 1
    finally:
        server.send_signal(signal.SIGKILL)
        server.wait(timeout=10)
    assert stored_turn(database_url, update_id) == [("user", "What time is my flight tomorrow?")]
    assert fake_telegram.sent() == []

    fake_anthropic.behaviour = "ok"
    telegram = app_client("telegram_webhook")
    # Redelivered while the dead attempt could still have answered: come back later.
    early = telegram.post("/", json=delivery, headers=TELEGRAM_HEADERS)
    assert early.status_code == 503
    assert early.get_json()["error"] == "still_answering"
    assert len(fake_anthropic.requests) == 1

    pass_the_deadline(database_url, update_id)
    redelivered = telegram.post("/", json=delivery, headers=TELEGRAM_HEADERS)
    assert redelivered.status_code == 200
    assert redelivered.get_json() == {"ok": True, "outcome": "answered"}
    assert len(fake_anthropic.requests) == 2  # one model call for the redelivery
    assert fake_anthropic.requests[-1]["messages"][-1]["content"][0]["text"].endswith(
        "What time is my flight tomorrow?"
    )
    reply = "Your flight leaves at 9:40."
    assert [m["text"] for m in fake_telegram.sent()] == [reply]
    assert stored_turn(database_url, update_id) == [("user", "What time is my flight tomorrow?"), ("assistant", reply)]

    again = telegram.post("/", json=delivery, headers=TELEGRAM_HEADERS)
    assert again.status_code == 200
    assert again.get_json() == {"ok": True, "outcome": "duplicate"}
    assert len(fake_anthropic.requests) == 2
    assert len(fake_telegram.sent()) == 1


# The scheduled job answers what no platform redelivers.


@pytest.fixture
def job_database(environment: pytest.MonkeyPatch, postgres_server: str) -> Iterator[str]:
    """A database of the test's own: the job answers every owed message it finds."""
    with migrated_database(postgres_server) as url:
        environment.setenv("DATABASE_URL", url)
        yield url
        runtime.reset()  # its connections go before the database does


def owed_environment(environment: pytest.MonkeyPatch, fake_twilio: FakeTwilio) -> None:
    environment.setenv("TWILIO_AUTH_TOKEN", TWILIO_TOKEN)
    environment.setenv("PUBLIC_BASE_URL", PUBLIC_BASE_URL)
    environment.setenv("TWILIO_ACCOUNT_SID", ACCOUNT_SID)
    environment.setenv("TWILIO_WHATSAPP_FROM", BUSINESS)
    environment.setenv("TWILIO_API_BASE", fake_twilio.url)
    environment.setenv("DIGEST_SECRET", DIGEST["X-Digest-Secret"])
    environment.setenv("MEMORY_NOTES", "false")
    environment.setenv("OWED_REPLY_MAX_AGE", "10")


def test_the_scheduled_job_answers_an_owed_whatsapp_message_once_and_leaves_an_older_one(
    environment: pytest.MonkeyPatch, job_database: str, fake_anthropic: FakeAnthropic, fake_twilio: FakeTwilio
) -> None:
    owed_environment(environment, fake_twilio)
    whatsapp = app_client("whatsapp_webhook")
    number = f"whatsapp:+3461{uuid.uuid4().int % 10**7:07d}"
    # The model fails on both: each person gets the fallback, each message stays unanswered.
    fake_anthropic.behaviour = "500"
    recent, old = form("Is the pharmacy open on Sunday?", sender=number), form("And on Monday?", sender=number)
    for fields in (old, recent):
        answered = whatsapp.post("/", data=fields, headers=signed(fields))
        assert answered.status_code == 200
        assert messages_of(answered.text) == [
            "Sorry, I can't think straight right now. I have your message and will remember it; "
            "please try again in a moment."
        ]
    execute(
        job_database,
        "update messages set created_at = clock_timestamp() - interval '11 minutes' where external_id = %s",
        old["MessageSid"],
    )
    fake_anthropic.behaviour = "ok"
    fake_anthropic.answer = lambda body: "Yes, from 10 to 14."
    asked = len(fake_anthropic.requests)

    job = app_client("memory_digest").post("/", headers=DIGEST)
    assert job.status_code == 200
    assert job.get_json()["owed_answered"] == 1
    assert job.get_json()["owed_failed"] == 0
    assert len(fake_anthropic.requests) == asked + 1
    reply = "Yes, from 10 to 14."
    assert fake_twilio.messages == [{"From": BUSINESS, "To": number, "Body": reply}]
    assert stored_turn(job_database, recent["MessageSid"]) == [
        ("user", "Is the pharmacy open on Sunday?"),
        ("assistant", reply),
    ]
    assert stored_turn(job_database, old["MessageSid"]) == [("user", "And on Monday?")]
    delivered = rows(
        job_database,
        "select delivered_at is not null from messages where in_reply_to = "
        "(select id from messages where external_id = %s)",
        recent["MessageSid"],
    )
    assert delivered == [(True,)]

    again = app_client("memory_digest").post("/", headers=DIGEST)
    assert again.get_json()["owed_answered"] == 0
    assert len(fake_twilio.messages) == 1
    assert len(fake_anthropic.requests) == asked + 1
    # Twilio redelivering it now (a retry the account configured) repeats the stored reply.
    redelivered = whatsapp.post("/", data=recent, headers=signed(recent))
    assert messages_of(redelivered.text) == [reply]
    assert len(fake_anthropic.requests) == asked + 1


def test_the_scheduled_job_shows_an_owed_message_on_the_persons_clock(
    environment: pytest.MonkeyPatch, job_database: str, fake_anthropic: FakeAnthropic, fake_twilio: FakeTwilio
) -> None:
    """The job's context reads the person's timezone as begin_turn's does: the tags agree with
    the follow-up tools whichever answers."""
    owed_environment(environment, fake_twilio)
    whatsapp = app_client("whatsapp_webhook")
    fields = form("Is the pharmacy open on Sunday?", sender=f"whatsapp:+3461{uuid.uuid4().int % 10**7:07d}")
    fake_anthropic.behaviour = "500"
    assert whatsapp.post("/", data=fields, headers=signed(fields)).status_code == 200
    [(person, created_at)] = rows(
        job_database, "select user_id, created_at from messages where external_id = %s", fields["MessageSid"]
    )
    execute(job_database, "insert into person_timezones (user_id, timezone) values (%s, 'Asia/Kathmandu')", person)
    fake_anthropic.behaviour = "ok"

    job = app_client("memory_digest").post("/", headers=DIGEST)
    assert job.get_json()["owed_answered"] == 1
    shown = created_at.astimezone(ZoneInfo("Asia/Kathmandu"))
    first = fake_anthropic.requests[-1]["messages"][0]["content"][-1]["text"]
    day = f"{shown:%a} {shown.day} {shown:%b %Y}"  # its day's first message: the whole date
    assert first == f"[whatsapp · {day} · {shown.hour:02d}:{shown.minute:02d}] Is the pharmacy open on Sunday?"


def test_two_job_runs_at_once_answer_each_owed_message_once(
    environment: pytest.MonkeyPatch, job_database: str, fake_anthropic: FakeAnthropic, fake_twilio: FakeTwilio
) -> None:
    owed_environment(environment, fake_twilio)
    whatsapp = app_client("whatsapp_webhook")
    fake_anthropic.behaviour = "500"
    sent = []
    for index in range(4):
        fields = form(f"question {index}", sender=f"whatsapp:+3462{uuid.uuid4().int % 10**7:07d}")
        assert whatsapp.post("/", data=fields, headers=signed(fields)).status_code == 200
        sent.append(fields)
    fake_anthropic.behaviour = "ok"
    fake_anthropic.latency_s = (0.1, 0.2)
    answers: list[dict[str, Any]] = []
    # Both built before either runs: building one resets the runtime, closing the pool the other uses.
    jobs = [app_client("memory_digest") for _ in range(2)]

    def run_the_job(job: FlaskClient) -> None:
        answers.append(job.post("/", headers=DIGEST).get_json())

    runs = [threading.Thread(target=run_the_job, args=(job,)) for job in jobs]
    for run in runs:
        run.start()
    for run in runs:
        run.join()
    assert sum(answer["owed_answered"] for answer in answers) == 4
    assert sorted(m["To"] for m in fake_twilio.messages) == sorted(fields["From"] for fields in sent)
    for fields in sent:
        assert len(stored_turn(job_database, fields["MessageSid"])) == 2


def test_a_whatsapp_number_that_twilio_refuses_is_given_up_not_retried(
    environment: pytest.MonkeyPatch, job_database: str, fake_anthropic: FakeAnthropic, fake_twilio: FakeTwilio
) -> None:
    owed_environment(environment, fake_twilio)
    fake_anthropic.behaviour = "500"
    fields = form("hello?", sender=f"whatsapp:+3463{uuid.uuid4().int % 10**7:07d}")
    assert app_client("whatsapp_webhook").post("/", data=fields, headers=signed(fields)).status_code == 200
    fake_anthropic.behaviour = "ok"
    fake_twilio.fail_with(400, 63016)  # outside the 24-hour window: retrying cannot help
    first = app_client("memory_digest").post("/", headers=DIGEST).get_json()
    assert (first["owed_answered"], first["owed_failed"]) == (1, 0)  # answered and stored, not delivered
    delivered = rows(
        job_database,
        "select delivered_at is null from messages where in_reply_to = "
        "(select id from messages where external_id = %s)",
        fields["MessageSid"],
    )
    assert delivered == [(True,)]
    asked = len(fake_anthropic.requests)
    second = app_client("memory_digest").post("/", headers=DIGEST).get_json()
    assert second["owed_answered"] == 0
    assert len(fake_anthropic.requests) == asked


LONG_ANSWER = " ".join(f"Sentence {n} of a long answer." for n in range(150))  # three WhatsApp messages


def reply_state(database_url: str, fields: dict[str, str]) -> list[tuple[int | None, bool]]:
    """The stored reply to the message as (unsent_from, delivered)."""
    return rows(
        database_url,
        "select unsent_from, delivered_at is not null from messages where in_reply_to = "
        "(select id from messages where external_id = %s)",
        fields["MessageSid"],
    )


@pytest.mark.parametrize("taken", [0, 1])
def test_a_reply_the_job_could_not_send_whole_is_sent_by_its_next_run_from_the_part_it_stopped_at(
    environment: pytest.MonkeyPatch,
    job_database: str,
    fake_anthropic: FakeAnthropic,
    fake_twilio: FakeTwilio,
    taken: int,
) -> None:
    """The job's answer, three WhatsApp messages, meets Twilio's 503 after `taken` of them went
    out (a later part past its two retries): stored, owed from the part it stopped at. The next
    run sends the rest, each part once, and asks no model; the run after it sends nothing. Before,
    the reply was stored undelivered and nothing sent it again: on WhatsApp, lost."""
    owed_environment(environment, fake_twilio)
    fake_anthropic.behaviour = "500"
    fields = form("Tell me everything about the pharmacy.", sender=f"whatsapp:+3464{uuid.uuid4().int % 10**7:07d}")
    assert app_client("whatsapp_webhook").post("/", data=fields, headers=signed(fields)).status_code == 200
    fake_anthropic.behaviour = "ok"
    fake_anthropic.answer = lambda body: LONG_ANSWER
    fake_twilio.fail_after(taken, 503, 20500)
    first = app_client("memory_digest").post("/", headers=DIGEST).get_json()
    assert (first["owed_answered"], first["owed_failed"]) == (1, 0)  # answered and stored
    parts = split_message(LONG_ANSWER, WHATSAPP_LIMIT)
    assert len(parts) == 3 and [m["Body"] for m in fake_twilio.messages] == parts[:taken]
    assert reply_state(job_database, fields) == [(taken, False)]
    asked = len(fake_anthropic.requests)
    fake_twilio.recover()
    second = app_client("memory_digest").post("/", headers=DIGEST).get_json()
    assert (second["owed_answered"], second["owed_failed"]) == (1, 0)
    assert [m["Body"] for m in fake_twilio.messages] == parts and len(fake_anthropic.requests) == asked
    assert reply_state(job_database, fields) == [(None, True)]
    third = app_client("memory_digest").post("/", headers=DIGEST).get_json()
    assert (third["owed_answered"], third["owed_failed"]) == (0, 0) and len(fake_twilio.messages) == 3


def test_with_twilio_down_for_everyone_a_run_stops_after_two_and_an_old_reply_is_left(
    environment: pytest.MonkeyPatch, job_database: str, fake_anthropic: FakeAnthropic, fake_twilio: FakeTwilio
) -> None:
    """Twilio's Messages API down: the job's answers to three people are stored, owed a send. A run
    that then fails to send two people's stops (the surface is down for everyone: each try would
    cost a timeout), asking no model; the one left goes first next run. Once the messages are older
    than OWED_REPLY_MAX_AGE their replies are left (a rest that late reads as a stranger's)."""
    owed_environment(environment, fake_twilio)
    fake_anthropic.behaviour = "500"
    sent = [form(f"question {n}", sender=f"whatsapp:+3465{uuid.uuid4().int % 10**7:07d}") for n in range(3)]
    for fields in sent:
        assert app_client("whatsapp_webhook").post("/", data=fields, headers=signed(fields)).status_code == 200
    fake_anthropic.behaviour = "ok"
    fake_twilio.fail_with(503, 20500)

    def run() -> tuple[int, int]:
        done = app_client("memory_digest").post("/", headers=DIGEST).get_json()
        return done["owed_answered"], done["owed_failed"]

    assert run() == (3, 0)  # answered and stored, none delivered
    assert [reply_state(job_database, fields) for fields in sent] == [[(0, False)]] * 3
    assert [run(), run()] == [(0, 2), (0, 2)]
    tried = rows(job_database, "select owed_tries from messages where role = 'user' order by id")
    # the second run tried two people and stopped; the third began with the one it left
    assert sorted(tries for (tries,) in tried) == [2, 2, 3]
    assert fake_twilio.messages == [] and len(fake_anthropic.requests) == 6  # the webhook's 3, the job's 3
    execute(job_database, "update messages set created_at = clock_timestamp() - interval '11 minutes'")
    fake_twilio.recover()
    assert run() == (0, 0) and fake_twilio.messages == []
    assert [reply_state(job_database, fields) for fields in sent] == [[(0, False)]] * 3


# A web client that hangs up mid-stream.


def test_a_web_client_that_reads_two_deltas_and_hangs_up_is_counted_logged_and_answered_on_retry(
    environment: pytest.MonkeyPatch,
    database_url: str,
    fake_anthropic: FakeAnthropic,
    caplog: pytest.LogCaptureFixture,
) -> None:
    environment.setenv("SUPABASE_JWT_SECRET", JWT_SECRET)
    environment.setenv("TOKENS_PER_DAY", "1000000")
    fake_anthropic.answer = lambda body: "one two three four five six seven eight nine ten eleven twelve"
    fake_anthropic.delta_pause_s = 0.1
    app = app_client("web_chat").application
    server = make_server("127.0.0.1", 0, app, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    person, client_id = uuid.uuid4(), f"client-{uuid.uuid4()}"
    body = {"message": "Tell me a long story", "client_message_id": client_id}
    headers = {**bearer(person), "Accept": "text/event-stream"}
    caplog.set_level(logging.INFO, logger="crossmem.turn")
    try:
        deltas = []
        url = f"http://127.0.0.1:{server.port}/"
        with httpx.Client(timeout=10) as client, client.stream("POST", url, json=body, headers=headers) as stream:
            for line in stream.iter_lines():
                if line.startswith("event: delta"):
                    deltas.append(line)
                if len(deltas) == 2:
                    break  # the tab is closed
        for _ in range(100):
            if any(getattr(r, "outcome", None) == "abandoned" for r in caplog.records):
                break
            time.sleep(0.05)
        turns = [r for r in caplog.records if r.getMessage() == "turn"]
        assert [getattr(r, "outcome", None) for r in turns] == ["abandoned"]
        stored = rows(
            database_url,
            "select u.tokens, m.answer_by <= clock_timestamp() from turn_usage u join messages m on m.id = u.message_id"
            " where m.external_id = %s",
            client_id,
        )
        # The input the model reported when it started (the fake counts 4 characters a token).
        assert len(stored) == 1 and stored[0][0] > 0 and stored[0][1] is True
        assert turns[0].input_tokens + turns[0].cache_creation_tokens > 0
        assert stored_turn(database_url, client_id) == [("user", "Tell me a long story")]
        asked = len(fake_anthropic.requests)

        fake_anthropic.delta_pause_s = 0.0
        web = app_client("web_chat")
        retried = web.post("/", json=body, headers=bearer(person))
        assert retried.status_code == 200
        answer = "one two three four five six seven eight nine ten eleven twelve"
        assert retried.get_json()["reply"] == answer
        assert retried.get_json()["outcome"] == "answered"
        assert len(fake_anthropic.requests) == asked + 1
        tokens = rows(
            database_url,
            "select u.tokens from turn_usage u join messages m on m.id = u.message_id where m.external_id = %s",
            client_id,
        )
        assert tokens[0][0] > stored[0][0]  # both attempts' tokens, added

        once_more = web.post("/", json=body, headers=bearer(person))
        assert once_more.get_json()["reply"] == answer
        assert once_more.get_json()["outcome"] == "redelivered"
        assert len(fake_anthropic.requests) == asked + 1
    finally:
        server.shutdown()


def test_a_retry_while_the_first_attempt_still_streams_is_told_to_wait(
    environment: pytest.MonkeyPatch, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    environment.setenv("SUPABASE_JWT_SECRET", JWT_SECRET)
    person, client_id = uuid.uuid4(), f"client-{uuid.uuid4()}"
    execute_turn = app_client("web_chat")
    # The model answers once the retry has been answered, however slow the machine (a model that
    # took 1.5 s lost to a second instance that took longer to get there).
    retried = threading.Event()

    def answer_after_the_retry(body: dict[str, Any]) -> str:
        retried.wait(30)
        return echo_last_message(body)

    fake_anthropic.answer = answer_after_the_retry
    body = {"message": "Are you there?", "client_message_id": client_id}
    first: dict[str, Any] = {}
    running = threading.Thread(
        target=lambda: first.update(response=execute_turn.post("/", json=body, headers=bearer(person)))
    )
    running.start()
    deadline = time.monotonic() + 30
    while not fake_anthropic.requests:
        assert time.monotonic() < deadline, "the first attempt never reached the model"
        time.sleep(0.02)
    retry = app_client("web_chat").post("/", json=body, headers=bearer(person))
    retried.set()
    running.join()
    assert retry.status_code == 409
    assert retry.get_json()["error"] == "still_answering"
    assert 1 <= int(retry.headers["Retry-After"]) <= 70
    assert first["response"].get_json()["outcome"] == "answered"
    assert len(fake_anthropic.requests) == 1


# Every token counted.


def test_a_fallback_after_the_deadline_counts_the_tokens_the_model_reports_when_it_ends(
    environment: pytest.MonkeyPatch, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    environment.setenv("TWILIO_AUTH_TOKEN", TWILIO_TOKEN)
    environment.setenv("PUBLIC_BASE_URL", PUBLIC_BASE_URL)
    environment.setenv("TOKENS_PER_DAY", "1000000")
    environment.setenv("WHATSAPP_MODEL_DEADLINE", "0.5")
    fake_anthropic.behaviour, fake_anthropic.slow_s = "slow", 1.0
    fields = form("A question the model answers too late", sender=f"whatsapp:+3464{uuid.uuid4().int % 10**7:07d}")
    answered = app_client("whatsapp_webhook").post("/", data=fields, headers=signed(fields))
    assert messages_of(answered.text)[0].startswith("Sorry, I can't think straight right now.")
    query = "select u.tokens from turn_usage u join messages m on m.id = u.message_id where m.external_id = %s"
    # What the model reported when it started: it had read the whole context.
    started = fake_anthropic.usages[-1]
    assert started["input_tokens"] + started["cache_creation_input_tokens"] > 0
    assert rows(database_url, query, fields["MessageSid"])[0][0] == sum(started.values())


# Keys that mean one thing, with the budget on.


def test_a_client_id_used_before_never_reaches_the_model_again_in_a_new_conversation(
    environment: pytest.MonkeyPatch, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    environment.setenv("SUPABASE_JWT_SECRET", JWT_SECRET)
    environment.setenv("TURNS_PER_MINUTE", "2")
    fake_anthropic.answer = lambda body: "Noted."
    web = app_client("web_chat")
    person = uuid.uuid4()
    first = web.post("/", json={"message": "one", "client_message_id": "reused"}, headers=bearer(person))
    second = web.post("/", json={"message": "two", "client_message_id": "other"}, headers=bearer(person))
    assert (first.status_code, second.status_code) == (200, 200)
    assert len(fake_anthropic.requests) == 2
    for streamed in (False, True):
        for _ in range(5):
            created = web.post("/conversations", headers=bearer(person))
            assert created.status_code == 201
            conversation = created.get_json()["id"]
            body = {"message": "sneak", "client_message_id": "reused", "conversation_id": conversation}
            headers = {**bearer(person), "Accept": "text/event-stream"} if streamed else bearer(person)
            again = web.post("/", json=body, headers=headers)
            # One id is one message of the person's: refused before any stream, nothing stored.
            assert (again.status_code, again.get_json()["error"]) == (409, "message_id_in_another_conversation")
    assert len(fake_anthropic.requests) == 2
    assert rows(database_url, "select count(*) from messages where content = 'sneak' and user_id = %s", person) == [
        (0,)
    ]
    assert rows(database_url, "select count(*) from messages where external_id = 'reused'") == [(1,)]
    over = web.post("/", json={"message": "three", "client_message_id": "new"}, headers=bearer(person))
    assert over.status_code == 429
    assert len(fake_anthropic.requests) == 2


# Consent before history moves, one parser for codes, and the small ones.


def web_and_telegram(environment: pytest.MonkeyPatch) -> tuple[Any, Any]:
    environment.setenv("SUPABASE_JWT_SECRET", JWT_SECRET)
    environment.setenv("TELEGRAM_BOT_USERNAME", "advisor_bot")
    return app_client("web_chat"), app_client("telegram_webhook")


def test_one_tap_on_someone_elses_deep_link_moves_nothing_until_the_chat_consents(
    environment: pytest.MonkeyPatch, database_url: str, fake_anthropic: FakeAnthropic, fake_telegram: FakeTelegram
) -> None:
    web, telegram = web_and_telegram(environment)
    victim = 610000000 + uuid.uuid4().int % 10**7
    said = telegram.post("/", json=update("My card PIN is 4417", user_id=victim), headers=TELEGRAM_HEADERS)
    assert said.status_code == 200
    attacker = uuid.uuid4()
    code = web.post("/links", headers=bearer(attacker, email="mallory@example.net")).get_json()["code"]

    tapped = telegram.post("/", json=update(f"/start {code}", user_id=victim), headers=TELEGRAM_HEADERS)
    assert tapped.status_code == 200
    assert fake_telegram.sent()[-1]["text"].startswith(
        "This code would join this chat to the web account m•••@example.net, and move what we have said here"
        " (2 messages)"
    )
    assert rows(database_url, "select count(*) from messages where user_id = %s", attacker) == [(0,)]
    later = telegram.post("/", json=update("And my locker is 12", user_id=victim), headers=TELEGRAM_HEADERS)
    assert later.status_code == 200
    assert rows(database_url, "select count(*) from messages where user_id = %s", attacker) == [(0,)]
    assert web.get("/memory", headers=bearer(attacker)).status_code == 200
    # The code is not spent by asking: typed, it is consent.
    typed = telegram.post("/", json=update(f"/link {code}", user_id=victim), headers=TELEGRAM_HEADERS)
    assert typed.status_code == 200
    assert fake_telegram.sent()[-1]["text"].startswith("Linked to the web account m•••@example.net!")
    assert rows(database_url, "select count(*) from messages where user_id = %s", attacker) == [(4,)]


def test_a_chat_with_no_messages_links_at_once_with_one_tap(
    environment: pytest.MonkeyPatch, database_url: str, fake_telegram: FakeTelegram
) -> None:
    web, telegram = web_and_telegram(environment)
    person, chat = uuid.uuid4(), 620000000 + uuid.uuid4().int % 10**7
    code = web.post("/links", headers=bearer(person)).get_json()["code"]
    assert telegram.post("/", json=update(f"/start {code}", user_id=chat), headers=TELEGRAM_HEADERS).status_code == 200
    assert fake_telegram.sent()[-1] == {
        "chat_id": chat,
        "text": "Linked to the web account u•••@example.com! This chat and that account now share one "
        "conversation: what you say here, I remember there, and the other way round.",
    }
    assert rows(database_url, "select user_id from identities where external_id = %s", str(chat)) == [(person,)]


def test_a_code_typed_with_spaces_on_whatsapp_links_and_is_never_stored(
    environment: pytest.MonkeyPatch, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    environment.setenv("SUPABASE_JWT_SECRET", JWT_SECRET)
    environment.setenv("TWILIO_AUTH_TOKEN", TWILIO_TOKEN)
    environment.setenv("PUBLIC_BASE_URL", PUBLIC_BASE_URL)
    person, number = uuid.uuid4(), f"whatsapp:+3466{uuid.uuid4().int % 10**7:07d}"
    code = app_client("web_chat").post("/links", headers=bearer(person)).get_json()["code"]
    spaced = f"link {code[:3]} {code[3:6].lower()} {code[6:]}"
    fields = form(spaced, sender=number)
    answered = app_client("whatsapp_webhook").post("/", data=fields, headers=signed(fields))
    assert messages_of(answered.text)[0].startswith("Linked to the web account u•••@example.com!")
    assert fake_anthropic.requests == []
    # the code's three parts in order: three of its characters alone are in other tests' messages
    stored = f"%{code[:3]}%{code[3:6]}%{code[6:]}%"
    assert rows(database_url, "select count(*) from messages where content ilike %s", stored) == [(0,)]
    assert rows(database_url, "select user_id from identities where external_id = %s", number[9:]) == [(person,)]


def test_deleting_a_missing_or_someone_elses_conversation_keeps_the_notes(
    environment: pytest.MonkeyPatch, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    environment.setenv("SUPABASE_JWT_SECRET", JWT_SECRET)
    web = app_client("web_chat")
    person, other = uuid.uuid4(), uuid.uuid4()
    theirs = web.post("/", json={"message": "theirs"}, headers=bearer(other)).get_json()["conversation_id"]
    for who in (person, other):
        execute(
            database_url,
            "insert into memory_notes (user_id, content, revision, written_at)"
            " values (%s, 'Sister: Carmen.', 1, now())",
            who,
        )
    for missing in (str(uuid.uuid4()), theirs, str(uuid.uuid4())):
        deleted = web.delete(f"/conversations/{missing}", headers=bearer(person))
        assert deleted.status_code == 404
    assert rows(database_url, "select content from memory_notes where user_id = %s", person) == [("Sister: Carmen.",)]
    assert rows(database_url, "select count(*) from messages where user_id = %s", other) == [(2,)]


def test_linking_two_people_whose_notes_are_both_full_folds_them_within_the_limit(
    environment: pytest.MonkeyPatch, database_url: str, fake_anthropic: FakeAnthropic, fake_telegram: FakeTelegram
) -> None:
    web, telegram = web_and_telegram(environment)
    person, chat = uuid.uuid4(), 630000000 + uuid.uuid4().int % 10**7
    assert telegram.post("/", json=update("hello", user_id=chat), headers=TELEGRAM_HEADERS).status_code == 200
    chat_person = rows(database_url, "select user_id from identities where external_id = %s", str(chat))[0][0]
    full = "x" * 40000  # 8,000 tokens of notes (MEMORY_NOTES_MAX_TOKENS' maximum) at five characters a token
    for who in (person, chat_person):
        execute(
            database_url,
            "insert into memory_notes (user_id, content, revision, written_at) values (%s, %s, 1, now())",
            who,
            full,
        )
    code = web.post("/links", headers=bearer(person)).get_json()["code"]
    assert telegram.post("/", json=update(f"/link {code}", user_id=chat), headers=TELEGRAM_HEADERS).status_code == 200
    assert fake_telegram.sent()[-1]["text"].startswith("Linked to the web account")
    notes = rows(database_url, "select char_length(content), pending_fold from memory_notes where user_id = %s", person)
    assert notes == [(64000, True)]


def test_the_scheduled_job_answers_an_owed_telegram_message_through_the_bot_api(
    environment: pytest.MonkeyPatch,
    job_database: str,
    fake_anthropic: FakeAnthropic,
    fake_telegram: FakeTelegram,
) -> None:
    environment.setenv("DIGEST_SECRET", DIGEST["X-Digest-Secret"])
    environment.setenv("MEMORY_NOTES", "false")
    fake_anthropic.behaviour = "500"
    delivery = update("Did I pay the electricity bill?", user_id=640000001)
    assert app_client("telegram_webhook").post("/", json=delivery, headers=TELEGRAM_HEADERS).status_code == 200
    assert [m["text"] for m in fake_telegram.sent()] == [
        "Sorry, I can't think straight right now. I have your message and will remember it; "
        "please try again in a moment."
    ]
    fake_anthropic.behaviour = "ok"
    fake_anthropic.answer = lambda body: "Yes, on Monday."
    job = app_client("memory_digest").post("/", headers=DIGEST)
    assert (job.get_json()["owed_answered"], job.get_json()["owed_failed"]) == (1, 0)
    assert fake_telegram.sent()[-1] == {"chat_id": 640000001, "text": "Yes, on Monday."}
    assert stored_turn(job_database, str(delivery["update_id"])) == [
        ("user", "Did I pay the electricity bill?"),
        ("assistant", "Yes, on Monday."),
    ]
    again = app_client("memory_digest").post("/", headers=DIGEST)
    assert again.get_json()["owed_answered"] == 0
    assert len(fake_telegram.sent()) == 2


def test_an_owed_message_whose_sender_cannot_be_reached_is_skipped_and_the_others_answered(
    environment: pytest.MonkeyPatch,
    job_database: str,
    fake_anthropic: FakeAnthropic,
    fake_telegram: FakeTelegram,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 30: one malformed owed row (a Telegram sender that is not a chat id) made the whole
    job raise, and every other person's owed reply waited behind it."""
    environment.setenv("DIGEST_SECRET", DIGEST["X-Digest-Secret"])
    environment.setenv("MEMORY_NOTES", "false")
    fake_anthropic.behaviour = "500"
    broken, fine = update("Is it broken?", user_id=640000011), update("Is it fine?", user_id=640000012)
    telegram = app_client("telegram_webhook")
    for delivery in (broken, fine):
        assert telegram.post("/", json=delivery, headers=TELEGRAM_HEADERS).status_code == 200
    execute(job_database, "update messages set sender = 'not-a-chat' where external_id = %s", str(broken["update_id"]))
    sent = len(fake_telegram.sent())
    fake_anthropic.behaviour = "ok"
    fake_anthropic.answer = lambda body: "Yes, it is."
    with caplog.at_level(logging.ERROR, logger="crossmem.owed"):
        job = app_client("memory_digest").post("/", headers=DIGEST)
    assert job.status_code == 200
    assert (job.get_json()["owed_answered"], job.get_json()["owed_failed"]) == (1, 1)
    assert fake_telegram.sent()[sent:] == [{"chat_id": 640000012, "text": "Yes, it is."}]
    assert stored_turn(job_database, str(fine["update_id"])) == [("user", "Is it fine?"), ("assistant", "Yes, it is.")]
    assert stored_turn(job_database, str(broken["update_id"])) == [("user", "Is it broken?")]
    skipped = [r for r in caplog.records if r.getMessage().startswith("an owed message could not be answered")]
    assert len(skipped) == 1 and skipped[0].__dict__["surface"] == "telegram"


def test_while_the_model_is_down_the_job_sends_nothing_and_the_next_run_tries_another_first(
    environment: pytest.MonkeyPatch, job_database: str, fake_anthropic: FakeAnthropic, fake_twilio: FakeTwilio
) -> None:
    owed_environment(environment, fake_twilio)
    whatsapp = app_client("whatsapp_webhook")
    fake_anthropic.behaviour = "500"
    first, second, third = (
        form("first question", sender=f"whatsapp:+3470{uuid.uuid4().int % 10**7:07d}"),
        form("second question", sender=f"whatsapp:+3471{uuid.uuid4().int % 10**7:07d}"),
        form("third question", sender=f"whatsapp:+3472{uuid.uuid4().int % 10**7:07d}"),
    )
    for fields in (first, second, third):
        assert whatsapp.post("/", data=fields, headers=signed(fields)).status_code == 200
    asked = len(fake_anthropic.requests)
    down = app_client("memory_digest").post("/", headers=DIGEST).get_json()
    # The model failing for two people in a row is down for everyone: the run ends there (core/turn/owed.py).
    assert (down["owed_answered"], down["owed_failed"]) == (0, 2)
    assert len(fake_anthropic.requests) == asked + 2
    assert fake_twilio.messages == []  # they had the fallback already: no apology every minute
    fake_anthropic.answer = lambda body: "Answered."
    fake_anthropic.behaviour = "ok"
    up = app_client("memory_digest").post("/", headers=DIGEST).get_json()
    assert (up["owed_answered"], up["owed_failed"]) == (3, 0)
    # The ones that failed went behind the one not tried yet.
    assert [m["To"] for m in fake_twilio.messages] == [third["From"], first["From"], second["From"]]


# No answer after answer_by (issue 30, finding 1).


class FakeClock:
    """The first attempt's clock (time.monotonic's stand-in, shared by its turn and its bot):
    time passes only when the model thinks or the bot waits; `meanwhile` runs while it waits."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []
        self.meanwhile: list[Callable[[], None]] = []

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds
        for happening in self.meanwhile:
            happening()


def first_attempt(clock: FakeClock) -> tuple[Turns, TelegramBot]:
    """The webhook's turn and bot as functions/telegram.py builds them, on the fake clock."""
    bot = TelegramBot(BOT_TOKEN, runtime.settings().telegram_api_base, clock=clock, sleep=clock.sleep)
    settings = TurnSettings("be brief", "FALLBACK", "NO", memory_notes=False)
    return Turns(runtime.memory(), runtime.model, runtime.identity(), settings, clock=clock), bot


def test_a_reply_held_up_by_a_429_past_answer_by_is_not_sent_late_and_the_message_is_answered_once(
    environment: pytest.MonkeyPatch,
    job_database: str,
    fake_anthropic: FakeAnthropic,
    fake_telegram: FakeTelegram,
) -> None:
    """The repro: the model answers at 5 s (inside TELEGRAM_MODEL_DEADLINE's 25 s), sendMessage
    gets a 429 with retry_after 41, which ends inside the channel's 50 s; meanwhile the message
    is owed (its answer_by, 35 s) and the scheduled job runs. On 8281e8c the bot waited the 41 s,
    the job answered, and the first attempt sent too: two answers to one message."""
    environment.setenv("DIGEST_SECRET", DIGEST["X-Digest-Secret"])
    environment.setenv("MEMORY_NOTES", "false")
    job, telegram = app_client("memory_digest"), app_client("telegram_webhook")
    clock = FakeClock()
    answers = iter(["Your train leaves at 8:15.", "The 8:15 train, from platform 4."])

    def thinking(body: dict[str, Any]) -> str:
        if clock.now == 1000.0:
            clock.advance(5.0)  # the first attempt's model
        return next(answers)

    fake_anthropic.answer = thinking
    delivery = update("When does my train leave?", user_id=640000021)
    update_id = str(delivery["update_id"])
    jobs: list[dict[str, Any]] = []

    def the_job_runs() -> None:
        pass_the_deadline(job_database, update_id)
        jobs.append(job.post("/", headers=DIGEST).get_json())

    clock.meanwhile.append(the_job_runs)
    fake_telegram.fail_with("too_many_requests", times=1)  # retry after 41 s
    turns, bot = first_attempt(clock)
    request = TurnRequest(
        Surface.TELEGRAM, "When does my train leave?", update_id, sender_id="640000021", deadline_s=25.0
    )
    channel = TelegramChannel(bot, 640000021, clock() + REPLY_DEADLINE_S, draft_id=int(update_id))
    result = turns.run(request, channel)
    bot.close()
    the_job_runs()  # 35 s: the message's answer_by
    telegram.post("/", json=delivery, headers=TELEGRAM_HEADERS)  # Telegram redelivers (the webhook answered 503)

    assert fake_telegram.sent() == [{"chat_id": 640000021, "text": "Your train leaves at 8:15."}]
    assert len(fake_anthropic.requests) == 1
    assert stored_turn(job_database, update_id) == [
        ("user", "When does my train leave?"),
        ("assistant", "Your train leaves at 8:15."),
    ]
    assert rows(job_database, "select count(*) from messages where delivered_at is not null") == [(1,)]
    # The 41 s would have ended past the attempt's time: not waited. Its reply, stored before
    # answer_by and owed a send, is sent by whichever comes first, here the job; the redelivery
    # then finds it delivered.
    assert clock.slept == [] and result.reply_owed
    assert [(run["owed_answered"], run["owed_failed"]) for run in jobs] == [(1, 0)]


def test_an_attempt_whose_time_ran_out_before_it_sent_hands_the_message_over_and_it_is_answered_once(
    environment: pytest.MonkeyPatch,
    job_database: str,
    fake_anthropic: FakeAnthropic,
    fake_telegram: FakeTelegram,
) -> None:
    """The answer comes when the attempt can no longer send it before its answer_by (less the time
    to store it): it is neither sent nor stored, the attempt ends and the message is owed at once;
    the job answers it, and Telegram's redelivery (the webhook answered 503) finds it answered."""
    environment.setenv("DIGEST_SECRET", DIGEST["X-Digest-Secret"])
    environment.setenv("MEMORY_NOTES", "false")
    job, telegram = app_client("memory_digest"), app_client("telegram_webhook")
    clock = FakeClock()
    answers = iter(["Too late to say.", "Yes, the gym opens at 7."])

    def thinking(body: dict[str, Any]) -> str:
        if clock.now == 1000.0:
            clock.advance(34.0)  # past the attempt's 25 + 10 - 2 s
        return next(answers)

    fake_anthropic.answer = thinking
    delivery = update("Is the gym open early?", user_id=640000022)
    update_id = str(delivery["update_id"])
    turns, bot = first_attempt(clock)
    request = TurnRequest(Surface.TELEGRAM, "Is the gym open early?", update_id, sender_id="640000022", deadline_s=25.0)
    result = turns.run(request, TelegramChannel(bot, 640000022, clock() + REPLY_DEADLINE_S))
    bot.close()

    assert result.reply_owed and result.reply_id is None
    assert fake_telegram.sent() == [] and fake_telegram.refused == []
    assert stored_turn(job_database, update_id) == [("user", "Is the gym open early?")]

    run = job.post("/", headers=DIGEST).get_json()  # owed at once: no answer_by to wait for
    assert (run["owed_answered"], run["owed_failed"]) == (1, 0)
    again = telegram.post("/", json=delivery, headers=TELEGRAM_HEADERS)
    assert again.get_json() == {"ok": True, "outcome": "duplicate"}
    assert fake_telegram.sent() == [{"chat_id": 640000022, "text": "Yes, the gym opens at 7."}]
    assert stored_turn(job_database, update_id) == [
        ("user", "Is the gym open early?"),
        ("assistant", "Yes, the gym opens at 7."),
    ]
    assert len(fake_anthropic.requests) == 2
