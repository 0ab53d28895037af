"""Bugs that once went unnoticed (issue #23), through the real functions: each test here fails
for its bug when run alone.

A message of exactly MAX_MESSAGE_CHARS is stored on every surface and one more is refused;
a WhatsApp signature covers the query string of the URL Twilio called; a Telegram (or digest)
secret is accepted whole and only whole; the offline digest of a deployment keeps the notes
within MEMORY_NOTES_MAX_TOKENS.
"""

from __future__ import annotations

import uuid

import psycopg
import pytest

from core.memory.digest import read_notes
from core.model.llm import approximate_tokens
from core.models import Person, Surface
from functions import runtime
from tests.fakes.anthropic_api import FakeAnthropic
from tests.fakes.telegram_api import FakeTelegram
from tests.helpers import (
    JWT_SECRET,
    PUBLIC_BASE_URL,
    TELEGRAM_SECRET,
    TWILIO_TOKEN,
    app_client,
    bearer,
    form,
    messages_of,
    signed,
    update,
)

LIMIT = 50
DIGEST_SECRET = "digest-secret-for-tests"


def user_messages(database_url: str, user: uuid.UUID | None = None, external_id: str | None = None) -> list[str]:
    """The stored user messages of a person, or of one delivery."""
    with psycopg.connect(database_url) as connection:
        rows = connection.execute(
            """select content from messages
                where role = 'user' and (user_id = %s or external_id = %s) order by id""",
            (user, external_id),
        ).fetchall()
    return [str(row[0]) for row in rows]


# --- MAX_MESSAGE_CHARS: exactly the limit is stored, one more is refused --------------------


