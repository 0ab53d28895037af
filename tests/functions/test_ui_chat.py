"""`useChat` on the web function (functions/ui_chat_routes.py, functions/ui_message_stream.py): the AI
SDK's request body as `DefaultChatTransport` posts it, answered with its UI message stream, and the
chat's stream resumed. Real function, real JWTs, real Postgres, fake Anthropic; the SDK's own
parser reads the same stream in tests/functions/test_ai_sdk_client.py."""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from flask.testing import FlaskClient
from werkzeug.serving import make_server

from core.errors import InputError
from core.memory.search import SEARCH_MEMORY
from core.models import Surface
from core.turn.request import Outcome, TurnRequest
from functions import runtime
from functions.ui_chat_routes import attachment
from functions.web_models import UIFilePart
from tests.fakes.anthropic_api import REFUSAL_TRIGGER, Answer, FakeAnthropic, text_block, tool_results, tool_use
from tests.fakes.deepgram_api import FakeDeepgram
from tests.helpers import (
    CORPUS,
    CORS_ORIGIN,
    ENGLISH,
    JWT_SECRET,
    answer_of,
    app_client,
    as_owner,
    bearer,
    chat_body,
    loaded,
    new_conversation,
    owners_telegram_thread,
    parts_of,
    rows,
    stored_count,
    ui_message,
    ui_text,
)

ANSWER = "Here is a fairly long answer that arrives piece by piece, as written."


