"""Outside APP_ENV=local a function refuses to serve, on every route, rather than answer real
people without memory or with the offline stand-in."""

from __future__ import annotations

import logging

import pytest

from tests.fakes.anthropic_api import FakeAnthropic
from tests.helpers import TELEGRAM_SECRET, app_client, update

NO_DATABASE = (
    "no database: set DATABASE_URL (on Supabase, the transaction pooler's URL) "
    "or SUPABASE_URL with SUPABASE_SERVICE_ROLE_KEY"
)
NO_MODEL = "no model: set ANTHROPIC_API_KEY, or ALLOW_OFFLINE_MODEL=true to answer with the offline stand-in"
ROUTES = [
    ("telegram_webhook", "POST", "/"),
    ("whatsapp_webhook", "POST", "/"),
    ("sms_webhook", "POST", "/"),
    ("web_chat", "POST", "/"),
    ("web_chat", "GET", "/conversations"),
    ("web_chat", "OPTIONS", "/"),
]


@pytest.mark.parametrize(("function", "method", "path"), ROUTES)
def test_a_production_function_without_a_database_answers_503_on_every_route_and_logs_it(
    environment: pytest.MonkeyPatch,
    fake_anthropic: FakeAnthropic,
    caplog: pytest.LogCaptureFixture,
    function: str,
    method: str,
    path: str,
) -> None:
    environment.delenv("DATABASE_URL")
    environment.delenv("SUPABASE_URL", raising=False)
    client = app_client(function)
    with caplog.at_level(logging.ERROR, logger="crossmem"):
        for _ in range(3):
            response = client.open(path, method=method, headers={"Origin": "https://example.com"})
            assert response.status_code == 503
            assert response.get_json() == {"error": "not_configured", "message": NO_DATABASE}
    # Logged once an instance, not once a request: a flood of requests is not a flood of lines.
    assert [(r.getMessage(), getattr(r, "error", None)) for r in caplog.records] == [("refusing to serve", NO_DATABASE)]
    assert fake_anthropic.requests == []


def test_supabase_without_its_key_is_not_a_database(environment: pytest.MonkeyPatch) -> None:
    environment.delenv("DATABASE_URL")
    environment.setenv("SUPABASE_URL", "https://project.supabase.co")
    response = app_client("telegram_webhook").post("/", json=update("hi"))
    assert response.status_code == 503
    assert response.get_json() == {
        "error": "not_configured",
        "message": "SUPABASE_URL is set but SUPABASE_SERVICE_ROLE_KEY is not",
    }


def test_without_a_model_key_production_refuses_unless_the_offline_model_is_allowed(
    environment: pytest.MonkeyPatch,
) -> None:
    environment.delenv("ANTHROPIC_API_KEY")
    environment.setenv("TELEGRAM_REPLY_IN_WEBHOOK", "true")
    headers = {"X-Telegram-Bot-Api-Secret-Token": TELEGRAM_SECRET}
    refused = app_client("telegram_webhook").post("/", json=update("hi"), headers=headers)
    assert refused.status_code == 503
    assert refused.get_json() == {"error": "not_configured", "message": NO_MODEL}
    environment.setenv("ALLOW_OFFLINE_MODEL", "true")
    served = app_client("telegram_webhook").post("/", json=update("hi"), headers=headers)
    assert served.status_code == 200
    assert "offline stand-in" in served.get_json()["text"].lower()


def test_locally_the_embedded_database_and_the_offline_model_are_fine(environment: pytest.MonkeyPatch) -> None:
    environment.setenv("APP_ENV", "local")
    environment.delenv("ANTHROPIC_API_KEY")
    environment.setenv("TELEGRAM_REPLY_IN_WEBHOOK", "true")
    headers = {"X-Telegram-Bot-Api-Secret-Token": TELEGRAM_SECRET}
    assert app_client("telegram_webhook").post("/", json=update("hi"), headers=headers).status_code == 200


def test_a_bot_api_base_that_is_no_url_is_a_503_with_its_reason_not_a_500(environment: pytest.MonkeyPatch) -> None:
    """It was a 500 (httpx: "invalid literal for int() with base 10: '80x81'") on every delivery."""
    environment.setenv("TELEGRAM_API_BASE", "http://localhost:80x81")
    client = app_client("telegram_webhook")
    response = client.post("/", json=update("hello"), headers={"X-Telegram-Bot-Api-Secret-Token": TELEGRAM_SECRET})
    assert response.status_code == 503
    assert response.get_json() == {
        "error": "not_configured",
        "message": "invalid configuration: TELEGRAM_API_BASE: Value error, not an http(s) URL with a host",
    }
