"""A person's language, remembered across their apps (docs/decisions.md, "The person's language"):
stated by a request (Telegram's `language_code`, the web's `language`) or heard by the
transcription service when nothing was stated, kept in `person_languages` by the turn's own two
round trips, and chosen after what the request states and before what was heard and the words.
Through the real functions, the fake Bot API, Twilio's media host and Deepgram; every test has a
second person whose language is theirs alone."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from core.phrases.catalogue import Phrases
from tests.fakes.anthropic_api import FakeAnthropic
from tests.fakes.deepgram_api import FakeDeepgram
from tests.fakes.telegram_api import FakeTelegram
from tests.fakes.twilio_api import FakeTwilio
from tests.helpers import (
    CORPUS,
    ENGLISH,
    SPANISH,
    TELEGRAM_HEADERS,
    TWILIO_TOKEN,
    Apps,
    app_client,
    as_role,
    execute,
    forgotten,
    form,
    messages_of,
    new_code,
    rows,
    signed,
    sms_can_send_later,
    update,
    will_delete,
)

DEEPGRAM_KEY = "deepgram-test-key"
ACCOUNT_SID = "AC1a03647d811fab342c0ad608e382fab2"
VOICE = (CORPUS / "media" / "voice_note_es.ogg").read_bytes()
LANGUAGE_OF = "select language from person_languages where user_id = %s"


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


def telegram_says(apps: Apps, text: str, language_code: str | None, chat: int | None = None) -> None:
    """A Telegram message from a person whose app is in `language_code` (None: it says none)."""
    body = update(text, uuid.uuid4().int % 10**9, user_id=chat or apps.chat)
    if language_code is not None:
        body["message"]["from"]["language_code"] = language_code
    assert apps.telegram.post("/", json=body, headers=TELEGRAM_HEADERS).status_code == 200


def whatsapp_says(apps: Apps, text: str, number: str, **media: str) -> list[str]:
    fields = form(text, sender=f"whatsapp:{number}", **media)
    response = apps.whatsapp.post("/", data=fields, headers=signed(fields))
    assert response.status_code == 200
    return messages_of(response.text)


def voice_note(fake_twilio: FakeTwilio) -> dict[str, str]:
    """Twilio's media fields of a WhatsApp voice note its fake media host serves."""
    path = f"/2010-04-01/Accounts/{ACCOUNT_SID}/Messages/MM{uuid.uuid4().hex}/Media/ME{uuid.uuid4().hex}"
    fake_twilio.media[path] = (VOICE, "audio/ogg")
    return {"NumMedia": "1", "MediaUrl0": "https://api.twilio.com" + path, "MediaContentType0": "audio/ogg"}


def person_of(database_url: str, surface: str, external_id: str) -> Any:
    [(person,)] = rows(
        database_url, "select user_id from identities where surface = %s and external_id = %s", surface, external_id
    )
    return person


def a_number() -> str:
    return f"+3461{uuid.uuid4().int % 10**7:07d}"


def test_spanish_on_telegram_answers_an_ok_on_the_linked_whatsapp_in_spanish(
    apps: Apps, fake_anthropic: FakeAnthropic, fake_telegram: FakeTelegram, database_url: str
) -> None:
    """The issue's WhatsApp person: "ok" says nothing of its language, and Twilio's form names none;
    what their Telegram stated, remembered with the person, answers the fallback and a media
    refusal in Spanish. Another WhatsApp person's "ok" stays in DEFAULT_LANGUAGE, and neither
    person can read the other's language."""
    person = uuid.uuid4()
    telegram_says(apps, "Hola, vivo en Madrid", "es")
    code = new_code(apps, person)["code"]
    telegram_says(apps, f"/start {code}", "es")
    telegram_says(apps, f"/link {code}", "es")  # the chat's history joins the web person
    assert whatsapp_says(apps, f"link {new_code(apps, person)['code']}", apps.number)  # WhatsApp joins too
    assert rows(database_url, LANGUAGE_OF, person) == [("es",)]

    fake_anthropic.behaviour = "500"
    assert whatsapp_says(apps, "ok", apps.number) == [SPANISH.say("turn.fallback")]
    voice = {"NumMedia": "1", "MediaUrl0": "https://api.twilio.com/v/1", "MediaContentType0": "audio/ogg"}
    assert whatsapp_says(apps, "", apps.number, **voice) == [SPANISH.say("media.no_transcriber")]

    other = a_number()
    assert whatsapp_says(apps, "ok", other) == [ENGLISH.say("turn.fallback")]
    assert whatsapp_says(apps, "", other, **voice) == [ENGLISH.say("media.no_transcriber")]
    assert rows(database_url, LANGUAGE_OF, person_of(database_url, "whatsapp", other)) == []
    # The Telegram chat's own person was merged: its row went with it.
    chats_first_person = rows(database_url, "select from_user_id from merged_people where into_user_id = %s", person)
    assert [rows(database_url, LANGUAGE_OF, merged) for (merged,) in chats_first_person] == [[]]
    # Row-level security: a person's token reads their own language, and nobody else's.
    with as_role(database_url, "authenticated", person) as own:
        assert own.execute("select user_id, language from person_languages").fetchall() == [(person, "es")]
    with as_role(database_url, "authenticated", uuid.uuid4()) as stranger:
        assert stranger.execute("select user_id, language from person_languages").fetchall() == []


