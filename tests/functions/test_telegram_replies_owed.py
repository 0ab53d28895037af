"""Replies the Bot API did not take: owed (the webhook answers 503, Telegram redelivers,
the redelivery sends the stored reply without a model call) or given up (200)."""

from __future__ import annotations

import logging

import psycopg
import pytest

from tests.fakes.anthropic_api import FakeAnthropic
from tests.fakes.telegram_api import FakeTelegram
from tests.helpers import TELEGRAM_HEADERS, app_client, stored_turn, update


def delivered_flags(database_url: str, external_id: str) -> list[bool]:
    with psycopg.connect(database_url) as connection:
        rows = connection.execute(
            """select r.delivered_at is not null from messages r
                where r.in_reply_to in (select id from messages where external_id = %s)""",
            (external_id,),
        ).fetchall()
    return [flag for (flag,) in rows]


@pytest.mark.parametrize("failure", ["gateway", "too_many_requests_long"])
def test_a_reply_the_bot_api_did_not_take_is_owed_and_the_redelivery_sends_it_once(
    environment: pytest.MonkeyPatch,
    database_url: str,
    fake_anthropic: FakeAnthropic,
    fake_telegram: FakeTelegram,
    caplog: pytest.LogCaptureFixture,
    failure: str,
) -> None:
    fake_telegram.fail_with(failure)
    body = update("hello while Telegram is down")
    client = app_client("telegram_webhook")
    with caplog.at_level(logging.ERROR, logger="crossmem"):
        first = client.post("/", json=body, headers=TELEGRAM_HEADERS)
    assert first.status_code == 503 and first.get_json()["error"] == "reply_owed"
    assert any("sending a reply failed" in record.getMessage() for record in caplog.records)
    rows = stored_turn(database_url, str(body["update_id"]))
    assert [role for role, _ in rows] == ["user", "assistant"]
    assert delivered_flags(database_url, str(body["update_id"])) == [False]

    again = client.post("/", json=body, headers=TELEGRAM_HEADERS)  # Telegram redelivers; still failing
    assert again.status_code == 503
    assert delivered_flags(database_url, str(body["update_id"])) == [False]

    fake_telegram.recover()
    assert client.post("/", json=body, headers=TELEGRAM_HEADERS).status_code == 200
    assert client.post("/", json=body, headers=TELEGRAM_HEADERS).status_code == 200  # one more: nothing owed now
    assert [payload["text"] for payload in fake_telegram.sent()] == [rows[1][1]]
    assert len(fake_telegram.refused) == 2
    assert delivered_flags(database_url, str(body["update_id"])) == [True]
    assert len(fake_anthropic.requests) == 1


@pytest.mark.parametrize("failure", ["blocked_by_user", "cannot_initiate", "chat_not_found", "user_is_blocked_as_400"])
def test_a_person_who_blocked_the_bot_or_a_chat_that_is_gone_is_given_up(
    environment: pytest.MonkeyPatch,
    database_url: str,
    fake_anthropic: FakeAnthropic,
    fake_telegram: FakeTelegram,
    failure: str,
) -> None:
    fake_telegram.fail_with(failure)
    body = update("then I blocked the bot")
    response = app_client("telegram_webhook").post("/", json=body, headers=TELEGRAM_HEADERS)
    assert response.status_code == 200 and response.get_json() == {"ok": True, "outcome": "answered"}
    assert len(fake_telegram.refused) == 1 and fake_telegram.sent() == []
    assert [role for role, _ in stored_turn(database_url, str(body["update_id"]))] == ["user", "assistant"]
    assert delivered_flags(database_url, str(body["update_id"])) == [False]


def test_a_fallback_that_could_not_be_sent_is_not_owed(
    environment: pytest.MonkeyPatch, database_url: str, fake_anthropic: FakeAnthropic, fake_telegram: FakeTelegram
) -> None:
    """The fallback is not stored, so a redelivery could not send it: asking for one would only repeat nothing."""
    fake_anthropic.behaviour = "500"
    fake_telegram.fail_with("gateway")
    body = update("the model and Telegram both fail")
    response = app_client("telegram_webhook").post("/", json=body, headers=TELEGRAM_HEADERS)
    assert response.status_code == 200 and response.get_json() == {"ok": True, "outcome": "fallback"}
    assert stored_turn(database_url, str(body["update_id"])) == [("user", "the model and Telegram both fail")]
