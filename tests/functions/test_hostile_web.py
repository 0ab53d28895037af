"""web_chat against hostile clients: a history that would cost more than the context
uses, dates the context cannot show, tokens whose header lies about their key."""

from __future__ import annotations

import json
import uuid
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from flask.testing import FlaskClient

from tests.fakes.anthropic_api import FakeAnthropic
from tests.fakes.jwks import KID, FakeJwks
from tests.helpers import JWT_SECRET, app_client, bearer, stored_count


def history(count: int, size: int, **extra: Any) -> list[dict[str, Any]]:
    roles = ("user", "assistant")
    return [{"role": roles[index % 2], "content": f"{index:03d}" + "x" * (size - 3), **extra} for index in range(count)]


def test_a_history_past_max_history_chars_is_413_and_nothing_is_stored(
    web: FlaskClient, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    person = uuid.uuid4()
    body = {"message": "summarise all that", "history": history(15, 60_000)}
    response = web.post("/", json=body, headers=bearer(person))
    assert (response.status_code, response.get_json()) == (
        413,
        {
            "error": "history_too_long",
            "message": "the history the context would use has 900000 characters; the limit is 64000",
        },
    )
    assert stored_count(database_url, person) == 0 and fake_anthropic.requests == []


def test_max_history_chars_follows_max_message_chars_and_can_be_set(
    environment: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic
) -> None:
    environment.setenv("SUPABASE_JWT_SECRET", JWT_SECRET)
    environment.setenv("MAX_MESSAGE_CHARS", "1000")
    body = {"message": "hi", "history": history(2, 2001)}
    response = app_client("web_chat").post("/", json=body, headers=bearer(uuid.uuid4()))
    assert (response.status_code, response.get_json()["message"]) == (
        413,
        "the history the context would use has 4002 characters; the limit is 4000",
    )
    environment.setenv("MAX_HISTORY_CHARS", "5000")
    response = app_client("web_chat").post("/", json=body, headers=bearer(uuid.uuid4()))
    assert response.status_code == 200


def test_only_the_part_of_the_history_the_context_uses_is_kept_and_counted(
    web: FlaskClient, environment: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic
) -> None:
    # 40 items: the stepped window (at most 15, its start moving 8 at a time) is the last 8,
    # 16,000 characters; the 320,000 before them are neither sent nor counted.
    environment.setenv("CONTEXT_MAX_MESSAGES", "16")
    environment.setenv("CONTEXT_WINDOW_STEP", "8")
    web = app_client("web_chat")
    big = history(32, 10_000)
    small = history(8, 2_000)
    response = web.post("/", json={"message": "and now?", "history": big + small}, headers=bearer(uuid.uuid4()))
    assert response.status_code == 200, response.get_json()
    sent = json.dumps(fake_anthropic.requests[-1]["messages"])
    assert "x" * 10_000 not in sent
    assert sent.count("x" * 1_997) == 8


@pytest.mark.parametrize("date", ["0001-01-01T00:00:00+05:00", "9999-12-31T23:00:00-05:00"])
def test_a_history_date_the_context_cannot_show_is_400_and_nothing_is_stored(
    web: FlaskClient, database_url: str, fake_anthropic: FakeAnthropic, date: str
) -> None:
    person = uuid.uuid4()
    body = {"message": "when was that?", "history": [{"role": "user", "content": "long ago", "created_at": date}]}
    response = web.post("/", json=body, headers=bearer(person))
    assert (response.status_code, response.get_json()) == (
        400,
        {"error": "date_out_of_range", "message": f"the date {date} cannot be shown in the context's time zone"},
    )
    assert stored_count(database_url, person) == 0 and fake_anthropic.requests == []


@pytest.mark.parametrize(
    ("zone", "date"),
    [("Pacific/Kiritimati", "9999-12-31T23:00:00+00:00"), ("Pacific/Pago_Pago", "0001-01-01T05:00:00+00:00")],
)
def test_a_history_date_the_persons_own_time_zone_cannot_show_is_400_too(
    web: FlaskClient, database_url: str, fake_anthropic: FakeAnthropic, zone: str, date: str
) -> None:
    """A date CONTEXT_TIMEZONE (UTC) can show, but not the zone the person's earlier turn gave
    (UTC+14, UTC-11), which their context is shown in: refused before anything is stored, not a
    500 after the message was (and then held as still being answered)."""
    person = uuid.uuid4()
    first = web.post("/", json={"message": "hi", "timezone": zone}, headers=bearer(person))
    assert first.status_code == 200
    body = {
        "message": "again",
        "client_message_id": "c1",
        "history": [{"role": "user", "content": "old", "created_at": date}],
    }
    for _ in range(2):  # and the same again: refused alike, never held
        response = web.post("/", json=body, headers=bearer(person))
        assert (response.status_code, response.get_json()) == (
            400,
            {"error": "date_out_of_range", "message": f"the date {date} cannot be shown in the context's time zone"},
        )
    assert stored_count(database_url, person) == 2 and len(fake_anthropic.requests) == 1


def test_a_streamed_turn_refuses_the_same_history_before_any_event(
    web: FlaskClient, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    person = uuid.uuid4()
    headers = {**bearer(person), "Accept": "text/event-stream"}
    response = web.post("/", json={"message": "hi", "history": history(15, 60_000)}, headers=headers)
    assert (response.status_code, response.get_json()["error"]) == (413, "history_too_long")
    assert stored_count(database_url, person) == 0


def test_an_rs256_header_with_the_kid_of_the_projects_ec_key_is_401(
    environment: pytest.MonkeyPatch, jwks: FakeJwks, database_url: str
) -> None:
    environment.setenv("SUPABASE_JWKS_URL", jwks.url)
    client = app_client("web_chat")
    person = uuid.uuid4()
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    claims = {"sub": str(person), "aud": "authenticated", "exp": 2**40}
    token = jwt.encode(claims, rsa_key, algorithm="RS256", headers={"kid": KID})
    response = client.post("/", json={"message": "hi"}, headers={"Authorization": f"Bearer {token}"})
    assert (response.status_code, response.get_json()) == (
        401,
        {"error": "unauthorized", "message": "the token's key is not a RS256 key"},
    )
    assert stored_count(database_url, person) == 0


def test_a_conversation_title_with_nul_characters_is_stored_without_them(web: FlaskClient) -> None:
    response = web.post("/conversations", json={"title": "trip\u0000 plans"}, headers=bearer(uuid.uuid4()))
    assert (response.status_code, response.get_json()["title"]) == (201, "trip plans")


def test_a_client_message_id_with_nul_characters_still_stores_the_turn(
    web: FlaskClient, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    person = uuid.uuid4()
    response = web.post("/", json={"message": "hi", "client_message_id": "c\u00001"}, headers=bearer(person))
    assert (response.status_code, response.get_json()["outcome"]) == (200, "answered")
    assert stored_count(database_url, person) == 2


@pytest.mark.parametrize(
    ("message_id", "reason"),
    [
        (2**63, "less than or equal to 9223372036854775807"),
        (0, "greater than or equal to 1"),
        (-1, "greater than or equal to 1"),
    ],
)
def test_a_history_id_no_stored_message_can_have_is_400_and_nothing_is_stored(
    web: FlaskClient, database_url: str, fake_anthropic: FakeAnthropic, message_id: int, reason: str
) -> None:
    # merged_into_last counts the history's ids among the messages the answer answered: one past
    # bigint failed finish_turn after the reply went out, which was then never stored
    person = uuid.uuid4()
    body = {"message": "and then?", "history": [{"role": "user", "content": "first", "id": message_id}]}
    response = web.post("/", json=body, headers=bearer(person))
    assert (response.status_code, response.get_json()) == (
        400,
        {"error": "bad_request", "message": f"invalid body at history.0.id: Input should be {reason}"},
    )
    assert stored_count(database_url, person) == 0 and fake_anthropic.requests == []