def test_the_remembered_language_survives_a_cold_start_because_it_is_stored(
    apps: Apps, fake_anthropic: FakeAnthropic, fake_telegram: FakeTelegram, database_url: str
) -> None:
    other_chat = apps.chat + 1
    telegram_says(apps, "Hola", "es")
    telegram_says(apps, "Hello", "en", chat=other_chat)
    fake_anthropic.behaviour = "500"
    cold = app_client("telegram_webhook")  # a new instance: nothing of the earlier one is kept
    apps.telegram = cold
    telegram_says(apps, "ok", None)
    assert fake_telegram.sent()[-1] == {"chat_id": apps.chat, "text": SPANISH.say("turn.fallback")}
    telegram_says(apps, "ok", None, chat=other_chat)
    assert fake_telegram.sent()[-1] == {"chat_id": other_chat, "text": ENGLISH.say("turn.fallback")}
    # Only the stored row made it Spanish: without it, "ok" is DEFAULT_LANGUAGE's.
    execute(
        database_url,
        "delete from person_languages where user_id = %s",
        person_of(database_url, "telegram", str(apps.chat)),
    )
    telegram_says(apps, "ok", None)
    assert fake_telegram.sent()[-1] == {"chat_id": apps.chat, "text": ENGLISH.say("turn.fallback")}


def test_over_the_budget_the_pause_is_said_in_the_remembered_language(
    apps: Apps, environment: pytest.MonkeyPatch, fake_telegram: FakeTelegram
) -> None:
    """begin_turn answers the person's language when it refuses a turn: an "ok" from an app that
    states none, past the budget, pauses in the Spanish stated before; another person's in English."""
    environment.setenv("TURNS_PER_MINUTE", "1")
    apps.telegram = app_client("telegram_webhook")
    other_chat = apps.chat + 1
    telegram_says(apps, "Hola", "es")
    telegram_says(apps, "Hello", None, chat=other_chat)
    telegram_says(apps, "ok", None)
    assert fake_telegram.sent()[-1]["text"].startswith("Has escrito mucho en poco tiempo, así que hago una pausa.")
    telegram_says(apps, "ok", None, chat=other_chat)
    assert fake_telegram.sent()[-1]["text"].startswith("You've written a lot in a short time")


def test_forgetting_removes_the_remembered_language_and_only_the_persons(
    apps: Apps, fake_anthropic: FakeAnthropic, fake_telegram: FakeTelegram, database_url: str
) -> None:
    other_chat = apps.chat + 1
    telegram_says(apps, "Mi hermana se llama Carmen", "es")
    telegram_says(apps, "Mi hermano se llama Luis", "es", chat=other_chat)
    person = person_of(database_url, "telegram", str(apps.chat))
    other = person_of(database_url, "telegram", str(other_chat))
    telegram_says(apps, "/forget", "es")
    telegram_says(apps, "/forget confirm", "es")
    assert rows(database_url, LANGUAGE_OF, person) == []
    assert rows(database_url, LANGUAGE_OF, other) == [("es",)]
    fake_anthropic.behaviour = "500"
    telegram_says(apps, "ok", None)
    assert fake_telegram.sent()[-1] == {"chat_id": apps.chat, "text": ENGLISH.say("turn.fallback")}
    telegram_says(apps, "ok", None, chat=other_chat)
    assert fake_telegram.sent()[-1] == {"chat_id": other_chat, "text": SPANISH.say("turn.fallback")}


@pytest.fixture
def listening(
    apps: Apps, environment: pytest.MonkeyPatch, fake_deepgram: FakeDeepgram, fake_twilio: FakeTwilio
) -> Apps:
    """The apps with Deepgram and Twilio's media host (the fakes) configured."""
    environment.setenv("DEEPGRAM_API_KEY", DEEPGRAM_KEY)
    environment.setenv("DEEPGRAM_API_BASE", fake_deepgram.url)
    environment.setenv("TWILIO_ACCOUNT_SID", ACCOUNT_SID)
    environment.setenv("TWILIO_API_BASE", fake_twilio.url)
    environment.setenv("WHATSAPP_TYPING_INDICATOR", "false")
    apps.whatsapp, apps.telegram = app_client("whatsapp_webhook"), app_client("telegram_webhook")
    return apps


