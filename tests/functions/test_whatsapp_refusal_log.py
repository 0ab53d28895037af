"""A WhatsApp post refused for its signature is logged once per instance at WARNING with the
URL it was checked against, so a PUBLIC_BASE_URL that is not the URL Twilio calls shows."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterator

import pytest
from twilio.request_validator import RequestValidator

from functions import runtime
from tests.helpers import app_client

TOKEN = "twilio-auth-token-for-tests"
CALLED = "https://europe-west1-advisor-prod.cloudfunctions.net/whatsapp_webhook"
WITHOUT_PATH = "https://europe-west1-advisor-prod.cloudfunctions.net"


@pytest.fixture
def fresh_instance() -> Iterator[None]:
    """A new instance (app_client's runtime.reset() makes one too): nothing logged yet."""
    runtime.reset()
    yield
    runtime.reset()


def twilio_post(body: str) -> tuple[dict[str, str], dict[str, str]]:
    fields = {"From": "whatsapp:+34600111222", "To": "whatsapp:+14155238886", "Body": body}
    fields |= {"MessageSid": "SM" + uuid.uuid4().hex, "NumMedia": "0"}
    return fields, {"X-Twilio-Signature": RequestValidator(TOKEN).compute_signature(CALLED, fields)}


def test_a_public_base_url_without_the_path_refuses_and_says_so_once(
    environment: pytest.MonkeyPatch, fresh_instance: None, caplog: pytest.LogCaptureFixture
) -> None:
    environment.setenv("TWILIO_AUTH_TOKEN", TOKEN)
    environment.setenv("PUBLIC_BASE_URL", WITHOUT_PATH)  # what .env.example used to say
    client = app_client("whatsapp_webhook")
    caplog.set_level(logging.INFO, logger="crossmem")
    for text in ("hello", "are you there?", "hello again"):
        fields, headers = twilio_post(text)
        assert client.post("/", data=fields, headers=headers).status_code == 403
    refused = [record for record in caplog.records if record.name == "crossmem.whatsapp"]
    assert len(refused) == 1 and refused[0].levelname == "WARNING"
    assert refused[0].checked_url == WITHOUT_PATH  # type: ignore[attr-defined]
    logged = json.dumps([vars(record) for record in caplog.records], default=str)
    assert TOKEN not in logged and headers["X-Twilio-Signature"] not in logged and "hello again" not in logged


def test_the_full_url_twilio_calls_is_accepted_and_logs_no_refusal(
    environment: pytest.MonkeyPatch, fresh_instance: None, caplog: pytest.LogCaptureFixture
) -> None:
    environment.setenv("TWILIO_AUTH_TOKEN", TOKEN)
    environment.setenv("PUBLIC_BASE_URL", CALLED)
    client = app_client("whatsapp_webhook")
    caplog.set_level(logging.INFO, logger="crossmem")
    fields, headers = twilio_post("hello")
    assert client.post("/", data=fields, headers=headers).status_code == 200
    said = [record.getMessage() for record in caplog.records if record.name == "crossmem.whatsapp"]
    assert [message for message in said if message.startswith("Twilio signature refused")] == []


def test_a_post_signed_with_a_shared_key_this_instance_lacks_is_refused_and_says_so_once(
    environment: pytest.MonkeyPatch, fresh_instance: None, caplog: pytest.LogCaptureFixture
) -> None:
    """A Webhooks Rule makes Twilio sign with its shared key (HMAC-SHA256); without
    TWILIO_WEBHOOK_SHARED_KEY every such post is refused, and the refusal log line is the only way
    the operator learns why (a review's finding: it was refused before that line, so nothing said)."""
    environment.setenv("TWILIO_AUTH_TOKEN", TOKEN)
    environment.setenv("PUBLIC_BASE_URL", CALLED)
    client = app_client("whatsapp_webhook")
    caplog.set_level(logging.INFO, logger="crossmem")
    settings = {"X-Twilio-Webhooks-Signature-Settings": "key=webhooks_sharedkey_1,algorithm=HMAC_SHA256"}
    for text in ("hello", "hello again"):
        fields, _ = twilio_post(text)
        signature = RequestValidator("shared-key-secret").compute_signature(CALLED, fields, "HMAC_SHA256")
        headers = {"X-Twilio-Signature": signature, **settings}
        assert client.post("/", data=fields, headers=headers).status_code == 403
    refused = [record for record in caplog.records if record.name == "crossmem.whatsapp"]
    assert [(record.levelname, record.getMessage()) for record in refused] == [
        (
            "WARNING",
            "Twilio signature refused: signed with HMAC_SHA256 (a Webhooks Rule's shared key), and "
            "TWILIO_WEBHOOK_SHARED_KEY is not set (logged once per instance)",
        )
    ]
    assert refused[0].algorithm == "HMAC_SHA256"  # type: ignore[attr-defined]
    assert "shared-key-secret" not in json.dumps([vars(record) for record in caplog.records], default=str)


def test_a_public_base_url_with_twilios_basic_auth_credentials_never_logs_the_password(
    environment: pytest.MonkeyPatch, fresh_instance: None, caplog: pytest.LogCaptureFixture
) -> None:
    """Twilio takes a webhook URL with HTTP basic auth credentials in it
    (`https://username:password@host/path`, its Security page): the refusal names the URL it
    checked without them."""
    environment.setenv("TWILIO_AUTH_TOKEN", TOKEN)
    environment.setenv("PUBLIC_BASE_URL", CALLED.replace("https://", "https://twilio:webhook-password@"))
    client = app_client("whatsapp_webhook")
    caplog.set_level(logging.INFO, logger="crossmem")
    fields, _ = twilio_post("hello")
    assert client.post("/", data=fields, headers={"X-Twilio-Signature": "forged"}).status_code == 403
    refused = [record for record in caplog.records if record.name == "crossmem.whatsapp"]
    assert [record.checked_url for record in refused] == [CALLED]  # type: ignore[attr-defined]
    assert "webhook-password" not in json.dumps([vars(record) for record in caplog.records], default=str)
