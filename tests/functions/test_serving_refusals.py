"""Outside APP_ENV=local a function refuses to serve, on every route, rather than answer real
people without memory or with the offline stand-in."""

from __future__ import annotations

import logging

import pytest
from werkzeug.test import TestResponse

from tests.fakes.anthropic_api import FakeAnthropic
from tests.helpers import CORS_ORIGIN, TELEGRAM_SECRET, app_client, update

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


# The CORS headers an allowed page's answer carries (functions/web.py's cors_headers).
ALLOWED_PAGE = {
    "Access-Control-Allow-Origin": CORS_ORIGIN,
    "Access-Control-Allow-Headers": "Authorization, Content-Type, Accept, User-Agent, x-vercel-ai-ui-message-stream",
    "Access-Control-Allow-Methods": "GET, POST, DELETE, OPTIONS",
    "Access-Control-Expose-Headers": "Retry-After, Allow, Content-Disposition, x-vercel-ai-ui-message-stream",
    "Access-Control-Max-Age": "600",
    "Vary": "Origin",
}
JWKS_NO_URL = "invalid configuration: SUPABASE_JWKS_URL: Value error, not an http(s) URL with a host"


def cors_of(response: TestResponse) -> dict[str, str]:
    return {name: value for name, value in response.headers if name.startswith("Access-Control-") or name == "Vary"}


@pytest.mark.parametrize(
    ("unset", "wrong", "reason"),
    [("DATABASE_URL", None, NO_DATABASE), ("ANTHROPIC_API_KEY", None, NO_MODEL), (None, "jwks.json", JWKS_NO_URL)],
)
def test_a_web_function_that_refuses_to_serve_says_why_to_an_allowed_page(
    environment: pytest.MonkeyPatch, unset: str | None, wrong: str | None, reason: str
) -> None:
    """Seen failing: the 503 and the preflight's refusal carried no CORS headers, so the page on
    CORS_ORIGINS saw a bare "CORS error" (the browser hides such an answer) and never
    `not_configured`. Its preflight is answered (a browser sends the request only after a 2xx
    one), then the refusal, readable; another origin's are refused as before."""
    environment.setenv("CORS_ORIGINS", CORS_ORIGIN)
    if unset is not None:
        environment.delenv(unset, raising=False)
        environment.delenv("SUPABASE_URL", raising=False)
    if wrong is not None:
        environment.setenv("SUPABASE_JWKS_URL", wrong)
    client = app_client("web_chat")
    preflight = client.options("/", headers={"Origin": CORS_ORIGIN, "Access-Control-Request-Method": "POST"})
    assert (preflight.status_code, cors_of(preflight), preflight.data) == (204, ALLOWED_PAGE, b"")
    refused = client.post("/", json={"message": "hi"}, headers={"Origin": CORS_ORIGIN})
    assert (refused.status_code, refused.get_json()) == (503, {"error": "not_configured", "message": reason})
    assert cors_of(refused) == ALLOWED_PAGE
    for other in (client.options("/", headers={"Origin": "https://evil.example.com"}), client.post("/", json={})):
        assert (other.status_code, other.get_json(), cors_of(other)) == (
            503,
            {"error": "not_configured", "message": reason},
            {},
        )


STEP_PAST_WINDOW = "CONTEXT_WINDOW_STEP must not exceed CONTEXT_MAX_MESSAGES"
NO_ORIGIN = (
    "invalid configuration: CORS_ORIGINS: Value error, each is * or an origin as a browser sends it: "
    "https://HOST[:PORT], no path, no trailing /, lowercase, no default port, an ASCII host"
)


@pytest.mark.parametrize(
    ("name", "value", "reason"),
    [
        ("CORS_ORIGINS", "https://advisor.example.com/", NO_ORIGIN),
        ("CORS_ORIGINS", "advisor.example.com", NO_ORIGIN),
        # a rule of several settings: no settings at all, CORS_ORIGINS among them
        ("CONTEXT_WINDOW_STEP", "41", "invalid configuration: " + STEP_PAST_WINDOW),
    ],
)
def test_a_wrong_cors_origins_allows_no_page_even_to_read_its_refusal(
    environment: pytest.MonkeyPatch, name: str, value: str, reason: str
) -> None:
    """CORS_ORIGINS itself does not parse (or no setting can be read): no origin is known to be
    allowed, so the refusal, and the preflight's, carry no CORS headers (docs/api.md: the page sees
    a CORS error, the reason is in the log)."""
    environment.setenv("CORS_ORIGINS", CORS_ORIGIN)
    environment.setenv(name, value)
    client = app_client("web_chat")
    for method in ("OPTIONS", "POST"):
        headers = {"Origin": CORS_ORIGIN, "Access-Control-Request-Method": "POST"}
        refused = client.open("/", method=method, headers=headers)
        assert (refused.status_code, refused.get_json(), cors_of(refused)) == (
            503,
            {"error": "not_configured", "message": reason},
            {},
        )
