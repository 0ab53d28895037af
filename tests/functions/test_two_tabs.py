"""One conversation open in two tabs (or on a laptop and a phone) of the web function, as useChat
pages post to it. The first tab's turn is held inside its model call by an event, so the second
tab writes while it is still being answered. Real function, real Postgres, the real SDK at the fake."""

from __future__ import annotations

import json
import threading
import uuid
from typing import Any

from flask.testing import FlaskClient

from tests.fakes.anthropic_api import FakeAnthropic
from tests.helpers import bearer, chat_body, ui_message


def streamed(web: FlaskClient, person: uuid.UUID, body: dict[str, Any]) -> str:
    """The reply's words, as the UI message stream gave them."""
    text = web.post("/", json=body, headers=bearer(person)).get_data(as_text=True)
    parts = [json.loads(block[6:]) for block in text.split("\n\n") if block and block != "data: [DONE]"]
    return "".join(part["delta"] for part in parts if part["type"] == "text-delta")


def listed(web: FlaskClient, person: uuid.UUID, chat: str) -> list[tuple[str, str]]:
    page = web.get(f"/conversations/{chat}/messages", headers=bearer(person)).get_json()
    return [(message["role"], message["content"]) for message in page["messages"]]


def test_an_edit_in_one_tab_keeps_what_the_other_tab_said_while_it_was_answered(
    web: FlaskClient, fake_anthropic: FakeAnthropic
) -> None:
    """Tab A asks; while it is answered, tab B (loaded before it, so it never showed A's question)
    says something of its own; then A edits its question. useChat drops from A's page what followed
    the question there (nothing: a page sends its next message once its last one's answer is in),
    not what tab B said meanwhile, which B still shows: it stays listed, and B's next message, sent
    alone, reads it. Seen failing with B's words and their reply gone from the listing and the thread."""
    asked, release = threading.Event(), threading.Event()

    def answer(body: dict[str, Any]) -> str:
        last = body["messages"][-1]["content"][-1]["text"]
        if last.endswith("dentist on monday") and not asked.is_set():
            asked.set()
            assert release.wait(30)
        return "Noted: " + last.split()[-1]

    fake_anthropic.answer = answer
    person = uuid.uuid4()
    chat = str(web.post("/conversations", headers=bearer(person)).get_json()["id"])
    tab_a: list[str] = []
    question = ui_message("a-1", "user", "book the dentist on monday")
    thread = threading.Thread(target=lambda: tab_a.append(streamed(web, person, chat_body(chat, question))))
    thread.start()
    assert asked.wait(30)
    assert streamed(web, person, chat_body(chat, ui_message("b-1", "user", "buy milk"))) == "Noted: milk"
    release.set()
    thread.join(30)
    assert tab_a == ["Noted: monday"]
    edit = {**chat_body(chat, ui_message("a-1", "user", "book the dentist on tuesday")), "messageId": "a-1"}
    assert streamed(web, person, edit) == "Noted: tuesday"
    assert listed(web, person, chat) == [
        ("user", "buy milk"),
        ("assistant", "Noted: milk"),
        ("user", "book the dentist on tuesday"),
        ("assistant", "Noted: tuesday"),
    ]
    alone = {"id": chat, "message": ui_message("b-2", "user", "and eggs"), "trigger": "submit-message"}
    assert streamed(web, person, alone) == "Noted: eggs"
    read = [block["text"].split("] ", 1)[-1] for m in fake_anthropic.requests[-1]["messages"] for block in m["content"]]
    assert read == ["buy milk", "Noted: milk", "book the dentist on tuesday", "Noted: tuesday", "and eggs"]
