"""A useChat message whose turn gave the fallback (owed): sent under its id with other words and
no messageId, it is its edit, and the takeover ends as a failure of ours would, before the model
is asked; its photo's bytes, never stored, are told unread to every answer that reads it."""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import uuid
from typing import Any

import pytest
from flask.testing import FlaskClient

from core.errors import StoreUnavailable
from core.media.kinds import UNREAD_NOTICE
from core.models import Surface
from core.turn.request import Outcome, TurnRequest
from functions import runtime
from tests.fakes.anthropic_api import FakeAnthropic
from tests.helpers import (
    CORPUS,
    answer_of,
    app_client,
    bearer,
    chat_body,
    loaded,
    new_conversation,
    owners_telegram_thread,
    parts_of,
    rows,
    ui_message,
)


def monday_owed(web: FlaskClient, person: uuid.UUID, fake_anthropic: FakeAnthropic) -> str:
    fake_anthropic.answer = lambda body: (
        "Tuesday it is." if "tuesday" in json.dumps(body["messages"][-1]) else "Monday it is."
    )
    chat = new_conversation(web, person)
    fake_anthropic.behaviour = "500"
    first = chat_body(chat, ui_message("u-1", "user", "book the dentist on monday"))
    said = parts_of(web.post("/", json=first, headers=bearer(person)).get_data(as_text=True))
    assert said[-4]["data"]["outcome"] == "fallback"
    fake_anthropic.behaviour = "ok"
    return chat


def photo_owed(web: FlaskClient, person: uuid.UUID, fake_anthropic: FakeAnthropic) -> str:
    """The model down, a photo neither described nor answered: its message stays its placeholder,
    owed (the fallback was shown). The chat's id; the model still down."""
    chat = new_conversation(web, person)
    photo = base64.b64encode((CORPUS / "media" / "receipt.jpg").read_bytes()).decode()
    image = {"type": "file", "mediaType": "image/jpeg", "url": f"data:image/jpeg;base64,{photo}"}
    message = {"id": "u-photo", "role": "user", "parts": [image, {"type": "text", "text": "What did I pay?"}]}
    fake_anthropic.behaviour = "500"
    failed = parts_of(web.post("/", json=chat_body(chat, message), headers=bearer(person)).get_data(as_text=True))
    assert failed[-4]["data"]["outcome"] == "fallback"
    return chat


# Monday's message replaced by its edit, and the edit's answer.
EDITED = [
    ("user", "book the dentist on monday", True),
    ("user", "book the dentist on tuesday", False),
    ("assistant", "Tuesday it is.", False),
]


def stored(database_url: str, person: uuid.UUID) -> list[tuple[Any, ...]]:
    return rows(database_url, "select role, content, replaced from messages where user_id = %s order by id", person)


