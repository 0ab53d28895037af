"""Voice notes, photos and documents end to end: the corpus's real updates and forms drive the
real functions; Telegram's files, Twilio's media host and Deepgram are local fakes reached
through their base-URL settings; the fixtures are a real JPEG, PDF and OGG/Opus voice note
(tests/corpus/media/SOURCES.md).

The corpus's Telegram media updates come from a supergroup: each test moves them into a
private chat with the same sender (and gives the update and the sender ids of its own, as the
session's database is shared)."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask.testing import FlaskClient

from core.media.turn_media import DESCRIBE_PROMPT
from functions import runtime
from tests.fakes.anthropic_api import FakeAnthropic
from tests.fakes.deepgram_api import FakeDeepgram
from tests.fakes.telegram_api import FakeTelegram
from tests.fakes.twilio_api import FakeTwilio
from tests.helpers import (
    CORPUS,
    ENGLISH,
    PUBLIC_BASE_URL,
    TELEGRAM_HEADERS,
    TWILIO_TOKEN,
    app_client,
    as_owner,
    bearer,
    form,
    messages_of,
    ogg_lasting,
    rows,
    signed,
    stored_turn,
)

MEDIA = CORPUS / "media"
RECEIPT = (MEDIA / "receipt.jpg").read_bytes()
LEASE = (MEDIA / "lease.pdf").read_bytes()
VOICE = (MEDIA / "voice_note_es.ogg").read_bytes()
DEEPGRAM_KEY = "deepgram-test-key"
# The account of the corpus's media form (tests/corpus/twilio/02_media_image.json).
ACCOUNT_SID = "AC1a03647d811fab342c0ad608e382fab2"
DESCRIPTION = "A receipt from Bar Pepe: café con leche and a tostada, 5,50 EUR, 12/11/2026."
TRANSCRIPT = "Hola, mañana tengo cita con el dentista a las diez."


def answers(body: dict[str, Any]) -> str:
    """The reply model answers; the describer (its own system prompt) describes."""
    if body["system"][0]["text"] == DESCRIBE_PROMPT:
        return DESCRIPTION
    last = body["messages"][-1]["content"][-1]["text"]
    return f"Got it: {last[-60:]}"


@pytest.fixture
def fake_deepgram() -> Iterator[FakeDeepgram]:
    server = FakeDeepgram(DEEPGRAM_KEY)
    yield server
    server.close()


@pytest.fixture
def fake_twilio() -> Iterator[FakeTwilio]:
    server = FakeTwilio(ACCOUNT_SID, TWILIO_TOKEN)
    yield server
    server.close()


@pytest.fixture
def media_env(
    environment: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic, fake_deepgram: FakeDeepgram, fake_twilio: FakeTwilio
) -> pytest.MonkeyPatch:
    fake_anthropic.answer = answers
    environment.setenv("DEEPGRAM_API_KEY", DEEPGRAM_KEY)
    environment.setenv("DEEPGRAM_API_BASE", fake_deepgram.url)
    environment.setenv("TWILIO_ACCOUNT_SID", ACCOUNT_SID)
    environment.setenv("TWILIO_AUTH_TOKEN", TWILIO_TOKEN)
    environment.setenv("TWILIO_API_BASE", fake_twilio.url)
    environment.setenv("WHATSAPP_TYPING_INDICATOR", "false")
    environment.setenv("PUBLIC_BASE_URL", PUBLIC_BASE_URL)
    return environment


def private(name: str, sender: int | None = None) -> dict[str, Any]:
    """A corpus update, moved into a private chat with its sender, with ids of this test's own."""
    body = json.loads((CORPUS / "telegram" / name).read_text())
    message = dict(body["message"])
    sender = sender or 700_000_000 + uuid.uuid4().int % 10**8
    message["from"] = {**message["from"], "id": sender}
    message["chat"] = {"id": sender, "type": "private", "first_name": message["from"]["first_name"]}
    return {"update_id": uuid.uuid4().int % 10**9, "message": message}


def user_message(database_url: str, external_id: str) -> str:
    return next(content for role, content in stored_turn(database_url, external_id) if role == "user")


def replies(fake_anthropic: FakeAnthropic) -> list[dict[str, Any]]:
    return [body for body in fake_anthropic.requests if body["system"][0]["text"] != DESCRIBE_PROMPT]


def described(fake_anthropic: FakeAnthropic) -> list[dict[str, Any]]:
    return [body for body in fake_anthropic.requests if body["system"][0]["text"] == DESCRIBE_PROMPT]


def telegram_post(client: FlaskClient, body: dict[str, Any]) -> int:
    return client.post("/", json=body, headers=TELEGRAM_HEADERS).status_code


# Photos.


def test_a_telegram_photo_reaches_the_model_as_an_image_and_whatsapp_remembers_it(
    media_env: pytest.MonkeyPatch,
    owner: uuid.UUID,
    fake_anthropic: FakeAnthropic,
    fake_telegram: FakeTelegram,
    database_url: str,
) -> None:
    body = private("05_photo_caption.json")
    sender = body["message"]["from"]["id"]
    number = f"+3460{uuid.uuid4().int % 10**6:06d}"
    as_owner(media_env, owner, telegram=str(sender), whatsapp=number)
    # The largest of the four sizes within 1568 px and 1.15 megapixels: 720x1280.
    chosen = body["message"]["photo"][3]["file_id"]
    fake_telegram.files[chosen] = RECEIPT
    assert telegram_post(app_client("telegram_webhook"), body) == 200

    assert [payload["file_id"] for payload in fake_telegram.sent("getFile")] == [chosen]
    [asked] = replies(fake_anthropic)
    image, text = asked["messages"][-1]["content"]
    assert image == {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/jpeg", "data": base64.b64encode(RECEIPT).decode()},
    }
    assert text["text"].endswith("[photo] OK - some mages") and "cache_control" not in text
    assert len(described(fake_anthropic)) == 1
    assert user_message(database_url, str(body["update_id"])) == f"[photo: {DESCRIPTION}] OK - some mages"
    assert fake_telegram.sent()[-1]["text"] == "Got it: " + text["text"][-60:]

    # The next turn, on WhatsApp: the description, not the image.
    fields = form("¿cuánto pagué?", sender=f"whatsapp:{number}")
    whatsapp = app_client("whatsapp_webhook")
    assert whatsapp.post("/", data=fields, headers=signed(fields)).status_code == 200
    later = replies(fake_anthropic)[-1]
    blocks = [block for message in later["messages"] for block in message["content"]]
    assert all(block["type"] == "text" for block in blocks)
    assert f"[photo: {DESCRIPTION}] OK - some mages" in "\n".join(block["text"] for block in blocks)


