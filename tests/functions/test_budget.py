"""The budget through the real functions: a polite answer on every app, no model call."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from datetime import UTC, timedelta
from zoneinfo import ZoneInfo

import psycopg
import pytest
from flask.testing import FlaskClient

from tests.fakes.anthropic_api import FakeAnthropic
from tests.fakes.telegram_api import FakeTelegram
from tests.helpers import (
    JWT_SECRET,
    PUBLIC_BASE_URL,
    TELEGRAM_HEADERS,
    TWILIO_TOKEN,
    app_client,
    bearer,
    form,
    messages_of,
    rows,
    signed,
    stored_with_external_id,
    update,
)

POLITE = "You've written a lot in a short time, so I'm taking a pause. You can write again in "


@pytest.fixture
def budget_of_two(environment: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    environment.setenv("TURNS_PER_MINUTE", "2")
    environment.setenv("SUPABASE_JWT_SECRET", JWT_SECRET)
    environment.setenv("TWILIO_AUTH_TOKEN", TWILIO_TOKEN)
    environment.setenv("PUBLIC_BASE_URL", PUBLIC_BASE_URL)
    return environment


def test_telegram_past_the_budget_gets_a_polite_answer_and_nothing_is_stored(
    budget_of_two: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic, fake_telegram: FakeTelegram, database_url: str
) -> None:
    client = app_client("telegram_webhook")
    chat = 700000000 + uuid.uuid4().int % 10**6
    first = uuid.uuid4().int % 10**9  # update ids are unique for the whole bot, across tests too
    for update_id in (first, first + 1):
        assert client.post("/", json=update("hi", update_id, user_id=chat), headers=TELEGRAM_HEADERS).status_code == 200
    asked = len(fake_anthropic.requests)
    response = client.post("/", json=update("and again", first + 2, user_id=chat), headers=TELEGRAM_HEADERS)
    assert response.status_code == 200
    assert len(fake_anthropic.requests) == asked
    assert fake_telegram.sent()[-1]["chat_id"] == chat and fake_telegram.sent()[-1]["text"].startswith(POLITE)
    assert stored_with_external_id(database_url, str(first + 2)) == 0


def test_the_web_past_the_budget_is_429_with_the_polite_answer(
    budget_of_two: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic, database_url: str
) -> None:
    client, person = app_client("web_chat"), uuid.uuid4()
    for index in range(2):
        sent = client.post("/", json={"message": "hi", "client_message_id": f"b-{index}"}, headers=bearer(person))
        assert sent.status_code == 200
    asked = len(fake_anthropic.requests)
    [(first_at,)] = rows(database_url, "select min(at) from turn_usage where user_id = %s", person)
    for accept in ("application/json", "text/event-stream"):
        headers = {**bearer(person), "Accept": accept}
        refused = client.post("/", json={"message": "more", "client_message_id": "b-3"}, headers=headers)
        assert refused.status_code == 429
        assert refused.get_json()["error"] == "over_budget"
        assert refused.get_json()["message"].startswith(POLITE)
        # when the first turn leaves the minute: for a page to say on its own clock, and to wait for
        assert refused.get_json()["until"] == (first_at + timedelta(minutes=1)).astimezone(UTC).isoformat()
        waits = refused.get_json()["message"].removeprefix(POLITE).removesuffix(" seconds.")
        assert refused.headers["Retry-After"] == waits and 0 < int(waits) <= 60
    assert len(fake_anthropic.requests) == asked and stored_with_external_id(database_url, "b-3") == 0


def test_the_webs_pause_is_said_on_the_persons_clock(
    environment: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic, database_url: str
) -> None:
    """A person in Kolkata (their browser said so, their stored zone) past TURNS_PER_DAY on the web:
    the page said the day and hour on UTC's clock ("after 21:30 UTC": 03:00 on another day for
    them, "tomorrow" or not by UTC's midnight), while their tags and reminders, and the same pause on
    Telegram, are on their own clock."""
    environment.setenv("TURNS_PER_DAY", "1")
    environment.setenv("SUPABASE_JWT_SECRET", JWT_SECRET)
    client, person = app_client("web_chat"), uuid.uuid4()
    first = {"message": "hi", "client_message_id": "k-1", "timezone": "Asia/Kolkata"}
    assert client.post("/", json=first, headers=bearer(person)).status_code == 200
    [(first_at,)] = rows(database_url, "select min(at) from turn_usage where user_id = %s", person)
    again = {"message": "more", "client_message_id": "k-2", "timezone": "Asia/Kolkata"}
    refused = client.post("/", json=again, headers=bearer(person))
    assert refused.status_code == 429
    until = (first_at + timedelta(days=1)).astimezone(ZoneInfo("Asia/Kolkata"))
    assert refused.get_json()["message"] == (
        f"You've written a lot in a short time, so I'm taking a pause. You can write again tomorrow after"
        f" {until:%H:%M} (Asia/Kolkata)."
    )


def test_whatsapp_past_the_budget_gets_a_polite_answer(
    budget_of_two: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic, database_url: str
) -> None:
    client, number = app_client("whatsapp_webhook"), f"whatsapp:+3461{uuid.uuid4().int % 10**7:07d}"
    for _ in range(2):
        fields = form("hello", sender=number)
        assert client.post("/", data=fields, headers=signed(fields)).status_code == 200
    asked = len(fake_anthropic.requests)
    fields = form("and more", sender=number)
    response = client.post("/", data=fields, headers=signed(fields))
    assert response.status_code == 200
    [answer] = messages_of(response.text)
    assert answer.startswith(POLITE) and len(fake_anthropic.requests) == asked
    assert stored_with_external_id(database_url, fields["MessageSid"]) == 0


def test_the_models_tokens_count_against_the_day(
    environment: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic, database_url: str
) -> None:
    environment.setenv("SUPABASE_JWT_SECRET", JWT_SECRET)
    environment.setenv("TOKENS_PER_DAY", "1000")
    client, person = app_client("web_chat"), uuid.uuid4()
    assert client.post("/", json={"message": "hi"}, headers=bearer(person)).status_code == 200
    with psycopg.connect(database_url) as connection:
        row = connection.execute("select tokens from turn_usage where user_id = %s", (person,)).fetchone()
    # The system prompt alone is over a thousand tokens: what the fake model reported is recorded.
    assert row is not None and row[0] > 1000
    refused = client.post("/", json={"message": "again"}, headers=bearer(person))
    assert (refused.status_code, refused.get_json()["error"]) == (429, "over_budget")


def three_turns_a_day(
    environment: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic
) -> tuple[Callable[[str], None], FlaskClient]:
    """TURNS_PER_DAY=3: a new Telegram chat's `say` (each update answered 200) and the web."""
    environment.setenv("TURNS_PER_DAY", "3")
    environment.setenv("SUPABASE_JWT_SECRET", JWT_SECRET)
    environment.setenv("TELEGRAM_DRAFTS", "false")
    fake_anthropic.answer = lambda body: "Noted."
    chat = 710000000 + uuid.uuid4().int % 10**6
    telegram = app_client("telegram_webhook")

    def say(text: str) -> None:
        assert telegram.post("/", json=update(text, user_id=chat), headers=TELEGRAM_HEADERS).status_code == 200

    return say, app_client("web_chat")


