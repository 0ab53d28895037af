"""Each surface's real function, loaded by functions_framework from main.py, with the
real SDKs aimed at local fakes through their base-URL settings."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from flask.testing import FlaskClient
from functions_framework import create_app

from functions import runtime
from tests.fakes.anthropic_api import FakeAnthropic
from tests.fakes.jwks import FakeJwks
from tests.fakes.telegram_api import FakeTelegram

MAIN = str(Path(__file__).resolve().parents[2] / "main.py")
BOT_TOKEN = "123456789:TEST-token-abcdef"
TELEGRAM_SECRET = "telegram-webhook-secret"


@pytest.fixture
def fake_anthropic() -> Iterator[FakeAnthropic]:
    server = FakeAnthropic()
    yield server
    server.close()


@pytest.fixture
def fake_telegram() -> Iterator[FakeTelegram]:
    server = FakeTelegram(BOT_TOKEN)
    yield server
    server.close()


@pytest.fixture
def jwks() -> Iterator[FakeJwks]:
    server = FakeJwks()
    yield server
    server.close()


@pytest.fixture
def owner() -> uuid.UUID:
    return uuid.uuid4()


def production_settings(database_url: str, anthropic: FakeAnthropic, telegram: FakeTelegram) -> dict[str, str]:
    """A production-like configuration, with the fakes for Anthropic and the Bot API."""
    return {
        "APP_ENV": "production",
        "DATABASE_URL": database_url,
        "ANTHROPIC_API_KEY": "sk-ant-test",
        "ANTHROPIC_BASE_URL": anthropic.url,
        "ANTHROPIC_MAX_RETRIES": "0",
        "TELEGRAM_BOT_TOKEN": BOT_TOKEN,
        "TELEGRAM_WEBHOOK_SECRET": TELEGRAM_SECRET,
        "TELEGRAM_API_BASE": telegram.url,
        "IDENTITY_POLICY": "auto",
        # Tests send many turns as one person in a second; the budget's own tests turn it on.
        "TURNS_PER_MINUTE": "0",
        "TURNS_PER_DAY": "0",
        "TOKENS_PER_DAY": "0",
    }


@pytest.fixture
def environment(
    monkeypatch: pytest.MonkeyPatch,
    database_url: str,
    fake_anthropic: FakeAnthropic,
    fake_telegram: FakeTelegram,
    tmp_path: Path,
) -> Iterator[pytest.MonkeyPatch]:
    """A production-like configuration; tests adjust it, then build an app."""
    for name, value in production_settings(database_url, fake_anthropic, fake_telegram).items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)  # no developer's .env is read
    runtime.reset()
    yield monkeypatch
    runtime.reset()


def as_owner(
    environment: pytest.MonkeyPatch, owner: uuid.UUID, telegram: str = "4242", whatsapp: str = "+34600111222"
) -> None:
    """The owner policy: `owner` is the person behind these Telegram ids and WhatsApp numbers."""
    environment.setenv("IDENTITY_POLICY", "owner")
    environment.setenv("OWNER_USER_ID", str(owner))
    environment.setenv("OWNER_TELEGRAM_IDS", telegram)
    environment.setenv("OWNER_WHATSAPP_NUMBERS", whatsapp)


def app_client(target: str) -> FlaskClient:
    """A new instance of the function, as a cold start would build it."""
    runtime.reset()
    return create_app(target, MAIN).test_client()


def stored_count(database_url: str, user: uuid.UUID) -> int:
    """How many messages are stored for this person."""
    with psycopg.connect(database_url) as connection:
        row = connection.execute("select count(*) from messages where user_id = %s", (user,)).fetchone()
    assert row is not None
    return int(row[0])
