"""WhatsApp's typing indicator never holds the answer up (issue 30, finding 9): Twilio's REST API
is called on a thread of its own, so Twilio's 15 s are the turn's, whatever that API does."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from tests.fakes.anthropic_api import FakeAnthropic
from tests.helpers import PUBLIC_BASE_URL, TWILIO_TOKEN, app_client, form, signed

ACCOUNT_SID = "AC" + "2" * 32


def test_the_typing_indicator_is_sent_off_the_requests_thread(
    environment: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic, caplog: pytest.LogCaptureFixture
) -> None:
    environment.setenv("TWILIO_AUTH_TOKEN", TWILIO_TOKEN)
    environment.setenv("PUBLIC_BASE_URL", PUBLIC_BASE_URL)
    environment.setenv("TWILIO_ACCOUNT_SID", ACCOUNT_SID)
    environment.setenv("TWILIO_API_BASE", "http://127.0.0.1:9")  # nothing listens: the indicator fails, and says where
    fields = form("are you coming?", sender="whatsapp:+34600222333")
    with caplog.at_level(logging.WARNING, logger="crossmem.whatsapp"):
        # The test client runs the function on this thread: the request's.
        answered = app_client("whatsapp_webhook").post("/", data=fields, headers=signed(fields))
        assert answered.status_code == 200
        for _ in range(500):
            failed = [r for r in caplog.records if r.getMessage() == "the typing indicator failed"]
            if failed:
                break
            time.sleep(0.01)
    assert len(failed) == 1
    assert failed[0].threadName == "whatsapp-typing" != threading.current_thread().name
