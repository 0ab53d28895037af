"""Places and contacts shared on Telegram and WhatsApp: part of the thread as text, and answered.

The real functions, the real Postgres, the fake Bot API and Anthropic; the WhatsApp forms signed
with the twilio SDK. The payloads are tests/corpus/telegram/21-25 and tests/corpus/twilio/03, 05.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from flask.testing import FlaskClient

from tests.fakes.anthropic_api import FakeAnthropic
from tests.fakes.telegram_api import FakeTelegram
from tests.helpers import (
    PUBLIC_BASE_URL,
    TELEGRAM_HEADERS,
    TWILIO_TOKEN,
    app_client,
    count,
    messages_of,
    signed,
    stored_turn,
    update,
)

CORPUS = Path(__file__).resolve().parents[1] / "corpus"
REPLY = "Anotado: ya sé dónde."


@pytest.fixture(autouse=True)
def answering(fake_anthropic: FakeAnthropic) -> None:
    fake_anthropic.answer = lambda body: REPLY


def telegram_update(name: str) -> dict[str, Any]:
    """A corpus update with an update_id of this test's own (the database is shared by the session)."""
    body: dict[str, Any] = json.loads((CORPUS / "telegram" / name).read_text())
    body["update_id"] = uuid.uuid4().int % 10**9
    return body


def last_said(anthropic: FakeAnthropic) -> str:
    """The last message the model was shown, without its `[telegram · 09:12] ` tag."""
    text: str = anthropic.requests[-1]["messages"][-1]["content"][0]["text"]
    return text.split("] ", 1)[1]


@pytest.mark.parametrize(
    ("name", "stored"),
    [
        ("21_private_location.json", "[location: -2.8903, -79.0043]"),
        ("22_private_venue.json", "[location: Cuenca, Provincia del Azuay · -2.8989, -79.0068]"),
    ],
    ids=["location", "venue"],
)
def test_a_telegram_location_or_venue_is_answered_and_kept_as_text(
    environment: pytest.MonkeyPatch,
    name: str,
    stored: str,
    database_url: str,
    fake_anthropic: FakeAnthropic,
    fake_telegram: FakeTelegram,
) -> None:
    body = telegram_update(name)
    client = app_client("telegram_webhook")
    for _ in range(2):  # a redelivery changes nothing
        assert client.post("/", json=body, headers=TELEGRAM_HEADERS).status_code == 200
    assert stored_turn(database_url, str(body["update_id"])) == [
        ("user", stored),
        ("assistant", REPLY),
    ]
    assert len(fake_anthropic.requests) == 1 and last_said(fake_anthropic) == stored
    assert [(p["chat_id"], p["text"]) for p in fake_telegram.sent()] == [(3527065, REPLY)]


def test_a_contact_card_is_answered_by_its_name_and_its_number_is_kept_nowhere(
    environment: pytest.MonkeyPatch, database_url: str, fake_anthropic: FakeAnthropic, fake_telegram: FakeTelegram
) -> None:
    client = app_client("telegram_webhook")
    # Another person, in a chat of their own, before: their words are theirs alone.
    other = update("Mi dentista es el 0788 999 111", user_id=6060606)
    assert client.post("/", json=other, headers=TELEGRAM_HEADERS).status_code == 200
    body = telegram_update("23_private_contact.json")
    body["message"]["contact"].update(
        last_name="Ruiz", user_id=987654321, vcard="BEGIN:VCARD\nTEL:0788531373\nEND:VCARD"
    )
    assert client.post("/", json=body, headers=TELEGRAM_HEADERS).status_code == 200
    expected = "[contact: Adolf Taxi Ruiz]"
    assert stored_turn(database_url, str(body["update_id"])) == [
        ("user", expected),
        ("assistant", REPLY),
    ]
    shown = json.dumps(fake_anthropic.requests[-1], ensure_ascii=False)
    assert last_said(fake_anthropic) == expected and "Mi dentista" not in shown
    for kept in ("0788531373", "987654321", "VCARD"):
        assert kept not in shown
        assert count(database_url, "select count(*) from messages where content like %s", f"%{kept}%") == 0
    assert fake_telegram.sent()[-1] == {"chat_id": 3527065, "text": REPLY}


