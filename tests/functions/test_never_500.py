"""Whatever arrives, correctly authenticated or not, no function answers 5xx (but 503 for
'not configured', which these configurations are not)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import jwt
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from twilio.request_validator import RequestValidator

from tests.functions.conftest import TELEGRAM_SECRET, app_client

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=5),
    max_leaves=12,
)
# Shapes close to the real ones, so that parsing gets past the first field.
UPDATES = st.fixed_dictionaries(
    {"update_id": st.integers(-5, 2**40)},
    optional={
        "message": st.dictionaries(
            st.sampled_from(["message_id", "chat", "from", "text", "caption", "photo", "entities", "date"]),
            JSON,
            max_size=6,
        ),
        "edited_message": JSON,
        "callback_query": JSON,
        "my_chat_member": JSON,
    },
)
FORMS = st.dictionaries(
    st.sampled_from(
        [
            "From",
            "Body",
            "MessageSid",
            "NumMedia",
            "Latitude",
            "Longitude",
            "MessageType",
            "MediaContentType0",
            "ProfileName",
            "WaId",
        ]
    ),
    st.text(max_size=40),
    max_size=8,
)
SENDS = st.fixed_dictionaries(
    {"message": st.text(max_size=50)},
    optional={
        "conversation_id": st.text(max_size=40) | st.just(str(uuid.uuid4())),
        "history": JSON,
        "client_message_id": JSON,
    },
)
RUNS = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))


@given(body=UPDATES | JSON)
@RUNS
def test_telegram(environment: pytest.MonkeyPatch, body: Any) -> None:
    response = app_client("telegram_webhook").post(
        "/",
        data=json.dumps(body),
        content_type="application/json",
        headers={"X-Telegram-Bot-Api-Secret-Token": TELEGRAM_SECRET},
    )
    assert response.status_code < 500, response.get_data(as_text=True)


@given(form=FORMS)
@RUNS
def test_whatsapp(environment: pytest.MonkeyPatch, form: dict[str, str]) -> None:
    environment.setenv("TWILIO_AUTH_TOKEN", "token")
    environment.setenv("PUBLIC_BASE_URL", "https://example.com/whatsapp")
    signature = RequestValidator("token").compute_signature("https://example.com/whatsapp", form)
    response = app_client("whatsapp_webhook").post("/", data=form, headers={"X-Twilio-Signature": signature})
    assert response.status_code < 500, response.get_data(as_text=True)


@given(body=SENDS | JSON, path=st.sampled_from(["/", "/messages", "/conversations", "/conversations/x/messages"]))
@RUNS
def test_web(environment: pytest.MonkeyPatch, body: Any, path: str) -> None:
    environment.setenv("SUPABASE_JWT_SECRET", "s" * 32)
    token = jwt.encode({"sub": str(uuid.uuid4()), "aud": "authenticated", "exp": 2**40}, "s" * 32, algorithm="HS256")
    response = app_client("web_chat").post(
        path, data=json.dumps(body), content_type="application/json", headers={"Authorization": f"Bearer {token}"}
    )
    assert response.status_code < 500, response.get_data(as_text=True)
