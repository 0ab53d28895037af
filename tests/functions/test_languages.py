"""Every fixed answer in the person's language, through the real Telegram function and the fake
Bot API: a person whose Telegram speaks Spanish (`from.language_code: es`) over the budget, over
a media limit, linking, forgetting, and when the model fails gets each answer in Spanish; the
same person in English in English; without a language_code, the language of their words
(docs/decisions.md, "The person's language")."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from core.phrases.catalogue import Phrases
from tests.fakes.anthropic_api import FakeAnthropic
from tests.fakes.telegram_api import FakeTelegram
from tests.helpers import (
    CORPUS,
    ENGLISH,
    JWT_SECRET,
    PUBLIC_BASE_URL,
    SPANISH,
    TELEGRAM_HEADERS,
    TWILIO_TOKEN,
    Apps,
    app_client,
    bearer,
    forgotten,
    form,
    messages_of,
    new_code,
    signed,
    update,
    will_delete,
)

LANGUAGES = [pytest.param("es", SPANISH, id="es"), pytest.param("en-GB", ENGLISH, id="en")]
ACCOUNT = "u•••@example.com"  # `bearer`'s account, masked


def said(client: Any, body: dict[str, Any], language_code: str | None) -> None:
    """Send an update from a person whose Telegram app is in `language_code` (None: it says none)."""
    if language_code is not None:
        body["message"]["from"]["language_code"] = language_code
    response = client.post("/", json=body, headers=TELEGRAM_HEADERS)
    assert response.status_code == 200, response.get_data(as_text=True)


def last_text(fake_telegram: FakeTelegram, chat: int) -> str:
    sent = [message for message in fake_telegram.sent() if message["chat_id"] == chat]
    return str(sent[-1]["text"])


def a_chat() -> int:
    return 720_000_000 + uuid.uuid4().int % 10**8


@pytest.mark.parametrize(("language_code", "phrases"), LANGUAGES)
def test_over_the_budget_the_pause_is_said_in_the_persons_language(
    environment: pytest.MonkeyPatch,
    fake_anthropic: FakeAnthropic,
    fake_telegram: FakeTelegram,
    language_code: str,
    phrases: Phrases,
) -> None:
    environment.setenv("TURNS_PER_MINUTE", "2")
    client, chat = app_client("telegram_webhook"), a_chat()
    for text in ("hi", "again"):
        said(client, update(text, user_id=chat), language_code)
    asked = len(fake_anthropic.requests)
    said(client, update("and again", user_id=chat), language_code)
    assert len(fake_anthropic.requests) == asked
    pauses = {phrases.say("budget.pause", when=phrases.count("budget.in_seconds", n)) for n in range(1, 61)}
    assert last_text(fake_telegram, chat) in pauses
    if language_code == "es":
        assert last_text(fake_telegram, chat).startswith(
            "Has escrito mucho en poco tiempo, así que hago una pausa. Puedes volver a escribirme dentro de "
        )


@pytest.mark.parametrize(("language_code", "phrases"), LANGUAGES)
def test_a_photo_over_the_limit_is_refused_in_the_persons_language_with_its_numbers(
    environment: pytest.MonkeyPatch,
    fake_anthropic: FakeAnthropic,
    fake_telegram: FakeTelegram,
    language_code: str,
    phrases: Phrases,
) -> None:
    """IMAGE_MAX_BYTES's default, 3,750,000 bytes: the issue's "larger than 3.8 MB"."""
    body = json.loads((CORPUS / "telegram" / "05_photo_caption.json").read_text())
    chat = a_chat()
    body["update_id"] = uuid.uuid4().int % 10**9
    body["message"]["from"] = {**body["message"]["from"], "id": chat}
    body["message"]["chat"] = {"id": chat, "type": "private"}
    for size in body["message"]["photo"]:  # every size says it is past the limit
        size["file_size"] = 3_900_000
    said(app_client("telegram_webhook"), body, language_code)
    assert fake_telegram.sent("getFile") == [] and fake_anthropic.requests == []
    expected = {
        "es": "Perdona, no he podido usar lo que me has enviado (pesa más de 3,8 MB). "
        "¿Me cuentas con palabras qué dice?",
        "en-GB": "Sorry, I couldn't use what you sent (larger than 3.8 MB). Could you tell me in words what it says?",
    }
    assert last_text(fake_telegram, chat) == expected[language_code]
    reason = phrases.say("media.reason.too_large", size=phrases.megabytes(3_750_000))
    assert expected[language_code] == phrases.say("media.unreadable", reason=reason)


@pytest.mark.parametrize(("language_code", "phrases"), LANGUAGES)
def test_linking_is_answered_in_the_persons_language(
    apps: Apps, fake_telegram: FakeTelegram, language_code: str, phrases: Phrases
) -> None:
    said(apps.telegram, update("I live in Madrid", user_id=apps.chat), language_code)
    said(apps.telegram, update("/link QQQQQQQQQ", user_id=apps.chat), language_code)
    assert last_text(fake_telegram, apps.chat) == phrases.say("link.invalid")
    person = uuid.uuid4()
    code = new_code(apps, person)["code"]
    said(apps.telegram, update(f"/start {code}", user_id=apps.chat), language_code)
    question = fake_telegram.sent()[-1]
    assert question["text"] == phrases.say(
        "link.needs_consent", account=ACCOUNT, messages=phrases.count("count.messages", 2), code=code
    )
    button = phrases.say("telegram.confirm_button")
    assert question["reply_markup"] == {"inline_keyboard": [[{"text": button, "callback_data": f"link:{code}"}]]}
    said(apps.telegram, update(f"/link {code}", user_id=apps.chat), language_code)
    assert last_text(fake_telegram, apps.chat) == phrases.say("link.linked", account=ACCOUNT)
    said(apps.telegram, update("/unlink", user_id=apps.chat), language_code)
    assert last_text(fake_telegram, apps.chat) == phrases.say("link.unlinked")
    if language_code == "es":
        assert button == "Confirmar"
        assert last_text(fake_telegram, apps.chat) == (
            "Desvinculado. Desde tu próximo mensaje este chat empieza de cero: "
            "ya no comparte la memoria de tu cuenta web."
        )


@pytest.mark.parametrize(
    ("language_code", "asked"),
    [
        (
            "es",
            "Este código uniría este chat a la cuenta web {account} y le pasaría lo que nos hemos dicho aquí "
            "(1 mensaje): quien entre en esa cuenta podría leerlo. Solo si esa cuenta es tuya, pulsa Confirmar o "
            "envía: /link {code}",
        ),
        (
            "en",
            "This code would join this chat to the web account {account}, and move what we have said here "
            "(1 message) to it: whoever signs in there would read it. Only if that account is yours, tap Confirm, "
            "or send: /link {code}",
        ),
    ],
)
def test_a_chat_of_one_message_is_asked_in_good_words(
    apps: Apps, fake_anthropic: FakeAnthropic, fake_telegram: FakeTelegram, language_code: str, asked: str
) -> None:
    """A chat whose one message has no answer stored (the model failed) is asked before it links,
    counting one message: "nuestros 1 mensaje" is not Spanish, nor "our 1 message ... read them" English."""
    fake_anthropic.behaviour = "500"
    said(apps.telegram, update("Vivo en Madrid", user_id=apps.chat), language_code)
    code = new_code(apps, uuid.uuid4())["code"]
    said(apps.telegram, update(f"/start {code}", user_id=apps.chat), language_code)
    assert fake_telegram.sent()[-1]["text"] == asked.format(account=ACCOUNT, code=code)


@pytest.mark.parametrize(("language_code", "phrases"), LANGUAGES)
def test_forgetting_is_answered_in_the_persons_language(
    apps: Apps, fake_telegram: FakeTelegram, language_code: str, phrases: Phrases
) -> None:
    said(apps.telegram, update("/forget", user_id=apps.chat), language_code)
    assert last_text(fake_telegram, apps.chat) == phrases.say("forget.nothing_stored")
    said(apps.telegram, update("My sister is Carmen", user_id=apps.chat), language_code)
    said(apps.telegram, update("/forget", user_id=apps.chat), language_code)
    assert last_text(fake_telegram, apps.chat) == will_delete(phrases, 2, 1, "/forget confirm")
    said(apps.telegram, update("/forget confirm", user_id=apps.chat), language_code)
    assert last_text(fake_telegram, apps.chat) == forgotten(phrases, 2)
    if language_code == "es":
        assert last_text(fake_telegram, apps.chat) == (
            "Hecho: lo he olvidado todo (2 mensajes). Tu próximo mensaje empieza una conversación nueva."
        )


@pytest.mark.parametrize(("language_code", "phrases"), LANGUAGES)
def test_the_welcome_a_sticker_and_a_failed_model_are_answered_in_the_persons_language(
    environment: pytest.MonkeyPatch,
    fake_anthropic: FakeAnthropic,
    fake_telegram: FakeTelegram,
    language_code: str,
    phrases: Phrases,
) -> None:
    client, chat = app_client("telegram_webhook"), a_chat()
    said(client, update("/start", user_id=chat), language_code)
    assert last_text(fake_telegram, chat) == phrases.say("telegram.welcome")
    said(client, update("/help", user_id=chat), language_code)
    assert last_text(fake_telegram, chat) == phrases.say("telegram.help")
    sticker = update("", user_id=chat)
    del sticker["message"]["text"]
    sticker["message"]["sticker"] = {"file_id": "CAACAgIAAxkBAAIB", "emoji": "👍"}
    said(client, sticker, language_code)
    assert last_text(fake_telegram, chat) == phrases.say("media.text_only")
    fake_anthropic.behaviour = "500"
    said(client, update("What was my sister's name?", user_id=chat), language_code)
    assert last_text(fake_telegram, chat) == phrases.say("turn.fallback")


def test_without_a_language_code_the_words_choose_and_then_default_language(
    environment: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic, fake_telegram: FakeTelegram
) -> None:
    environment.setenv("TURNS_PER_MINUTE", "1")
    client, chat = app_client("telegram_webhook"), a_chat()
    said(client, update("hola", user_id=chat), None)
    said(client, update("¿Qué tal estás? Quiero saber una cosa", user_id=chat), None)
    assert last_text(fake_telegram, chat).startswith("Has escrito mucho en poco tiempo")
    said(client, update("ok", user_id=chat), None)  # says nothing of its language: DEFAULT_LANGUAGE
    assert last_text(fake_telegram, chat).startswith("You've written a lot in a short time")
    environment.setenv("DEFAULT_LANGUAGE", "es")
    other = a_chat()
    said(app_client("telegram_webhook"), update("/start", user_id=other), None)
    assert last_text(fake_telegram, other) == SPANISH.say("telegram.welcome")


def test_an_operators_fallback_reply_is_said_in_every_language(
    environment: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic, fake_telegram: FakeTelegram
) -> None:
    environment.setenv("FALLBACK_REPLY", "Back in a moment.")
    fake_anthropic.behaviour = "500"
    client, chat = app_client("telegram_webhook"), a_chat()
    said(client, update("¿Cómo se llamaba mi hermana?", user_id=chat), "es")
    assert last_text(fake_telegram, chat) == "Back in a moment."


def test_whatsapp_has_no_language_field_so_the_words_choose(
    environment: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic
) -> None:
    environment.setenv("TURNS_PER_MINUTE", "1")
    environment.setenv("TWILIO_AUTH_TOKEN", TWILIO_TOKEN)
    environment.setenv("PUBLIC_BASE_URL", PUBLIC_BASE_URL)
    client, number = app_client("whatsapp_webhook"), f"whatsapp:+3461{uuid.uuid4().int % 10**7:07d}"
    for text in ("hola", "¿Me recuerdas qué te dije ayer de mi hermana?"):
        fields = form(text, sender=number)
        answered = messages_of(client.post("/", data=fields, headers=signed(fields)).get_data(as_text=True))
    pauses = {SPANISH.say("budget.pause", when=SPANISH.count("budget.in_seconds", n)) for n in range(1, 61)}
    assert len(answered) == 1 and answered[0] in pauses
    fields = form("", sender=number)
    answered = messages_of(client.post("/", data=fields, headers=signed(fields)).get_data(as_text=True))
    assert answered == [ENGLISH.say("whatsapp.empty")]  # nothing to go by: DEFAULT_LANGUAGE


def test_whatsapp_spanish_typed_without_accents_is_answered_in_spanish(
    environment: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic
) -> None:
    environment.setenv("TWILIO_AUTH_TOKEN", TWILIO_TOKEN)
    environment.setenv("PUBLIC_BASE_URL", PUBLIC_BASE_URL)
    fake_anthropic.behaviour = "500"
    client, number = app_client("whatsapp_webhook"), f"whatsapp:+3462{uuid.uuid4().int % 10**7:07d}"
    fields = form("hola como estas", sender=number)
    answered = messages_of(client.post("/", data=fields, headers=signed(fields)).get_data(as_text=True))
    assert answered == [SPANISH.say("turn.fallback")]


def test_the_web_clients_language_chooses_the_fallback_and_is_remembered(
    environment: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic
) -> None:
    """Stated once, remembered: the same person's next request, which states none, is answered in
    it over the English of its words; another person's is not."""
    environment.setenv("SUPABASE_JWT_SECRET", JWT_SECRET)
    fake_anthropic.behaviour = "500"
    client, person, other = app_client("web_chat"), uuid.uuid4(), uuid.uuid4()
    body = {"message": "What was my sister's name?", "language": "es-ES"}
    assert client.post("/", json=body, headers=bearer(person)).get_json()["reply"] == SPANISH.say("turn.fallback")
    body = {"message": "What was my sister's name?"}
    assert client.post("/", json=body, headers=bearer(person)).get_json()["reply"] == SPANISH.say("turn.fallback")
    assert client.post("/", json=body, headers=bearer(other)).get_json()["reply"] == ENGLISH.say("turn.fallback")
    body = {"message": "What was my sister's name?", "language": "en-US"}  # stated again: it changes
    assert client.post("/", json=body, headers=bearer(person)).get_json()["reply"] == ENGLISH.say("turn.fallback")
