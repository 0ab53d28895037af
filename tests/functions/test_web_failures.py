"""The web's failure paths as the page meets them: the streamed turn when the model fails,
and a retried send, which must get its reply back."""

from __future__ import annotations

import json
import uuid
from typing import Any

import psycopg
import pytest
from flask.testing import FlaskClient

from tests.fakes.anthropic_api import FakeAnthropic
from tests.helpers import bearer

FALLBACK = "Sorry, I can't answer right now."
STREAM = {"Accept": "text/event-stream"}


@pytest.fixture
def web_settings() -> dict[str, str]:
    """A known fallback, and a deadline the fake's slow answer passes."""
    return {"FALLBACK_REPLY": FALLBACK, "WEB_MODEL_DEADLINE": "1"}


def events_of(body: str) -> list[tuple[str, dict[str, Any]]]:
    events = []
    for block in body.split("\n\n"):
        if block:
            name, data = block.split("\n", 1)
            events.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return events


def stored(database_url: str, person: uuid.UUID) -> list[tuple[str, str]]:
    with psycopg.connect(database_url) as connection:
        rows = connection.execute(
            "select role, content from messages where user_id = %s order by created_at, id", (person,)
        ).fetchall()
    return [(role, content) for role, content in rows]


@pytest.mark.parametrize("behaviour", ["500", "529", "slow", "malformed", "empty"])
def test_a_streamed_turn_whose_model_fails_ends_with_one_done_carrying_the_fallback(
    web: FlaskClient, database_url: str, fake_anthropic: FakeAnthropic, behaviour: str
) -> None:
    if behaviour == "empty":
        fake_anthropic.answer = lambda body: ""
    else:
        fake_anthropic.behaviour = behaviour
    person = uuid.uuid4()
    response = web.post(
        "/", json={"message": "are you there?", "client_message_id": "c1"}, headers={**bearer(person), **STREAM}
    )
    assert response.status_code == 200 and response.mimetype == "text/event-stream"
    events = events_of(response.get_data(as_text=True))
    names = [name for name, _ in events]
    assert names.count("done") == 1 and names[-1] == "done"
    done = events[-1][1]
    assert done["outcome"] == "fallback" and done["reply"] == FALLBACK and done["reply_id"] is None
    assert "".join(data["text"] for name, data in events if name == "delta") == FALLBACK
    assert stored(database_url, person) == [("user", "are you there?")]


@pytest.mark.parametrize("accept", [{}, STREAM], ids=["json", "stream"])
def test_a_retried_send_gets_its_reply_back(
    web: FlaskClient, database_url: str, fake_anthropic: FakeAnthropic, accept: dict[str, str]
) -> None:
    person = uuid.uuid4()
    fake_anthropic.answer = lambda body: "The first and only answer."
    replies = []
    for _ in range(3):
        response = web.post(
            "/", json={"message": "hello", "client_message_id": "retry-1"}, headers={**bearer(person), **accept}
        )
        assert response.status_code == 200
        result = events_of(response.get_data(as_text=True))[-1][1] if accept else response.get_json()
        replies.append((result["outcome"], result["reply"]))
    assert replies == [
        ("answered", "The first and only answer."),
        ("redelivered", "The first and only answer."),
        ("redelivered", "The first and only answer."),
    ]
    assert stored(database_url, person) == [("user", "hello"), ("assistant", "The first and only answer.")]
    assert len(fake_anthropic.requests) == 1


def test_a_streamed_answer_still_being_written_at_the_deadline_ends_in_the_fallback_and_stays_owed(
    web: FlaskClient, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    """The model writes steadily past WEB_MODEL_DEADLINE (1 s here: 40 words, one each 0.05 s):
    the page has read the start, then the fallback after it; the half answer is not stored as the
    reply, and the retry of the same send gets a whole answer."""
    answer = " ".join(f"word{index}" for index in range(40))
    fake_anthropic.answer = lambda body: answer
    fake_anthropic.first_token_s, fake_anthropic.delta_pause_s = 0.5, 0.05
    person = uuid.uuid4()
    send = {"message": "tell me everything", "client_message_id": "late-1"}
    events = events_of(web.post("/", json=send, headers={**bearer(person), **STREAM}).get_data(as_text=True))
    written = "".join(data["text"] for name, data in events if name == "delta")
    shown, _, said = written.rpartition("\n\n")
    assert said == FALLBACK and shown and answer.startswith(shown) and shown != answer
    assert [name for name, _ in events].count("done") == 1
    assert (events[-1][1]["outcome"], events[-1][1]["reply"]) == ("fallback", written)
    assert stored(database_url, person) == [("user", "tell me everything")]
    fake_anthropic.delta_pause_s = 0.0
    again = web.post("/", json=send, headers=bearer(person)).get_json()
    assert (again["outcome"], again["reply"]) == ("answered", answer)
    assert stored(database_url, person) == [("user", "tell me everything"), ("assistant", answer)]
