"""A setting that does not parse refuses the functions that read it, and only them: each answers
503 `not_configured` naming its own wrong settings (never a value), before anything is stored,
while the others serve. The settings every function reads (the database, the model) refuse them all.

Seen failing (a left-over finding): one malformed Twilio or SMS setting, and the Telegram webhook
and the web chat answered 503 too, though neither reads it."""

from __future__ import annotations

import logging
import uuid

import pytest

from functions.function_settings import BY_FUNCTION
from tests.fakes.anthropic_api import FakeAnthropic
from tests.helpers import count, one_request

NO_URL = "Value error, not an http(s) URL with a host"
NO_ORIGIN = (
    "each is * or an origin as a browser sends it: https://HOST[:PORT], no path, no trailing /, "
    "lowercase, no default port, an ASCII host"
)
CHATS = {"telegram_webhook", "whatsapp_webhook", "sms_webhook", "web_chat"}
# A wrong value of each kind of setting, and the functions that read it, so refuse.
WRONG = [
    ("TWILIO_API_BASE", "http://localhost:80x81", NO_URL, {"whatsapp_webhook", "sms_webhook", "memory_digest"}),
    ("PUBLIC_BASE_URL", "advisor.example.com/whatsapp", NO_URL, {"whatsapp_webhook", "sms_webhook"}),
    (
        "SMS_MODEL_DEADLINE",
        "soon",
        "Input should be a valid number, unable to parse string as a number",
        {"sms_webhook", "memory_digest"},
    ),
    ("TELEGRAM_API_BASE", "api.telegram.org", NO_URL, {"telegram_webhook", "memory_digest"}),
    ("SUPABASE_JWKS_URL", "jwks.json", NO_URL, {"web_chat"}),
    ("DEEPGRAM_API_BASE", "deepgram", NO_URL, CHATS),  # every chat's voice notes, not the job
    ("DIGEST_BATCH_SIZE", "0", "Input should be greater than or equal to 1", {"memory_digest"}),
    ("DATABASE_POOL_SIZE", "0", "Input should be greater than or equal to 1", set(BY_FUNCTION)),
    ("ANTHROPIC_BASE_URL", "anthropic", NO_URL, set(BY_FUNCTION)),
    # Seen failing: served, every turn answered without memory ("the memory store could not be set up").
    ("SUPABASE_URL", "xxxx.supabase.co", NO_URL, set(BY_FUNCTION)),
    # Seen failing: a mistyped zone was a 500 on every request of every function (ZoneInfo at the first turn).
    ("CONTEXT_TIMEZONE", "Europe/Pari", "Value error, no IANA time zone of that name", set(BY_FUNCTION)),
    # Seen failing: served, and every owed reply and reminder Twilio refused (a From of another
    # channel than its To); the turns' own answers, in the TwiML, hid it.
    (
        "TWILIO_WHATSAPP_FROM",
        "+14155238886",
        "Value error, a WhatsApp sender is written whatsapp:+NUMBER",
        {"whatsapp_webhook", "memory_digest"},
    ),
    # Seen failing: served, and every owed SMS reply and reminder went out with a WhatsApp From beside
    # an SMS To (the value copied from TWILIO_WHATSAPP_FROM), which Twilio refuses.
    (
        "TWILIO_SMS_FROM",
        "whatsapp:+14155238886",
        "Value error, an SMS sender is a number (+14155238886), not a WhatsApp sender",
        {"sms_webhook", "memory_digest"},
    ),
    # Seen failing: served, and no browser's Origin (never a path, never a trailing /) was ever
    # allowed, with nothing said on the server.
    ("CORS_ORIGINS", "https://advisor.example.com/", "Value error, " + NO_ORIGIN, {"web_chat"}),
    ("CORS_ORIGINS", "advisor.example.com", "Value error, " + NO_ORIGIN, {"web_chat"}),
    # Seen failing: served, and the owner, written by their username, was a stranger on Telegram.
    (
        "OWNER_TELEGRAM_IDS",
        "123456789,@advisor",
        "Value error, each is a Telegram user id, digits (getUpdates' from.id), not a username",
        set(BY_FUNCTION),
    ),
]


@pytest.mark.parametrize("function", sorted(BY_FUNCTION))
@pytest.mark.parametrize(("name", "value", "why", "readers"), WRONG, ids=[case[0] for case in WRONG])
def test_a_wrong_setting_refuses_the_functions_that_read_it_and_no_other(
    environment: pytest.MonkeyPatch,
    fake_anthropic: FakeAnthropic,
    database_url: str,
    function: str,
    name: str,
    value: str,
    why: str,
    readers: set[str],
) -> None:
    stored = count(database_url, "select count(*) from messages")
    response = one_request(function, environment, **{name: value})
    if function not in readers:
        assert response.status_code == 200, response.text
        return
    assert (response.status_code, response.get_json()) == (
        503,
        {"error": "not_configured", "message": f"invalid configuration: {name}: {why}"},
    )
    assert fake_anthropic.requests == []
    assert count(database_url, "select count(*) from messages") == stored


def test_a_function_names_each_of_its_wrong_settings_and_only_its_own(environment: pytest.MonkeyPatch) -> None:
    wrong = {"TELEGRAM_API_BASE": "api.telegram.org", "PUBLIC_BASE_URL": "example.com", "TWILIO_API_BASE": "twilio"}
    refused = one_request("whatsapp_webhook", environment, **wrong)
    assert (refused.status_code, refused.get_json()) == (
        503,
        {
            "error": "not_configured",
            "message": f"invalid configuration: TWILIO_API_BASE: {NO_URL}; PUBLIC_BASE_URL: {NO_URL}",
        },
    )
    assert one_request("web_chat", environment).status_code == 200


def test_a_wrong_settings_value_is_in_no_answer_and_no_log(
    environment: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A base URL may carry credentials (user:password@host): what is wrong is said, never the value."""
    secret = "s3cret-" + uuid.uuid4().hex
    wrong = {"TWILIO_API_BASE": f"https://AC123:{secret}@api.twilio.com:443x"}
    with caplog.at_level(logging.DEBUG):
        refused = one_request("sms_webhook", environment, **wrong)
        served = one_request("telegram_webhook", environment, **wrong)
    assert (refused.status_code, served.status_code) == (503, 200)
    assert refused.get_json()["message"] == f"invalid configuration: TWILIO_API_BASE: {NO_URL}"
    assert [(r.getMessage(), getattr(r, "error", None)) for r in caplog.records if r.levelno >= logging.ERROR] == [
        ("refusing to serve", f"invalid configuration: TWILIO_API_BASE: {NO_URL}")
    ]
    assert secret not in refused.text + served.text + caplog.text