def test_an_image_document_is_read_as_the_image_its_bytes_are(
    media_env: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic, fake_telegram: FakeTelegram, database_url: str
) -> None:
    body = private("08_document.json")
    fake_telegram.files[body["message"]["document"]["file_id"]] = RECEIPT  # named .png, a JPEG inside
    assert telegram_post(app_client("telegram_webhook"), body) == 200
    image = replies(fake_anthropic)[0]["messages"][-1]["content"][0]
    assert image["type"] == "image" and image["source"]["media_type"] == "image/jpeg"
    assert user_message(database_url, str(body["update_id"])) == f"[photo: {DESCRIPTION}] rrrrrrrrrrrr"


def test_a_pdf_reaches_the_model_as_a_document_block(
    media_env: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic, fake_telegram: FakeTelegram, database_url: str
) -> None:
    body = private("08_document.json")
    document = body["message"]["document"]
    body["message"]["document"] = {**document, "mime_type": "application/pdf", "file_name": "lease.pdf"}
    body["message"]["caption"] = "mi contrato"
    fake_telegram.files[document["file_id"]] = LEASE
    assert telegram_post(app_client("telegram_webhook"), body) == 200
    block, text = replies(fake_anthropic)[0]["messages"][-1]["content"]
    assert block == {
        "type": "document",
        "source": {"type": "base64", "media_type": "application/pdf", "data": base64.b64encode(LEASE).decode()},
    }
    assert text["text"].endswith('[PDF "lease.pdf"] mi contrato')
    assert user_message(database_url, str(body["update_id"])) == f'[PDF "lease.pdf": {DESCRIPTION}] mi contrato'


def test_twilios_media_form_is_fetched_from_twilio_with_the_accounts_credentials(
    media_env: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic, fake_twilio: FakeTwilio, database_url: str
) -> None:
    fields = json.loads((CORPUS / "twilio" / "02_media_image.json").read_text())
    fields["MessageSid"] = "MM" + uuid.uuid4().hex
    path = fields["MediaUrl0"].removeprefix("https://api.twilio.com")
    fake_twilio.media[path] = (RECEIPT, "image/jpeg")
    response = app_client("whatsapp_webhook").post("/", data=fields, headers=signed(fields))
    assert response.status_code == 200
    assert fake_twilio.media_requests == [path]
    image, text = replies(fake_anthropic)[0]["messages"][-1]["content"]
    assert image["source"]["data"] == base64.b64encode(RECEIPT).decode()
    assert text["text"].endswith("[photo]")
    assert messages_of(response.text) == ["Got it: " + text["text"][-60:]]
    assert user_message(database_url, fields["MessageSid"]) == f"[photo: {DESCRIPTION}]"


def test_a_contact_card_beside_a_photo_is_named_and_the_photo_still_answered(
    media_env: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic, fake_twilio: FakeTwilio, database_url: str
) -> None:
    """Issue 30, finding 8: a vCard beside an image answered "not this kind of file" and dropped the image."""
    card = f"/2010-04-01/Accounts/{ACCOUNT_SID}/Messages/MM1/Media/ME1"
    photo = f"/2010-04-01/Accounts/{ACCOUNT_SID}/Messages/MM1/Media/ME2"
    fake_twilio.media[card] = (b"BEGIN:VCARD\nFN:Ana\nEND:VCARD\n", "text/vcard")
    fake_twilio.media[photo] = (RECEIPT, "image/jpeg")
    fields = form(
        "who is this and what is this?",
        NumMedia="2",
        MediaUrl0="https://api.twilio.com" + card,
        MediaContentType0="text/vcard",
        MediaUrl1="https://api.twilio.com" + photo,
        MediaContentType1="image/jpeg",
    )
    response = app_client("whatsapp_webhook").post("/", data=fields, headers=signed(fields))
    assert response.status_code == 200
    assert fake_twilio.media_requests == [photo]  # the card is not fetched: nothing could read it
    image, text = replies(fake_anthropic)[0]["messages"][-1]["content"]
    assert image["source"]["data"] == base64.b64encode(RECEIPT).decode()
    assert messages_of(response.text) == ["Got it: " + text["text"][-60:]]
    assert user_message(database_url, fields["MessageSid"]) == (
        f"[file text/vcard, not read: a type I cannot read] [photo: {DESCRIPTION}] who is this and what is this?"
    )


@pytest.mark.parametrize(
    "url",
    [
        "https://media.example.com/2010-04-01/Accounts/{sid}/Messages/MM1/Media/ME1",
        "http://api.twilio.com/2010-04-01/Accounts/{sid}/Messages/MM1/Media/ME1",
        "https://api.twilio.com.example.com/2010-04-01/Accounts/{sid}/Messages/MM1/Media/ME1",
        "https://api.twilio.com/2010-04-01/Accounts/AC00000000000000000000000000000000/Messages/MM1/Media/ME1",
        "https://api.twilio.com/2010-04-01/Accounts/{sid}/Messages/MM1/Media/ME1?redirect=https://x.example",
        "{fake}/2010-04-01/Accounts/{sid}/Messages/MM1/Media/ME1",
        "https://[api.twilio.com/2010-04-01/Accounts/{sid}/Messages/MM1/Media/ME1",
    ],
    ids=["other host", "http", "look-alike host", "other account", "query", "the fake itself", "no URL at all"],
)
def test_a_media_url_off_twilios_media_host_is_never_fetched(
    media_env: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic, fake_twilio: FakeTwilio, database_url: str, url: str
) -> None:
    fake_twilio.media["/2010-04-01/Accounts/" + ACCOUNT_SID + "/Messages/MM1/Media/ME1"] = (RECEIPT, "image/jpeg")
    target = url.format(sid=ACCOUNT_SID, fake=fake_twilio.url)
    fields = form("", NumMedia="1", MediaUrl0=target, MediaContentType0="image/jpeg")
    response = app_client("whatsapp_webhook").post("/", data=fields, headers=signed(fields))
    assert response.status_code == 200
    assert fake_twilio.media_requests == [] and fake_anthropic.requests == []
    assert messages_of(response.text) == [
        "Sorry, I couldn't use what you sent (it was not on Twilio's media host). "
        "Could you tell me in words what it says?"
    ]
    assert user_message(database_url, fields["MessageSid"]) == "[photo, not read: it was not on Twilio's media host]"


# Voice notes.


