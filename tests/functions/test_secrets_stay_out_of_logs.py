"""No log line carries a secret, even with every logger switched on."""

from __future__ import annotations

import logging

import pytest

from tests.fakes.telegram_api import FakeTelegram
from tests.functions.hostile_requests import telegram_skeleton
from tests.helpers import BOT_TOKEN, TELEGRAM_SECRET, app_client


def test_httpx_never_logs_the_bot_api_url_that_holds_the_token(
    environment: pytest.MonkeyPatch, fake_telegram: FakeTelegram, caplog: pytest.LogCaptureFixture
) -> None:
    client = app_client("telegram_webhook")
    update = telegram_skeleton(31337, 4242, "hello")
    with caplog.at_level(logging.DEBUG):  # the root logger at DEBUG, as a debugging session might set it
        response = client.post("/", json=update, headers={"X-Telegram-Bot-Api-Secret-Token": TELEGRAM_SECRET})
    assert (response.status_code, response.get_json()) == (200, {"ok": True, "outcome": "answered"})
    assert [sent["chat_id"] for sent in fake_telegram.sent()] == [4242]
    assert caplog.records, "the turn's own line is still logged"
    assert BOT_TOKEN not in caplog.text
    assert TELEGRAM_SECRET not in caplog.text


def test_a_mistyped_database_url_never_prints_its_password(
    environment: pytest.MonkeyPatch, fake_telegram: FakeTelegram, capfd: pytest.CaptureFixture[str]
) -> None:
    """psycopg quotes a connection string it cannot parse whole; every line and the doctor mask it."""
    from functions.tools.cli import main

    environment.setenv("DATABASE_URL", "postgres:S3cret@127.0.0.1/x")  # the scheme forgotten
    environment.setenv("DATABASE_CONNECT_TIMEOUT", "1")
    client = app_client("telegram_webhook")
    update = telegram_skeleton(31338, 4242, "hello")
    response = client.post("/", json=update, headers={"X-Telegram-Bot-Api-Secret-Token": TELEGRAM_SECRET})
    assert response.status_code == 200  # answered without history
    main(["doctor", "--json"])
    printed = "".join(capfd.readouterr())
    assert "S3cret" not in printed
    assert "postgres:***@127.0.0.1/x" in printed  # the lines that quoted it are there, masked