def test_linking_and_unlinking_a_chat_again_and_again_never_starts_a_new_day(
    environment: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic, fake_telegram: FakeTelegram, database_url: str
) -> None:
    """A linked chat counts with its web account; unlinked, it leaves with what it spent today. Four
    rounds of four messages, `/link CODE`, four more, `/unlink`: three turns in all reach the model."""
    web_person = uuid.uuid4()
    say, web = three_turns_a_day(environment, fake_anthropic)

    asked = len(fake_anthropic.requests)
    for round_ in range(4):
        for index in range(4):
            say(f"Round {round_}, note {index}")
        code = web.post("/links", headers=bearer(web_person)).get_json()["code"]
        say(f"/link {code}")
        for index in range(4):
            say(f"Round {round_}, linked note {index}")
        # Linked, the chat's turns are the web account's: its own message waits too.
        linked = web.post(
            "/", json={"message": "hi", "client_message_id": f"linked-{round_}"}, headers=bearer(web_person)
        )
        assert linked.status_code == 429
        say("/unlink")
    assert len(fake_anthropic.requests) - asked == 3
    last_note = fake_telegram.sent()[-2]["text"]  # before /unlink's answer
    assert last_note.startswith("You've written a lot in a short time, so I'm taking a pause. You can write again ")
    # Unlinked, the web account is a person of its own again, with the day it spent itself: none.
    alone = web.post("/", json={"message": "hi", "client_message_id": "after-links"}, headers=bearer(web_person))
    assert alone.status_code == 200


