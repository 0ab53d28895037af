"""The web's failure paths as the page meets them: the streamed turn when the model fails,
and a retried send, which must get its reply back."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import psycopg
import pytest
from flask.testing import FlaskClient

from core.errors import StoreUnavailable
from core.model.llm import ModelReply, Usage
from core.turn.context import ModelMessage
from functions import runtime
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


class BreaksAfterItsFirstWords:
    """A model whose stream raises `error` after its first words, as a bug of ours would (a model's
    own failure, ModelUnavailable, is the fallback's: the test above); with `error` None, it answers."""

    name = "breaks-after-its-first-words"

    def __init__(self, error: Exception | None) -> None:
        self.error = error

    def reply(self, system: str, messages: Sequence[ModelMessage], timeout_s: float, notes: str = "") -> ModelReply:
        raise AssertionError("a streamed turn asks for a stream")

    def stream(
        self, system: str, messages: Sequence[ModelMessage], timeout_s: float, notes: str = "", **_: Any
    ) -> Iterator[str | Usage]:
        yield "The first words"
        if self.error is not None:
            raise self.error
        yield " and the rest."
        yield Usage(input_tokens=10, output_tokens=5)


@pytest.mark.parametrize(
    ("error", "ends_with"),
    [
        (
            StoreUnavailable("the database went away"),
            {"error": "store_unavailable", "message": "the database went away"},
        ),
        (
            RuntimeError("a bug's own words"),
            {"error": "internal_error", "message": "the turn failed; your message is kept: send it again"},
        ),
    ],
    ids=["an error of ours", "a bug"],
)
def test_a_streamed_turn_that_fails_after_its_first_event_ends_with_one_error_event(
    environment: pytest.MonkeyPatch,
    web: FlaskClient,
    database_url: str,
    caplog: pytest.LogCaptureFixture,
    error: Exception,
    ends_with: dict[str, str],
) -> None:
    """Once the first event is out, the status and headers are sent: a failure after it was a
    stream cut with no last event (the UI message stream ends in its `error` part). It ends with
    one `error` event, `{"error", "message"}` as our JSON errors are (a bug's own words stay in the
    log), and the message is kept, owed: the same send again is answered."""
    model = BreaksAfterItsFirstWords(error)
    environment.setattr(runtime, "model", lambda: model)
    person = uuid.uuid4()
    send = {"message": "tell me", "client_message_id": "broken-1"}
    response = web.post("/", json=send, headers={**bearer(person), **STREAM})
    assert response.status_code == 200 and response.mimetype == "text/event-stream"
    assert events_of(response.get_data(as_text=True)) == [("delta", {"text": "The first words"}), ("error", ends_with)]
    [line] = [r for r in caplog.records if r.name == "crossmem.functions" and r.levelno >= logging.ERROR]
    assert (line.getMessage(), line.__dict__["error"]) == (
        "a streamed turn failed after its first event",
        ends_with["error"],
    )
    assert stored(database_url, person) == [("user", "tell me")]
    model.error = None
    again = web.post("/", json=send, headers=bearer(person)).get_json()
    assert (again["outcome"], again["reply"]) == ("answered", "The first words and the rest.")
    assert stored(database_url, person) == [("user", "tell me"), ("assistant", "The first words and the rest.")]