def test_a_use_chat_request_is_answered_with_the_ui_message_stream_and_stored_once(
    web: FlaskClient, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    fake_anthropic.answer = lambda body: ANSWER
    person = uuid.uuid4()
    chat = new_conversation(web, person)
    body = chat_body(chat, ui_message("u-1", "user", "stream please"))
    response = web.post("/", json=body, headers=bearer(person))
    assert response.status_code == 200 and response.mimetype == "text/event-stream"
    assert response.headers["x-vercel-ai-ui-message-stream"] == "v1"
    parts = parts_of(response.get_data(as_text=True))
    kinds = [part if isinstance(part, str) else part["type"] for part in parts]
    deltas = kinds.count("text-delta")
    assert deltas > 1
    assert kinds == ["start", "text-start", *["text-delta"] * deltas, "text-end", "data-turn", "finish", "[DONE]"]
    text = "".join(part["delta"] for part in parts if isinstance(part, dict) and part["type"] == "text-delta")
    stored = rows(database_url, "select id, role, content from messages where user_id = %s order by id", person)
    assert [(role, content) for _, role, content in stored] == [("user", "stream please"), ("assistant", ANSWER)]
    # Named before its first word: the id begin_turn reserved, which finish_turn stored it under.
    assert parts[0] == {"type": "start", "messageId": str(stored[1][0])}
    assert text == ANSWER
    assert parts[-3]["data"] == {
        "conversationId": chat,
        "messageId": stored[0][0],
        "replyId": stored[1][0],
        "outcome": "answered",
    }
    assert parts[-2] == {"type": "finish", "finishReason": "stop"}
    assert rows(database_url, "select external_id from messages where id = %s", stored[0][0]) == [("u-1",)]

    again = parts_of(web.post("/", json=body, headers=bearer(person)).get_data(as_text=True))
    assert again[0] == {"type": "start", "messageId": str(stored[1][0])}  # the stored reply, named
    assert again[2] == {"type": "text-delta", "id": "text-1", "delta": ANSWER}
    assert again[4]["data"]["outcome"] == "redelivered"
    assert stored_count(database_url, person) == 2 and len(fake_anthropic.requests) == 1


def test_the_earlier_messages_are_the_clients_history_each_once(
    web: FlaskClient, environment: pytest.MonkeyPatch, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    person = uuid.uuid4()
    environment.setenv("OWNER_USER_ID", str(person))
    environment.setenv("OWNER_TELEGRAM_IDS", "4242")
    runtime.reset()
    web = app_client("web_chat")
    fake_anthropic.answer = lambda body: "Noted."
    said = runtime.turns().run(TurnRequest(Surface.TELEGRAM, "On Telegram: I'm allergic to penicillin", "9", "4242"))
    chat = new_conversation(web, person)
    telegram = {"surface": "telegram"}
    body = chat_body(
        chat,
        ui_message(str(said.message_id), "user", "On Telegram: I'm allergic to penicillin", metadata=telegram),
        ui_message(str(said.reply_id), "assistant", "Noted.", metadata=telegram),
        {"id": "sys", "role": "system", "parts": [{"type": "text", "text": "ignored"}]},
        ui_message("²", "user", "I like green tea"),  # a digit int() refuses: not a stored message's id
        {"id": "a-2", "role": "assistant", "parts": [{"type": "step-start"}, {"type": "text", "text": "Tea noted."}]},
        ui_message("u-3", "user", "Which antibiotics should I avoid?"),
    )
    response = web.post("/", json=body, headers=bearer(person))
    assert response.status_code == 200, response.get_data(as_text=True)
    sent = fake_anthropic.requests[-1]["messages"]
    assert json.dumps(sent).count("allergic to penicillin") == 1  # the prepend leaves out what the client sent
    texts = [block["text"] for message in sent for block in message["content"] if block["type"] == "text"]
    assert "ignored" not in json.dumps(sent)
    assert [text.split("] ", 1)[-1] for text in texts] == [
        "On Telegram: I'm allergic to penicillin",
        "Noted.",
        "I like green tea",
        "Tea noted.",
        "Which antibiotics should I avoid?",
    ]
    assert texts[0].startswith("[telegram] ") and texts[-1].startswith("[web · ")  # no time: none was sent


def test_a_file_part_is_the_messages_attachment(
    web: FlaskClient, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    person = uuid.uuid4()
    chat = new_conversation(web, person)
    photo = base64.b64encode((CORPUS / "media" / "receipt.jpg").read_bytes()).decode()
    message = {
        "id": "u-photo",
        "role": "user",
        "parts": [
            {
                "type": "file",
                "mediaType": "image/jpeg",
                "filename": "receipt.jpg",
                "url": f"data:image/jpeg;base64,{photo}",
            },
            {"type": "text", "text": "What did I pay?"},
        ],
    }
    response = web.post("/", json=chat_body(chat, message), headers=bearer(person))
    assert response.status_code == 200, response.get_data(as_text=True)
    images = [
        block
        for request in fake_anthropic.requests
        for turn in request["messages"]
        for block in turn["content"]
        if block["type"] == "image"
    ]
    assert images and images[0]["source"] == {"type": "base64", "media_type": "image/jpeg", "data": photo}
    stored = rows(database_url, "select content from messages where user_id = %s and role = 'user'", person)
    assert stored[0][0].startswith("[photo") and stored[0][0].endswith("What did I pay?")


@pytest.mark.parametrize(
    ("body", "status", "error", "reason"),
    [
        ({"id": "not-a-uuid", "messages": [ui_message("u", "user", "hi")]}, 400, "bad_request", "invalid body at id"),
        ({"id": "CHAT", "messages": []}, 400, "bad_request", "invalid body at messages"),
        ({"id": "CHAT", "messages": [ui_message("a", "assistant", "hi")]}, 400, "bad_request", "role user"),
        ({"id": "CHAT", "messages": [ui_message("u", "user", "")]}, 400, "empty_message", ""),
        ({"id": "CHAT", "messages": [ui_message("u", "user", "x" * 20_000)]}, 413, "message_too_long", ""),
        # Past a text part's old limit, once read as a part without words: 400 empty_message.
        ({"id": "CHAT", "messages": [ui_message("u", "user", "x" * 250_000)]}, 413, "message_too_long", ""),
        (
            {
                "id": "CHAT",
                "messages": [
                    {
                        "id": "u",
                        "role": "user",
                        "parts": [{"type": "file", "mediaType": "image/png", "url": "https://example.com/a.png"}],
                    }
                ],
            },
            400,
            "bad_request",
            "data: URL",
        ),
        (
            {
                "id": "CHAT",
                "messages": [
                    {
                        "id": "u",
                        "role": "user",
                        "parts": [{"type": "file", "mediaType": "video/mp4", "url": "data:video/mp4;base64,AAAA"}],
                    }
                ],
            },
            400,
            "bad_request",
            "invalid file part",
        ),
        (  # once read as a part without words, and the message answered without its photo
            {
                "id": "CHAT",
                "messages": [
                    {
                        "id": "u",
                        "role": "user",
                        "parts": [
                            {"type": "file", "mediaType": "image/png" + " " * 100, "url": "data:image/png;base64,AAAA"},
                            {"type": "text", "text": "what is this?"},
                        ],
                    }
                ],
            },
            400,
            "bad_request",
            "invalid body at messages.0.parts.0.file.mediaType: String should have at most 100 characters",
        ),
        ({"id": str(uuid.uuid4()), "messages": [ui_message("u", "user", "hi")]}, 404, "not_found", ""),
        (
            {"id": "CHAT", "messages": [ui_message("i" * 129, "user", "hi")]},
            400,
            "bad_request",
            "invalid body at messages.0.id: Value error, an id has at most 128 characters"
            " (an edited message's, `~` and 16 hex digits more)",
        ),
    ],
    ids=[
        "chat-id",
        "no-messages",
        "last-not-user",
        "empty",
        "too-long",
        "longer-than-a-text-part-was",
        "remote-file",
        "video",
        "long-media-type",
        "unknown-chat",
        "long-id",
    ],
)
def test_a_bad_use_chat_request_is_answered_with_its_status_before_any_stream(
    web: FlaskClient,
    database_url: str,
    fake_anthropic: FakeAnthropic,
    body: dict[str, Any],
    status: int,
    error: str,
    reason: str,
) -> None:
    person = uuid.uuid4()
    if body["id"] == "CHAT":
        body = {**body, "id": new_conversation(web, person)}
    response = web.post("/", json=body, headers=bearer(person))
    assert (response.status_code, response.mimetype) == (status, "application/json")
    assert response.get_json()["error"] == error and reason in response.get_json()["message"]
    assert stored_count(database_url, person) == 0 and fake_anthropic.requests == []


def test_over_budget_and_someone_elses_chat_are_refused_before_any_stream(
    web: FlaskClient, environment: pytest.MonkeyPatch, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    environment.setenv("TURNS_PER_MINUTE", "1")
    runtime.reset()
    web = app_client("web_chat")
    alice, mallory = uuid.uuid4(), uuid.uuid4()
    chat = new_conversation(web, alice)
    first = web.post("/", json=chat_body(chat, ui_message("a-1", "user", "my plan")), headers=bearer(alice))
    assert first.status_code == 200 and first.get_data(as_text=True).endswith("data: [DONE]\n\n")
    stolen = web.post("/", json=chat_body(chat, ui_message("m-1", "user", "hi")), headers=bearer(mallory))
    assert stolen.status_code == 404 and "my plan" not in stolen.get_data(as_text=True)
    assert web.get(f"/{chat}/stream", headers=bearer(mallory)).status_code == 404
    limited = web.post("/", json=chat_body(chat, ui_message("a-2", "user", "more")), headers=bearer(alice))
    assert (limited.status_code, limited.get_json()["error"]) == (429, "over_budget")
    assert "x-vercel-ai-ui-message-stream" not in limited.headers
    assert stored_count(database_url, alice) == 2 and stored_count(database_url, mallory) == 0


def test_a_model_that_fails_mid_stream_ends_in_an_error_part_with_our_code(
    web: FlaskClient, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    person = uuid.uuid4()
    chat = new_conversation(web, person)
    fake_anthropic.behaviour = "500"
    response = web.post("/", json=chat_body(chat, ui_message("u-1", "user", "hello?")), headers=bearer(person))
    assert response.status_code == 200
    parts = parts_of(response.get_data(as_text=True))
    kinds = [part if isinstance(part, str) else part["type"] for part in parts]
    assert kinds == ["start", "text-start", "text-delta", "text-end", "data-turn", "error", "finish", "[DONE]"]
    assert parts[2]["delta"] == ENGLISH.say("turn.fallback")  # what the person reads
    assert parts[4]["data"]["outcome"] == "fallback" and parts[4]["data"]["replyId"] is None
    assert parts[5]["errorText"].startswith("model_unavailable: ")
    assert parts[6] == {"type": "finish", "finishReason": "error"}
    assert rows(database_url, "select role from messages where user_id = %s", person) == [("user",)]
    # The fallback is not stored: the id its start named (reserved when the turn began) names nothing.
    assert rows(database_url, "select count(*) from messages where id = %s", int(parts[0]["messageId"])) == [(0,)]


def test_a_bug_mid_stream_ends_in_an_error_part_that_keeps_its_words_in_the_log(
    environment: pytest.MonkeyPatch, web: FlaskClient, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A failure that is no error of ours, after the first part: the stream was cut with no `error`
    part, no `finish` and no `[DONE]` (only our errors were caught). It ends as ours do, with our
    code and plain words; the bug's own words and its traceback are the log's; the message is kept."""

    class BreaksAfterItsFirstWords:
        name = "breaks"

        def stream(self, *_: Any, **__: Any) -> Any:
            yield "The first words"
            raise RuntimeError("a bug's own words")

    environment.setattr(runtime, "model", lambda: BreaksAfterItsFirstWords())
    person = uuid.uuid4()
    chat = new_conversation(web, person)
    response = web.post("/", json=chat_body(chat, ui_message("u-1", "user", "hello?")), headers=bearer(person))
    parts = parts_of(response.get_data(as_text=True))
    assert [part if isinstance(part, str) else part["type"] for part in parts] == [
        "start",
        "text-start",
        "text-delta",
        "error",
        "finish",
        "[DONE]",
    ]
    assert parts[3]["errorText"] == "internal_error: the turn failed; your message is kept: send it again"
    assert parts[4] == {"type": "finish", "finishReason": "error"}
    [line] = [r for r in caplog.records if r.name == "crossmem.functions" and r.levelno >= logging.ERROR]
    assert line.getMessage() == "a streamed turn failed after its first event" and line.exc_info is not None
    assert "a bug's own words" not in response.get_data(as_text=True)
    assert rows(database_url, "select role, content from messages where user_id = %s", person) == [("user", "hello?")]


def test_the_chat_stream_resumes_an_abandoned_turn_once(
    environment: pytest.MonkeyPatch,
    database_url: str,
    fake_anthropic: FakeAnthropic,
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
) -> None:
    environment.setenv("SUPABASE_JWT_SECRET", JWT_SECRET)
    web = app_client("web_chat")
    story = "one two three four five six seven eight nine ten eleven twelve"
    fake_anthropic.answer = lambda body: story
    fake_anthropic.delta_pause_s = 0.1
    person, other = uuid.uuid4(), uuid.uuid4()
    chat = new_conversation(web, person)
    assert web.get(f"/{chat}/stream", headers=bearer(person)).status_code == 204  # nothing sent yet
    server = make_server("127.0.0.1", 0, web.application, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    caplog.set_level(logging.INFO, logger="crossmem.turn")
    try:
        url = f"http://127.0.0.1:{server.port}/"
        body = chat_body(chat, ui_message("u-story", "user", "Tell me a long story"))
        seen = 0
        with (
            httpx.Client(timeout=10) as client,
            client.stream("POST", url, json=body, headers=bearer(person)) as stream,
        ):
            for line in stream.iter_lines():
                seen += '"text-delta"' in line
                if seen == 2:
                    break  # the tab is closed
        for _ in range(100):
            if any(getattr(r, "outcome", None) == "abandoned" for r in caplog.records):
                break
            time.sleep(0.05)
        assert [getattr(r, "outcome", None) for r in caplog.records if r.getMessage() == "turn"] == ["abandoned"]
        assert web.get(f"/{chat}/stream", headers=bearer(other)).status_code == 404
        fake_anthropic.delta_pause_s = 0.0
        resumed = web.get(f"/{chat}/stream", headers=bearer(person))
        assert resumed.status_code == 200 and resumed.headers["x-vercel-ai-ui-message-stream"] == "v1"
        parts = parts_of(resumed.get_data(as_text=True))
        text = "".join(part["delta"] for part in parts if isinstance(part, dict) and part["type"] == "text-delta")
        assert text == story and parts[-1] == "[DONE]"
        reply = rows(database_url, "select id, content from messages where user_id = %s and role = 'assistant'", person)
        assert reply == [(reply[0][0], story)]
        assert parts[0] == {"type": "start", "messageId": str(reply[0][0])}
        assert web.get(f"/{chat}/stream", headers=bearer(person)).status_code == 204  # once
    finally:
        server.shutdown()


def test_a_follow_up_scheduled_in_the_turn_travels_as_a_data_part(
    web: FlaskClient, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    def answer(body: dict[str, Any]) -> Any:
        if results := tool_results(body):
            return f"Done: {results[0]['content']}"
        return [
            text_block("I'll remind you."),
            tool_use("schedule_follow_up", {"content": "Stretch.", "in_minutes": 30}),
        ]

    fake_anthropic.answer = answer
    person = uuid.uuid4()
    chat = new_conversation(web, person)
    response = web.post(
        "/", json=chat_body(chat, ui_message("u-1", "user", "remind me in 30 min")), headers=bearer(person)
    )
    parts = parts_of(response.get_data(as_text=True))
    [follow_ups] = [part for part in parts if isinstance(part, dict) and part["type"] == "data-follow-ups"]
    due = rows(database_url, "select content, due_at from follow_ups where user_id = %s", person)
    assert len(due) == 1 and follow_ups["data"]["scheduled"] == [
        {
            "content": "Stretch.",
            "due_at": due[0][1].isoformat(),
            "timezone": follow_ups["data"]["scheduled"][0]["timezone"],
        }
    ]
    assert [part["type"] for part in parts if isinstance(part, dict)][-3:] == ["data-turn", "data-follow-ups", "finish"]
    fake_anthropic.answer = lambda body: "You're welcome."
    plain = parts_of(
        web.post("/", json=chat_body(chat, ui_message("u-2", "user", "thanks")), headers=bearer(person)).get_data(
            as_text=True
        )
    )
    assert "data-follow-ups" not in [part["type"] for part in plain if isinstance(part, dict)]


def test_todays_body_gets_the_ui_message_stream_only_when_it_asks_for_it(
    web: FlaskClient, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    fake_anthropic.answer = lambda body: ANSWER
    person = uuid.uuid4()
    asking = {**bearer(person), "Accept": "text/event-stream", "x-vercel-ai-ui-message-stream": "v1"}
    response = web.post("/", json={"message": "hello", "client_message_id": "d-1"}, headers=asking)
    assert response.headers["x-vercel-ai-ui-message-stream"] == "v1"
    parts = parts_of(response.get_data(as_text=True))
    turn = next(part for part in parts if isinstance(part, dict) and part["type"] == "data-turn")["data"]
    stored = rows(database_url, "select id, conversation_id from messages where user_id = %s order by id", person)
    assert turn == {
        "conversationId": str(stored[0][1]),
        "messageId": stored[0][0],
        "replyId": stored[1][0],
        "outcome": "answered",
    }
    legacy = web.post(
        "/",
        json={"message": "hello", "client_message_id": "d-1"},
        headers={**bearer(person), "Accept": "text/event-stream"},
    )
    assert "x-vercel-ai-ui-message-stream" not in legacy.headers
    assert legacy.get_data(as_text=True).startswith("event: delta\ndata: ")
    preflight = web.options("/", headers={"Origin": CORS_ORIGIN, "Access-Control-Request-Method": "POST"})
    assert "x-vercel-ai-ui-message-stream" in preflight.headers["Access-Control-Allow-Headers"]


def test_the_preflight_of_an_ai_sdk_5_transport_in_safari_or_firefox_is_allowed(web: FlaskClient) -> None:
    """`ai` from 5.0.43 until its March 2026 fix (5.x and 6.0.x alike) has DefaultChatTransport send its
    own User-Agent (`ai-sdk/5.0.53 runtime/browser`). Chrome drops it; Safari and Firefox send it and
    ask for it in the preflight, which refused it: every turn and resume failed there with a CORS
    error before any request reached the function."""
    for method in ("POST", "GET"):
        preflight = web.options(
            "/",
            headers={
                "Origin": CORS_ORIGIN,
                "Access-Control-Request-Method": method,
                "Access-Control-Request-Headers": "authorization,content-type,user-agent",
            },
        )
        allowed = {name.strip().lower() for name in preflight.headers["Access-Control-Allow-Headers"].split(",")}
        assert preflight.status_code == 204
        assert {"authorization", "content-type", "user-agent"} <= allowed


@pytest.mark.parametrize(
    ("media_type", "url", "taken"),
    [
        ("audio/webm;codecs=opus", "data:audio/webm;codecs=opus;base64,GkXfow==", "audio/webm"),
        ("image/png", "data:image/png;base64,iVBORw0KGgo=", "image/png"),
        ("image/png", "data:image/jpeg;base64,/9j/4A==", None),
        ("image/png", "data:image/png,not-base64", None),
        ("image/png", "data:image/png;base64,***", None),
    ],
)
def test_a_file_parts_data_url_is_taken_with_todays_rules(media_type: str, url: str, taken: str | None) -> None:
    part = UIFilePart(type="file", mediaType=media_type, url=url)
    if taken is None:
        with pytest.raises(InputError):
            attachment(part)
    else:
        assert attachment(part).media_type == taken


def test_a_body_nested_past_the_recursion_limit_is_a_400(web: FlaskClient) -> None:
    for body in ("[" * 100_000, '{"messages": ' + "[" * 100_000):
        response = web.post("/", data=body, content_type="application/json", headers=bearer(uuid.uuid4()))
        assert (response.status_code, response.get_json()["error"]) == (400, "bad_request")


def test_auth_is_answered_before_any_stream(
    web: FlaskClient, environment: pytest.MonkeyPatch, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    owner, stranger = uuid.uuid4(), uuid.uuid4()
    as_owner(environment, owner)
    runtime.reset()
    web = app_client("web_chat")
    chat = new_conversation(web, owner)
    body = chat_body(chat, ui_message("u-1", "user", "hi"))
    answers = [
        web.post("/", json=body),
        web.post("/", json=body, headers=bearer(owner, exp=int(time.time()) - 3600)),
        web.post("/", json=body, headers=bearer(stranger)),
        web.get(f"/{chat}/stream"),
        web.get(f"/{chat}/stream", headers=bearer(stranger)),
    ]
    assert [(a.status_code, a.mimetype, a.get_json()["error"]) for a in answers] == [
        (401, "application/json", "unauthorized"),
        (401, "application/json", "unauthorized"),
        (403, "application/json", "forbidden"),
        (401, "application/json", "unauthorized"),
        (403, "application/json", "forbidden"),
    ]
    assert stored_count(database_url, owner) == 0 and stored_count(database_url, stranger) == 0
    assert fake_anthropic.requests == []


def test_with_the_database_down_the_start_names_no_reply(
    web: FlaskClient, environment: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic
) -> None:
    fake_anthropic.answer = lambda body: ANSWER
    environment.setenv("DATABASE_URL", "postgresql://postgres@127.0.0.1:1/postgres")
    down = app_client("web_chat")
    chat = str(uuid.uuid4())
    response = down.post(
        "/", json=chat_body(chat, ui_message("u-1", "user", "still there?")), headers=bearer(uuid.uuid4())
    )
    parts = parts_of(response.get_data(as_text=True))
    assert parts[0] == {"type": "start"}  # nothing was stored, and nothing will be
    text = "".join(part["delta"] for part in parts if isinstance(part, dict) and part["type"] == "text-delta")
    assert text == ANSWER
    assert parts[-3]["data"] == {"conversationId": chat, "messageId": None, "replyId": None, "outcome": "answered"}


def test_a_declined_turn_finishes_as_content_filter_and_its_mark_keeps_it_out_of_the_clients_history(
    web: FlaskClient, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    """The model declines (its stop reason `refusal`): the stream finishes with `content-filter`
    and the reply's metadata `declined`, which the page keeps, the history route gives too, and
    a later request's history then leaves out with the message it answered."""
    fake_anthropic.answer = lambda body: "Sure."
    person = uuid.uuid4()
    chat = new_conversation(web, person)
    asked = ui_message("u-1", "user", f"tell me {REFUSAL_TRIGGER}")
    parts = parts_of(web.post("/", json=chat_body(chat, asked), headers=bearer(person)).get_data(as_text=True))
    assert parts[-2] == {"type": "finish", "finishReason": "content-filter", "messageMetadata": {"declined": True}}
    assert parts[-3]["data"]["outcome"] == "declined"
    reply_id = parts[0]["messageId"]
    listed = web.get(f"/conversations/{chat}/messages", headers=bearer(person)).get_json()["messages"]
    assert [(m["role"], m["declined"]) for m in listed] == [("user", True), ("assistant", True)]
    assert str(listed[1]["id"]) == reply_id

    declined = {"declined": True}
    said = ui_message(reply_id, "assistant", "I can't help with that one.", metadata=declined)
    body = chat_body(chat, asked, said, ui_message("u-2", "user", "then a poem"))
    parts = parts_of(web.post("/", json=body, headers=bearer(person)).get_data(as_text=True))
    assert parts[-2] == {"type": "finish", "finishReason": "stop"}
    sent = fake_anthropic.requests[-1]["messages"]
    assert len(sent) == 1 and sent[0]["content"][-1]["text"].endswith("] then a poem")


def test_a_declined_reply_sent_again_keeps_its_mark(
    web: FlaskClient, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    """`regenerate()` or the same message sent again gets the stored answer back, marked as the
    first was: the page's next history would otherwise carry the refused turn."""
    fake_anthropic.answer = lambda body: "Sure."
    person = uuid.uuid4()
    chat = new_conversation(web, person)
    asked = ui_message("u-1", "user", f"tell me {REFUSAL_TRIGGER}")
    first = parts_of(web.post("/", json=chat_body(chat, asked), headers=bearer(person)).get_data(as_text=True))
    assert first[-2]["finishReason"] == "content-filter"
    body = {**chat_body(chat, asked), "trigger": "regenerate-message"}
    again = parts_of(web.post("/", json=body, headers=bearer(person)).get_data(as_text=True))
    assert again[-3]["data"]["outcome"] == "redelivered"
    assert again[-2] == {"type": "finish", "finishReason": "content-filter", "messageMetadata": {"declined": True}}
    today = {"message": "ignored: the stored answer comes back", "conversation_id": chat, "client_message_id": "u-1"}
    answer = web.post("/", json=today, headers=bearer(person)).get_json()
    assert (answer["outcome"], answer["declined"]) == ("redelivered", True)
    assert len(fake_anthropic.requests) == 1


def kept_by_use_chat(parts: list[Any]) -> dict[str, Any]:
    """The assistant message `useChat` keeps from a stream: its text and data parts, under `start`'s
    id, with `finish`'s metadata (the SDK's processUIMessageStream)."""
    text = "".join(part["delta"] for part in parts if isinstance(part, dict) and part["type"] == "text-delta")
    data = [
        {key: part[key] for key in ("type", "id", "data")}
        for part in parts
        if isinstance(part, dict) and part["type"].startswith("data-")
    ]
    message = {"id": parts[0].get("messageId", "kept"), "role": "assistant", "parts": [ui_text(text), *data]}
    finish = next(part for part in parts if isinstance(part, dict) and part["type"] == "finish")
    if "messageMetadata" in finish:
        message["metadata"] = finish["messageMetadata"]
    return message


def test_a_thread_kept_by_use_chat_leaves_out_its_fallbacks_and_declined_turns(
    web: FlaskClient, fake_anthropic: FakeAnthropic
) -> None:
    """The page sends its whole thread: the fallback it was shown (never stored) is left out, so the
    message the model failed on and the next are one turn, as in the stored thread; declined for the
    first, the turn is left out whole by its reply's mark. Seen failing with every next question
    declined (the fallback kept the failed message out of the declined turn)."""
    fake_anthropic.answer = lambda body: "Sure."
    person = uuid.uuid4()
    chat = new_conversation(web, person)
    thread: list[dict[str, Any]] = []

    def say(key: str, text: str) -> str:
        thread.append(ui_message(key, "user", text))
        parts = parts_of(web.post("/", json=chat_body(chat, *thread), headers=bearer(person)).get_data(as_text=True))
        thread.append(kept_by_use_chat(parts))
        return str(next(p for p in parts if isinstance(p, dict) and p["type"] == "data-turn")["data"]["outcome"])

    assert say("m-0", "hello") == "answered"
    fake_anthropic.behaviour = "529"
    assert say("m-a", f"explain {REFUSAL_TRIGGER}") == "fallback"
    fake_anthropic.behaviour = "ok"
    assert say("m-b", "never mind") == "declined"
    assert [say(f"m-c{n}", f"question {n}") for n in range(2)] == ["answered"] * 2
    texts = [block["text"] for message in fake_anthropic.requests[-1]["messages"] for block in message["content"]]
    assert [text.split("] ", 1)[-1] for text in texts] == ["hello", "Sure.", "question 0", "Sure.", "question 1"]


def test_a_web_message_a_chat_turn_declined_is_not_resumed(
    web: FlaskClient, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    """The model was down for a web message (the fallback). The person then writes on Telegram,
    whose window holds every app's: its turn merges the web message, is declined for it, and marks
    it. Nothing is left to resume on the web: 204; sent again, it is answered as declined. Seen
    failing with an empty reply 'resumed' at every page load, and an empty answer to the retry."""
    person = uuid.uuid4()
    chat = new_conversation(web, person)
    fake_anthropic.behaviour = "529"
    asked = ui_message("u-w", "user", f"explain {REFUSAL_TRIGGER}")
    web.post("/", json=chat_body(chat, asked), headers=bearer(person))
    fake_anthropic.behaviour = "ok"
    telegram = runtime.turns().run(TurnRequest(Surface.TELEGRAM, "hi", "tg-1", user_id=person, deadline_s=30))
    assert telegram.outcome is Outcome.DECLINED
    marked = rows(database_url, "select surface, declined from messages where user_id = %s and role = 'user'", person)
    assert sorted(marked) == [("telegram", True), ("web", True)]
    assert web.get(f"/{chat}/stream", headers=bearer(person)).status_code == 204
    # The page sends it again: declined already, said again, marked (the thread then leaves it out).
    again = parts_of(web.post("/", json=chat_body(chat, asked), headers=bearer(person)).get_data(as_text=True))
    declined = (
        "I can't help with that one, so I'll leave it out of our conversation from here on. Ask me anything else."
    )
    assert "".join(p["delta"] for p in again if isinstance(p, dict) and p["type"] == "text-delta") == declined
    assert again[-3]["data"]["outcome"] == "duplicate"
    assert again[-2] == {"type": "finish", "finishReason": "content-filter", "messageMetadata": {"declined": True}}


def test_with_the_database_down_a_declined_turn_is_said_and_nothing_stored(
    web: FlaskClient, environment: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic
) -> None:
    environment.setenv("DATABASE_URL", "postgresql://postgres@127.0.0.1:1/postgres")
    down = app_client("web_chat")
    body = chat_body(str(uuid.uuid4()), ui_message("u-0", "user", "hello"), ui_message("u-1", "user", REFUSAL_TRIGGER))
    parts = parts_of(down.post("/", json=body, headers=bearer(uuid.uuid4())).get_data(as_text=True))
    assert parts[-2] == {"type": "finish", "finishReason": "content-filter", "messageMetadata": {"declined": True}}
    assert (parts[-3]["data"]["outcome"], parts[-3]["data"]["replyId"]) == ("declined", None)  # nothing stored


@pytest.mark.parametrize("data", ["fallback", ["outcome", "fallback"], None, {"outcome": 3}])
def test_a_data_turn_part_of_any_shape_is_read_without_failing(
    web: FlaskClient, fake_anthropic: FakeAnthropic, data: object
) -> None:
    """A page's own (or a forged) `data-turn` part: whatever its `data`, the request is answered."""
    fake_anthropic.answer = lambda body: "Sure."
    person = uuid.uuid4()
    chat = new_conversation(web, person)
    earlier = {"id": "a-0", "role": "assistant", "parts": [ui_text("Hi."), {"type": "data-turn", "data": data}]}
    body = chat_body(chat, ui_message("u-0", "user", "hello"), earlier, ui_message("u-1", "user", "and now?"))
    response = web.post("/", json=body, headers=bearer(person))
    assert response.status_code == 200 and parts_of(response.get_data(as_text=True))[-2]["finishReason"] == "stop"
    assert [message["role"] for message in fake_anthropic.requests[-1]["messages"]] == ["user", "assistant", "user"]


def test_try_again_after_a_reload_sends_the_message_under_its_client_id_stored_once(
    web: FlaskClient, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    """The model fails (a fallback, not stored), the person reloads, and "Try again" (regenerate())
    posts the loaded thread: its message under the id it was sent with, answered and stored once
    (under its stored id, "812", it was a new message: stored twice). Another person sending that
    id sends a message of their own."""
    alice, mallory = uuid.uuid4(), uuid.uuid4()
    chat = new_conversation(web, alice)
    fake_anthropic.behaviour = "500"
    first = web.post("/", json=chat_body(chat, ui_message("u-1", "user", "book the dentist")), headers=bearer(alice))
    assert '"outcome": "fallback"' in first.get_data(as_text=True)
    fake_anthropic.behaviour = "ok"
    fake_anthropic.answer = lambda body: "Booked."
    thread = loaded(web, alice, chat)
    assert [(message["id"], message["role"]) for message in thread] == [("u-1", "user")]
    again = web.post("/", json={**chat_body(chat, *thread), "trigger": "regenerate-message"}, headers=bearer(alice))
    assert parts_of(again.get_data(as_text=True))[-3]["data"]["outcome"] == "answered"
    said = rows(database_url, "select id, role, content from messages where user_id = %s order by id", alice)
    assert [(role, content) for _, role, content in said] == [("user", "book the dentist"), ("assistant", "Booked.")]
    page = web.get(f"/conversations/{chat}/messages", headers=bearer(alice)).get_json()["messages"]
    assert [message["client_id"] for message in page] == ["u-1", None]  # a reply keeps its stored id
    theirs = new_conversation(web, mallory)
    sent = web.post("/", json=chat_body(theirs, ui_message("u-1", "user", "hi")), headers=bearer(mallory))
    assert sent.status_code == 200
    assert rows(database_url, "select content from messages where user_id = %s and role = 'user'", mallory) == [("hi",)]
    assert rows(database_url, "select count(*) from messages where user_id = %s", alice) == [(2,)]


def test_an_id_a_page_used_in_another_chat_is_refused_not_answered_with_that_chats_reply(
    web: FlaskClient, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    """A page whose ids count messages in each chat (`msg-1`...) sends its second chat's first
    question under the first chat's id: a 409 before any stream, nothing stored or asked; it was
    answered with the first chat's reply, as its message sent again."""
    fake_anthropic.answer = lambda body: "Call the plumber."
    person = uuid.uuid4()
    boiler, poem = new_conversation(web, person), new_conversation(web, person)
    sent = web.post(
        "/", json=chat_body(boiler, ui_message("msg-1", "user", "the boiler broke")), headers=bearer(person)
    )
    assert parts_of(sent.get_data(as_text=True))[-1] == "[DONE]"
    reused = web.post("/", json=chat_body(poem, ui_message("msg-1", "user", "a poem please")), headers=bearer(person))
    assert (reused.status_code, reused.mimetype, reused.get_json()["error"]) == (
        409,
        "application/json",
        "message_id_in_another_conversation",
    )
    assert rows(
        database_url, "select conversation_id::text, content from messages where user_id = %s order by id", person
    ) == [
        (boiler, "the boiler broke"),
        (boiler, "Call the plumber."),
    ]
    assert len(fake_anthropic.requests) == 1


def test_a_long_use_chat_session_is_answered_from_its_last_messages(
    web: FlaskClient, environment: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic
) -> None:
    """useChat posts every message of the tab (50 loaded, and 75 turns later 201): the body's bytes
    bound them, not a count, and the model reads the context's last messages (a 400 past 201)."""
    environment.setenv("CONTEXT_MAX_MESSAGES", "4")
    environment.setenv("CONTEXT_WINDOW_STEP", "1")
    runtime.reset()
    web = app_client("web_chat")
    fake_anthropic.answer = lambda body: "Noted."
    person = uuid.uuid4()
    chat = new_conversation(web, person)
    thread = [ui_message(f"h-{i}", "user" if i % 2 == 0 else "assistant", f"earlier {i}") for i in range(250)]
    thread.append(ui_message("u-new", "user", "and now?"))
    response = web.post("/", json=chat_body(chat, *thread), headers=bearer(person))
    assert response.status_code == 200, response.get_data(as_text=True)
    texts = [block["text"] for message in fake_anthropic.requests[-1]["messages"] for block in message["content"]]
    assert [text.split("] ", 1)[-1] for text in texts] == ["earlier 248", "earlier 249", "and now?"]


def test_a_use_chat_body_of_its_new_message_alone_reads_the_stored_thread(
    web: FlaskClient, fake_anthropic: FakeAnthropic
) -> None:
    """A page that loaded nothing, or sends the new message alone: the model reads the stored
    thread, as for today's body without `history` (it read nothing of the conversation)."""
    fake_anthropic.answer = lambda body: "Noted."
    person = uuid.uuid4()
    chat = new_conversation(web, person)
    body = {"message": "my sister lands on the 14th", "conversation_id": chat, "client_message_id": "c-1"}
    assert web.post("/", json=body, headers=bearer(person)).status_code == 200
    response = web.post(
        "/", json=chat_body(chat, ui_message("u-2", "user", "when does she land?")), headers=bearer(person)
    )
    assert response.status_code == 200
    texts = [block["text"] for message in fake_anthropic.requests[-1]["messages"] for block in message["content"]]
    assert [text.split("] ", 1)[-1] for text in texts] == [
        "my sister lands on the 14th",
        "Noted.",
        "when does she land?",
    ]


def test_a_use_chat_thread_past_the_body_limit_is_refused_naming_the_way_out(
    web: FlaskClient, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    """Seen failing: useChat posts its whole thread each turn; a long chat's passed the body's
    1,000,000 bytes, and every later turn was a 413 saying only that: the page could never write again."""
    person = uuid.uuid4()
    chat = new_conversation(web, person)
    thread = [ui_message(f"h-{i}", "user" if i % 2 == 0 else "assistant", f"{i} " * 12_000) for i in range(40)]
    body = chat_body(chat, *thread, ui_message("u-new", "user", "and now?"))
    assert len(json.dumps(body)) > 1_000_000
    response = web.post("/", json=body, headers={**bearer(person), "Origin": CORS_ORIGIN})
    assert (response.status_code, response.get_json()) == (
        413,
        {
            "error": "body_too_large",
            "message": "the request body is larger than 1000000 bytes: send only the new message, the thread is "
            "stored here (useChat: prepareSendMessagesRequest returning {id, message, trigger, messageId}, "
            "docs/frontend.md)",
        },
    )
    assert response.headers["Access-Control-Allow-Origin"] == CORS_ORIGIN
    assert stored_count(database_url, person) == 0 and fake_anthropic.requests == []


def test_the_ai_sdks_new_message_alone_is_answered_on_the_stored_thread(
    web: FlaskClient, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    """`{id, message}`, the AI SDK's own way to send only the last message (its "Sending only the
    last message", prepareSendMessagesRequest): seen failing as a 400 (`message` read as today's
    string). It is that message's useChat turn, read with the stored thread."""
    fake_anthropic.answer = lambda body: "Noted."
    person = uuid.uuid4()
    chat = new_conversation(web, person)
    said = {"message": "my sister lands on the 14th", "conversation_id": chat, "client_message_id": "c-1"}
    assert web.post("/", json=said, headers=bearer(person)).status_code == 200
    alone = {"id": chat, "message": ui_message("u-2", "user", "when does she land?"), "trigger": "submit-message"}
    response = web.post("/", json=alone, headers=bearer(person))
    assert (response.status_code, response.headers["x-vercel-ai-ui-message-stream"]) == (200, "v1")
    parts = parts_of(response.get_data(as_text=True))
    assert parts[-3]["data"]["outcome"] == "answered" and parts[-1] == "[DONE]"
    texts = [block["text"] for message in fake_anthropic.requests[-1]["messages"] for block in message["content"]]
    thread = ["my sister lands on the 14th", "Noted.", "when does she land?"]
    assert [text.split("] ", 1)[-1] for text in texts] == thread
    query = "select role, content, external_id from messages where user_id = %s order by id"
    stored = rows(database_url, query, person)
    assert stored[2:] == [("user", "when does she land?", "u-2"), ("assistant", "Noted.", None)]
    both = web.post("/", json={**alone, "messages": [alone["message"]]}, headers=bearer(person))
    assert (both.status_code, both.get_json()) == (
        400,
        {
            "error": "bad_request",
            "message": "invalid body: Value error, send the new message as `message` or the thread as `messages`, "
            "not both",
        },
    )


def test_a_reloaded_thread_is_read_as_stored_and_not_searched_again(
    web: FlaskClient, fake_anthropic: FakeAnthropic
) -> None:
    """After a reload, loadMessages names the person's web message by its client's id: the turn
    finds it stored, so the search leaves it out beside the history that shows it."""
    person = uuid.uuid4()
    chat = new_conversation(web, person)
    fake_anthropic.answer = lambda body: "Noted."
    said = ui_message("u-1", "user", "The garage door code is 7788")
    assert '"outcome": "answered"' in web.post("/", json=chat_body(chat, said), headers=bearer(person)).get_data(
        as_text=True
    )
    thread = loaded(web, person, chat)
    assert [message["id"] for message in thread][0] == "u-1"

    def searching(body: dict[str, Any]) -> Answer:
        results = tool_results(body)
        if results:
            return "From memory: " + str(results[0]["content"])
        return [tool_use(SEARCH_MEMORY, {"query": "garage door code"}, id="toolu_search")]

    fake_anthropic.answer = searching
    asked = chat_body(chat, *thread, ui_message("u-2", "user", "what was the garage code?"))
    response = web.post("/", json=asked, headers=bearer(person))
    assert '"outcome": "answered"' in response.get_data(as_text=True)
    sent = json.dumps(fake_anthropic.requests[-1]["messages"])
    assert sent.count("The garage door code is 7788") == 1, sent


def test_a_live_tabs_voice_note_is_read_as_stored_in_the_next_turn(
    environment: pytest.MonkeyPatch, web: FlaskClient, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    """A voice note sent from a useChat tab, then a typed question: the thread the tab posts holds
    the note without words (crossmemTransport leaves its file part out), and the turn reads it as
    stored, its transcript; another person's message sent under the same id never comes in."""
    deepgram = FakeDeepgram("deepgram-test-key")
    try:
        environment.setenv("DEEPGRAM_API_KEY", "deepgram-test-key")
        environment.setenv("DEEPGRAM_API_BASE", deepgram.url)
        runtime.reset()
        web = app_client("web_chat")
        person, mallory = uuid.uuid4(), uuid.uuid4()
        chat = new_conversation(web, person)
        fake_anthropic.answer = lambda body: "Noted."
        voice = base64.b64encode((CORPUS / "media" / "voice_note_es.ogg").read_bytes()).decode()
        note = {
            "id": "v-1",
            "role": "user",
            "parts": [{"type": "file", "mediaType": "audio/ogg", "url": f"data:audio/ogg;base64,{voice}"}],
        }
        first = web.post("/", json=chat_body(chat, note), headers=bearer(person)).get_data(as_text=True)
        reply_id = parts_of(first)[0]["messageId"]
        theirs = new_conversation(web, mallory)
        web.post("/", json=chat_body(theirs, ui_message("v-1", "user", "mallory's own")), headers=bearer(mallory))
        said = "select content from messages where user_id = %s and role = 'user'"
        [(transcript,)] = rows(database_url, said, person)
        assert "dentista" in transcript
        thread = [
            {**note, "parts": []},
            ui_message(reply_id, "assistant", "Noted."),
            ui_message("u-2", "user", "when is my appointment?"),
        ]
        second = web.post("/", json=chat_body(chat, *thread), headers=bearer(person))
        assert parts_of(second.get_data(as_text=True))[-3]["data"]["outcome"] == "answered"
        texts = [block["text"] for message in fake_anthropic.requests[-1]["messages"] for block in message["content"]]
        assert [text.split("] ", 1)[-1] for text in texts] == [transcript, "Noted.", "when is my appointment?"]
    finally:
        deepgram.close()


def test_a_use_chat_message_with_an_empty_id_is_a_400_not_the_last_ones_resend(
    web: FlaskClient, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    """The new message's id is its idempotency key: `""` was taken as one, and the person's next
    message with an empty id was answered as a resend of the first, never stored."""
    fake_anthropic.answer = lambda body: "Noted."
    person = uuid.uuid4()
    chat = new_conversation(web, person)
    response = web.post("/", json=chat_body(chat, ui_message("", "user", "first question")), headers=bearer(person))
    assert response.status_code == 400
    assert response.get_json() == {
        "error": "bad_request",
        "message": "invalid body at messages.0.id: String should have at least 1 character",
    }
    assert stored_count(database_url, person) == 0 and fake_anthropic.requests == []


# useChat's own ids, and a page's whose generateId is `Date.now()`: digits only, which could name a
# stored message (another app's, as the history lists it), and its edit was taken for a Try again.
@pytest.mark.parametrize("message_id", ["u-1", "1765090000001"], ids=["useChat's", "digits"])
def test_an_edited_message_is_not_answered_with_the_reply_to_its_old_words(
    web: FlaskClient, database_url: str, fake_anthropic: FakeAnthropic, message_id: str
) -> None:
    """useChat's edit, `sendMessage({ text, messageId })` ("the message will be replaced"), posts
    the new words under the message's id, with `messageId` that id: the model reads the edit, and
    the person is not shown the reply to the words they replaced as if it answered it."""
    fake_anthropic.answer = lambda body: (
        "Tuesday it is." if "tuesday" in json.dumps(body["messages"][-1]) else "Monday it is."
    )
    person = uuid.uuid4()
    chat = new_conversation(web, person)
    first = web.post(
        "/", json=chat_body(chat, ui_message(message_id, "user", "book the dentist on monday")), headers=bearer(person)
    )
    assert parts_of(first.get_data(as_text=True))[-3]["data"]["outcome"] == "answered"
    edited = {**chat_body(chat, ui_message(message_id, "user", "book the dentist on tuesday")), "messageId": message_id}
    response = web.post("/", json=edited, headers=bearer(person))
    assert response.status_code == 200, response.get_data(as_text=True)
    parts = parts_of(response.get_data(as_text=True))
    text = "".join(part["delta"] for part in parts if isinstance(part, dict) and part["type"] == "text-delta")
    assert text == "Tuesday it is."  # it was the stored "Monday it is.", redelivered


def said_reply_id(database_url: str, person: uuid.UUID) -> int:
    """The id of the person's latest reply."""
    return int(
        rows(database_url, "select max(id) from messages where user_id = %s and role = 'assistant'", person)[0][0]
    )


def dentist_booked(web: FlaskClient, fake_anthropic: FakeAnthropic) -> tuple[uuid.UUID, str]:
    """A person's new chat whose message "u-1", "book the dentist on monday", is answered "Monday it
    is." (its edit to tuesday: "Tuesday it is."): the person and the chat."""
    fake_anthropic.answer = lambda body: (
        "Tuesday it is." if "tuesday" in json.dumps(body["messages"][-1]) else "Monday it is."
    )
    person = uuid.uuid4()
    chat = new_conversation(web, person)
    first = chat_body(chat, ui_message("u-1", "user", "book the dentist on monday"))
    assert parts_of(web.post("/", json=first, headers=bearer(person)).get_data(as_text=True))[-1] == "[DONE]"
    return person, chat


def test_an_edit_sent_again_or_tried_again_is_answered_once_after_the_words_it_replaced(
    web: FlaskClient, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    """The edit is a message of its own, keyed by the message's id and its new words: the same edit
    posted again, or its Try again (regenerate() under the same id), is its stored reply again; the
    replaced words and their reply stay stored before it (docs/decisions.md)."""
    person, chat = dentist_booked(web, fake_anthropic)
    edited = {**chat_body(chat, ui_message("u-1", "user", "book the dentist on tuesday")), "messageId": "u-1"}
    tried_again = {**edited, "trigger": "regenerate-message", "messageId": None}
    texts = []
    for body in (edited, edited, tried_again):
        parts = parts_of(web.post("/", json=body, headers=bearer(person)).get_data(as_text=True))
        text = "".join(p["delta"] for p in parts if isinstance(p, dict) and p["type"] == "text-delta")
        texts.append((parts[-3]["data"]["outcome"], text))
    assert texts == [
        ("answered", "Tuesday it is."),
        ("redelivered", "Tuesday it is."),
        ("redelivered", "Tuesday it is."),
    ]
    assert len(fake_anthropic.requests) == 2
    said = rows(database_url, "select role, content from messages where user_id = %s order by id", person)
    assert said == [
        ("user", "book the dentist on monday"),
        ("assistant", "Monday it is."),
        ("user", "book the dentist on tuesday"),
        ("assistant", "Tuesday it is."),
    ]
    # The page keeps the edit under the message's id: the next turn's history is its words, not the replaced ones.
    fake_anthropic.answer = lambda body: "At 9."
    later = chat_body(
        chat,
        ui_message("u-1", "user", "book the dentist on tuesday"),
        ui_message(str(said_reply_id(database_url, person)), "assistant", "Tuesday it is."),
        ui_message("u-2", "user", "what time?"),
    )
    assert parts_of(web.post("/", json=later, headers=bearer(person)).get_data(as_text=True))[-1] == "[DONE]"
    read = json.dumps(fake_anthropic.requests[-1]["messages"])
    assert "tuesday" in read and "monday" not in read


def test_a_reloaded_page_lists_the_thread_its_edits_left(
    web: FlaskClient, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    """The page replaced the edited message and dropped its reply; reloaded (loadMessages from the
    history route), it showed them again before the edit, and the next turn read them as the
    page's thread. The history lists the thread the edits left; memory keeps every word said. An
    edit of the reloaded edit (its id the edit's key) replaces it too, keyed from the message's own id."""
    day = {"monday": "Monday", "tuesday": "Tuesday", "wednesday": "Wednesday"}
    fake_anthropic.answer = lambda body: next(
        f"{name} it is." for word, name in day.items() if word in json.dumps(body["messages"][-1])
    )
    person, other = uuid.uuid4(), uuid.uuid4()
    chat = new_conversation(web, person)

    def posted(body: dict[str, Any]) -> None:
        assert parts_of(web.post("/", json=body, headers=bearer(person)).get_data(as_text=True))[-1] == "[DONE]"

    def listed() -> list[tuple[str, str, str | None]]:
        page = web.get(f"/conversations/{chat}/messages", headers=bearer(person)).get_json()["messages"]
        return [(message["role"], message["content"], message["client_id"]) for message in page]

    def digest(text: str) -> str:
        return "~" + hashlib.sha256(text.encode()).hexdigest()[:16]

    posted(chat_body(chat, ui_message("u-1", "user", "book the dentist on monday")))
    posted({**chat_body(chat, ui_message("u-1", "user", "book the dentist on tuesday")), "messageId": "u-1"})
    tuesday = "u-1" + digest("book the dentist on tuesday")
    assert listed() == [("user", "book the dentist on tuesday", tuesday), ("assistant", "Tuesday it is.", None)]
    posted({**chat_body(chat, ui_message(tuesday, "user", "book the dentist on wednesday")), "messageId": tuesday})
    wednesday = "u-1" + digest("book the dentist on wednesday")  # keyed from the message, never a chain
    assert listed() == [("user", "book the dentist on wednesday", wednesday), ("assistant", "Wednesday it is.", None)]
    said = rows(database_url, "select content from messages where user_id = %s order by id", person)
    assert [content for (content,) in said] == [
        "book the dentist on monday",
        "Monday it is.",
        "book the dentist on tuesday",
        "Tuesday it is.",
        "book the dentist on wednesday",
        "Wednesday it is.",
    ]
    # Only the person's own edits replace: another's call naming their message replaces nothing.
    posted(chat_body(chat, ui_message("u-2", "user", "and the hygienist on monday")))
    [(later,)] = rows(database_url, "select id from messages where user_id = %s and external_id = 'u-2'", person)
    runtime.memory().replace_message(other, later, wednesday)
    assert rows(database_url, "select count(*) from messages where user_id = %s and replaced", person) == [(2,)]
    assert [content for _, content, _ in listed()][:2] == ["book the dentist on wednesday", "Wednesday it is."]


def test_an_edit_back_to_words_the_page_showed_before_is_listed_with_their_reply(
    web: FlaskClient, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    """A live tab keeps the edited message under its id: an edit back to words it was stored with
    before (the first ones, or an earlier edit's) is that message sent again, its stored reply shown
    again. The page shows those words and that reply; reloaded, it lists them, not the edit they
    came back from (which the listing showed, and the next turn read as the page's thread)."""
    day = {"monday": "Monday", "tuesday": "Tuesday", "wednesday": "Wednesday"}
    fake_anthropic.answer = lambda body: next(
        f"{name} it is." for word, name in day.items() if word in json.dumps(body["messages"][-1])
    )
    person = uuid.uuid4()
    chat = new_conversation(web, person)

    def edited(text: str) -> tuple[str, str]:
        body = {**chat_body(chat, ui_message("u-1", "user", text)), "messageId": "u-1"}
        parts = parts_of(web.post("/", json=body, headers=bearer(person)).get_data(as_text=True))
        return parts[-3]["data"]["outcome"], "".join(p["delta"] for p in parts[:-3] if p["type"] == "text-delta")

    def listed() -> list[tuple[str, str]]:
        page = web.get(f"/conversations/{chat}/messages", headers=bearer(person)).get_json()["messages"]
        return [(message["role"], message["content"]) for message in page]

    first = chat_body(chat, ui_message("u-1", "user", "book the dentist on monday"))
    assert parts_of(web.post("/", json=first, headers=bearer(person)).get_data(as_text=True))[-1] == "[DONE]"
    assert edited("book the dentist on tuesday") == ("answered", "Tuesday it is.")
    assert edited("book the dentist on monday") == ("redelivered", "Monday it is.")
    assert listed() == [("user", "book the dentist on monday"), ("assistant", "Monday it is.")]
    assert edited("book the dentist on wednesday") == ("answered", "Wednesday it is.")
    assert edited("book the dentist on tuesday") == ("redelivered", "Tuesday it is.")
    assert listed() == [("user", "book the dentist on tuesday"), ("assistant", "Tuesday it is.")]
    assert rows(database_url, "select count(*) from messages where user_id = %s", person) == [(6,)]


@dataclass(frozen=True)
class NotingPage:
    """A useChat page on a new web conversation of a person's, the fake model noting the last word
    of each message."""

    web: FlaskClient
    person: uuid.UUID
    chat: str

    def posted(self, body: dict[str, Any]) -> list[Any]:
        """The UI message stream's parts, whole."""
        parts = parts_of(self.web.post("/", json=body, headers=bearer(self.person)).get_data(as_text=True))
        assert parts[-1] == "[DONE]"
        return parts

    def listed(self) -> list[tuple[str, str]]:
        """The conversation as a reloaded page lists it: role and words."""
        page = self.web.get(f"/conversations/{self.chat}/messages", headers=bearer(self.person)).get_json()
        return [(message["role"], message["content"]) for message in page["messages"]]


def noting_page(web: FlaskClient, fake_anthropic: FakeAnthropic) -> NotingPage:
    fake_anthropic.answer = lambda body: "Noted: " + body["messages"][-1]["content"][-1]["text"].split()[-1]
    person = uuid.uuid4()
    return NotingPage(web, person, new_conversation(web, person))


def test_a_reloaded_page_lists_no_message_an_edit_of_an_earlier_one_dropped(
    web: FlaskClient, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    """useChat's edit of an earlier message drops what followed it on the page. Reloaded, the page
    listed the dropped message and its reply again, before the edit (out of the order they were
    said in on the page), and its next turn read them as the page's thread; edited back, likewise.
    Memory keeps every word said."""
    page = noting_page(web, fake_anthropic)
    person, chat, posted, listed = page.person, page.chat, page.posted, page.listed

    monday, milk = ui_message("u-1", "user", "book the dentist on monday"), ui_message("u-2", "user", "buy milk")
    posted(chat_body(chat, monday))
    posted(chat_body(chat, monday, ui_message("r-1", "assistant", "Noted: monday"), milk))
    posted({**chat_body(chat, ui_message("u-1", "user", "book the dentist on tuesday")), "messageId": "u-1"})
    assert listed() == [("user", "book the dentist on tuesday"), ("assistant", "Noted: tuesday")]
    posted({**chat_body(chat, monday), "messageId": "u-1"})
    assert listed() == [("user", "book the dentist on monday"), ("assistant", "Noted: monday")]
    assert rows(database_url, "select count(*) from messages where user_id = %s", person) == [(6,)]


def test_an_edit_back_drops_from_the_listing_what_followed_the_version_it_leaves(
    web: FlaskClient, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    """Edited, the page went on after the edit ("buy milk"); edited back to the message's first
    words, useChat drops what followed the edit from the page. Reloaded, the page listed it again,
    after the words put back and their reply, and its next turn read it as the page's thread."""
    page = noting_page(web, fake_anthropic)
    person, chat, posted, listed = page.person, page.chat, page.posted, page.listed

    monday, tuesday = ui_message("u-1", "user", "dentist on monday"), ui_message("u-1", "user", "dentist on tuesday")
    posted(chat_body(chat, monday))
    posted({**chat_body(chat, tuesday), "messageId": "u-1"})
    posted(
        chat_body(
            chat, tuesday, ui_message("r-1", "assistant", "Noted: tuesday"), ui_message("u-2", "user", "buy milk")
        )
    )
    assert listed() == [
        ("user", "dentist on tuesday"),
        ("assistant", "Noted: tuesday"),
        ("user", "buy milk"),
        ("assistant", "Noted: milk"),
    ]
    posted({**chat_body(chat, monday), "messageId": "u-1"})
    assert listed() == [("user", "dentist on monday"), ("assistant", "Noted: monday")]
    posted({**chat_body(chat, tuesday), "messageId": "u-1"})
    assert listed() == [("user", "dentist on tuesday"), ("assistant", "Noted: tuesday")]
    assert rows(database_url, "select count(*) from messages where user_id = %s", person) == [(6,)]


def test_a_reloaded_page_lists_no_message_a_try_again_of_an_earlier_reply_dropped(
    web: FlaskClient, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    """ "Try again" on an earlier reply (regenerate({ messageId }) with that reply's id) drops it and
    what followed it from the page, and posts the message it answered: its stored reply comes back.
    Reloaded, the page listed what it had dropped after it, and its next turn read it as the page's
    thread. Memory keeps every word said."""
    page = noting_page(web, fake_anthropic)
    person, chat, posted, listed = page.person, page.chat, page.posted, page.listed

    monday = ui_message("u-1", "user", "book the dentist on monday")
    reply = posted(chat_body(chat, monday))[0]["messageId"]
    posted(
        chat_body(chat, monday, ui_message(reply, "assistant", "Noted: monday"), ui_message("u-2", "user", "buy milk"))
    )
    again = posted({**chat_body(chat, monday), "trigger": "regenerate-message", "messageId": reply})
    assert (again[0]["messageId"], again[-3]["data"]["outcome"]) == (reply, "redelivered")
    assert listed() == [("user", "book the dentist on monday"), ("assistant", "Noted: monday")]
    assert rows(database_url, "select count(*) from messages where user_id = %s", person) == [(4,)]


def test_a_live_tab_that_edited_a_reloaded_edit_sends_its_words_to_the_model(
    web: FlaskClient, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    """A reloaded page names an edited message by its edit's key (`u-1~<digest of tuesday>`); edited
    there again, the tab keeps that id for the new words. Its next turn's thread showed the model
    the words stored under that key (tuesday), not the ones the page shows and stored (wednesday)."""
    fake_anthropic.answer = lambda body: "Noted: " + body["messages"][-1]["content"][-1]["text"].split()[-1]
    person = uuid.uuid4()
    chat = new_conversation(web, person)

    def posted(body: dict[str, Any]) -> list[Any]:
        parts = parts_of(web.post("/", json=body, headers=bearer(person)).get_data(as_text=True))
        assert parts[-1] == "[DONE]"
        return parts

    posted(chat_body(chat, ui_message("u-1", "user", "dentist on monday")))
    posted({**chat_body(chat, ui_message("u-1", "user", "dentist on tuesday")), "messageId": "u-1"})
    [reloaded, _] = web.get(f"/conversations/{chat}/messages", headers=bearer(person)).get_json()["messages"]
    assert reloaded["content"] == "dentist on tuesday" and reloaded["client_id"].startswith("u-1~")
    wednesday = ui_message(reloaded["client_id"], "user", "dentist on wednesday")
    reply = posted({**chat_body(chat, wednesday), "messageId": reloaded["client_id"]})[0]["messageId"]
    posted(
        chat_body(chat, wednesday, ui_message(reply, "assistant", "Noted: wednesday"), ui_message("u-2", "user", "ok?"))
    )
    thread = [(m["role"], m["content"][-1]["text"]) for m in fake_anthropic.requests[-1]["messages"]]
    assert "dentist on wednesday" in thread[0][1] and "tuesday" not in json.dumps(thread), thread


def test_a_stopped_edit_the_page_edited_back_is_not_resumed(
    web: FlaskClient, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    """The person stops an edit's reply (stop(): the edit stored, unanswered), then edits the message
    back to its first words (their stored reply shown again). The page shows those words and that
    reply; the replaced edit, the conversation's newest message, was resumed when the page mounted
    (useChat's resume), its answer streamed below a reply to other words and stored."""
    fake_anthropic.answer = lambda body: (
        "Tuesday it is." if "tuesday" in json.dumps(body["messages"]) else "Monday it is."
    )
    person = uuid.uuid4()
    chat = new_conversation(web, person)
    first = chat_body(chat, ui_message("u-1", "user", "book the dentist on monday"))
    assert parts_of(web.post("/", json=first, headers=bearer(person)).get_data(as_text=True))[-1] == "[DONE]"
    edit = {**chat_body(chat, ui_message("u-1", "user", "book the dentist on tuesday")), "messageId": "u-1"}
    web.post("/", json=edit, headers=bearer(person)).close()  # stop(): its turn ends, nothing answers it
    back = {**first, "messageId": "u-1"}
    parts = parts_of(web.post("/", json=back, headers=bearer(person)).get_data(as_text=True))
    assert parts[-3]["data"]["outcome"] == "redelivered"
    resumed = web.get(f"/{chat}/stream", headers=bearer(person))
    assert (resumed.status_code, resumed.get_data(as_text=True)) == (204, "")
    said = rows(database_url, "select role, content from messages where user_id = %s order by id", person)
    assert said == [
        ("user", "book the dentist on monday"),
        ("assistant", "Monday it is."),
        ("user", "book the dentist on tuesday"),
    ]


def test_an_edit_replaces_only_the_versions_of_its_message(
    web: FlaskClient, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    """An edit of "u-1" replaces it and its edits (`u-1~<digest>`, chained), never the person's other
    messages whose ids begin alike: "u-10", or "u-1~2" from a page whose generateId joins with `~`
    (said before it here: what follows an edited message leaves the page with the edit)."""
    fake_anthropic.answer = lambda body: "Noted."
    person = uuid.uuid4()
    chat = new_conversation(web, person)
    for message_id, text in (("u-1~2", "and the hygienist"), ("u-10", "at nine"), ("u-1", "dentist on monday")):
        body = chat_body(chat, ui_message(message_id, "user", text))
        assert parts_of(web.post("/", json=body, headers=bearer(person)).get_data(as_text=True))[-1] == "[DONE]"
    edit = {**chat_body(chat, ui_message("u-1", "user", "dentist on tuesday")), "messageId": "u-1"}
    assert parts_of(web.post("/", json=edit, headers=bearer(person)).get_data(as_text=True))[-1] == "[DONE]"
    page = web.get(f"/conversations/{chat}/messages", headers=bearer(person)).get_json()["messages"]
    assert [message["content"] for message in page if message["role"] == "user"] == [
        "and the hygienist",
        "at nine",
        "dentist on tuesday",
    ]
    replaced = "select external_id from messages where user_id = %s and replaced order by id"
    assert rows(database_url, replaced, person) == [("u-1",)]


@pytest.mark.parametrize("first_id", ["V1StGXR8_Z5jdHi6", "c" * 128], ids=["generateId", "128 characters"])
def test_a_message_edited_after_each_of_many_reloads_can_still_be_sent_with_its_thread(
    web: FlaskClient, fake_anthropic: FakeAnthropic, first_id: str
) -> None:
    """After a reload, an edited message's id is its edit's key (`<id>~<digest>`), and its next edit
    adds a digest to that: from a useChat id (16 characters), the seventh made a key of 135, past
    the 128 an id may have, and from then on every request of a page that loads the history (its
    thread holds that id) was a 400: the conversation could no longer be written in. An id of 128
    characters did so at the first edit: an edit's key may have 17 more."""
    fake_anthropic.answer = lambda body: "Noted."
    person = uuid.uuid4()
    chat = new_conversation(web, person)
    first = chat_body(chat, ui_message(first_id, "user", "the dentist, version 0"))
    assert parts_of(web.post("/", json=first, headers=bearer(person)).get_data(as_text=True))[-1] == "[DONE]"
    for version in range(1, 9):
        [message, _] = loaded(web, person, chat)
        edit = {**message, "parts": [ui_text(f"the dentist, version {version}")]}
        response = web.post("/", json={**chat_body(chat, edit), "messageId": edit["id"]}, headers=bearer(person))
        assert (version, response.status_code) == (version, 200), response.get_data(as_text=True)
        assert parts_of(response.get_data(as_text=True))[-1] == "[DONE]"
    later = chat_body(chat, *loaded(web, person, chat), ui_message("u-2", "user", "and at nine"))
    assert web.post("/", json=later, headers=bearer(person)).status_code == 200


# The owner's [Telegram] thread as stored once its message was edited on the web: all that was said.
MAY_THEN_JUNE = [
    ("user", "my passport expires in May"),
    ("assistant", "Noted."),
    ("user", "my passport expires in June"),
    ("assistant", "June, noted."),
]


def test_try_again_in_the_telegram_thread_does_not_store_its_message_twice(
    web: FlaskClient, environment: pytest.MonkeyPatch, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    """The page lists the person's [Telegram] thread (GET /conversations) and loads it as
    loadMessages does: a Telegram message has no client_id, so it keeps its stored id. "Try again"
    (regenerate()) on its last reply posts that message again under its stored id: it is the stored
    message, sent again, not a new web message with the same words."""
    fake_anthropic.answer = lambda body: "Noted."
    web, person, telegram, said = owners_telegram_thread(environment, database_url)
    assert telegram["title"] == "[Telegram]"
    thread = loaded(web, person, telegram["id"])
    assert [(message["id"], message["role"]) for message in thread] == [
        (str(said.message_id), "user"),
        (str(said.reply_id), "assistant"),
    ]
    again = {**chat_body(telegram["id"], *thread[:-1]), "trigger": "regenerate-message", "messageId": thread[-1]["id"]}
    response = web.post("/", json=again, headers=bearer(person))
    assert response.status_code == 200
    assert parts_of(response.get_data(as_text=True))[-1] == "[DONE]"
    stored = rows(database_url, "select surface, role, content from messages where user_id = %s order by id", person)
    assert stored == [("telegram", "user", "my passport expires in May"), ("telegram", "assistant", "Noted.")]
    text = "".join(
        p["delta"]
        for p in parts_of(response.get_data(as_text=True))
        if isinstance(p, dict) and p["type"] == "text-delta"
    )
    assert text == "Noted."  # its stored reply, sent again
    # Another person naming that message and that conversation names none of theirs: the id is a
    # client's, and the conversation is not theirs.
    stranger = uuid.uuid4()
    theirs = web.post("/", json=again, headers=bearer(stranger))
    assert theirs.status_code == 404, theirs.get_data(as_text=True)
    assert stored_count(database_url, stranger) == 0
    assert rows(database_url, "select count(*) from messages where user_id = %s", person) == [(2,)]


def test_try_again_right_after_stop_answers_the_message(
    environment: pytest.MonkeyPatch, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    """useChat's stop() aborts the stream; its "Try again" (regenerate()) posts the same message at
    once. The attempt the stop ended is noticed only at its next write, so the resend finds it
    still running: it is answered once that attempt has ended (as the chat's resume waits for it),
    not refused with 409 still_answering and "ask again in 70 seconds"."""
    environment.setenv("SUPABASE_JWT_SECRET", JWT_SECRET)
    web = app_client("web_chat")
    story = "one two three four five six"
    fake_anthropic.answer = lambda body: story
    fake_anthropic.delta_pause_s = 0.5  # a model between two words (or in a tool call)
    person = uuid.uuid4()
    chat = new_conversation(web, person)
    server = make_server("127.0.0.1", 0, web.application, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.port}/"
        body = chat_body(chat, ui_message("u-stop", "user", "Tell me a story"))
        with httpx.Client(timeout=30) as client:
            with client.stream("POST", url, json=body, headers=bearer(person)) as stream:
                for line in stream.iter_lines():
                    if '"text-delta"' in line:
                        break  # stop()
            fake_anthropic.delta_pause_s = 0.0
            again = client.post(url, json={**body, "trigger": "regenerate-message"}, headers=bearer(person))
        assert again.status_code == 200, again.text
        parts = parts_of(again.text)
        assert parts[-3]["data"]["outcome"] == "answered"
        said = rows(database_url, "select role, content from messages where user_id = %s order by id", person)
        assert said == [("user", "Tell me a story"), ("assistant", story)]
    finally:
        server.shutdown()


def test_an_edit_in_the_telegram_thread_is_answered_not_the_old_reply_sent_again(
    web: FlaskClient, environment: pytest.MonkeyPatch, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    """An edit (sendMessage({ text, messageId })) of a Telegram message in the web's [Telegram]
    thread posts the new words under the message's stored id: it is a new message, answered
    (docs/decisions.md, An edit on the web is a new message), not the Telegram message sent again,
    its old reply shown as the answer to words it never read."""
    fake_anthropic.answer = lambda body: "June, noted." if "June" in json.dumps(body["messages"][-1]) else "Noted."
    web, person, telegram, said = owners_telegram_thread(environment, database_url)
    thread = loaded(web, person, telegram["id"])
    edit = ui_message(thread[0]["id"], "user", "my passport expires in June")
    response = web.post("/", json={**chat_body(telegram["id"], edit), "messageId": edit["id"]}, headers=bearer(person))
    assert response.status_code == 200, response.get_data(as_text=True)
    parts = parts_of(response.get_data(as_text=True))
    text = "".join(p["delta"] for p in parts if isinstance(p, dict) and p["type"] == "text-delta")
    assert (parts[-3]["data"]["outcome"], text) == ("answered", "June, noted.")
    stored = rows(database_url, "select role, content from messages where user_id = %s order by id", person)
    assert stored == MAY_THEN_JUNE
    # Reloaded, the page shows the thread it showed: the edit replaced the message there too.
    reloaded = [(m["role"], m["parts"][0]["text"]) for m in loaded(web, person, telegram["id"])]
    assert reloaded == [("user", "my passport expires in June"), ("assistant", "June, noted.")]


def test_an_edit_in_the_telegram_thread_never_drops_from_the_listing_what_was_said_on_telegram(
    web: FlaskClient, environment: pytest.MonkeyPatch, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    """What followed an edited message leaves the listing with the edit (useChat drops it from the
    page), but not what the person said on another app: the page may never have shown it (loaded
    before they wrote it on their phone), and it is that app's thread, said there. Seen failing with
    the Telegram message written after the page was loaded gone from every later listing."""
    fake_anthropic.answer = lambda body: "June, noted." if "June" in json.dumps(body["messages"][-1]) else "Noted."
    web, person, telegram, said = owners_telegram_thread(environment, database_url)
    thread = loaded(web, person, telegram["id"])  # the page, loaded before the person wrote again
    chat_id = rows(database_url, "select sender from messages where id = %s", said.message_id)[0][0]
    runtime.turns().run(TurnRequest(Surface.TELEGRAM, "and my visa in July", "10", chat_id))
    edit = ui_message(thread[0]["id"], "user", "my passport expires in June")
    response = web.post("/", json={**chat_body(telegram["id"], edit), "messageId": edit["id"]}, headers=bearer(person))
    assert parts_of(response.get_data(as_text=True))[-1] == "[DONE]"
    reloaded = [(m["role"], m["parts"][0]["text"]) for m in loaded(web, person, telegram["id"])]
    assert reloaded == [
        ("user", "and my visa in July"),
        ("assistant", "Noted."),
        ("user", "my passport expires in June"),
        ("assistant", "June, noted."),
    ]


def test_try_again_of_a_message_stored_without_its_nul_is_not_an_edit_answered_again(
    web: FlaskClient, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    """A message's words are stored without their NUL characters (Postgres text holds none): its
    Try again, the same words under the same id, is the stored message sent again, not an edit
    stored and answered a second time."""
    fake_anthropic.answer = lambda body: "Noted."
    person = uuid.uuid4()
    chat = new_conversation(web, person)
    body = chat_body(chat, ui_message("u-nul", "user", "pasted\u0000 text"))
    assert parts_of(web.post("/", json=body, headers=bearer(person)).get_data(as_text=True))[-3]["data"]["outcome"] == (
        "answered"
    )
    again = web.post("/", json={**body, "trigger": "regenerate-message"}, headers=bearer(person))
    assert parts_of(again.get_data(as_text=True))[-3]["data"]["outcome"] == "redelivered"
    assert len(fake_anthropic.requests) == 1
    stored = rows(database_url, "select role, content from messages where user_id = %s order by id", person)
    assert stored == [("user", "pasted text"), ("assistant", "Noted.")]


def test_a_client_id_shaped_like_an_edits_key_replaces_no_other_message(
    web: FlaskClient, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    """A page's generateId may join a prefix and 16 hex digits with `~` (createIdGenerator({ prefix:
    "m", separator: "~", alphabet: "0123456789abcdef" })): every id then looks like an edit's key
    of the message "m". A new message, and a Try again of one, replaced every other message of the
    conversation ("m" and its "edits"), and a reloaded page listed only the last one."""
    fake_anthropic.answer = lambda body: "Noted."
    person = uuid.uuid4()
    chat = new_conversation(web, person)
    first = ui_message("m~0123456789abcdef", "user", "the dentist on monday")
    second = ui_message("m~fedcba9876543210", "user", "and the hygienist")
    for body in (
        chat_body(chat, first),
        chat_body(chat, second),
        {**chat_body(chat, second), "trigger": "regenerate-message"},
    ):
        assert parts_of(web.post("/", json=body, headers=bearer(person)).get_data(as_text=True))[-1] == "[DONE]"
    page = web.get(f"/conversations/{chat}/messages", headers=bearer(person)).get_json()["messages"]
    assert [(message["content"], message["client_id"]) for message in page] == [
        ("the dentist on monday", "m~0123456789abcdef"),
        ("Noted.", None),
        ("and the hygienist", "m~fedcba9876543210"),
        ("Noted.", None),
    ]
    assert rows(database_url, "select count(*) from messages where user_id = %s and replaced", person) == [(0,)]


def test_a_client_id_past_128_characters_shaped_like_an_edits_key_is_taken_and_its_edit_refused(
    web: FlaskClient, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    """An id may have 17 characters past 128 when it ends like an edit's key (a reloaded page's id
    for an edited message): a client's own such id is a message, but its edit's key would outgrow
    an id (the page could then never post its thread again), so the edit is a 400, nothing stored."""
    fake_anthropic.answer = lambda body: "Noted."
    person = uuid.uuid4()
    chat = new_conversation(web, person)
    long_id = "m" * 128 + "~0123456789abcdef"
    sent = web.post("/", json=chat_body(chat, ui_message(long_id, "user", "the dentist")), headers=bearer(person))
    assert parts_of(sent.get_data(as_text=True))[-1] == "[DONE]"
    edit = {**chat_body(chat, ui_message(long_id, "user", "the hygienist")), "messageId": long_id}
    refused = web.post("/", json=edit, headers=bearer(person))
    assert (refused.status_code, refused.get_json()) == (
        400,
        {"error": "bad_request", "message": "a message whose id has more than 128 characters cannot be edited"},
    )
    assert rows(database_url, "select content, external_id from messages where user_id = %s order by id", person) == [
        ("the dentist", long_id),
        ("Noted.", None),
    ]


def test_an_edit_back_to_the_first_words_after_a_reload_is_their_message_sent_again(
    web: FlaskClient, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    """Reloaded, an edited message's id is its edit's key; edited back to its first words (stored
    under the message's own key), it was keyed `<key>~<digest of the first words>`: a new message,
    the same words stored a second time and answered again, where a live tab's edit back is that
    message sent again, its stored reply shown (docs/decisions.md)."""
    person, chat = dentist_booked(web, fake_anthropic)
    edit = {**chat_body(chat, ui_message("u-1", "user", "book the dentist on tuesday")), "messageId": "u-1"}
    assert parts_of(web.post("/", json=edit, headers=bearer(person)).get_data(as_text=True))[-1] == "[DONE]"
    [message, _] = loaded(web, person, chat)
    back = {**message, "parts": [ui_text("book the dentist on monday")]}
    parts = parts_of(
        web.post("/", json={**chat_body(chat, back), "messageId": back["id"]}, headers=bearer(person)).get_data(
            as_text=True
        )
    )
    text = "".join(p["delta"] for p in parts if isinstance(p, dict) and p["type"] == "text-delta")
    assert (parts[-3]["data"]["outcome"], text) == ("redelivered", "Monday it is.")
    assert len(fake_anthropic.requests) == 2
    said = rows(database_url, "select external_id, content from messages where user_id = %s and role = 'user'", person)
    assert sorted(said) == [("u-1", "book the dentist on monday"), (message["id"], "book the dentist on tuesday")]
    listed = [(m["id"], m["parts"][0]["text"]) for m in loaded(web, person, chat)]
    assert listed == [("u-1", "book the dentist on monday"), (listed[1][0], "Monday it is.")]


def test_an_edit_in_the_telegram_thread_edited_back_after_a_reload_is_the_message_sent_again(
    web: FlaskClient, environment: pytest.MonkeyPatch, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    """In the web's [Telegram] thread a reloaded edit keeps its stored id (it has no client id):
    edited back to the Telegram message's words, it was keyed `<key>~<digest of them>`, the words
    stored a second time and answered again, where a live tab's edit back is the message sent
    again, its stored reply shown."""
    fake_anthropic.answer = lambda body: "June, noted." if "June" in json.dumps(body["messages"][-1]) else "Noted."
    web, person, telegram, said = owners_telegram_thread(environment, database_url)
    outcomes = []
    for text in ("my passport expires in June", "my passport expires in May"):
        [message, _] = loaded(web, person, telegram["id"])
        edit = {**message, "parts": [ui_text(text)]}
        body = {**chat_body(telegram["id"], edit), "messageId": edit["id"]}
        parts = parts_of(web.post("/", json=body, headers=bearer(person)).get_data(as_text=True))
        outcomes.append(
            (parts[-3]["data"]["outcome"], "".join(p["delta"] for p in parts[:-3] if p["type"] == "text-delta"))
        )
    assert outcomes == [("answered", "June, noted."), ("redelivered", "Noted.")]
    stored = rows(database_url, "select role, content from messages where user_id = %s order by id", person)
    assert stored == MAY_THEN_JUNE
    reloaded = [(m["id"], m["parts"][0]["text"]) for m in loaded(web, person, telegram["id"])]
    assert reloaded == [(str(said.message_id), "my passport expires in May"), (str(said.reply_id), "Noted.")]


def test_two_tabs_edits_of_one_message_replaced_at_once_leave_one_of_them_listed(
    web: FlaskClient, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    """Two tabs edit the same message to other words at the same moment: both edits are stored, then
    each replaces the message's other versions. The second waited for the first's lock and, on the
    versions its statement had read, replaced the first's edit while the first replaced the
    second's: every version was replaced, and the message and its replies left the listing."""
    fake_anthropic.answer = lambda body: "Noted."
    person = uuid.uuid4()
    chat = new_conversation(web, person)
    for text, edit in (("dentist on monday", {}), ("dentist on tuesday", {"messageId": "u-1"})):
        body = {**chat_body(chat, ui_message("u-1", "user", text)), **edit}
        assert parts_of(web.post("/", json=body, headers=bearer(person)).get_data(as_text=True))[-1] == "[DONE]"
    body = {**chat_body(chat, ui_message("u-1", "user", "dentist on wednesday")), "messageId": "u-1"}
    assert parts_of(web.post("/", json=body, headers=bearer(person)).get_data(as_text=True))[-1] == "[DONE]"
    versions = "select id from messages where user_id = %s and role = 'user' order by id"
    [_, tuesday, wednesday] = [message_id for (message_id,) in rows(database_url, versions, person)]
    rows(database_url, "update messages set replaced = false where user_id = %s returning id", person)
    with psycopg.connect(database_url) as first, psycopg.connect(database_url, autocommit=True) as second:
        first.execute("select replace_message(%s, %s, 'u-1')", (person, tuesday))
        waiting = threading.Thread(
            target=second.execute, args=("select replace_message(%s, %s, 'u-1')", (person, wednesday))
        )
        waiting.start()
        pid = second.info.backend_pid
        for _ in range(200):
            if rows(database_url, "select wait_event_type from pg_stat_activity where pid = %s", pid) == [("Lock",)]:
                break
            time.sleep(0.05)
        first.commit()
        waiting.join(10)
    listed = rows(database_url, "select id from messages where user_id = %s and role = 'user' and not replaced", person)
    assert listed == [(wednesday,)]


def test_a_use_chat_thread_of_detailed_answers_can_still_be_written_in(
    web: FlaskClient, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    """useChat posts its whole thread every turn, and the page cannot shorten it. Nineteen questions,
    each answered in 3,398 characters (a detailed answer: some 850 tokens), make a thread whose
    window (at most CONTEXT_MAX_MESSAGES - 1 = 39 messages) holds 64,562 characters of the server's
    own replies, past MAX_HISTORY_CHARS (4 x 16,000). The twentieth question was refused with 413
    history_too_long, nothing stored, and so was every one after it: nothing new entered the thread,
    so the chat could never be written in again (a reload loads the same thread). Now the window's
    start moves on by CONTEXT_WINDOW_STEP (24) messages, as the stored window's does: the model
    reads the last fourteen, from question 12."""
    answer = "A detailed answer, as asked. " * 117 + "Done."  # 3,398 characters
    fake_anthropic.answer = lambda body: answer
    person = uuid.uuid4()
    chat = new_conversation(web, person)
    thread: list[dict[str, Any]] = []
    for turn in range(19):
        thread.append(ui_message(f"u-{turn}", "user", f"question {turn}"))
        parts = parts_of(web.post("/", json=chat_body(chat, *thread), headers=bearer(person)).get_data(as_text=True))
        assert parts[-3]["data"]["outcome"] == "answered"
        thread.append(ui_message(parts[0]["messageId"], "assistant", answer))
    assert len(answer) == 3_398 and stored_count(database_url, person) == 38
    thread.append(ui_message("u-19", "user", "question 19"))
    response = web.post("/", json=chat_body(chat, *thread), headers=bearer(person))
    assert response.status_code == 200, response.get_data(as_text=True)
    assert parts_of(response.get_data(as_text=True))[-3]["data"]["outcome"] == "answered"
    assert stored_count(database_url, person) == 40
    read = json.dumps(fake_anthropic.requests[-1]["messages"])
    assert (read.count(answer), "question 11" in read, "question 12" in read) == (7, False, True)


def read_thread(fake_anthropic: FakeAnthropic) -> list[str]:
    """The words the model read at its last request, without the surface and time in front."""
    messages = fake_anthropic.requests[-1]["messages"]
    return [block["text"].split("] ", 1)[-1] for message in messages for block in message["content"]]


def three_said(web: FlaskClient, fake_anthropic: FakeAnthropic) -> tuple[uuid.UUID, str]:
    """A person's chat of three messages sent alone, `{id, message}` as the documented transport
    sends them: "u-1", "u-2" (the dentist on monday, edited to tuesday below) and "u-3"."""
    replies = {"sister": "Noted.", "monday": "Monday it is.", "tuesday": "Tuesday it is.", "haircut": "Haircut too."}
    fake_anthropic.answer = lambda body: next(
        (reply for word, reply in replies.items() if word in json.dumps(body["messages"][-1])), "At 9."
    )
    person = uuid.uuid4()
    chat = new_conversation(web, person)
    said = (("u-1", "my sister lands on the 14th"), ("u-2", "book the dentist on monday"), ("u-3", "and a haircut"))
    for key, text in said:
        alone = {"id": chat, "message": ui_message(key, "user", text), "trigger": "submit-message"}
        assert parts_of(web.post("/", json=alone, headers=bearer(person)).get_data(as_text=True))[-1] == "[DONE]"
    return person, chat


def test_an_edit_sent_alone_with_its_message_id_reads_the_stored_thread_before_it(
    web: FlaskClient, fake_anthropic: FakeAnthropic
) -> None:
    """Seen failing: `{id, message, messageId}` (an edit sent alone) gave the model no history at
    all, where a new message sent alone reads the stored thread: it reads the thread the page
    shows before the message it edits."""
    person, chat = three_said(web, fake_anthropic)
    edit = {
        "id": chat,
        "message": ui_message("u-2", "user", "book the dentist on tuesday"),
        "trigger": "submit-message",
        "messageId": "u-2",
    }
    assert answer_of(web.post("/", json=edit, headers=bearer(person))) == ("answered", "Tuesday it is.")
    assert read_thread(fake_anthropic) == ["my sister lands on the 14th", "Noted.", "book the dentist on tuesday"]


def test_an_edit_sent_alone_without_message_id_is_answered_as_the_edit_it_is(
    web: FlaskClient, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    """Seen failing: a client that follows the AI SDK's own "send only the last message" example
    posts `{id, message}` and no `messageId`, so its edit came as the message's id with other words:
    answered 200 `redelivered` with the reply to the words it replaced, the edit neither stored nor
    answered. The same id with other words is an edit of that message, as useChat's edit is."""
    person, chat = three_said(web, fake_anthropic)
    edit = {"id": chat, "message": ui_message("u-2", "user", "book the dentist on tuesday")}
    assert answer_of(web.post("/", json=edit, headers=bearer(person))) == ("answered", "Tuesday it is.")
    assert read_thread(fake_anthropic) == ["my sister lands on the 14th", "Noted.", "book the dentist on tuesday"]
    assert answer_of(web.post("/", json=edit, headers=bearer(person))) == ("redelivered", "Tuesday it is.")
    assert len(fake_anthropic.requests) == 4
    page = web.get(f"/conversations/{chat}/messages", headers=bearer(person)).get_json()["messages"]
    assert [message["content"] for message in page] == [
        "my sister lands on the 14th",
        "Noted.",
        "book the dentist on tuesday",
        "Tuesday it is.",
    ]


def test_a_new_message_alone_after_an_edit_reads_the_thread_the_page_shows(
    web: FlaskClient, fake_anthropic: FakeAnthropic
) -> None:
    """Seen failing: after an edit of an earlier message (useChat drops what followed it from the
    page), the next message sent alone read the stored thread with the replaced words, their reply
    and everything the edit dropped, which the page and the listing no longer show."""
    person, chat = three_said(web, fake_anthropic)
    edit = chat_body(
        chat,
        ui_message("u-1", "user", "my sister lands on the 14th"),
        ui_message("r-1", "assistant", "Noted."),
        ui_message("u-2", "user", "book the dentist on tuesday"),
    )
    edit["messageId"] = "u-2"
    assert answer_of(web.post("/", json=edit, headers=bearer(person))) == ("answered", "Tuesday it is.")
    later = {"id": chat, "message": ui_message("u-4", "user", "what time?"), "trigger": "submit-message"}
    assert answer_of(web.post("/", json=later, headers=bearer(person))) == ("answered", "At 9.")
    assert read_thread(fake_anthropic) == [
        "my sister lands on the 14th",
        "Noted.",
        "book the dentist on tuesday",
        "Tuesday it is.",
        "what time?",
    ]


def test_a_try_again_of_an_earlier_reply_sent_alone_as_the_413_says_drops_what_followed(
    web: FlaskClient, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    """The 413 said to return `{id, message}`, which drops `trigger` and `messageId`: a Try again of an
    earlier reply then could not say what the page dropped. Sent alone with both, as it now says, the
    next turn reads the thread the page shows."""
    person, chat = three_said(web, fake_anthropic)
    query = "select id from messages where user_id = %s and role = 'assistant' order by id limit 1"
    [(reply,)] = rows(database_url, query, person)
    again = {
        "id": chat,
        "message": ui_message("u-1", "user", "my sister lands on the 14th"),
        "trigger": "regenerate-message",
        "messageId": str(reply),
    }
    assert answer_of(web.post("/", json=again, headers=bearer(person))) == ("redelivered", "Noted.")
    later = {"id": chat, "message": ui_message("u-4", "user", "what time?"), "trigger": "submit-message"}
    assert answer_of(web.post("/", json=later, headers=bearer(person))) == ("answered", "At 9.")
    assert read_thread(fake_anthropic) == ["my sister lands on the 14th", "Noted.", "what time?"]
