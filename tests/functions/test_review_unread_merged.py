"""Review of e74047e: an owed photo's bytes are gone for every answer that reads its placeholder,
not only for a takeover of that message."""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any

from flask.testing import FlaskClient

from core.media.kinds import UNREAD_NOTICE
from tests.fakes.anthropic_api import FakeAnthropic
from tests.helpers import CORPUS, bearer, rows


def ui_message(message_id: str, role: str, text: str) -> dict[str, Any]:
    return {"id": message_id, "role": role, "parts": [{"type": "text", "text": text}]}


def chat_body(chat_id: str, *messages: dict[str, Any]) -> dict[str, Any]:
    return {"id": chat_id, "messages": list(messages), "trigger": "submit-message"}


def parts_of(text: str) -> list[Any]:
    blocks = [block for block in text.split("\n\n") if block]
    return [block[6:] if block == "data: [DONE]" else json.loads(block[6:]) for block in blocks]


def new_conversation(web: FlaskClient, person: uuid.UUID) -> str:
    return str(web.post("/conversations", headers=bearer(person)).get_json()["id"])


def answer_of(response: Any) -> tuple[str, str]:
    parts = parts_of(response.get_data(as_text=True))
    text = "".join(part["delta"] for part in parts if isinstance(part, dict) and part["type"] == "text-delta")
    return parts[-3]["data"]["outcome"], text


def test_a_photo_left_unread_and_merged_into_the_next_message_is_told_unread(
    web: FlaskClient, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    """e74047e tells the model a taken-over owed message's photo was never read. The person's next
    message answers that owed message too (merged with it, answered_with_later), from the same
    placeholder, with the same bytes gone: it must be told so too."""
    person = uuid.uuid4()
    chat = new_conversation(web, person)
    photo = base64.b64encode((CORPUS / "media" / "receipt.jpg").read_bytes()).decode()
    image = {"type": "file", "mediaType": "image/jpeg", "url": f"data:image/jpeg;base64,{photo}"}
    message = {"id": "u-photo", "role": "user", "parts": [image, {"type": "text", "text": "What did I pay?"}]}
    fake_anthropic.behaviour = "500"
    failed = parts_of(web.post("/", json=chat_body(chat, message), headers=bearer(person)).get_data(as_text=True))
    assert failed[-4]["data"]["outcome"] == "fallback"
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
