"""No answer after the platform stopped waiting (issue 30, finding 1, WhatsApp's half): Twilio waits
15 s for the TwiML answer; a turn that would answer later gives no reply and stores none, and the
message is owed at once, for the scheduled job to answer through Twilio's Messages API."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from core.identity.policy import IdentityPolicy
from core.memory.service import Memory
from core.model.llm import AnthropicModel
from core.models import Surface
from core.turn.request import Outcome, TurnRequest, TurnSettings
from core.turn.turns import Turns
from tests.fakes.anthropic_api import FakeAnthropic
from tests.helpers import MovedClock, rows, stored_turn

SETTINGS = TurnSettings(system_prompt="be brief", fallback_reply="FALLBACK", stranger_reply="NO", memory_notes=False)


@pytest.fixture
def fake() -> Iterator[FakeAnthropic]:
    server = FakeAnthropic()
    yield server
    server.close()


def whatsapp_turn(memory: Memory, fake: FakeAnthropic, clock: MovedClock, thinks_s: float) -> tuple[Turns, TurnRequest]:
    def thinking(body: dict[str, Any]) -> str:
        clock.now += thinks_s
        return "Sure, at noon."

    fake.answer = thinking
    model = AnthropicModel(
        api_key="sk-ant-test", model="claude-test-1", max_tokens=64, base_url=fake.url, max_retries=0
    )
    turns = Turns(memory, lambda: model, IdentityPolicy("auto"), SETTINGS, clock=clock)
    sender = f"+3460{uuid.uuid4().int % 10**7:07d}"
    request = TurnRequest(
        Surface.WHATSAPP,
        "Lunch tomorrow?",
        "SM" + uuid.uuid4().hex,
        sender_id=sender,
        deadline_s=30.0,  # the model has time: Twilio's wait is what ends this turn
        reply_within_s=14.0,
    )
    return turns, request


def test_an_answer_that_would_come_after_twilio_stopped_waiting_is_not_given_and_the_message_is_owed(
    memory: Memory, database_url: str, fake: FakeAnthropic
) -> None:
    clock = MovedClock()
    turns, request = whatsapp_turn(memory, fake, clock, thinks_s=14.5)
    result = turns.run(request)
    assert result.outcome is Outcome.ANSWERED
    assert (result.reply, result.reply_id, result.follow_ups_first) == (None, None, [])
    assert stored_turn(database_url, str(request.external_id)) == [("user", "Lunch tomorrow?")]
    owed = "select answer_by <= clock_timestamp() from messages where external_id = %s"
    assert rows(database_url, owed, request.external_id) == [(True,)]


def test_an_answer_inside_twilios_wait_is_given_and_stored(
    memory: Memory, database_url: str, fake: FakeAnthropic
) -> None:
    clock = MovedClock()
    turns, request = whatsapp_turn(memory, fake, clock, thinks_s=11.0)
    result = turns.run(request)
    assert result.reply == "Sure, at noon." and result.reply_id is not None
    assert stored_turn(database_url, str(request.external_id)) == [
        ("user", "Lunch tomorrow?"),
        ("assistant", "Sure, at noon."),
    ]