def test_a_voice_note_is_transcribed_once_and_answered_once_however_often_it_is_delivered(
    media_env: pytest.MonkeyPatch,
    fake_anthropic: FakeAnthropic,
    fake_telegram: FakeTelegram,
    fake_deepgram: FakeDeepgram,
    database_url: str,
) -> None:
    body = private("07_voice.json")
    fake_telegram.files[body["message"]["voice"]["file_id"]] = VOICE
    client = app_client("telegram_webhook")
    for _ in range(3):
        assert telegram_post(client, body) == 200
    [heard] = fake_deepgram.requests
    assert heard.audio == VOICE and heard.content_type == "audio/ogg"
    assert heard.query == {"model": ["nova-3"], "detect_language": ["true"], "smart_format": ["true"]}
    [asked] = fake_anthropic.requests
    assert asked["messages"][-1]["content"][-1]["text"].endswith(f"[voice note, 0:03] {TRANSCRIPT}")
    assert len(fake_telegram.sent()) == 1 and len(fake_telegram.downloads) == 1
    assert stored_turn(database_url, str(body["update_id"]))[0] == ("user", f"[voice note, 0:03] {TRANSCRIPT}")


def test_a_whatsapp_voice_note_says_its_own_length(
    media_env: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic, fake_twilio: FakeTwilio, database_url: str
) -> None:
    """Twilio's form gives no duration: the OGG file's own granule position does (3.7 s)."""
    path = f"/2010-04-01/Accounts/{ACCOUNT_SID}/Messages/MM{uuid.uuid4().hex}/Media/ME{uuid.uuid4().hex}"
    fake_twilio.media[path] = (VOICE, "audio/ogg")
    fields = form("", NumMedia="1", MediaUrl0="https://api.twilio.com" + path, MediaContentType0="audio/ogg")
    response = app_client("whatsapp_webhook").post("/", data=fields, headers=signed(fields))
    assert response.status_code == 200 and len(messages_of(response.text)) == 1
    assert user_message(database_url, fields["MessageSid"]) == f"[voice note, 0:04] {TRANSCRIPT}"


def test_without_a_transcription_service_a_voice_note_gets_a_polite_answer(
    media_env: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic, fake_telegram: FakeTelegram, database_url: str
) -> None:
    media_env.delenv("DEEPGRAM_API_KEY")
    body = private("07_voice.json")
    fake_telegram.files[body["message"]["voice"]["file_id"]] = VOICE
    assert telegram_post(app_client("telegram_webhook"), body) == 200
    assert fake_anthropic.requests == [] and fake_telegram.downloads == []
    assert [m["text"] for m in fake_telegram.sent()] == [ENGLISH.say("media.no_transcriber")]
    assert stored_turn(database_url, str(body["update_id"])) == [
        ("user", "[voice note, 0:03, not transcribed: no transcription service]"),
        ("assistant", ENGLISH.say("media.no_transcriber")),
    ]