def test_the_language_deepgram_heard_is_remembered_when_nothing_was_stated(
    listening: Apps,
    fake_anthropic: FakeAnthropic,
    fake_deepgram: FakeDeepgram,
    fake_twilio: FakeTwilio,
    fake_telegram: FakeTelegram,
    database_url: str,
) -> None:
    """A WhatsApp voice note heard in Spanish: kept by the turn's end, whether the model answered
    (finish_turn) or failed (end_attempt, whose fallback is then said in what was heard); the
    person's next "ok" is answered in it. A Telegram person whose app states English keeps English
    whatever their voice notes are heard in."""
    apps, answered, failed = listening, a_number(), a_number()
    assert whatsapp_says(apps, "", answered, **voice_note(fake_twilio)) == ["Noted."]
    assert rows(database_url, LANGUAGE_OF, person_of(database_url, "whatsapp", answered)) == [("es",)]

    fake_anthropic.behaviour = "500"
    assert whatsapp_says(apps, "", failed, **voice_note(fake_twilio)) == [SPANISH.say("turn.fallback")]
    assert rows(database_url, LANGUAGE_OF, person_of(database_url, "whatsapp", failed)) == [("es",)]
    assert whatsapp_says(apps, "ok", answered) == [SPANISH.say("turn.fallback")]
    assert whatsapp_says(apps, "ok", a_number()) == [ENGLISH.say("turn.fallback")]

    fake_anthropic.behaviour = "ok"
    body = update("", uuid.uuid4().int % 10**9, user_id=apps.chat)
    del body["message"]["text"]
    body["message"]["from"]["language_code"] = "en"
    body["message"]["voice"] = {
        "file_id": "AwACAgQAAx0",
        "file_unique_id": "AgAD",
        "duration": 3,
        "mime_type": "audio/ogg",
    }
    fake_telegram.files["AwACAgQAAx0"] = VOICE
    assert apps.telegram.post("/", json=body, headers=TELEGRAM_HEADERS).status_code == 200
    assert len(fake_deepgram.requests) == 3
    assert rows(database_url, LANGUAGE_OF, person_of(database_url, "telegram", str(apps.chat))) == [("en",)]


# The fixed answers given without a turn: commands and notices (docs/decisions.md, "The person's
# language"): stated, else remembered (the command's own SQL function answers it), else the words.

ACCOUNT = "u•••@example.com"  # `bearer`'s account, masked
INVALID_CODE = {  # core/phrases/*.toml's link.invalid, as the person reads it
    "es": "Ese código no es válido. Revísalo o pide uno nuevo en la web.",
    "en": "That code isn't valid. Check it, or ask for a new one on the web.",
}


@pytest.mark.parametrize(
    ("heard", "phrases", "default"),
    [pytest.param("es", SPANISH, "en", id="es"), pytest.param("en", ENGLISH, "es", id="en")],
)
def test_whatsapp_forget_and_link_are_answered_in_the_remembered_language(
    listening: Apps,
    environment: pytest.MonkeyPatch,
    fake_deepgram: FakeDeepgram,
    fake_twilio: FakeTwilio,
    database_url: str,
    heard: str,
    phrases: Phrases,
    default: str,
) -> None:
    """A WhatsApp person whose voice note was heard in `heard` (WhatsApp states no language, and
    "forget" or a code says nothing by its words) gets `forget`, `forget confirm`, `link` and
    `unlink` in it; DEFAULT_LANGUAGE is the other language, so only the remembered one can say it.
    A sender with nothing remembered gets DEFAULT_LANGUAGE."""
    environment.setenv("DEFAULT_LANGUAGE", default)
    apps = listening
    apps.whatsapp, apps.web = app_client("whatsapp_webhook"), app_client("web_chat")
    fallback = SPANISH if default == "es" else ENGLISH
    fake_deepgram.language = heard
    forgetting, linking = a_number(), a_number()
    for number in (forgetting, linking):
        assert whatsapp_says(apps, "", number, **voice_note(fake_twilio)) == ["Noted."]
        assert rows(database_url, LANGUAGE_OF, person_of(database_url, "whatsapp", number)) == [(heard,)]

    assert whatsapp_says(apps, "forget", forgetting) == [will_delete(phrases, 2, 1, "forget confirm")]
    # Said in the language forgetting deletes with everything else: read before it.
    assert whatsapp_says(apps, "forget confirm", forgetting) == [forgotten(phrases, 2)]
    assert whatsapp_says(apps, "forget", forgetting) == [fallback.say("forget.nothing_stored")]

    assert whatsapp_says(apps, "link ABC234XYZ", linking) == [INVALID_CODE[heard]]
    code = new_code(apps, uuid.uuid4())["code"]
    assert whatsapp_says(apps, f"link {code}", linking) == [phrases.say("link.linked", account=ACCOUNT)]
    assert whatsapp_says(apps, "unlink", linking) == [phrases.say("link.unlinked")]
    # Unlinked, the number is nobody's: its next `unlink` has no language but the default's.
    assert whatsapp_says(apps, "unlink", linking) == [fallback.say("link.not_linked")]