def test_the_web_stores_a_message_of_exactly_the_limit_and_refuses_one_more(
    environment: pytest.MonkeyPatch, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    environment.setenv("MAX_MESSAGE_CHARS", str(LIMIT))
    environment.setenv("SUPABASE_JWT_SECRET", JWT_SECRET)
    client = app_client("web_chat")
    person = uuid.uuid4()
    exact = client.post("/", json={"message": "w" * LIMIT}, headers=bearer(person))
    assert exact.status_code == 200, exact.get_json()
    over = client.post("/", json={"message": "w" * (LIMIT + 1)}, headers=bearer(person))
    assert (over.status_code, over.get_json()["error"]) == (413, "message_too_long")
    assert user_messages(database_url, person) == ["w" * LIMIT]


def test_telegram_stores_a_message_of_exactly_the_limit_and_refuses_one_more(
    environment: pytest.MonkeyPatch, database_url: str, fake_telegram: FakeTelegram, fake_anthropic: FakeAnthropic
) -> None:
    environment.setenv("MAX_MESSAGE_CHARS", str(LIMIT))
    client = app_client("telegram_webhook")
    headers = {"X-Telegram-Bot-Api-Secret-Token": TELEGRAM_SECRET}
    exact, over = update("t" * LIMIT), update("t" * (LIMIT + 1))
    assert client.post("/", json=exact, headers=headers).status_code == 200
    assert user_messages(database_url, external_id=str(exact["update_id"])) == ["t" * LIMIT]
    assert len(fake_anthropic.requests) == 1
    assert client.post("/", json=over, headers=headers).status_code == 200
    assert user_messages(database_url, external_id=str(over["update_id"])) == []
    assert fake_telegram.sent()[-1]["text"] == (
        f"Sorry, I couldn't take that message: the message has {LIMIT + 1} characters; the limit is {LIMIT}."
    )


def test_whatsapp_stores_a_message_of_exactly_the_limit_and_refuses_one_more(
    environment: pytest.MonkeyPatch, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    environment.setenv("MAX_MESSAGE_CHARS", str(LIMIT))
    environment.setenv("TWILIO_AUTH_TOKEN", TWILIO_TOKEN)
    environment.setenv("PUBLIC_BASE_URL", PUBLIC_BASE_URL)
    client = app_client("whatsapp_webhook")
    exact, over = form("m" * LIMIT), form("m" * (LIMIT + 1))
    answered = client.post("/", data=exact, headers=signed(exact, PUBLIC_BASE_URL))
    assert answered.status_code == 200
    assert user_messages(database_url, external_id=exact["MessageSid"]) == ["m" * LIMIT]
    refused = client.post("/", data=over, headers=signed(over, PUBLIC_BASE_URL))
    assert refused.status_code == 200
    assert messages_of(refused.get_data(as_text=True)) == [
        f"Sorry, I couldn't take that message: the message has {LIMIT + 1} characters; the limit is {LIMIT}."
    ]
    assert user_messages(database_url, external_id=over["MessageSid"]) == []


# --- the WhatsApp signature covers the query string -----------------------------------------


def test_a_whatsapp_signature_covers_the_query_string_of_the_url_twilio_called(
    environment: pytest.MonkeyPatch, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    environment.setenv("TWILIO_AUTH_TOKEN", TWILIO_TOKEN)
    environment.setenv("PUBLIC_BASE_URL", PUBLIC_BASE_URL)
    client = app_client("whatsapp_webhook")
    query = "tenant=main&v=2"

    with_query = form("signed with the query")
    response = client.post(f"/?{query}", data=with_query, headers=signed(with_query, f"{PUBLIC_BASE_URL}?{query}"))
    assert response.status_code == 200, response.get_data(as_text=True)
    assert user_messages(database_url, external_id=with_query["MessageSid"]) == ["signed with the query"]

    without_query = form("signed without the query")
    response = client.post(f"/?{query}", data=without_query, headers=signed(without_query, PUBLIC_BASE_URL))
    assert response.status_code == 403, "a signature of the URL without its query string was accepted"
    assert user_messages(database_url, external_id=without_query["MessageSid"]) == []


# --- a secret is accepted whole, and only whole -----------------------------------------------


@pytest.mark.parametrize("kind", ["empty", "first-character", "prefix", "secret-and-more"])
def test_telegram_refuses_a_secret_token_that_is_not_the_whole_secret(
    environment: pytest.MonkeyPatch, database_url: str, fake_anthropic: FakeAnthropic, kind: str
) -> None:
    given = {
        "empty": "",
        "first-character": TELEGRAM_SECRET[:1],
        "prefix": TELEGRAM_SECRET[:-1],
        "secret-and-more": TELEGRAM_SECRET + "x",
    }[kind]
    client = app_client("telegram_webhook")
    body = update("let me in")
    refused = client.post("/", json=body, headers={"X-Telegram-Bot-Api-Secret-Token": given})
    assert refused.status_code == 401, f"the secret token {given!r} was accepted"
    assert user_messages(database_url, external_id=str(body["update_id"])) == []
    assert fake_anthropic.requests == []
    accepted = client.post("/", json=body, headers={"X-Telegram-Bot-Api-Secret-Token": TELEGRAM_SECRET})
    assert accepted.status_code == 200
    assert user_messages(database_url, external_id=str(body["update_id"])) == ["let me in"]


@pytest.mark.parametrize("kind", ["empty", "first-character", "prefix", "secret-and-more"])
def test_the_digest_refuses_a_secret_that_is_not_the_whole_secret(environment: pytest.MonkeyPatch, kind: str) -> None:
    given = {
        "empty": "",
        "first-character": DIGEST_SECRET[:1],
        "prefix": DIGEST_SECRET[:-1],
        "secret-and-more": DIGEST_SECRET + "x",
    }[kind]
    environment.setenv("DIGEST_SECRET", DIGEST_SECRET)
    environment.setenv("MEMORY_NOTES", "false")  # the run itself is not what this is about
    client = app_client("memory_digest")
    refused = client.post("/", headers={"X-Digest-Secret": given})
    assert refused.status_code == 401, f"the digest secret {given!r} was accepted"
    assert refused.get_json()["error"] == "unauthorized"
    assert client.post("/", headers={"X-Digest-Secret": DIGEST_SECRET}).status_code == 200


# --- the offline digest of a deployment keeps to MEMORY_NOTES_MAX_TOKENS ---------------------


def test_a_deployment_without_a_key_cuts_the_notes_to_memory_notes_max_tokens(
    environment: pytest.MonkeyPatch, database_url: str
) -> None:
    environment.delenv("ANTHROPIC_API_KEY")
    environment.setenv("ALLOW_OFFLINE_MODEL", "true")
    environment.setenv("MEMORY_NOTES_MAX_TOKENS", "50")
    environment.setenv("CONTEXT_MAX_MESSAGES", "4")
    environment.setenv("CONTEXT_WINDOW_STEP", "2")
    environment.setenv("DIGEST_PAUSE_SECONDS", "0")
    runtime.reset()
    memory = runtime.memory()
    person = uuid.uuid4()
    texts = [f"weather report {k}: " + "cloudy and mild, " * 6 for k in range(6)]  # ~120 characters each
    for text in texts:  # 12 messages: 8 have left the window of 4
        start = memory.begin_turn(Person(user_id=person), Surface.TELEGRAM, text, uuid.uuid4().hex)
        assert start.message_id is not None
        memory.finish_turn(person, start.message_id, f"reply to {text}")
    job = runtime.digest_job()
    assert job.run(person).updated == 1
    notes = read_notes(runtime.store(), person).content
    assert approximate_tokens(notes) <= 50, f"notes of {len(notes)} characters for MEMORY_NOTES_MAX_TOKENS=50"
    # A line takes at most a quarter of the budget: the four digested messages, each cut, in order.
    lines = notes.split("\n")
    assert [line.split("] ", 1)[1][:17] for line in lines] == [f"weather report {k}:" for k in range(4)]
    assert all(line.startswith("- [telegram · ") and line.endswith("…") for line in lines)
