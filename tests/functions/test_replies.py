"""Replies end to end: the real functions, real Postgres, the fake Bot API, Twilio's signed forms
and the fake Anthropic. A reply shows the model the text it quotes beside the new message, even
when the message replied to left the context window a month ago, and keeps which stored message
it answers."""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

import pytest
from flask.testing import FlaskClient

from tests.fakes.anthropic_api import FakeAnthropic
from tests.helpers import (
    CORPUS,
    PUBLIC_BASE_URL,
    TELEGRAM_HEADERS,
    TWILIO_TOKEN,
    app_client,
    execute,
    form,
    messages_of,
    rows,
    sent_texts,
    signed,
    update,
)

CORPUS_CHAT = "1111111"  # the Telegram corpus's chat and sender (files 19 and 20)
CORPUS_NUMBER = "15555550101"  # the Twilio corpus's sender (files 04 and 10)
# The tag of a day's first message, its app named `app`: `[app · Sun 6 Dec 2026 · 09:12]`.
DATED = r"\[app · [A-Z][a-z]{2} \d{1,2} [A-Z][a-z]{2} \d{4} · \d\d:\d\d\]"


def reply_row(database_url: str, external_id: str) -> tuple[Any, ...]:
    """The stored message of a delivery: its content, quote and the stored message it answers."""
    found = rows(database_url, "select content, quoted, replied_to from messages where external_id = %s", external_id)
    assert len(found) == 1
    return found[0]


def message_id(database_url: str, platform_ref: str) -> int:
    found = rows(database_url, "select id from messages where platform_ref = %s and role = 'user'", platform_ref)
    assert len(found) == 1
    return int(found[0][0])


def a_month_ago(database_url: str, surface: str, sender: str) -> None:
    """Everything this sender's person said, and was answered, moved 30 days back."""
    execute(
        database_url,
        """update messages set created_at = created_at - interval '30 days'
            where user_id = (select user_id from identities where surface = %s and external_id = %s)""",
        surface,
        sender,
    )


@pytest.fixture
def chat() -> str:
    return str(620000000 + uuid.uuid4().int % 10**8)


@pytest.fixture
def number() -> str:
    return f"1555{uuid.uuid4().int % 10**7:07d}"


@pytest.fixture
def whatsapp(environment: pytest.MonkeyPatch) -> FlaskClient:
    environment.setenv("TWILIO_AUTH_TOKEN", TWILIO_TOKEN)
    environment.setenv("PUBLIC_BASE_URL", PUBLIC_BASE_URL)
    return app_client("whatsapp_webhook")


def test_a_telegram_reply_to_a_30_day_old_message_shows_the_model_the_quoted_text(
    environment: pytest.MonkeyPatch, chat: str, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    client = app_client("telegram_webhook")
    reply: dict[str, Any] = json.loads(
        (CORPUS / "telegram" / "19_private_reply_with_quote.json").read_text().replace(CORPUS_CHAT, chat)
    )
    reply["update_id"] = uuid.uuid4().int % 10**9
    replied = {"update_id": reply["update_id"] - 1, "message": reply["message"]["reply_to_message"]}
    assert client.post("/", json=replied, headers=TELEGRAM_HEADERS).status_code == 200
    a_month_ago(database_url, "telegram", chat)
    assert client.post("/", json=reply, headers=TELEGRAM_HEADERS).status_code == 200
    # The message replied to left the 24-hour window long ago: the quote is the model's only view of it.
    texts = sent_texts(fake_anthropic.requests[-1])
    assert len(texts) == 1
    quoted = r' \[replying to: "Edited"\] Reply with a quote'
    assert re.fullmatch(DATED + quoted, texts[0].replace("telegram", "app", 1))
    assert reply_row(database_url, str(reply["update_id"])) == (
        '[replying to: "Edited"] Reply with a quote',
        "Edited",
        message_id(database_url, f"{chat}:1365"),
    )


def test_a_telegram_reply_to_a_voice_note_quotes_what_memory_kept_of_it(
    environment: pytest.MonkeyPatch, chat: str, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    """A replied message with no text in the update (a voice note) is quoted from memory."""
    client = app_client("telegram_webhook")
    first = update("placeholder", user_id=int(chat))
    first["message"]["message_id"] = 700
    assert client.post("/", json=first, headers=TELEGRAM_HEADERS).status_code == 200
    execute(
        database_url,
        "update messages set content = '[voice note, 0:05] buy milk and eggs' where platform_ref = %s",
        f"{chat}:700",
    )
    a_month_ago(database_url, "telegram", chat)
    reply = update("and bread", user_id=int(chat))
    reply["message"]["message_id"] = 701
    voice_note = {**first["message"], "text": None, "voice": {"file_id": "voice-700", "duration": 5}}
    reply["message"]["reply_to_message"] = {key: value for key, value in voice_note.items() if value is not None}
    assert client.post("/", json=reply, headers=TELEGRAM_HEADERS).status_code == 200
    texts = sent_texts(fake_anthropic.requests[-1])
    assert len(texts) == 1
    assert texts[0].endswith('] [replying to: "[voice note, 0:05] buy milk and eggs"] and bread')
    assert reply_row(database_url, str(reply["update_id"]))[2] == message_id(database_url, f"{chat}:700")


def test_a_whatsapp_reply_to_a_30_day_old_message_shows_the_model_its_text(
    whatsapp: FlaskClient, number: str, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    fields: dict[str, str] = json.loads(
        (CORPUS / "twilio" / "10_reply_to_own_message.json").read_text().replace(CORPUS_NUMBER, number)
    )
    earlier = form(
        "The plumber comes on the 3rd, ask for Iñaki", fields["OriginalRepliedMessageSid"], f"whatsapp:+{number}"
    )
    assert whatsapp.post("/", data=earlier, headers=signed(earlier)).status_code == 200
    a_month_ago(database_url, "whatsapp", f"+{number}")
    response = whatsapp.post("/", data=fields, headers=signed(fields))
    assert response.status_code == 200
    texts = sent_texts(fake_anthropic.requests[-1])
    quoted = '[replying to: "The plumber comes on the 3rd, ask for Iñaki"] Nice'
    assert len(texts) == 1 and re.fullmatch(DATED + " " + re.escape(quoted), texts[0].replace("whatsapp", "app", 1))
    assert messages_of(response.text) == [f"Claude heard: {texts[0]}"]
    assert reply_row(database_url, fields["MessageSid"]) == (
        quoted,
        "The plumber comes on the 3rd, ask for Iñaki",
        message_id(database_url, fields["OriginalRepliedMessageSid"]),
    )
    # Redelivered, the reply is neither stored nor quoted twice.
    assert whatsapp.post("/", data=fields, headers=signed(fields)).status_code == 200
    assert len(fake_anthropic.requests) == 2
    assert rows(database_url, "select count(*) from messages where external_id = %s", fields["MessageSid"]) == [(1,)]


def test_a_whatsapp_reply_to_one_of_our_messages_quotes_nothing(
    whatsapp: FlaskClient, number: str, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    """Twilio gives only the Sid of the message replied to, and a TwiML answer's Sid is never told
    us: a reply to the agent's message is stored and shown as it was written."""
    fields: dict[str, str] = json.loads(
        (CORPUS / "twilio" / "04_reply_profilename_waid.json").read_text().replace(CORPUS_NUMBER, number)
    )
    assert whatsapp.post("/", data=fields, headers=signed(fields)).status_code == 200
    assert reply_row(database_url, fields["MessageSid"]) == ("Nice", None, None)
    assert sent_texts(fake_anthropic.requests[-1])[-1].endswith("] Nice")