def test_sms_and_telegram_without_a_stated_language_answer_in_the_remembered_one(
    apps: Apps, environment: pytest.MonkeyPatch, fake_telegram: FakeTelegram, database_url: str
) -> None:
    """A person whose Telegram stated Spanish, linked to the web: their SMS number's `link` and
    `forget` (after the link, the number is theirs) are answered in Spanish, and so are their
    Telegram app's notices and commands when it states no language (a sticker, a wrong code)."""
    person = uuid.uuid4()
    telegram_says(apps, "Hola, vivo en Madrid", "es")
    telegram_says(apps, f"/link {new_code(apps, person)['code']}", "es")
    assert rows(database_url, LANGUAGE_OF, person) == [("es",)]

    sms_can_send_later(environment)
    sms = app_client("sms_webhook")
    number = a_number()

    def sms_says(text: str) -> list[str]:
        fields = {"From": number, "To": "+14155238886", "Body": text, "MessageSid": f"SM{uuid.uuid4().hex}"}
        response = sms.post("/", data=fields, headers=signed(fields))
        assert response.status_code == 200
        return messages_of(response.text)

    code = new_code(apps, person)["code"]
    # Not the person's until its holder types back the digits sent to it: the default language.
    [asked] = sms_says(f"link {code}")
    digits = asked.rsplit(" ", 1)[1]
    assert asked == ENGLISH.say(
        "link.needs_confirmation",
        account="u•••@example.com",
        messages=ENGLISH.count("count.messages", 0),
        confirm=f"link {code} {digits}",
    )
    assert sms_says(f"link {code} {digits}") == [
        "¡Vinculado a la cuenta web u•••@example.com! Este chat y esa cuenta comparten ahora una sola "
        "conversación: lo que digas aquí lo recuerdo allí, y al revés."
    ]
    [asked] = sms_says("forget")
    sent_code = rows(database_url, "select code from forget_requests where user_id = %s", person)[0][0]
    assert asked == will_delete(SPANISH, 2, 1, f"forget confirm {sent_code}")
    assert sms_says("forget").pop().startswith("Esto borra todo lo que recuerdo de ti")

    sticker = json.loads((CORPUS / "telegram" / "06_sticker.json").read_text())
    sticker["message"]["chat"]["id"] = sticker["message"]["from"]["id"] = apps.chat
    sticker["message"]["from"].pop("language_code", None)
    assert apps.telegram.post("/", json=sticker, headers=TELEGRAM_HEADERS).status_code == 200
    assert fake_telegram.sent()[-1] == {"chat_id": apps.chat, "text": SPANISH.say("media.text_only")}
    telegram_says(apps, "/link ABC234XYZ", None)
    assert fake_telegram.sent()[-1]["text"] == INVALID_CODE["es"]


def test_a_group_mention_is_answered_in_the_senders_remembered_language(
    apps: Apps, fake_telegram: FakeTelegram, database_url: str
) -> None:
    """core/surfaces/telegram_inbound.py asks the remembered language of `action.chat_id`: in a
    group that is the group's id, never a person's, so the sender's remembered Spanish is not found
    (and every mention from an app without a catalogued language costs a round trip for nothing)."""
    spoke = update("Hola, vivo en Madrid", user_id=apps.chat)
    spoke["message"]["from"]["language_code"] = "es"
    assert apps.telegram.post("/", json=spoke, headers=TELEGRAM_HEADERS).status_code == 200
    [(person,)] = rows(
        database_url, "select user_id from identities where surface = 'telegram' and external_id = %s", str(apps.chat)
    )
    assert rows(database_url, "select language from person_languages where user_id = %s", person) == [("es",)]

    group = -1000000000000 - uuid.uuid4().int % 10**6
    mention = update("@advisor_bot ¿qué te dije ayer?", user_id=apps.chat, chat_type="supergroup")
    mention["message"]["chat"]["id"] = group  # the same person, writing in a group; their app states no language
    assert apps.telegram.post("/", json=mention, headers=TELEGRAM_HEADERS).status_code == 200
    said = fake_telegram.sent()[-1]
    assert said["chat_id"] == group
    assert said["text"] == SPANISH.say("telegram.private_only")