def test_the_edited_takeover_is_owed_at_once_its_reservation_back_and_nothing_logged_as_an_error(
    environment: pytest.MonkeyPatch,
    database_url: str,
    fake_anthropic: FakeAnthropic,
    caplog: pytest.LogCaptureFixture,
    web: FlaskClient,
) -> None:
    environment.setenv("TOKENS_PER_DAY", "1000000")
    runtime.reset()
    web = app_client("web_chat")
    person = uuid.uuid4()
    chat = monday_owed(web, person, fake_anthropic)
    before = rows(
        database_url,
        "select u.tokens, u.reserved from turn_usage u join messages m on m.id = u.message_id"
        " where m.user_id = %s and m.external_id = 'u-1'",
        person,
    )
    asked = len(fake_anthropic.requests)
    caplog.clear()
    caplog.set_level(logging.INFO)
    edit = {"id": chat, "message": ui_message("u-1", "user", "book the dentist on tuesday")}
    assert answer_of(web.post("/", json=edit, headers=bearer(person))) == ("answered", "Tuesday it is.")
    assert len(fake_anthropic.requests) == asked + 1
    after = rows(
        database_url,
        "select u.tokens, u.reserved, m.answer_by <= clock_timestamp(), m.replaced from turn_usage u"
        " join messages m on m.id = u.message_id where m.user_id = %s and m.external_id = 'u-1'",
        person,
    )
    assert after == [(before[0][0], 0, True, True)]
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_an_edit_that_cannot_be_read_with_the_database_away_leaves_the_message_owed(
    web: FlaskClient, database_url: str, fake_anthropic: FakeAnthropic, monkeypatch: pytest.MonkeyPatch
) -> None:
    person = uuid.uuid4()
    chat = monday_owed(web, person, fake_anthropic)
    asked = len(fake_anthropic.requests)
    memory = runtime.memory()

    def away(*args: object, **kwargs: object) -> object:
        raise StoreUnavailable("web_messages failed: OperationalError")

    monkeypatch.setattr(memory, "web_messages", away)
    edit = {"id": chat, "message": ui_message("u-1", "user", "book the dentist on tuesday")}
    response = web.post("/", json=edit, headers=bearer(person))
    assert response.status_code == 503, response.get_data(as_text=True)
    assert len(fake_anthropic.requests) == asked
    assert rows(
        database_url,
        "select m.answer_by <= clock_timestamp() from messages m where m.user_id = %s and m.external_id = 'u-1'",
        person,
    ) == [(True,)]


def test_the_same_words_again_are_the_owed_message_answered(web: FlaskClient, fake_anthropic: FakeAnthropic) -> None:
    person = uuid.uuid4()
    chat = monday_owed(web, person, fake_anthropic)
    again = {"id": chat, "message": ui_message("u-1", "user", "book the dentist on monday")}
    assert answer_of(web.post("/", json=again, headers=bearer(person))) == ("answered", "Monday it is.")
    assert answer_of(web.post("/", json=again, headers=bearer(person))) == ("redelivered", "Monday it is.")