def test_a_turn_through_the_function_settles_its_reservation_to_what_the_model_reported(
    environment: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 30, finding 3: the web function's turn reserves when it starts (its log line says how
    much) and leaves in the person's day exactly what the model reported, JSON or streamed."""
    environment.setenv("SUPABASE_JWT_SECRET", JWT_SECRET)
    environment.setenv("TOKENS_PER_DAY", "2000000")
    fake_anthropic.answer = lambda body: "Noted, and kept."
    caplog.set_level(logging.INFO, logger="crossmem.turn")
    client, person = app_client("web_chat"), uuid.uuid4()
    for index, accept in enumerate(("application/json", "text/event-stream")):
        headers = {**bearer(person), "Accept": accept}
        sent = client.post("/", json={"message": "remember this", "client_message_id": f"s-{index}"}, headers=headers)
        assert sent.status_code == 200
        sent.get_data()  # a stream is read to its end
    read = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
    reported = [sum(usage[key] for key in read) + len("Noted, and kept.") // 4 for usage in fake_anthropic.usages]
    with psycopg.connect(database_url) as connection:
        counted = connection.execute(
            "select tokens, reserved from turn_usage where user_id = %s order by at", (person,)
        ).fetchall()
    assert counted == [(reported[0], 0), (reported[1], 0)]
    lines = [record.__dict__ for record in caplog.records if record.getMessage() == "turn"]
    # at least the input it read and ANTHROPIC_MAX_TOKENS for its answer
    spent = ("input_tokens", "cache_creation_tokens", "cache_read_tokens")
    assert len(lines) == 2 and all(line["reserved_tokens"] > sum(line[key] for key in spent) + 4096 for line in lines)


def test_a_chat_linked_again_straight_after_unlinking_brings_its_day_back(
    environment: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic, fake_telegram: FakeTelegram, database_url: str
) -> None:
    """`/unlink`, then `/link CODE` before any other message: the day the chat spent, which left with
    it, comes back with it, as it does when its next message makes a person of its own."""
    web_person = uuid.uuid4()
    say, web = three_turns_a_day(environment, fake_anthropic)

    def link() -> None:
        say(f"/link {web.post('/links', headers=bearer(web_person)).get_json()['code']}")

    asked = len(fake_anthropic.requests)
    link()
    for round_ in range(3):
        for index in range(3):
            say(f"Round {round_}, note {index}")
        say("/unlink")
        link()
    assert len(fake_anthropic.requests) - asked == 3


@pytest.mark.parametrize("erase", ["/forget", "delete the thread"])
def test_a_chat_whose_thread_was_erased_leaves_with_its_day_when_unlinked(
    environment: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic, fake_telegram: FakeTelegram, erase: str
) -> None:
    """Unlinking takes the day the chat spent with it, found by the messages it counted: a chat whose
    messages were forgotten (`/forget confirm`) or deleted (the web's DELETE of its [Telegram] thread)
    before `/unlink` left its day with the web account and started a new one, three turns more each
    time (and forgetting gives no turns back)."""
    web_person = uuid.uuid4()
    say, web = three_turns_a_day(environment, fake_anthropic)
    say(f"/link {web.post('/links', headers=bearer(web_person)).get_json()['code']}")
    asked = len(fake_anthropic.requests)
    for index in range(3):
        say(f"Note {index}")
    if erase == "/forget":
        say("/forget")
        say("/forget confirm")
    else:
        [thread] = web.get("/conversations", headers=bearer(web_person)).get_json()["conversations"]
        assert web.delete(f"/conversations/{thread['id']}", headers=bearer(web_person)).status_code == 204
    say("/unlink")
    say("Note 3")
    assert len(fake_anthropic.requests) - asked == 3
    assert fake_telegram.sent()[-1]["text"].startswith("You've written a lot in a short time, so I'm taking a pause.")
    # The web account keeps the day it spent itself: none.
    assert web.post("/", json={"message": "hi"}, headers=bearer(web_person)).status_code == 200
