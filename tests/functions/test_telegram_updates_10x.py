"""Update kinds Bot API 9.6 to 10.2 added, through the real telegram_webhook: a 200, never a 5xx,
nothing stored, no model asked, nothing sent (docs/decisions.md, Bot API 10.x).

The payloads are tests/corpus/telegram/26-28, documented examples built from the Bot API's field
lists (tests/corpus/telegram/SOURCES.md). A guest message is the one that looks like a turn: a
Message, in a private chat, from a person, with text; it belongs to a chat the bot is not in and
would be answered with answerGuestQuery, so it must never reach the person's memory.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.anthropic_api import FakeAnthropic
from tests.fakes.telegram_api import FakeTelegram
from tests.helpers import TELEGRAM_HEADERS, app_client, count, stored_turn, update

CORPUS = Path(__file__).resolve().parents[1] / "corpus" / "telegram"
ALL_MESSAGES = "select count(*) from messages"

NEW_KINDS = {
    "26_guest_message.json": "guest_message",  # Bot API 10.0
    "27_managed_bot.json": "managed_bot",  # Bot API 9.6
    "28_subscription.json": "subscription",  # Bot API 10.2
}


@pytest.mark.parametrize("name", sorted(NEW_KINDS))
def test_an_update_kind_of_bot_api_10_is_answered_200_and_changes_nothing(
    environment: pytest.MonkeyPatch,
    name: str,
    database_url: str,
    fake_anthropic: FakeAnthropic,
    fake_telegram: FakeTelegram,
) -> None:
    environment.setenv("TELEGRAM_BOT_USERNAME", "advisor_bot")
    client = app_client("telegram_webhook")
    body: dict[str, Any] = json.loads((CORPUS / name).read_text())
    stored = count(database_url, ALL_MESSAGES)
    for _ in range(2):  # a redelivery, the same
        response = client.post("/", json=body, headers=TELEGRAM_HEADERS)
        assert (response.status_code, response.get_json()) == (200, {"ok": True, "ignored": NEW_KINDS[name]})
    assert count(database_url, ALL_MESSAGES) == stored and stored_turn(database_url, str(body["update_id"])) == []
    assert fake_anthropic.requests == [] and fake_telegram.calls == []


def test_a_guest_message_from_a_person_with_a_memory_never_reaches_it(
    environment: pytest.MonkeyPatch, database_url: str, fake_anthropic: FakeAnthropic, fake_telegram: FakeTelegram
) -> None:
    """The guest message's sender also talks to the bot in a private chat: that chat answers,
    their guest message (same person, same words) is neither stored nor answered."""
    environment.setenv("TELEGRAM_BOT_USERNAME", "advisor_bot")
    client = app_client("telegram_webhook")
    person = 4343000 + uuid.uuid4().int % 10**6
    said = update("Hola, soy Ana", user_id=person)
    assert client.post("/", json=said, headers=TELEGRAM_HEADERS).status_code == 200
    guest: dict[str, Any] = json.loads((CORPUS / "26_guest_message.json").read_text())
    guest["update_id"] = uuid.uuid4().int % 10**9
    guest["guest_message"]["from"]["id"] = person
    guest["guest_message"]["chat"] = {"id": person, "type": "private", "first_name": "Ana"}
    response = client.post("/", json=guest, headers=TELEGRAM_HEADERS)
    assert (response.status_code, response.get_json()) == (200, {"ok": True, "ignored": "guest_message"})
    assert stored_turn(database_url, str(guest["update_id"])) == []
    assert count(database_url, "select count(*) from messages where content like %s", "%qué tiempo%") == 0
    assert len(fake_anthropic.requests) == 1 and len(fake_telegram.sent()) == 1


@pytest.mark.parametrize(
    ("kind", "named"),
    [
        ("purchased_paid_media", "purchased_paid_media"),
        ("Not A Kind", "unhandled update kind"),
        ("x" * 100, "unhandled update kind"),
    ],
    ids=["known-shape", "odd-name", "long-name"],
)
def test_any_other_unknown_kind_is_a_200_naming_it_only_when_it_looks_like_one(
    environment: pytest.MonkeyPatch, kind: str, named: str, fake_anthropic: FakeAnthropic, fake_telegram: FakeTelegram
) -> None:
    body = {"update_id": uuid.uuid4().int % 10**9, kind: {"from": {"id": 4242, "is_bot": False}, "text": "hola"}}
    response = app_client("telegram_webhook").post("/", json=body, headers=TELEGRAM_HEADERS)
    assert (response.status_code, response.get_json()) == (200, {"ok": True, "ignored": named})
    assert fake_anthropic.requests == [] and fake_telegram.calls == []