def test_the_edit_sent_twice_is_stored_and_answered_once(
    web: FlaskClient, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    person = uuid.uuid4()
    chat = monday_owed(web, person, fake_anthropic)
    asked = len(fake_anthropic.requests)
    edit = {"id": chat, "message": ui_message("u-1", "user", "book the dentist on tuesday")}
    assert answer_of(web.post("/", json=edit, headers=bearer(person))) == ("answered", "Tuesday it is.")
    assert answer_of(web.post("/", json=edit, headers=bearer(person))) == ("redelivered", "Tuesday it is.")
    assert len(fake_anthropic.requests) == asked + 1
    assert stored(database_url, person) == EDITED


@pytest.mark.parametrize("named", [False, True], ids=["no_message_id", "message_id"])
def test_a_telegram_message_left_owed_and_edited_on_the_web_is_not_answered_again_by_the_job(
    web: FlaskClient,
    environment: pytest.MonkeyPatch,
    own_database: str,
    fake_anthropic: FakeAnthropic,
    named: bool,
) -> None:
    """A Telegram message whose turn gave the fallback is owed; the person edits it in the web's
    [Telegram] thread (under its stored id, other words, with useChat's `messageId` or without):
    the edit is stored and answered from the thread before it, and the message it replaced leaves
    the page. The scheduled job must not then answer the replaced words on Telegram: the person
    edited them away, and their edit has its answer. Seen failing with the replaced words read
    before the edit ("…in May", then "…in June": a Telegram turn ignored the page's thread), without
    `messageId` still listed, and, once read no more, claimed by the job."""
    environment.setenv("DATABASE_URL", own_database)  # the job's claim reads everyone's owed messages
    web, person, telegram, said = owners_telegram_thread(environment, own_database, owed_by=fake_anthropic)
    assert said.reply_id is None
    fake_anthropic.answer = lambda body: "June, noted." if "June" in json.dumps(body["messages"][-1]) else "Noted."
    thread = loaded(web, person, telegram["id"])
    edit = ui_message(thread[0]["id"], "user", "my passport expires in June")
    body = {**chat_body(telegram["id"], edit), **({"messageId": edit["id"]} if named else {})}
    assert answer_of(web.post("/", json=body, headers=bearer(person))) == ("answered", "June, noted.")
    # The edit's turn reads the thread before the message it edits, not the words it replaced.
    assert [block["text"].split("] ", 1)[1] for block in fake_anthropic.requests[-1]["messages"][-1]["content"]] == [
        "my passport expires in June"
    ]
    assert [(m["role"], m["parts"][0]["text"]) for m in loaded(web, person, telegram["id"])] == [
        ("user", "my passport expires in June"),
        ("assistant", "June, noted."),
    ]
    assert rows(own_database, "select replaced, declined from messages where id = %s", said.message_id) == [
        (True, False)
    ]
    assert runtime.memory().claim_owed_replies([Surface.TELEGRAM], max_age_s=600, answer_within_s=30, limit=5) == []


def test_telegrams_redelivery_of_a_message_edited_away_on_the_web_answers_nothing(
    web: FlaskClient, environment: pytest.MonkeyPatch, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    """An owed Telegram message the person edited on the web's page of its thread is owed no more
    (docs/decisions.md): Telegram's redelivery of its update, as the scheduled job, answers nothing
    (no model asked, nothing sent on Telegram about the words edited away); a page that sends it
    again (another tab's Try again) still has it answered, once. Seen failing with the redelivery
    answering the replaced words ("Noted." to "…in May", under the edit's answer)."""
    web, person, telegram, said = owners_telegram_thread(environment, database_url, owed_by=fake_anthropic)
    fake_anthropic.answer = lambda body: "June, noted." if "June" in json.dumps(body["messages"][-1]) else "Noted."
    edit = ui_message(str(said.message_id), "user", "my passport expires in June")
    assert answer_of(web.post("/", json=chat_body(telegram["id"], edit), headers=bearer(person))) == (
        "answered",
        "June, noted.",
    )
    asked = len(fake_anthropic.requests)
    chat_id = rows(database_url, "select sender from messages where id = %s", said.message_id)[0][0]
    again = runtime.turns().run(TurnRequest(Surface.TELEGRAM, "my passport expires in May", "9", chat_id))
    assert (again.outcome, again.reply, len(fake_anthropic.requests)) == (Outcome.DUPLICATE, None, asked)
    assert rows(database_url, "select count(*) from messages where in_reply_to = %s", said.message_id) == [(0,)]
    other_tab = ui_message(str(said.message_id), "user", "my passport expires in May")
    retried = {**chat_body(telegram["id"], other_tab), "trigger": "regenerate-message", "messageId": "fallback"}
    assert answer_of(web.post("/", json=retried, headers=bearer(person))) == ("answered", "Noted.")
    assert rows(database_url, "select count(*) from messages where in_reply_to = %s", said.message_id) == [(1,)]


def test_an_edit_of_a_telegram_message_whose_stream_dropped_is_answered_by_the_pages_resume(
    web: FlaskClient, environment: pytest.MonkeyPatch, own_database: str, fake_anthropic: FakeAnthropic
) -> None:
    """The person edits an owed Telegram message on the web's page of its thread and the stream
    drops (a tab closed, a train's tunnel): the edit is owed, and the message it replaced is owed no
    more. Nothing else answers the edit (it came from the page: the scheduled job has no chat to
    send it to), so the page's resume (useChat's resume, as it mounts) answers it, once, from the
    thread before it, as it answers a web message. Seen failing with a 204: neither the edited words
    nor the edit were ever answered."""
    environment.setenv("DATABASE_URL", own_database)  # the job's claim reads everyone's owed messages
    web, person, telegram, said = owners_telegram_thread(environment, own_database, owed_by=fake_anthropic)
    fake_anthropic.answer = lambda body: "June, noted." if "June" in json.dumps(body["messages"][-1]) else "Noted."
    edit = ui_message(str(said.message_id), "user", "my passport expires in June")
    web.post("/", json=chat_body(telegram["id"], edit), headers=bearer(person)).close()  # the stream dropped
    assert runtime.memory().claim_owed_replies([Surface.TELEGRAM], max_age_s=600, answer_within_s=30, limit=5) == []
    resumed = web.get(f"/{telegram['id']}/stream", headers=bearer(person))
    assert answer_of(resumed) == ("answered", "June, noted.")
    assert [block["text"].split("] ", 1)[1] for block in fake_anthropic.requests[-1]["messages"][-1]["content"]] == [
        "my passport expires in June"
    ]
    assert [(m["role"], m["parts"][0]["text"]) for m in loaded(web, person, telegram["id"])] == [
        ("user", "my passport expires in June"),
        ("assistant", "June, noted."),
    ]
    assert web.get(f"/{telegram['id']}/stream", headers=bearer(person)).status_code == 204
    assert rows(own_database, "select count(*) from messages where in_reply_to = %s", said.message_id) == [(0,)]


@pytest.mark.parametrize("earlier", [False, True])
def test_an_unnamed_edit_posted_as_messages_reads_no_replaced_words(
    web: FlaskClient, database_url: str, fake_anthropic: FakeAnthropic, earlier: bool
) -> None:
    person = uuid.uuid4()
    chat = new_conversation(web, person)
    fake_anthropic.answer = lambda body: (
        "Tuesday it is." if "tuesday" in json.dumps(body["messages"][-1]) else "Monday it is."
    )
    thread = []
    if earlier:
        said = {"id": chat, "messages": [ui_message("u-0", "user", "hello")], "trigger": "submit-message"}
        web.post("/", json=said, headers=bearer(person))
        thread = [ui_message("u-0", "user", "hello"), ui_message("a-0", "assistant", "Monday it is.")]
    fake_anthropic.behaviour = "500"
    first = chat_body(chat, *thread, ui_message("u-1", "user", "book the dentist on monday"))
    web.post("/", json=first, headers=bearer(person)).get_data()
    fake_anthropic.behaviour = "ok"
    edit = chat_body(chat, *thread, ui_message("u-1", "user", "book the dentist on tuesday"))
    assert answer_of(web.post("/", json=edit, headers=bearer(person))) == ("answered", "Tuesday it is.")
    read = json.dumps(fake_anthropic.requests[-1]["messages"])
    assert "monday" not in read


def test_two_tabs_sending_the_same_unnamed_edit_at_once_store_and_answer_it_once(
    web: FlaskClient, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    import threading

    import httpx
    from werkzeug.serving import make_server

    person = uuid.uuid4()
    chat = monday_owed(web, person, fake_anthropic)
    asked = len(fake_anthropic.requests)
    fake_anthropic.delta_pause_s = 0.2
    server = make_server("127.0.0.1", 0, web.application, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.port}/"
    edit = {"id": chat, "message": ui_message("u-1", "user", "book the dentist on tuesday")}
    answers: list[tuple[str, str]] = []

    def tab() -> None:
        with httpx.Client(timeout=60) as client:
            response = client.post(url, json=edit, headers=bearer(person))
            parts = parts_of(response.text)
            text = "".join(p["delta"] for p in parts if isinstance(p, dict) and p["type"] == "text-delta")
            answers.append((parts[-3]["data"]["outcome"], text))

    try:
        tabs = [threading.Thread(target=tab) for _ in range(2)]
        for t in tabs:
            t.start()
        for t in tabs:
            t.join()
    finally:
        server.shutdown()
    assert sorted(answers) == [("answered", "Tuesday it is."), ("redelivered", "Tuesday it is.")]
    assert len(fake_anthropic.requests) == asked + 1
    assert stored(database_url, person) == EDITED


def test_a_photo_left_unread_and_merged_into_the_next_message_is_told_unread(
    web: FlaskClient, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    """e74047e tells the model a taken-over owed message's photo was never read. The person's next
    message answers that owed message too (merged with it, answered_with_later), from the same
    placeholder, with the same bytes gone: it must be told so too."""
    person = uuid.uuid4()
    chat = photo_owed(web, person, fake_anthropic)
    fake_anthropic.behaviour = "ok"
    fake_anthropic.answer = lambda body: "I could not see it."
    asked = len(fake_anthropic.requests)
    later = {"id": chat, "message": ui_message("u-2", "user", "so how much was it?")}
    assert answer_of(web.post("/", json=later, headers=bearer(person)))[0] == "answered"
    [request] = fake_anthropic.requests[asked:]
    assert rows(
        database_url, "select answered_with_later from messages where user_id = %s and external_id = 'u-photo'", person
    ) == [(True,)]
    [block] = request["messages"][-1]["content"]
    notice = UNREAD_NOTICE.format(what="a photo")
    assert f"] [photo] What did I pay?\n{notice}\n\n[web · " in block["text"]
    assert block["text"].endswith("] so how much was it?") and block["text"].count(notice) == 1
    # The notice is the model's, never the memory's.
    assert rows(database_url, "select role, content from messages where user_id = %s order by id", person) == [
        ("user", "[photo] What did I pay?"),
        ("user", "so how much was it?"),
        ("assistant", "I could not see it."),
    ]


def test_a_resumed_photo_its_failed_turn_never_read_is_answered_knowing_it_was_not_seen(
    web: FlaskClient, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    """The model down, a photo is neither described nor answered: its message stays its placeholder,
    owed. The chat's resume (or the same send again without its file) answers it with no bytes to
    show, and the model is told so, as the scheduled job tells it (test_owed_fairness's Finding 8),
    not left to answer `[photo]` as if it had seen it."""
    person = uuid.uuid4()
    chat = photo_owed(web, person, fake_anthropic)
    assert rows(database_url, "select role, content from messages where user_id = %s", person) == [
        ("user", "[photo] What did I pay?")
    ]
    fake_anthropic.behaviour = "ok"
    asked = len(fake_anthropic.requests)
    resumed = parts_of(web.get(f"/{chat}/stream", headers=bearer(person)).get_data(as_text=True))
    assert resumed[-3]["data"]["outcome"] == "answered"
    [request] = fake_anthropic.requests[asked:]
    [block] = request["messages"][-1]["content"]
    notice = UNREAD_NOTICE.format(what="a photo")
    assert block["text"].endswith("] [photo] What did I pay?\n" + notice)
    # The notice is the model's, never the memory's.
    assert rows(database_url, "select content from messages where user_id = %s and role = 'user'", person) == [
        ("[photo] What did I pay?",)
    ]


def test_an_edit_without_message_id_of_a_message_left_unanswered_is_answered_as_the_edit(
    web: FlaskClient, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    """The model down, "monday" got the fallback and stayed owed. Its edit, sent alone under its id
    with other words and no `messageId`, was taken for that owed message sent again: "monday" was
    answered, and "tuesday", which the page shows, was neither stored nor answered. It is the
    message's edit, as it is once the message has a reply."""
    person = uuid.uuid4()
    chat = monday_owed(web, person, fake_anthropic)
    asked = len(fake_anthropic.requests)
    edit = {"id": chat, "message": ui_message("u-1", "user", "book the dentist on tuesday")}
    assert answer_of(web.post("/", json=edit, headers=bearer(person))) == ("answered", "Tuesday it is.")
    assert len(fake_anthropic.requests) == asked + 1  # the model never asked about monday again
    page = web.get(f"/conversations/{chat}/messages", headers=bearer(person)).get_json()["messages"]
    assert [(message["content"], message["client_id"]) for message in page] == [
        ("book the dentist on tuesday", "u-1~" + hashlib.sha256(b"book the dentist on tuesday").hexdigest()[:16]),
        ("Tuesday it is.", None),
    ]
    assert web.get(f"/{chat}/stream", headers=bearer(person)).status_code == 204