def test_a_live_location_is_answered_once_and_its_moves_store_nothing(
    environment: pytest.MonkeyPatch, database_url: str, fake_anthropic: FakeAnthropic, fake_telegram: FakeTelegram
) -> None:
    client = app_client("telegram_webhook")
    first = telegram_update("24_live_location.json")
    chat = 5150000 + uuid.uuid4().int % 10**5  # this test's own chat, so the edits find this message
    first["message"]["chat"]["id"] = first["message"]["from"]["id"] = chat
    assert client.post("/", json=first, headers=TELEGRAM_HEADERS).status_code == 200
    stored = "[location: -2.8903, -79.0043]"
    assert stored_turn(database_url, str(first["update_id"])) == [
        ("user", stored),
        ("assistant", REPLY),
    ]
    calls = len(fake_telegram.calls)
    for seconds, (latitude, longitude) in enumerate([(-2.891544, -79.003901), (-2.893001, -79.0021)], start=1):
        moved = telegram_update("25_live_location_edit.json")
        edited = moved["edited_message"]
        edited["chat"]["id"] = edited["from"]["id"] = chat
        edited["edit_date"] += seconds * 60
        edited["location"].update(latitude=latitude, longitude=longitude)
        response = client.post("/", json=moved, headers=TELEGRAM_HEADERS)
        assert response.status_code == 200
        assert response.get_json() == {"ok": True, "ignored": "live location update"}
        assert stored_turn(database_url, str(moved["update_id"])) == []
    assert stored_turn(database_url, str(first["update_id"])) == [
        ("user", stored),
        ("assistant", REPLY),
    ]
    for moved_to in ("-2.8915", "-2.8930"):
        assert count(database_url, "select count(*) from messages where content like %s", f"%{moved_to}%") == 0
    assert len(fake_anthropic.requests) == 1 and len(fake_telegram.calls) == calls


@pytest.fixture
def whatsapp(environment: pytest.MonkeyPatch) -> FlaskClient:
    environment.setenv("TWILIO_AUTH_TOKEN", TWILIO_TOKEN)
    environment.setenv("PUBLIC_BASE_URL", PUBLIC_BASE_URL)
    return app_client("whatsapp_webhook")


@pytest.mark.parametrize(
    ("name", "stored"),
    [
        (
            "03_location_address_label.json",
            "[location: Microsoft, Evert van de Beekstraat 354, Schiphol, North Holland 1118 CZ · 52.3039, 4.7500]",
        ),
        ("05_location_messagetype.json", "[location: 25.0188, -77.3960]"),
    ],
    ids=["label-and-address", "coordinates-only"],
)
def test_a_whatsapp_location_form_is_answered_and_kept_as_text(
    whatsapp: FlaskClient, name: str, stored: str, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    fields: dict[str, str] = json.loads((CORPUS / "twilio" / name).read_text())
    fields["MessageSid"] = "SM" + uuid.uuid4().hex  # the captures' Sids are shared by other tests
    for _ in range(2):  # Twilio's redelivery: the stored reply again, the model asked once
        response = whatsapp.post("/", data=fields, headers=signed(fields))
        assert response.status_code == 200
        assert messages_of(response.get_data(as_text=True)) == [REPLY]
    assert stored_turn(database_url, fields["MessageSid"]) == [
        ("user", stored),
        ("assistant", REPLY),
    ]
    assert len(fake_anthropic.requests) == 1 and last_said(fake_anthropic) == stored


def test_a_whatsapp_location_without_usable_coordinates_or_name_is_answered_in_words_and_not_stored(
    whatsapp: FlaskClient, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    fields: dict[str, str] = json.loads((CORPUS / "twilio" / "05_location_messagetype.json").read_text())
    fields.update(MessageSid="SM" + uuid.uuid4().hex, Latitude="nan")
    response = whatsapp.post("/", data=fields, headers=signed(fields))
    assert response.status_code == 200
    assert "location" in messages_of(response.get_data(as_text=True))[0]
    assert stored_turn(database_url, fields["MessageSid"]) == [] and fake_anthropic.requests == []
