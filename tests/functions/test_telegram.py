"""telegram_webhook end to end: real function, real Postgres, fake Bot API and Anthropic."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

from core.channels.splitting import split_message
from core.channels.telegram_bot import TELEGRAM_LIMIT
from core.models import Surface
from core.turn.request import TurnRequest
from functions import runtime
from tests.fakes.anthropic_api import FakeAnthropic, echo_last_message
from tests.fakes.telegram_api import FakeTelegram
from tests.helpers import (
    ENGLISH,
    MAIN,
    TELEGRAM_HEADERS,
    app_client,
    as_owner,
    forgotten,
    rows,
    stored_turn,
    update,
)

CORPUS = Path(__file__).resolve().parents[1] / "corpus" / "telegram"

# What each real update kind gets (the README's table): a turn, a short notice, or a silent 200.
EXPECTED = {
    "01_private_text.json": "turn",
    "02_start_deeplink.json": "notice",
    "03_emoji_nonlatin_text.json": "turn",
    "04_edited_message.json": "ignore",  # an edit of a message never stored (tests/functions/test_telegram_edits.py)
    "05_photo_caption.json": "ignore",  # a supergroup, not addressed to the bot
    "06_sticker.json": "notice",
    "07_voice.json": "ignore",  # supergroup
    "08_document.json": "ignore",  # supergroup
    "09_location.json": "ignore",  # supergroup
    "10_contact.json": "ignore",  # supergroup
    "11_callback_query.json": "ignore",
    "12_channel_post.json": "ignore",
    "13_my_chat_member_blocked.json": "ignore",
    "14_my_chat_member_unblocked.json": "ignore",
    "15_group_reply.json": "ignore",
    "16_forward_origin.json": "turn",
    "17_inline_query.json": "ignore",
    "18_document_nonlatin_filename_2018.json": "ignore",  # supergroup
    "19_private_reply_with_quote.json": "turn",  # its quote: tests/functions/test_replies.py
    "20_edited_reply_with_quote.json": "ignore",  # an edit: the reply to the original stands
}

# The same group captures, as if sent in a private chat with the bot. `media`: a turn of its own
# (tests/functions/test_media.py); here, with no file in the fake Bot API and no transcriber, its
# clear answer is stored with the message, once, and no model is asked.
EXPECTED_IN_PRIVATE = {
    "05_photo_caption.json": "media",
    "07_voice.json": "media",
    "08_document.json": "media",
    "09_location.json": "turn",  # as text: tests/functions/test_places.py
    "10_contact.json": "turn",
    "18_document_nonlatin_filename_2018.json": "media",
}


def test_what_was_said_on_the_web_and_whatsapp_reaches_the_next_telegram_message(
    environment: pytest.MonkeyPatch, owner: uuid.UUID, fake_anthropic: FakeAnthropic, fake_telegram: FakeTelegram
) -> None:
    as_owner(environment, owner)
    first = app_client("telegram_webhook")
    turns = runtime.turns()
    web = turns.memory.create_conversation(owner)
    turns.run(
        TurnRequest(Surface.WEB, "On the web: my sister's name is Carmen", "w1", user_id=owner, conversation_id=web.id)
    )
    turns.run(
        TurnRequest(Surface.WHATSAPP, "On WhatsApp: my flight is at 7:05", "SM1", sender_id="whatsapp:+34600111222")
    )
    response = first.post("/", json=update("What do you know about today?"), headers=TELEGRAM_HEADERS)
    assert response.status_code == 200
    texts = [m["content"][0]["text"] for m in fake_anthropic.requests[-1]["messages"]]
    assert texts[0].endswith("On the web: my sister's name is Carmen")
    assert texts[2].endswith("On WhatsApp: my flight is at 7:05")
    assert texts[-1].startswith("[telegram · ") and texts[-1].endswith("What do you know about today?")
    # A second instance, built from nothing, shares no RAM with the first and sees it all.
    second = app_client("telegram_webhook")
    assert second.post("/", json=update("And again?"), headers=TELEGRAM_HEADERS).status_code == 200
    texts = [m["content"][0]["text"] for m in fake_anthropic.requests[-1]["messages"]]
    assert len(texts) == 7 and texts[4].endswith("What do you know about today?")
    assert [p["chat_id"] for p in fake_telegram.sent()] == [4242, 4242]
    assert fake_telegram.sent("sendChatAction") == [{"chat_id": 4242, "action": "typing"}] * 2


@pytest.mark.parametrize("headers", [{}, {"X-Telegram-Bot-Api-Secret-Token": "wrong"}], ids=["missing", "wrong"])
def test_a_missing_or_wrong_secret_is_401_and_touches_nothing(
    environment: pytest.MonkeyPatch,
    headers: dict[str, str],
    database_url: str,
    fake_anthropic: FakeAnthropic,
    fake_telegram: FakeTelegram,
) -> None:
    body = update("let me in")
    response = app_client("telegram_webhook").post("/", json=body, headers=headers)
    assert response.status_code == 401
    assert stored_turn(database_url, str(body["update_id"])) == []
    assert fake_anthropic.requests == [] and fake_telegram.calls == []


def test_a_get_with_the_right_secret_is_405_and_touches_nothing(
    environment: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic, fake_telegram: FakeTelegram
) -> None:
    """Telegram only POSTs; a GET (a browser, a health check given the secret) is told so, not a 500."""
    response = app_client("telegram_webhook").get("/", headers=TELEGRAM_HEADERS)
    assert response.status_code == 405
    assert response.get_json() == {"error": "method_not_allowed", "message": "POST an Update"}
    assert fake_anthropic.requests == [] and fake_telegram.calls == []


def test_without_a_secret_configured_production_refuses_to_serve(
    environment: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic
) -> None:
    environment.delenv("TELEGRAM_WEBHOOK_SECRET")
    response = app_client("telegram_webhook").post("/", json=update("hi"))
    assert response.status_code == 503 and "TELEGRAM_WEBHOOK_SECRET" in response.get_json()["message"]
    assert fake_anthropic.requests == []


def in_private(body: dict[str, Any]) -> dict[str, Any]:
    message = dict(body["message"])
    message["chat"] = {"id": message["from"]["id"], "type": "private", "first_name": message["from"]["first_name"]}
    return {"update_id": body["update_id"], "message": message}


CASES = [(name, kind, False) for name, kind in sorted(EXPECTED.items())] + [
    (name, kind, True) for name, kind in sorted(EXPECTED_IN_PRIVATE.items())
]


@pytest.mark.parametrize(("name", "expected", "private"), CASES, ids=[f"{n}{'-private' * p}" for n, _, p in CASES])
def test_each_real_update_kind_is_answered_as_the_readme_says(
    environment: pytest.MonkeyPatch,
    name: str,
    expected: str,
    private: bool,
    database_url: str,
    fake_anthropic: FakeAnthropic,
    fake_telegram: FakeTelegram,
) -> None:
    body = json.loads((CORPUS / name).read_text())
    body = in_private(body) if private else body
    client = app_client("telegram_webhook")
    for _ in range(2):  # a redelivery changes nothing
        response = client.post("/", json=body, headers=TELEGRAM_HEADERS)
        assert response.status_code == 200
    rows = stored_turn(database_url, str(body["update_id"]))
    if expected == "turn":
        assert [role for role, _ in rows] == ["user", "assistant"]
        assert len(fake_anthropic.requests) == 1 and len(fake_telegram.sent()) == 1
    elif expected == "media":
        assert [role for role, _ in rows] == ["user", "assistant"] and rows[0][1].startswith("[")
        assert fake_anthropic.requests == [] and len(fake_telegram.sent()) == 1
    else:
        assert rows == [] and fake_anthropic.requests == []
        notices = fake_telegram.sent()
        assert len(notices) == (2 if expected == "notice" else 0)


def test_a_group_message_addressed_to_the_bot_is_pointed_to_a_private_chat(
    environment: pytest.MonkeyPatch, fake_telegram: FakeTelegram, fake_anthropic: FakeAnthropic
) -> None:
    environment.setenv("TELEGRAM_BOT_USERNAME", "advisor_bot")
    body = update("@advisor_bot what did I tell you yesterday?", user_id=-100123, chat_type="supergroup")
    body["message"]["from"]["id"] = 555
    assert app_client("telegram_webhook").post("/", json=body, headers=TELEGRAM_HEADERS).status_code == 200
    assert [p["chat_id"] for p in fake_telegram.sent()] == [-100123]
    assert "private" in fake_telegram.sent()[0]["text"] and fake_anthropic.requests == []


def test_one_update_delivered_three_times_is_one_turn(
    environment: pytest.MonkeyPatch, database_url: str, fake_anthropic: FakeAnthropic, fake_telegram: FakeTelegram
) -> None:
    fake_anthropic.behaviour = "ok"
    # The first delivery's model answers once the other two have been answered, so they arrive
    # while its attempt runs however late a loaded machine starts their threads (a wait of half a
    # second was not always enough: a thread started after the answer found it stored, a 200).
    statuses: list[int] = []
    others_answered = threading.Event()

    def answer_once_the_others_were(body: dict[str, Any]) -> str:
        others_answered.wait(30)
        return echo_last_message(body)

    def deliver() -> None:
        statuses.append(client.post("/", json=concurrent, headers=TELEGRAM_HEADERS).status_code)
        if len(statuses) >= 2:
            others_answered.set()

    fake_anthropic.answer = answer_once_the_others_were
    client = app_client("telegram_webhook")
    concurrent = update("three times at once")
    threads = [threading.Thread(target=deliver) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    in_sequence = update("three times in a row")
    for _ in range(3):
        statuses.append(client.post("/", json=in_sequence, headers=TELEGRAM_HEADERS).status_code)
    # At once: one answers; the others find its attempt still running and ask Telegram to come
    # back later (503), when that attempt has answered or can no longer answer.
    assert sorted(statuses[:3]) == [200, 503, 503]
    assert statuses[3:] == [200] * 3
    for body in (concurrent, in_sequence):
        rows = stored_turn(database_url, str(body["update_id"]))
        assert [role for role, _ in rows if role == "user"] == ["user"]
    assert len(fake_anthropic.requests) == 2
    assert len(fake_telegram.sent()) == 2


RENT_NEWS = {"id": -1001, "type": "channel", "title": "Rent News"}
FLAT = {"id": -1002, "type": "supergroup", "title": "Flat 3B"}
ORIGINS = [
    ({"type": "hidden_user", "sender_user_name": "Ana\nGómez", "date": 1}, "[forwarded from Ana Gómez]"),
    ({"type": "channel", "chat": RENT_NEWS, "message_id": 7, "date": 1}, "[forwarded from Rent News]"),
    ({"type": "chat", "sender_chat": FLAT, "date": 1}, "[forwarded from Flat 3B]"),
    ({"type": "user", "sender_user": {"id": 7, "is_bot": False}, "date": 1}, "[forwarded]"),
]


def test_a_forwarded_message_is_remembered_as_someone_elses_words(
    environment: pytest.MonkeyPatch, database_url: str, fake_anthropic: FakeAnthropic, fake_telegram: FakeTelegram
) -> None:
    """The corpus's forward (someone's "喵呜呜～") and the other origins Telegram names: the thread
    keeps whose words they were, or the model, the search and the notes take a landlord's or a
    channel's message for the person's own. Seen failing with the forwarded text stored bare."""
    body = json.loads((CORPUS / "16_forward_origin.json").read_text())
    person = 610_000_000 + uuid.uuid4().int % 10**8
    body["update_id"] = uuid.uuid4().int % 10**9
    body["message"]["from"]["id"] = body["message"]["chat"]["id"] = person
    client = app_client("telegram_webhook")
    assert client.post("/", json=body, headers=TELEGRAM_HEADERS).status_code == 200
    assert stored_turn(database_url, str(body["update_id"]))[0] == ("user", "[forwarded from 猫] 喵呜呜～")
    assert fake_anthropic.requests[-1]["messages"][-1]["content"][-1]["text"].endswith("[forwarded from 猫] 喵呜呜～")
    for origin, said in ORIGINS:
        forward = update("The rent goes up to 900 in March.", user_id=person)
        forward["message"]["forward_origin"] = origin
        assert client.post("/", json=forward, headers=TELEGRAM_HEADERS).status_code == 200
        assert stored_turn(database_url, str(forward["update_id"]))[0] == (
            "user",
            f"{said} The rent goes up to 900 in March.",
        )
    # The person's own message, forwarded back (from their Saved Messages): their own words.
    own = update("My passport number ends in 4417.", user_id=person)
    own["message"]["forward_origin"] = {"type": "user", "sender_user": {"id": person, "is_bot": False}, "date": 1}
    assert client.post("/", json=own, headers=TELEGRAM_HEADERS).status_code == 200
    assert stored_turn(database_url, str(own["update_id"]))[0] == ("user", "My passport number ends in 4417.")


def test_a_gif_is_answered_as_a_video_is_not_as_an_mp4_file(
    environment: pytest.MonkeyPatch, database_url: str, fake_anthropic: FakeAnthropic, fake_telegram: FakeTelegram
) -> None:
    """A GIF reaches a bot as an `animation` and, "for backward compatibility", as a `document` (the
    Bot API's Message.animation): the person sent a GIF, not an .mp4 file, and gets the answer a video
    gets, with nothing stored. Seen failing with "not .mp4 files" answered and the GIF kept as one."""
    gif = {
        "file_id": "CgACAgQAAxkBAAIBq2",
        "file_unique_id": "AgADq2",
        "mime_type": "video/mp4",
        "file_name": "dance.mp4",
    }
    body = update("")
    del body["message"]["text"]
    body["message"] |= {"animation": {**gif, "width": 320, "height": 240, "duration": 3}, "document": gif}
    assert app_client("telegram_webhook").post("/", json=body, headers=TELEGRAM_HEADERS).status_code == 200
    assert [payload["text"] for payload in fake_telegram.sent()] == [ENGLISH.say("media.text_only")]
    assert stored_turn(database_url, str(body["update_id"])) == [] and fake_anthropic.requests == []


def test_a_checklist_is_answered_as_a_poll_is_not_met_with_silence(
    environment: pytest.MonkeyPatch, fake_telegram: FakeTelegram, fake_anthropic: FakeAnthropic, database_url: str
) -> None:
    """Bot API 9.1's `checklist` (a Premium user's to-do list, sent in a private chat) has no text:
    it was ignored as "private message without text", so the person's list got no answer at all,
    where a poll or a dice gets the text-only notice (a review's finding)."""
    body = update("", user_id=6_100_007)
    del body["message"]["text"]
    body["message"]["checklist"] = {
        "title": "Groceries",
        "tasks": [{"id": 1, "text": "Milk"}, {"id": 2, "text": "Eggs"}],
    }
    response = app_client("telegram_webhook").post("/", json=body, headers=TELEGRAM_HEADERS)
    assert response.status_code == 200 and response.get_json() == {"ok": True}
    assert fake_telegram.sent() == [{"chat_id": 6_100_007, "text": ENGLISH.say("media.text_only")}]
    assert stored_turn(database_url, str(body["update_id"])) == [] and fake_anthropic.requests == []


def test_a_long_answer_arrives_in_parts_of_at_most_4096_characters(
    environment: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic, fake_telegram: FakeTelegram
) -> None:
    sentence = "Here is a sentence about planning the week ahead with care. "
    paragraphs = ["".join(sentence for _ in range(14)).strip() for _ in range(12)]
    long_answer = "\n\n".join(paragraphs) + " " + "word " * 150
    assert len(long_answer) > 10_000
    fake_anthropic.answer = lambda body: long_answer
    app_client("telegram_webhook").post("/", json=update("tell me everything"), headers=TELEGRAM_HEADERS)
    parts = [payload["text"] for payload in fake_telegram.sent()]
    assert len(parts) >= 3 and all(len(part) <= 4096 for part in parts)
    assert " ".join(" ".join(parts).split()) == " ".join(long_answer.split())
    assert all(part == part.strip() and not part.endswith("-") for part in parts)


def test_with_the_database_down_the_person_still_gets_an_answer(
    environment: pytest.MonkeyPatch, fake_telegram: FakeTelegram, caplog: pytest.LogCaptureFixture
) -> None:
    environment.setenv("DATABASE_URL", "postgresql://postgres@127.0.0.1:1/postgres")
    with caplog.at_level(logging.ERROR, logger="crossmem"):
        response = app_client("telegram_webhook").post("/", json=update("are you there?"), headers=TELEGRAM_HEADERS)
    assert response.status_code == 200
    assert fake_telegram.sent()[0]["text"] == "Claude heard: " + fake_telegram.sent()[0]["text"].split(": ", 1)[1]
    assert "are you there?" in fake_telegram.sent()[0]["text"]
    assert any("begin_turn failed" in record.getMessage() for record in caplog.records)


def test_with_the_database_down_an_edit_or_a_stop_is_a_200_that_says_so(
    environment: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic, fake_telegram: FakeTelegram
) -> None:
    """Neither is redelivered into the same failure nor answered: Telegram would hold the chat's
    next updates behind a non-2xx. The edit is dropped (`failed`), the stop not recorded."""
    environment.setenv("DATABASE_URL", "postgresql://postgres@127.0.0.1:1/postgres")
    client = app_client("telegram_webhook")
    edit = json.loads((CORPUS / "04_edited_message.json").read_text())
    stop = json.loads((CORPUS / "29_stopped_message_generation.json").read_text())
    answers = [client.post("/", json=body, headers=TELEGRAM_HEADERS) for body in (edit, stop)]
    assert [(answer.status_code, answer.get_json()) for answer in answers] == [
        (200, {"ok": True, "edit": "failed"}),
        (200, {"ok": True, "stopped": False}),
    ]
    assert fake_anthropic.requests == [] and fake_telegram.calls == []


@pytest.mark.parametrize(
    ("data", "content_type"),
    [
        (b"this is not json", "application/json"),
        (b"[1, 2, 3]", "application/json"),
        (b'{"message": {"text": "no update id"}}', "application/json"),
        (b'{"update_id": "not a number"}', "application/json"),
        (json.dumps(update("x" * 2_000_000)).encode(), "application/json"),
        (json.dumps(update("form?")).encode(), "application/x-www-form-urlencoded"),
        (b"", "text/plain"),
    ],
    ids=["not-json", "a-list", "no-update-id", "bad-type", "2MB", "form", "empty"],
)
def test_malformed_bodies_are_4xx_and_store_nothing(
    environment: pytest.MonkeyPatch, data: bytes, content_type: str, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    response = app_client("telegram_webhook").post("/", data=data, content_type=content_type, headers=TELEGRAM_HEADERS)
    assert 400 <= response.status_code < 500
    assert "message" in response.get_json()
    assert fake_anthropic.requests == []


def test_a_message_over_the_limit_gets_a_polite_answer_and_nothing_stored(
    environment: pytest.MonkeyPatch, database_url: str, fake_telegram: FakeTelegram
) -> None:
    environment.setenv("MAX_MESSAGE_CHARS", "50")
    body = update("a" * 60)
    assert app_client("telegram_webhook").post("/", json=body, headers=TELEGRAM_HEADERS).status_code == 200
    assert "60 characters" in fake_telegram.sent()[0]["text"]
    assert stored_turn(database_url, str(body["update_id"])) == []


def test_reply_inside_the_webhook_response(
    environment: pytest.MonkeyPatch, fake_telegram: FakeTelegram, fake_anthropic: FakeAnthropic
) -> None:
    environment.setenv("TELEGRAM_REPLY_IN_WEBHOOK", "true")
    response = app_client("telegram_webhook").post("/", json=update("answer inline"), headers=TELEGRAM_HEADERS)
    payload = response.get_json()
    assert payload["method"] == "sendMessage" and payload["chat_id"] == 4242
    assert payload["text"].endswith("answer inline")
    assert fake_telegram.calls == []


def test_a_reply_inside_the_webhook_response_is_answered_again_by_its_redelivery_and_whole_at_4096(
    environment: pytest.MonkeyPatch, fake_telegram: FakeTelegram, fake_anthropic: FakeAnthropic
) -> None:
    """Telegram redelivers an update whose answer it did not get: the reply it carried comes again in
    the redelivery's answer, with no second model call and no Bot API call. A reply of 4,096
    characters is one message: carried whole, where it was cut at 4,094 and marked " …"."""
    environment.setenv("TELEGRAM_REPLY_IN_WEBHOOK", "true")
    full = ("A whole message. " * 241)[:4096]
    fake_anthropic.answer = lambda body: full
    body = update("answer inline", user_id=6_100_009)
    client = app_client("telegram_webhook")
    answers = [client.post("/", json=body, headers=TELEGRAM_HEADERS).get_json() for _ in range(2)]
    assert len(full) == 4096 and answers == [{"method": "sendMessage", "chat_id": 6_100_009, "text": full}] * 2
    assert fake_telegram.calls == [] and len(fake_anthropic.requests) == 1


def test_an_offline_telegram_turn_never_imports_anthropic_twilio_or_pypdf(database_url: str, tmp_path: Path) -> None:
    script = f"""
import json, sys
from functions_framework import create_app
client = create_app("telegram_webhook", {MAIN!r}).test_client()
update = {{"update_id": 77, "message": {{"message_id": 1, "chat": {{"id": 9, "type": "private"}},
          "from": {{"id": 9, "is_bot": False, "first_name": "A"}}, "text": "hello offline"}}}}
response = client.post("/", json=update)
print(json.dumps({{"status": response.status_code, "body": response.get_json(),
                  "anthropic": "anthropic" in sys.modules, "twilio": "twilio" in sys.modules,
                  "pypdf": "pypdf" in sys.modules, "jsonschema_rs": "jsonschema_rs" in sys.modules}}))
"""
    env = {
        "PATH": "/usr/bin:/bin",
        "APP_ENV": "local",
        "DATABASE_URL": database_url,
        "PYTHONPATH": str(Path(MAIN).parent),
    }
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["status"] == 200 and "offline stand-in" in result["body"]["text"].lower()
    assert result["anthropic"] is False and result["twilio"] is False and result["pypdf"] is False
    assert result["jsonschema_rs"] is False  # EXTRA_TOOLS' schemas only (core/turn/operator_tools.py)


def test_an_instance_without_any_database_still_answers(
    environment: pytest.MonkeyPatch, fake_telegram: FakeTelegram, caplog: pytest.LogCaptureFixture
) -> None:
    # the scheme forgotten: refused as the store is built (a SUPABASE_URL that is none is refused
    # before, as a wrong setting: functions/settings.py)
    environment.setenv("DATABASE_URL", "postgres:x@127.0.0.1/x")
    with caplog.at_level(logging.ERROR, logger="crossmem"):
        response = app_client("telegram_webhook").post("/", json=update("anyone home?"), headers=TELEGRAM_HEADERS)
    assert response.status_code == 200
    assert "anyone home?" in fake_telegram.sent()[0]["text"]
    assert any("could not be set up" in record.getMessage() for record in caplog.records)


@pytest.mark.parametrize(
    ("name", "value", "named"),
    [
        ("IDENTITY_POLICY", "owner", "OWNER_USER_ID"),
        ("DATABASE_CONNECT_TIMEOUT", "sk-secret-looking", "DATABASE_CONNECT_TIMEOUT"),
    ],
)
def test_a_misconfigured_instance_says_what_is_wrong_without_values(
    environment: pytest.MonkeyPatch, name: str, value: str, named: str, fake_anthropic: FakeAnthropic
) -> None:
    environment.setenv(name, value)
    response = app_client("telegram_webhook").post("/", json=update("hi"), headers=TELEGRAM_HEADERS)
    assert response.status_code == 503 and response.get_json()["error"] == "not_configured"
    message = response.get_json()["message"]
    assert named in message and "sk-secret-looking" not in message
    assert fake_anthropic.requests == []


def test_the_owner_policy_refuses_strangers_politely_and_keeps_nothing(
    environment: pytest.MonkeyPatch,
    owner: uuid.UUID,
    database_url: str,
    fake_anthropic: FakeAnthropic,
    fake_telegram: FakeTelegram,
) -> None:
    as_owner(environment, owner, telegram="4242, 777")
    environment.setenv("STRANGER_REPLY", "This assistant is private.")
    client = app_client("telegram_webhook")
    client.post("/", json=update("my secret: the safe code is 1234"), headers=TELEGRAM_HEADERS)
    stranger = update("what is the safe code?", user_id=999)
    assert client.post("/", json=stranger, headers=TELEGRAM_HEADERS).status_code == 200
    assert fake_telegram.sent()[-1] == {"chat_id": 999, "text": "This assistant is private."}
    assert len(fake_anthropic.requests) == 1  # only the owner's turn reached the model
    assert stored_turn(database_url, str(stranger["update_id"])) == []
    with psycopg.connect(database_url) as connection:
        row = connection.execute("select count(*) from identities where external_id = '999'").fetchone()
    assert row == (0,)
    client.post("/", json=update("and the second allowed id", user_id=777), headers=TELEGRAM_HEADERS)
    texts = json.dumps(fake_anthropic.requests[-1]["messages"])
    assert "safe code is 1234" in texts  # 777 is the owner too: the same memory


def test_under_the_owner_policy_a_stranger_is_never_welcomed_or_invited_to_write(
    environment: pytest.MonkeyPatch, owner: uuid.UUID, fake_anthropic: FakeAnthropic, fake_telegram: FakeTelegram
) -> None:
    """What a stranger meets first (/start, /help, a sticker, the bot named in a group) is the
    stranger's answer, as their words get: the welcome said "write to me here ... I remember our one
    conversation", /help listed the commands, and a sticker asked them to write instead. The
    owner still gets each fixed answer. Seen failing with the welcome sent to the stranger."""
    as_owner(environment, owner, telegram="4242")
    environment.setenv("STRANGER_REPLY", "This assistant is private.")
    environment.setenv("TELEGRAM_BOT_USERNAME", "advisor_bot")
    client = app_client("telegram_webhook")
    sticker = json.loads((CORPUS / "06_sticker.json").read_text())
    sticker["message"]["from"]["id"] = sticker["message"]["chat"]["id"] = 999
    group = update("@advisor_bot what is the safe code?", user_id=999, chat_type="group")
    for body in (update("/start", user_id=999), update("/help", user_id=999), sticker, group):
        assert client.post("/", json=body, headers=TELEGRAM_HEADERS).status_code == 200
        assert fake_telegram.sent()[-1] == {"chat_id": 999, "text": "This assistant is private."}
    assert client.post("/", json=update("/start"), headers=TELEGRAM_HEADERS).status_code == 200
    assert fake_telegram.sent()[-1] == {"chat_id": 4242, "text": ENGLISH.say("telegram.welcome")}
    assert fake_anthropic.requests == []


def test_without_a_bot_token_locally_a_long_reply_comes_back_cut_not_crashed(
    environment: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic
) -> None:
    environment.setenv("APP_ENV", "local")
    environment.delenv("TELEGRAM_BOT_TOKEN")
    fake_anthropic.answer = lambda body: "A long answer. " * 600
    response = app_client("telegram_webhook").post("/", json=update("tell me everything"), headers=TELEGRAM_HEADERS)
    assert response.status_code == 200
    text = response.get_json()["text"]
    assert len(text) <= 4096 and text.endswith(" …")


@pytest.mark.parametrize(
    "odd_path",
    ["photos/file\x07.jpg", "photos/file\n.jpg", "photos/" + "a" * 70_000],
    ids=["bell", "newline", "70000-characters"],
)
def test_a_get_file_path_no_url_can_hold_is_a_clear_answer_once_never_a_500(
    environment: pytest.MonkeyPatch,
    database_url: str,
    fake_anthropic: FakeAnthropic,
    fake_telegram: FakeTelegram,
    caplog: pytest.LogCaptureFixture,
    odd_path: str,
) -> None:
    """httpx refuses such a path with InvalidURL, no HTTPError: the person is told, the message is
    stored with the reason, and Telegram's redelivery finds it answered (a 500 would have it
    redeliver into the same crash)."""
    body = json.loads((CORPUS / "05_photo_caption.json").read_text())
    body["update_id"] = uuid.uuid4().int % 10**9  # ids of this test's own: the database is the module's
    message = body["message"]
    message["from"]["id"] = 700_000_000 + uuid.uuid4().int % 10**8
    message["chat"] = {"id": message["from"]["id"], "type": "private", "first_name": "Mark"}
    chosen = message["photo"][-1]["file_id"]
    fake_telegram.files[chosen] = (CORPUS.parent / "media" / "receipt.jpg").read_bytes()
    fake_telegram.file_paths[chosen] = odd_path
    client = app_client("telegram_webhook")
    with caplog.at_level(logging.WARNING, logger="crossmem"):
        statuses = [client.post("/", json=body, headers=TELEGRAM_HEADERS).status_code for _ in range(2)]
    assert statuses == [200, 200], statuses
    assert [sent["text"] for sent in fake_telegram.sent()] == [
        "Sorry, I couldn't use what you sent (the download failed). Could you tell me in words what it says?"
    ]
    assert [call[0] for call in fake_telegram.calls if call[0] == "getFile"] == ["getFile"]
    assert fake_anthropic.requests == []
    assert stored_turn(database_url, str(body["update_id"])) == [
        ("user", "[photo, not read: the download failed] OK - some mages"),
        ("assistant", fake_telegram.sent()[0]["text"]),
    ]
    fetch_failures = [r for r in caplog.records if r.getMessage() == "a Telegram file could not be fetched"]
    assert [r.__dict__["error"] for r in fetch_failures] == ["InvalidURL"]


def test_a_long_inline_reply_the_bot_api_did_not_take_is_sent_again_on_redelivery(
    environment: pytest.MonkeyPatch, fake_telegram: FakeTelegram, fake_anthropic: FakeAnthropic, database_url: str
) -> None:
    """A reply answered inside the webhook but longer than one message goes through the Bot API:
    when that fails for a reason that may pass, the webhook asks for a redelivery (it answered 200
    and the reply was lost), and the redelivery sends the stored reply, not a second answer."""
    environment.setenv("TELEGRAM_REPLY_IN_WEBHOOK", "true")
    long = " ".join(f"Sentence {n} of a long answer." for n in range(250))
    fake_anthropic.answer = lambda body: long
    fake_telegram.fail_with("gateway")
    body = update("tell me everything", user_id=6_100_001)
    client = app_client("telegram_webhook")
    first = client.post("/", json=body, headers=TELEGRAM_HEADERS)
    assert first.status_code == 503 and first.get_json()["error"] == "reply_owed"
    assert fake_telegram.sent() == []
    fake_telegram.recover()
    again = client.post("/", json=body, headers=TELEGRAM_HEADERS)
    assert again.status_code == 200 and again.get_json() == {"ok": True, "outcome": "redelivered"}
    parts = split_message(long, TELEGRAM_LIMIT)
    assert len(parts) == 2 and [call["text"] for call in fake_telegram.sent()] == parts
    assert len(fake_anthropic.requests) == 1


def test_help_whose_answer_the_bot_api_did_not_take_is_answered_again_on_redelivery(
    environment: pytest.MonkeyPatch, fake_telegram: FakeTelegram, fake_anthropic: FakeAnthropic
) -> None:
    """/help changes nothing: the redelivery answers it again, through the Bot API."""
    fake_telegram.fail_with("gateway")
    body = update("/help", user_id=6_100_002)
    client = app_client("telegram_webhook")
    first = client.post("/", json=body, headers=TELEGRAM_HEADERS)
    assert first.status_code == 503 and first.get_json()["error"] == "reply_owed"
    fake_telegram.recover()
    again = client.post("/", json=body, headers=TELEGRAM_HEADERS)
    assert again.status_code == 200 and again.get_json() == {"ok": True}
    [answer] = fake_telegram.sent()
    assert answer["chat_id"] == 6_100_002 and "/forget" in answer["text"] and fake_anthropic.requests == []


def test_a_forget_confirm_whose_answer_the_bot_api_did_not_take_is_told_as_done(
    environment: pytest.MonkeyPatch, fake_telegram: FakeTelegram, fake_anthropic: FakeAnthropic
) -> None:
    """`/forget confirm` deleted the person's memory, and its answer met a 502: the webhook asked
    for a redelivery, which ran the command again and, the request being spent, answered "There is
    nothing to confirm. Send /forget first": the person read that nothing was deleted, when all of
    it was (a review's finding). A command's answer (a forget, an unlink, a link: each changes what a
    second run would answer) now goes in the webhook's, and nothing is redelivered."""
    client = app_client("telegram_webhook")
    chat = 6_100_006
    for text in ("my locker code is 4417", "/forget"):
        assert client.post("/", json=update(text, user_id=chat), headers=TELEGRAM_HEADERS).status_code == 200
    fake_telegram.fail_with("gateway", times=1)
    first = client.post("/", json=update("/forget confirm", user_id=chat), headers=TELEGRAM_HEADERS)
    assert (first.status_code, first.get_json()) == (
        200,
        {"method": "sendMessage", "chat_id": chat, "text": forgotten(ENGLISH, 2)},
    )


def test_a_later_part_that_fails_for_a_moment_is_sent_again_and_the_first_not_twice(
    environment: pytest.MonkeyPatch, fake_telegram: FakeTelegram, fake_anthropic: FakeAnthropic
) -> None:
    """A reply of two parts whose second meets a 502 once: it is tried again a second later, the
    update is answered, and the person has each part once. An attacker review's finding: the
    webhook asked for a redelivery, which sent the whole reply, its first part a second time."""
    environment.setenv("TELEGRAM_DRAFTS", "false")
    long = " ".join(f"Sentence {n} of a long answer." for n in range(250))
    fake_anthropic.answer = lambda body: long
    seen: list[str] = []

    def second_part_fails_once(method: str, payload: dict[str, Any]) -> None:
        if method == "sendMessage":
            seen.append(payload["text"])
            if len(seen) == 1:
                fake_telegram.fail_with("gateway", times=1)

    fake_telegram.before_answer = second_part_fails_once
    response = app_client("telegram_webhook").post(
        "/", json=update("tell me everything", user_id=6_100_003), headers=TELEGRAM_HEADERS
    )
    assert response.status_code == 200 and response.get_json()["outcome"] == "answered"
    parts = split_message(long, TELEGRAM_LIMIT)
    assert [call["text"] for call in fake_telegram.sent()] == parts and len(parts) == 2


@pytest.mark.parametrize(
    "setting",
    [
        ("TELEGRAM_DRAFTS", "false"),
        ("TELEGRAM_REPLY_IN_WEBHOOK", "true"),
    ],
    ids=["through the Bot API", "in the webhook's answer"],
)
def test_a_later_part_that_keeps_failing_is_sent_alone_by_the_redelivery(
    environment: pytest.MonkeyPatch,
    fake_telegram: FakeTelegram,
    fake_anthropic: FakeAnthropic,
    database_url: str,
    setting: tuple[str, str],
) -> None:
    """A reply of two parts whose second meets 502s past its two retries: the webhook asks for a
    redelivery, and the redelivery sends the second part alone (the stored reply is owed from it),
    not the whole reply: the person has each part once. The notes of two sessions had left this."""
    environment.setenv(*setting)
    long = " ".join(f"Sentence {n} of a long answer." for n in range(250))
    fake_anthropic.answer = lambda body: long

    def down_after_the_first_part(method: str, payload: dict[str, Any]) -> None:
        if method == "sendMessage" and len(fake_telegram.sent()) == 1:
            fake_telegram.fail_with("gateway")

    fake_telegram.before_answer = down_after_the_first_part
    chat = 6_100_004 if setting[0] == "TELEGRAM_DRAFTS" else 6_100_008  # the database is the module's
    body = update("tell me everything", user_id=chat)
    client = app_client("telegram_webhook")
    first = client.post("/", json=body, headers=TELEGRAM_HEADERS)
    assert first.status_code == 503 and first.get_json()["error"] == "reply_owed"
    parts = split_message(long, TELEGRAM_LIMIT)
    assert [call["text"] for call in fake_telegram.sent()] == parts[:1] and len(parts) == 2
    reply = "select unsent_from, delivered_at is not null from messages where role = 'assistant' and user_id = %s"
    [(person,)] = rows(database_url, "select user_id from identities where external_id = %s", str(chat))
    assert rows(database_url, reply, person) == [(1, False)]
    fake_telegram.before_answer = None
    fake_telegram.recover()
    again = client.post("/", json=body, headers=TELEGRAM_HEADERS)
    assert again.status_code == 200 and again.get_json() == {"ok": True, "outcome": "redelivered"}
    assert [call["text"] for call in fake_telegram.sent()] == parts
    assert rows(database_url, reply, person) == [(None, True)]
    assert client.post("/", json=body, headers=TELEGRAM_HEADERS).status_code == 200
    assert [call["text"] for call in fake_telegram.sent()] == parts and len(fake_anthropic.requests) == 1
