"""One refusal per required setting: without it the function answers 503 `not_configured`
with the reason, before reading anything, rather than crashing on every request."""

from __future__ import annotations

import uuid

import jwt
import pytest

from tests.fakes.anthropic_api import FakeAnthropic
from tests.helpers import (
    JWT_SECRET,
    PUBLIC_BASE_URL,
    SKELETON_PERSON,
    TELEGRAM_SECRET,
    TWILIO_TOKEN,
    app_client,
    telegram_skeleton,
    twilio_signature,
)

TELEGRAM_REFUSAL = "TELEGRAM_WEBHOOK_SECRET and TELEGRAM_BOT_TOKEN must be set"
WHATSAPP_REFUSAL = "set TWILIO_AUTH_TOKEN and PUBLIC_BASE_URL"
WEB_REFUSAL = "set SUPABASE_JWT_SECRET or SUPABASE_JWKS_URL to verify web tokens"


def post_telegram() -> tuple[int, object]:
    response = app_client("telegram_webhook").post(
        "/",
        json=telegram_skeleton(1, SKELETON_PERSON, "hello"),
        headers={"X-Telegram-Bot-Api-Secret-Token": TELEGRAM_SECRET},
    )
    return response.status_code, response.get_json()


def post_whatsapp() -> tuple[int, object]:
    form = {"From": "whatsapp:+34600111222", "Body": "hello", "MessageSid": "SM" + uuid.uuid4().hex}
    headers = {"X-Twilio-Signature": twilio_signature(form)}
    response = app_client("whatsapp_webhook").post("/", data=form, headers=headers)
    return response.status_code, response.get_json()


def post_web() -> tuple[int, object]:
    token = jwt.encode({"sub": str(uuid.uuid4()), "aud": "authenticated", "exp": 2**40}, JWT_SECRET, algorithm="HS256")
    response = app_client("web_chat").post("/", json={"message": "hello"}, headers={"Authorization": f"Bearer {token}"})
    return response.status_code, response.get_json()


@pytest.mark.parametrize("missing", ["TELEGRAM_WEBHOOK_SECRET", "TELEGRAM_BOT_TOKEN"])
def test_telegram_refuses_without(environment: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic, missing: str) -> None:
    environment.delenv(missing)
    assert post_telegram() == (503, {"error": "not_configured", "message": TELEGRAM_REFUSAL})
    assert fake_anthropic.requests == []


@pytest.mark.parametrize("missing", ["TWILIO_AUTH_TOKEN", "PUBLIC_BASE_URL"])
def test_whatsapp_refuses_without(environment: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic, missing: str) -> None:
    environment.setenv("TWILIO_AUTH_TOKEN", TWILIO_TOKEN)
    environment.setenv("PUBLIC_BASE_URL", PUBLIC_BASE_URL)
    environment.delenv(missing)
    assert post_whatsapp() == (503, {"error": "not_configured", "message": WHATSAPP_REFUSAL})
    assert fake_anthropic.requests == []


def test_the_web_refuses_without_a_way_to_verify_tokens(
    environment: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic
) -> None:
    environment.delenv("SUPABASE_JWT_SECRET", raising=False)
    environment.delenv("SUPABASE_JWKS_URL", raising=False)
    assert post_web() == (503, {"error": "not_configured", "message": WEB_REFUSAL})
    assert fake_anthropic.requests == []


@pytest.mark.parametrize("post", [post_telegram, post_whatsapp, post_web])
def test_an_invalid_configuration_is_refused_by_every_function(environment: pytest.MonkeyPatch, post: object) -> None:
    environment.setenv("TWILIO_AUTH_TOKEN", TWILIO_TOKEN)
    environment.setenv("PUBLIC_BASE_URL", PUBLIC_BASE_URL)
    environment.setenv("SUPABASE_JWT_SECRET", JWT_SECRET)
    environment.setenv("CONTEXT_MAX_MESSAGES", "16")
    environment.setenv("CONTEXT_WINDOW_STEP", "20")
    message = "invalid configuration: CONTEXT_WINDOW_STEP must not exceed CONTEXT_MAX_MESSAGES"
    assert post() == (503, {"error": "not_configured", "message": message})  # type: ignore[operator]
    environment.setenv("CONTEXT_WINDOW_STEP", "8")
    environment.setenv("ANTHROPIC_EFFORT", "xhigh")  # which Sonnet 5.5 refuses without up-front thinking
    message = "invalid configuration: ANTHROPIC_THINKING=between_tools takes ANTHROPIC_EFFORT low, medium or high"
    assert post() == (503, {"error": "not_configured", "message": message})  # type: ignore[operator]