def test_a_failing_transcription_service_is_a_clear_answer_and_never_retried_on_redelivery(
    media_env: pytest.MonkeyPatch,
    fake_anthropic: FakeAnthropic,
    fake_telegram: FakeTelegram,
    fake_deepgram: FakeDeepgram,
    database_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The person's history says the service failed, in the words they were answered with; its
    status is the log line's (the thread kept "the transcription service answered 500")."""
    fake_deepgram.behaviour = "500"
    body = private("07_voice.json")
    fake_telegram.files[body["message"]["voice"]["file_id"]] = VOICE
    client = app_client("telegram_webhook")
    assert telegram_post(client, body) == 200
    assert telegram_post(client, body) == 200
    assert len(fake_deepgram.requests) == 1 and fake_anthropic.requests == []
    assert stored_turn(database_url, str(body["update_id"]))[0] == (
        "user",
        "[voice note, 0:03, not transcribed: the transcription service failed]",
    )
    assert fake_telegram.sent()[0]["text"] == unreadable("the transcription service failed")
    [line] = [r for r in caplog.records if r.name == "crossmem.transcription"]
    assert (line.levelname, line.getMessage(), line.__dict__["status"]) == (
        "WARNING",
        "the transcription service refused",
        500,
    )


def test_a_slow_transcription_service_is_given_up_within_its_timeout(
    media_env: pytest.MonkeyPatch, fake_telegram: FakeTelegram, fake_deepgram: FakeDeepgram, database_url: str
) -> None:
    media_env.setenv("TRANSCRIPTION_TIMEOUT", "0.3")
    fake_deepgram.behaviour, fake_deepgram.slow_s = "slow", 2.0
    body = private("07_voice.json")
    fake_telegram.files[body["message"]["voice"]["file_id"]] = VOICE
    assert telegram_post(app_client("telegram_webhook"), body) == 200
    assert user_message(database_url, str(body["update_id"])) == (
        "[voice note, 0:03, not transcribed: the transcription service was too slow]"
    )


def test_a_voice_note_longer_than_the_limit_is_neither_downloaded_nor_transcribed(
    media_env: pytest.MonkeyPatch,
    fake_telegram: FakeTelegram,
    fake_deepgram: FakeDeepgram,
    database_url: str,
) -> None:
    media_env.setenv("VOICE_MAX_SECONDS", "2")
    body = private("07_voice.json")
    fake_telegram.files[body["message"]["voice"]["file_id"]] = VOICE
    assert telegram_post(app_client("telegram_webhook"), body) == 200
    assert fake_telegram.downloads == [] and fake_deepgram.requests == []
    assert user_message(database_url, str(body["update_id"])) == (
        "[voice note, 0:03, not transcribed: longer than 0:02]"
    )


# Limits and failures.


def test_a_photo_over_the_byte_limit_is_refused_before_it_is_downloaded(
    media_env: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic, fake_telegram: FakeTelegram, database_url: str
) -> None:
    media_env.setenv("IMAGE_MAX_BYTES", "100000")  # the chosen size says 151,590 bytes
    body = private("05_photo_caption.json")
    assert telegram_post(app_client("telegram_webhook"), body) == 200
    assert fake_telegram.sent("getFile") == [] and fake_anthropic.requests == []
    assert fake_telegram.sent()[0]["text"] == (
        "Sorry, I couldn't use what you sent (larger than 0.1 MB). Could you tell me in words what it says?"
    )
    assert user_message(database_url, str(body["update_id"])) == "[photo, not read: larger than 0.1 MB] OK - some mages"


def test_a_file_telegram_will_not_give_is_a_clear_answer(
    media_env: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic, fake_telegram: FakeTelegram, database_url: str
) -> None:
    body = private("05_photo_caption.json")  # no file in the fake: getFile answers 400
    assert telegram_post(app_client("telegram_webhook"), body) == 200
    assert fake_anthropic.requests == []
    stored = user_message(database_url, str(body["update_id"]))
    assert stored == "[photo, not read: Telegram would not give the file] OK - some mages"


@pytest.mark.parametrize("odd_path", ["photos/file\x07.jpg", "photos/" + "a" * 70_000], ids=["control", "70000"])
def test_a_file_path_httpx_cannot_use_is_a_clear_answer_not_a_500(
    media_env: pytest.MonkeyPatch, fake_telegram: FakeTelegram, database_url: str, odd_path: str
) -> None:
    body = private("05_photo_caption.json")
    chosen = body["message"]["photo"][3]["file_id"]
    fake_telegram.files[chosen] = RECEIPT
    fake_telegram.file_paths[chosen] = odd_path
    assert telegram_post(app_client("telegram_webhook"), body) == 200
    stored = user_message(database_url, str(body["update_id"]))
    assert stored == "[photo, not read: the download failed] OK - some mages"


def test_a_file_the_model_cannot_read_is_named_and_stored_as_such(
    media_env: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic, fake_telegram: FakeTelegram, database_url: str
) -> None:
    body = private("08_document.json")
    document = body["message"]["document"]
    body["message"]["document"] = {**document, "mime_type": "application/msword", "file_name": "cv.doc"}
    assert telegram_post(app_client("telegram_webhook"), body) == 200
    assert fake_anthropic.requests == [] and fake_telegram.sent("getFile") == []
    assert fake_telegram.sent()[0]["text"].startswith("I can read photos, PDFs and voice notes, not .doc files.")
    assert user_message(database_url, str(body["update_id"])) == (
        "[file application/msword, not read: a type I cannot read] rrrrrrrrrrrr"
    )


def test_a_photo_turn_costs_more_tokens_than_a_text_turn_and_the_budget_counts_them(
    media_env: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic, fake_telegram: FakeTelegram, database_url: str
) -> None:
    media_env.setenv("TOKENS_PER_DAY", "1000000")  # the budget on: turn_usage counts each turn's tokens
    client = app_client("telegram_webhook")
    text = private("05_photo_caption.json")
    del text["message"]["photo"]
    text["message"]["text"] = text["message"].pop("caption")
    photo = private("05_photo_caption.json")
    fake_telegram.files[photo["message"]["photo"][3]["file_id"]] = RECEIPT
    assert telegram_post(client, text) == 200
    assert telegram_post(client, photo) == 200
    counted = {
        external_id: tokens
        for external_id, tokens in rows(
            database_url,
            "select m.external_id, u.tokens from turn_usage u join messages m on m.id = u.message_id"
            " where m.external_id in (%s, %s)",
            str(text["update_id"]),
            str(photo["update_id"]),
        )
    }
    # The receipt is 480x640: 409 tokens by Claude's rule (the fake's), in the answer and the description.
    assert counted[str(photo["update_id"])] - counted[str(text["update_id"])] >= 2 * 409


# The web.


def test_the_web_takes_an_image_as_base64_and_lists_it_with_its_kind(
    media_env: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic, web: FlaskClient, owner: uuid.UUID
) -> None:
    attachment = {"media_type": "image/jpeg", "data": base64.b64encode(RECEIPT).decode()}
    sent = web.post("/", json={"message": "what is this?", "attachments": [attachment]}, headers=bearer(owner))
    assert sent.status_code == 200, sent.text
    image = replies(fake_anthropic)[0]["messages"][-1]["content"][0]
    assert image["source"] == {"type": "base64", **attachment}
    conversation = sent.get_json()["conversation_id"]
    listed = web.get(f"/conversations/{conversation}/messages", headers=bearer(owner)).get_json()["messages"]
    assert [(m["role"], m["kind"], m["content"]) for m in listed] == [
        ("user", "image", f"[photo: {DESCRIPTION}] what is this?"),
        ("assistant", "text", sent.get_json()["reply"]),
    ]


def test_a_web_image_of_exactly_image_max_bytes_is_read_and_one_byte_more_is_refused(
    media_env: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic, web: FlaskClient, owner: uuid.UUID
) -> None:
    """The web's images come in the request, not from a platform: IMAGE_MAX_BYTES holds for them
    too (issue 30, finding 9), through the function's own settings."""
    attachment = {"media_type": "image/jpeg", "data": base64.b64encode(RECEIPT).decode()}
    media_env.setenv("IMAGE_MAX_BYTES", str(len(RECEIPT)))
    runtime.reset()
    exactly = web.post("/", json={"message": "and this?", "attachments": [attachment]}, headers=bearer(owner))
    assert exactly.get_json()["outcome"] == "answered"
    assert replies(fake_anthropic)[0]["messages"][-1]["content"][0]["source"]["data"] == attachment["data"]
    media_env.setenv("IMAGE_MAX_BYTES", str(len(RECEIPT) - 1))
    runtime.reset()
    past = web.post("/", json={"message": "and this?", "attachments": [attachment]}, headers=bearer(owner))
    limit = f"{(len(RECEIPT) - 1) / 1_000_000:.1f}"
    assert past.get_json()["reply"] == ENGLISH.say("media.unreadable", reason=f"larger than {limit} MB")
    assert len(replies(fake_anthropic)) == 1
    conversation = past.get_json()["conversation_id"]
    listed = web.get(f"/conversations/{conversation}/messages", headers=bearer(owner)).get_json()["messages"]
    assert listed[0]["content"] == f"[photo, not read: larger than {limit} MB] and this?"


def test_the_web_takes_a_voice_note_alone_and_remembers_its_transcript(
    media_env: pytest.MonkeyPatch,
    fake_anthropic: FakeAnthropic,
    fake_deepgram: FakeDeepgram,
    web: FlaskClient,
    owner: uuid.UUID,
) -> None:
    """A voice note with no text, as the demo page's microphone sends one: here an Ogg file (a
    recorder that makes Ogg, or any API client), whose length is read from the file, as WhatsApp's is."""
    attachment = {"media_type": "audio/ogg", "data": base64.b64encode(VOICE).decode()}
    sent = web.post("/", json={"message": "", "attachments": [attachment]}, headers=bearer(owner))
    assert sent.status_code == 200, sent.text
    assert [(heard.content_type, heard.audio) for heard in fake_deepgram.requests] == [("audio/ogg", VOICE)]
    assert replies(fake_anthropic)[0]["messages"][-1]["content"][-1]["text"].endswith(
        f"[voice note, 0:04] {TRANSCRIPT}"
    )
    conversation = sent.get_json()["conversation_id"]
    listed = web.get(f"/conversations/{conversation}/messages", headers=bearer(owner)).get_json()["messages"]
    assert [(m["role"], m["kind"], m["content"]) for m in listed][0] == (
        "user",
        "voice",
        f"[voice note, 0:04] {TRANSCRIPT}",
    )


@pytest.mark.parametrize(
    ("claimed", "heard", "transcriptions", "stored"),
    [
        (0, 3.7, 1, f"[voice note, 0:04] {TRANSCRIPT}"),  # off by more than a second: what was heard
        (3, 900.0, 1, "[voice note, 0:03, not transcribed: longer than 2:00]"),  # heard too long: unused
        (300, 3.7, 0, "[voice note, 5:00, not transcribed: longer than 2:00]"),  # said too long: not sent
    ],
)
def test_a_web_voice_notes_claimed_length_is_checked_against_what_the_service_heard(
    media_env: pytest.MonkeyPatch,
    fake_anthropic: FakeAnthropic,
    fake_deepgram: FakeDeepgram,
    web: FlaskClient,
    owner: uuid.UUID,
    claimed: int,
    heard: float,
    transcriptions: int,
    stored: str,
) -> None:
    """Chromium records WebM, whose length the recorder sends: a claim past VOICE_MAX_SECONDS is
    refused before anything is transcribed; Deepgram's length wins when the two disagree, and a
    note it hears as too long is answered like one that said so, the model never asked."""
    fake_deepgram.duration = heard
    attachment = {"media_type": "audio/webm", "data": base64.b64encode(VOICE).decode(), "seconds": claimed}
    sent = web.post("/", json={"message": "", "attachments": [attachment]}, headers=bearer(owner))
    assert sent.status_code == 200, sent.text
    assert len(fake_deepgram.requests) == transcriptions
    conversation = sent.get_json()["conversation_id"]
    listed = web.get(f"/conversations/{conversation}/messages", headers=bearer(owner)).get_json()["messages"]
    assert listed[0]["content"] == stored
    if "not transcribed" in stored:
        assert sent.get_json()["reply"] == unreadable("longer than 2:00")
        assert replies(fake_anthropic) == []


def voice_note(web: FlaskClient, owner: uuid.UUID, seconds: int) -> str:
    """A WebM voice note from the web, as the demo page sends one: its reply."""
    attachment = {"media_type": "audio/webm", "data": base64.b64encode(VOICE).decode(), "seconds": seconds}
    sent = web.post("/", json={"message": "", "attachments": [attachment]}, headers=bearer(owner))
    assert sent.status_code == 200, sent.text
    return str(sent.get_json()["reply"])


def test_a_persons_day_of_listening_ends_at_voice_seconds_per_day(
    media_env: pytest.MonkeyPatch, fake_deepgram: FakeDeepgram, web: FlaskClient, owner: uuid.UUID, database_url: str
) -> None:
    """Honest notes of 4 seconds (heard as 3.7) against a day of 10: two are transcribed, the third
    is answered without being sent to Deepgram, and what was counted is in voice_usage."""
    media_env.setenv("VOICE_SECONDS_PER_DAY", "10")
    runtime.reset()
    replies_ = [voice_note(web, owner, 4) for _ in range(3)]
    # In Spanish: the first two were heard in Spanish, remembered as the person's language.
    assert replies_[2] == (
        "Perdona, no he podido usar lo que me has enviado (ya has usado las notas de voz de hoy). "
        "¿Me cuentas con palabras qué dice?"
    )
    assert "used up" not in replies_[0] + replies_[1]
    assert len(fake_deepgram.requests) == 2
    assert rows(database_url, "select seconds from voice_usage where user_id = %s order by at", owner) == [(4,), (4,)]


def test_a_web_client_that_lies_about_its_notes_pays_for_what_was_heard(
    media_env: pytest.MonkeyPatch, fake_deepgram: FakeDeepgram, web: FlaskClient, owner: uuid.UUID, database_url: str
) -> None:
    """Notes that say 3 seconds and last 900 (refused once heard, as too long) count 900 each: with a
    day of 1000, the second is still heard, the third is never sent to Deepgram."""
    media_env.setenv("VOICE_SECONDS_PER_DAY", "1000")
    runtime.reset()
    fake_deepgram.duration = 900.0
    answers_ = [voice_note(web, owner, 3) for _ in range(3)]
    assert answers_[:2] == [unreadable("longer than 2:00")] * 2
    assert answers_[2] == unreadable("today's voice notes are used up")
    assert len(fake_deepgram.requests) == 2
    assert rows(database_url, "select seconds from voice_usage where user_id = %s order by at", owner) == [
        (900,),
        (900,),
    ]


def test_a_note_with_no_words_or_a_failed_transcription_still_counts_in_the_day(
    media_env: pytest.MonkeyPatch, fake_deepgram: FakeDeepgram, web: FlaskClient, owner: uuid.UUID, database_url: str
) -> None:
    """Deepgram bills what it listened to: 100 s of silence that said 1 s count 100, a transcription
    that timed out counts what it said; each is settled, so the person's next note may go."""
    media_env.setenv("VOICE_SECONDS_PER_DAY", "150")
    media_env.setenv("TRANSCRIPTION_TIMEOUT", "0.5")
    runtime.reset()
    fake_deepgram.transcript, fake_deepgram.duration = "", 100.0
    assert voice_note(web, owner, 1) == unreadable("no words could be heard in it")
    fake_deepgram.behaviour, fake_deepgram.slow_s = "slow", 1.0
    assert voice_note(web, owner, 7) == unreadable("the transcription service failed")
    assert rows(
        database_url, "select seconds, in_flight_since from voice_usage where user_id = %s order by at", owner
    ) == [(100, None), (7, None)]
    fake_deepgram.behaviour = "ok"
    assert voice_note(web, owner, 50) == unreadable("today's voice notes are used up")
    assert len(fake_deepgram.requests) == 2


def test_a_transcription_service_answering_nonsense_is_a_failed_transcription_counted_as_said(
    media_env: pytest.MonkeyPatch,
    fake_deepgram: FakeDeepgram,
    web: FlaskClient,
    owner: uuid.UUID,
    database_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A 200 whose JSON holds no transcript: the person is told the transcription failed (no
    500, no model asked with an empty note), and the note counts what it said in their day. Their
    history (GET /conversations/<id>/messages) says it in those words too; "answered nonsense",
    which it said before, is the log line's alone."""
    fake_deepgram.behaviour = "nonsense"
    assert voice_note(web, owner, 6) == unreadable("the transcription service failed")
    assert len(fake_deepgram.requests) == 1
    assert rows(database_url, "select seconds, in_flight_since from voice_usage where user_id = %s", owner) == [
        (6, None)
    ]
    listed = rows(database_url, "select content from messages where user_id = %s and role = 'user'", owner)
    assert listed == [("[voice note, 0:06, not transcribed: the transcription service failed]",)]
    [line] = [r for r in caplog.records if r.name == "crossmem.transcription"]
    assert (line.levelname, line.getMessage(), line.__dict__["error"]) == (
        "WARNING",
        "the transcription service answered nonsense",
        "IndexError",
    )


def test_a_message_with_a_voice_note_said_too_long_sends_none_of_its_notes_to_deepgram(
    media_env: pytest.MonkeyPatch, fake_deepgram: FakeDeepgram, web: FlaskClient, owner: uuid.UUID
) -> None:
    data = base64.b64encode(VOICE).decode()
    notes = [{"media_type": "audio/webm", "data": data, "seconds": seconds} for seconds in (5, 300, 7)]
    sent = web.post("/", json={"message": "", "attachments": notes}, headers=bearer(owner))
    assert sent.status_code == 200, sent.text
    assert sent.get_json()["reply"] == unreadable("longer than 2:00")
    assert fake_deepgram.requests == []
    conversation = sent.get_json()["conversation_id"]
    listed = web.get(f"/conversations/{conversation}/messages", headers=bearer(owner)).get_json()["messages"]
    assert listed[0]["content"] == (
        "[voice note, 0:05, not transcribed: sent with a voice note too long to hear]"
        " [voice note, 5:00, not transcribed: longer than 2:00]"
        " [voice note, 0:07, not transcribed: sent with a voice note too long to hear]"
    )


# Issue 30, finding 6: voice paid at what was heard, and once.


def voice_seconds_of(database_url: str, external_id: str) -> list[tuple[int]]:
    return [
        (int(seconds),)
        for (seconds,) in rows(
            database_url,
            "select v.seconds from voice_usage v join messages m on m.id = v.message_id where m.external_id = %s",
            external_id,
        )
    ]


@pytest.mark.parametrize(
    ("file_size_said", "downloads", "reason"),
    [
        (True, 0, "larger than a 0:01 voice note can be"),  # refused before the download
        (False, 1, "larger than 0.2 MB"),  # the download stops at 1 s of Opus at 510 kbit/s
    ],
    ids=["size said", "size unsaid"],
)
def test_a_telegram_voice_note_heavier_than_its_length_never_reaches_deepgram(
    media_env: pytest.MonkeyPatch,
    fake_anthropic: FakeAnthropic,
    fake_telegram: FakeTelegram,
    fake_deepgram: FakeDeepgram,
    database_url: str,
    file_size_said: bool,
    downloads: int,
    reason: str,
) -> None:
    """`duration: 1` and 4.9 MB (about 108 minutes of Opus at 6 kbit/s): on 8281e8c it went whole
    to Deepgram and counted 6,500 s against a day of 1,800. One second of Opus is at most 510 kbit/s
    (RFC 6716) plus its headers: the note is refused, nothing is sent to Deepgram or counted."""
    media_env.setenv("VOICE_SECONDS_PER_DAY", "1800")
    runtime.reset()
    fake_deepgram.duration = 6500.0
    body = private("07_voice.json")
    heavy = VOICE + bytes(4_900_000 - len(VOICE))
    voice = {**body["message"]["voice"], "duration": 1, "file_size": len(heavy)}
    if not file_size_said:
        del voice["file_size"]
    body["message"]["voice"] = voice
    fake_telegram.files[voice["file_id"]] = heavy
    assert telegram_post(app_client("telegram_webhook"), body) == 200
    assert fake_deepgram.requests == [] and fake_anthropic.requests == []
    assert len(fake_telegram.downloads) == downloads
    assert [m["text"] for m in fake_telegram.sent()] == [ENGLISH.say("media.unreadable", reason=reason)]
    assert user_message(database_url, str(body["update_id"])) == f"[voice note, 0:01, not transcribed: {reason}]"
    assert voice_seconds_of(database_url, str(body["update_id"])) == []


def test_a_whatsapp_ogg_whose_last_page_says_a_second_is_never_sent_heavier(
    media_env: pytest.MonkeyPatch,
    fake_anthropic: FakeAnthropic,
    fake_twilio: FakeTwilio,
    fake_deepgram: FakeDeepgram,
    database_url: str,
) -> None:
    """Twilio says no length: the OGG file's own last page does, a claim like any, and its bytes
    are bounded by it (1 s of Opus: at most 193,036 bytes with its headers; this one is 400,000)."""
    heavy = ogg_lasting(VOICE, 1.0) + bytes(400_000 - len(VOICE))
    path = f"/2010-04-01/Accounts/{ACCOUNT_SID}/Messages/MM{uuid.uuid4().hex}/Media/ME{uuid.uuid4().hex}"
    fake_twilio.media[path] = (heavy, "audio/ogg")
    sender = f"whatsapp:+3460{uuid.uuid4().int % 10**7:07d}"  # a number no Spanish note was heard from
    fields = form(
        "", sender=sender, NumMedia="1", MediaUrl0="https://api.twilio.com" + path, MediaContentType0="audio/ogg"
    )
    response = app_client("whatsapp_webhook").post("/", data=fields, headers=signed(fields))
    assert response.status_code == 200
    reason = "larger than a 0:01 voice note can be"
    assert messages_of(response.text) == [ENGLISH.say("media.unreadable", reason=reason)]
    assert fake_deepgram.requests == [] and fake_anthropic.requests == []
    assert user_message(database_url, fields["MessageSid"]) == f"[voice note, 0:00, not transcribed: {reason}]"


@pytest.mark.parametrize("claimed", [0, None], ids=["0 s", "unsaid"])
def test_web_notes_that_say_no_length_count_what_their_bytes_imply_when_deepgram_fails(
    media_env: pytest.MonkeyPatch,
    fake_deepgram: FakeDeepgram,
    web: FlaskClient,
    owner: uuid.UUID,
    database_url: str,
    claimed: int | None,
) -> None:
    """Three WebM notes of 300,000 bytes saying `seconds: 0` (or nothing), Deepgram too slow each
    time: on 8281e8c each was uploaded and counted 0 s (120 s when unsaid). The bytes imply at
    least (300,000 - 65,536 bytes of headers) / 63,750 bytes a second of Opus = 3.7 s: 4 each."""
    media_env.setenv("VOICE_SECONDS_PER_DAY", "1800")
    media_env.setenv("TRANSCRIPTION_TIMEOUT", "0.3")
    runtime.reset()
    fake_deepgram.behaviour, fake_deepgram.slow_s = "slow", 1.0
    audio = b"\x1aE\xdf\xa3" + bytes(300_000 - 4)  # WebM's magic: no length anywhere near its start
    attachment: dict[str, Any] = {"media_type": "audio/webm", "data": base64.b64encode(audio).decode()}
    if claimed is not None:
        attachment["seconds"] = claimed
    for _ in range(3):
        sent = web.post("/", json={"message": "", "attachments": [attachment]}, headers=bearer(owner))
        assert sent.get_json()["reply"] == ENGLISH.say("media.unreadable", reason="the transcription service failed")
    assert [len(heard.audio) for heard in fake_deepgram.requests] == [300_000] * 3
    assert rows(database_url, "select seconds from voice_usage where user_id = %s", owner) == [(4,), (4,), (4,)]


def test_an_owed_voice_turn_is_answered_from_its_stored_transcript_never_transcribed_again(
    media_env: pytest.MonkeyPatch,
    fake_anthropic: FakeAnthropic,
    fake_deepgram: FakeDeepgram,
    web: FlaskClient,
    owner: uuid.UUID,
    database_url: str,
) -> None:
    """The model fails after the transcription (the fallback answers, end_attempt keeps the
    transcript, the message is owed); the client's retry takes it over. On 8281e8c the retry
    transcribed again and counted the note twice (8 s); now it answers from the stored transcript."""
    media_env.setenv("VOICE_SECONDS_PER_DAY", "1800")
    runtime.reset()
    attachment = {"media_type": "audio/webm", "data": base64.b64encode(VOICE).decode(), "seconds": 4}
    payload = {"message": "", "attachments": [attachment], "client_message_id": f"voice-{uuid.uuid4()}"}
    fake_anthropic.behaviour = "500"
    first = web.post("/", json=payload, headers=bearer(owner)).get_json()
    assert first["outcome"] == "fallback"
    fake_anthropic.behaviour = "ok"
    again = web.post("/", json=payload, headers=bearer(owner)).get_json()
    assert again["outcome"] == "answered" and again["message_id"] == first["message_id"]
    assert len(fake_deepgram.requests) == 1
    asked = replies(fake_anthropic)[-1]["messages"][-1]["content"][-1]["text"]
    assert asked.endswith(f"[voice note, 0:04] {TRANSCRIPT}")
    assert rows(database_url, "select seconds from voice_usage where user_id = %s", owner) == [(4,)]
    assert user_message(database_url, payload["client_message_id"]) == f"[voice note, 0:04] {TRANSCRIPT}"


def test_an_owed_telegram_voice_reply_taken_over_by_its_redelivery_keeps_one_quote(
    media_env: pytest.MonkeyPatch,
    fake_anthropic: FakeAnthropic,
    fake_telegram: FakeTelegram,
    fake_deepgram: FakeDeepgram,
    database_url: str,
) -> None:
    """A voice note replying to a message: its stored content begins with the quote, which the
    takeover's answer does not quote again; Deepgram hears it once."""
    body = private("07_voice.json")
    message = body["message"]
    message["reply_to_message"] = {
        "message_id": message["message_id"] - 1,
        "from": message["from"],
        "chat": message["chat"],
        "date": message["date"] - 60,
        "text": "Is the dentist on Friday?",
    }
    fake_telegram.files[message["voice"]["file_id"]] = VOICE
    client = app_client("telegram_webhook")
    fake_anthropic.behaviour = "500"
    assert telegram_post(client, body) == 200  # the fallback answers; the message is owed
    fake_anthropic.behaviour = "ok"
    assert telegram_post(client, body) == 200  # a redelivery takes it over
    assert len(fake_deepgram.requests) == 1 and len(fake_telegram.downloads) == 1
    stored = f'[replying to: "Is the dentist on Friday?"] [voice note, 0:03] {TRANSCRIPT}'
    assert user_message(database_url, str(body["update_id"])) == stored
    asked = replies(fake_anthropic)[-1]["messages"][-1]["content"][-1]["text"]
    assert asked.endswith(f"] {stored}")  # the model reads the quote once, as it was stored
    assert len(fake_telegram.sent()) == 2


def test_a_voice_note_replying_to_a_message_shows_the_model_what_it_answers(
    media_env: pytest.MonkeyPatch,
    fake_anthropic: FakeAnthropic,
    fake_telegram: FakeTelegram,
    fake_deepgram: FakeDeepgram,
    database_url: str,
) -> None:
    """A reply with media: the model's view of the message is its transcript after the quote, as
    a text reply's is, not the transcript alone."""
    body = private("07_voice.json")
    message = body["message"]
    message["reply_to_message"] = {
        "message_id": message["message_id"] - 1,
        "from": message["from"],
        "chat": message["chat"],
        "date": message["date"] - 60,
        "text": "Is the dentist on Friday?",
    }
    fake_telegram.files[message["voice"]["file_id"]] = VOICE
    assert telegram_post(app_client("telegram_webhook"), body) == 200
    stored = f'[replying to: "Is the dentist on Friday?"] [voice note, 0:03] {TRANSCRIPT}'
    assert user_message(database_url, str(body["update_id"])) == stored
    asked = replies(fake_anthropic)[-1]["messages"][-1]["content"][-1]["text"]
    assert asked.endswith(f"] {stored}")


def test_an_owed_photo_and_voice_note_are_read_again_and_the_voice_not_heard_again(
    media_env: pytest.MonkeyPatch,
    fake_anthropic: FakeAnthropic,
    fake_deepgram: FakeDeepgram,
    web: FlaskClient,
    owner: uuid.UUID,
    database_url: str,
) -> None:
    """A photo beside a voice note, owed: the model reads the photo again (its bytes are in the
    retry), the voice note's transcript comes from memory, and nothing is described twice."""
    image = {"media_type": "image/jpeg", "data": base64.b64encode(RECEIPT).decode()}
    voice = {"media_type": "audio/webm", "data": base64.b64encode(VOICE).decode(), "seconds": 4}
    payload = {"message": "what's this?", "attachments": [image, voice], "client_message_id": f"m-{uuid.uuid4()}"}
    fake_anthropic.behaviour = "500"
    assert web.post("/", json=payload, headers=bearer(owner)).get_json()["outcome"] == "fallback"
    descriptions = len(described(fake_anthropic))
    fake_anthropic.behaviour = "ok"
    assert web.post("/", json=payload, headers=bearer(owner)).get_json()["outcome"] == "answered"
    assert len(fake_deepgram.requests) == 1 and len(described(fake_anthropic)) == descriptions
    stored = f"[photo] [voice note, 0:04] {TRANSCRIPT} what's this?"
    block, text = replies(fake_anthropic)[-1]["messages"][-1]["content"]
    assert block["source"] == {"type": "base64", **image} and text["text"].endswith(stored)
    assert user_message(database_url, payload["client_message_id"]) == stored


@pytest.mark.parametrize(
    ("attachment", "message"),
    [
        ({"media_type": "image/tiff", "data": "AAAA"}, "media_type"),
        ({"media_type": "audio/wav", "data": "AAAA"}, "media_type"),
        ({"media_type": "audio/webm", "data": "AAAA", "seconds": -1}, "seconds"),
        ({"media_type": "audio/webm", "data": "", "seconds": 3}, "data"),
        ({"media_type": "image/png", "data": "not base64!"}, "base64"),
    ],
)
def test_the_web_refuses_what_it_cannot_read_with_a_400(
    media_env: pytest.MonkeyPatch, web: FlaskClient, owner: uuid.UUID, attachment: dict[str, str], message: str
) -> None:
    sent = web.post("/", json={"message": "hi", "attachments": [attachment]}, headers=bearer(owner))
    assert sent.status_code == 400 and message in sent.get_json()["message"]


def test_fixtures_are_what_their_sources_say() -> None:
    assert Path(MEDIA / "SOURCES.md").exists()
    assert VOICE[:4] == b"OggS" and b"OpusHead" in VOICE[:100] and len(VOICE) < 16_000
    assert RECEIPT[:3] == b"\xff\xd8\xff" and LEASE[:5] == b"%PDF-"


def unreadable(reason: str) -> str:
    return ENGLISH.say("media.unreadable", reason=reason)


def test_a_streamed_web_turn_with_an_attachment_that_is_no_image_streams_the_notice_once(
    media_env: pytest.MonkeyPatch,
    fake_anthropic: FakeAnthropic,
    web: FlaskClient,
    owner: uuid.UUID,
    database_url: str,
) -> None:
    """The server-sent events' turn: a "PNG" whose bytes are a PDF is refused as the JSON turn
    refuses it; the notice is the one delta and the done event's reply, stored once, no model asked."""
    attachment = {"media_type": "image/png", "data": base64.b64encode(LEASE).decode()}
    payload = {"message": "what is this?", "attachments": [attachment], "client_message_id": f"m-{uuid.uuid4()}"}
    headers = {**bearer(owner), "Accept": "text/event-stream"}
    sent = web.post("/", json=payload, headers=headers)
    assert sent.status_code == 200 and sent.mimetype == "text/event-stream"
    events = [block.split("\n", 1) for block in sent.get_data(as_text=True).split("\n\n") if block]
    notice = unreadable("not a JPEG, PNG, GIF or WebP image")
    assert [(name, json.loads(data.removeprefix("data: "))) for name, data in events][0] == (
        "event: delta",
        {"text": notice},
    )
    done = json.loads(events[1][1].removeprefix("data: "))
    assert len(events) == 2 and (done["reply"], done["outcome"]) == (notice, "media_refused")
    assert stored_turn(database_url, payload["client_message_id"]) == [
        ("user", "[photo, not read: not a JPEG, PNG, GIF or WebP image] what is this?"),
        ("assistant", notice),
    ]
    assert fake_anthropic.requests == []
    again = web.post("/", json=payload, headers=headers)
    redone = json.loads(again.get_data(as_text=True).split("\n\n")[-2].split("\n", 1)[1].removeprefix("data: "))
    assert (redone["reply"], redone["outcome"]) == (notice, "redelivered")
    assert len(rows(database_url, "select 1 from messages where user_id = %s", owner)) == 2


PNG = b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\rIHDR" + bytes(17)
GIF = b"GIF89a" + bytes(20)
WEBP = b"RIFF" + (20).to_bytes(4, "little") + b"WEBPVP8 " + bytes(12)


@pytest.mark.parametrize(
    ("data", "claimed", "read_as"),
    [(PNG, "image/png", "image/png"), (GIF, "image/jpeg", "image/gif"), (WEBP, "image/jpeg", "image/webp")],
    ids=["png", "gif said jpeg", "webp said jpeg"],
)
def test_a_whatsapp_image_reaches_the_model_as_the_type_its_bytes_are(
    media_env: pytest.MonkeyPatch,
    fake_anthropic: FakeAnthropic,
    fake_twilio: FakeTwilio,
    data: bytes,
    claimed: str,
    read_as: str,
) -> None:
    """Anthropic refuses an image block whose media_type is not its bytes': the bytes say it."""
    path = f"/2010-04-01/Accounts/{ACCOUNT_SID}/Messages/MM{uuid.uuid4().hex}/Media/ME1"
    fake_twilio.media[path] = (data, claimed)
    fields = form("", NumMedia="1", MediaUrl0="https://api.twilio.com" + path, MediaContentType0=claimed)
    response = app_client("whatsapp_webhook").post("/", data=fields, headers=signed(fields))
    assert response.status_code == 200
    image = replies(fake_anthropic)[0]["messages"][-1]["content"][0]
    assert image["source"] == {"type": "base64", "media_type": read_as, "data": base64.b64encode(data).decode()}


def test_a_twilio_media_file_that_is_gone_is_a_clear_answer_and_the_message_is_kept(
    media_env: pytest.MonkeyPatch,
    fake_anthropic: FakeAnthropic,
    fake_twilio: FakeTwilio,
    database_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Twilio answers 404 for a media file deleted before it was fetched: the person is told, the
    model is not asked, and the message is stored as what is known of it, in the words they were
    told (the status is the log line's: "the download failed (404)" was the thread's)."""
    path = f"/2010-04-01/Accounts/{ACCOUNT_SID}/Messages/MM{uuid.uuid4().hex}/Media/ME1"
    sender = f"whatsapp:+3462{uuid.uuid4().int % 10**7:07d}"  # a number with no language remembered
    url = "https://api.twilio.com" + path
    fields = form("and this one?", sender=sender, NumMedia="1", MediaUrl0=url, MediaContentType0="image/jpeg")
    response = app_client("whatsapp_webhook").post("/", data=fields, headers=signed(fields))
    assert response.status_code == 200
    assert fake_twilio.media_requests == [path] and fake_anthropic.requests == []
    assert messages_of(response.text) == [unreadable("the download failed")]
    stored = user_message(database_url, fields["MessageSid"])
    assert stored == "[photo, not read: the download failed] and this one?"
    [line] = [r for r in caplog.records if r.name == "crossmem.media" and "fetched" in r.getMessage()]
    assert (line.levelname, line.getMessage(), line.__dict__["status"]) == (
        "WARNING",
        "a Twilio media file could not be fetched",
        404,
    )
