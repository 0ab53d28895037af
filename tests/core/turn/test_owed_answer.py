"""The scheduled job's answer to an owed message is the person's turn, asked again: with the tools
that turn would have had, reading what it would have read. Through `OwedReplies`, the real SDK
against the fake Anthropic server, and real Postgres."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from core.follow_ups.capability import FollowUpRules, FollowUps
from core.identity.policy import IdentityPolicy
from core.memory.service import Memory
from core.model.llm import AnthropicModel
from core.models import Surface
from core.stores.postgres_store import PostgresStore
from core.turn.capabilities import DEFAULT_SYSTEM_PROMPT
from core.turn.owed import OwedReplies, OwedRun
from core.turn.request import Outcome, TurnRequest, TurnSettings
from core.turn.turns import Turns
from tests.database import migrated_database
from tests.fakes.anthropic_api import REFUSAL_TRIGGER, FakeAnthropic, text_block, tool_results, tool_use
from tests.helpers import RecordingChannel, context_limits

SETTINGS = TurnSettings(
    system_prompt=DEFAULT_SYSTEM_PROMPT,
    fallback_reply="FALLBACK",
    stranger_reply="NO",
    capabilities=(FollowUps(FollowUpRules()),),
)


@pytest.fixture
def memory(postgres_server: str) -> Iterator[Memory]:
    """On a database of its own: the job answers every owed message it finds, other tests' too."""
    with migrated_database(postgres_server) as url:
        store = PostgresStore(url)
        yield Memory(store, context_limits())
        store.close()


def claude_turns(memory: Memory, fake: FakeAnthropic) -> Turns:
    model = AnthropicModel(
        api_key="sk-ant-test", model="claude-test-1", max_tokens=321, base_url=fake.url, max_retries=0
    )
    return Turns(memory, lambda: model, IdentityPolicy("auto"), SETTINGS)


def job_of(memory: Memory, turns: Turns, channel: RecordingChannel, max_tries: int = 3) -> OwedReplies:
    """The job over Telegram, its replies into `channel`."""
    return OwedReplies(
        memory, turns, {Surface.TELEGRAM: lambda sender: channel}, {Surface.TELEGRAM: 5.0}, 600, max_tries
    )


def test_the_jobs_answer_has_the_turns_tools_and_the_persons_follow_ups(
    memory: Memory, fake_anthropic: FakeAnthropic
) -> None:
    """ "What reminders do I have?" on Telegram: the model is overloaded, the person gets the
    fallback, the message is owed. The job asks again with the follow-up tools, and the list it
    reads is the person's. Seen failing with a request without tools (the model could only say it
    had looked, or that it had cancelled) and, with them, an empty list."""
    turns = claude_turns(memory, fake_anthropic)
    person, chat = uuid.uuid4(), "4040"

    def planned(body: dict[str, Any]) -> Any:
        if tool_results(body):
            return "Planned."
        return [text_block("Noted."), tool_use("schedule_follow_up", {"content": "Stretch.", "in_minutes": 90})]

    fake_anthropic.answer = planned
    asked = TurnRequest(Surface.TELEGRAM, "remind me to stretch", "owed-tools-1", sender_id=chat, user_id=person)
    assert turns.run(asked, RecordingChannel()).outcome is Outcome.ANSWERED
    fake_anthropic.behaviour = "529"
    live = RecordingChannel()
    asked = replace(asked, text="what reminders do I have?", external_id="owed-tools-2")
    assert turns.run(asked, live).outcome is Outcome.FALLBACK and live.sent == ["FALLBACK"]
    fake_anthropic.behaviour = "ok"
    fake_anthropic.answer = lambda body: (
        "You will be told to stretch." if tool_results(body) else [tool_use("list_follow_ups", {})]
    )
    job_channel = RecordingChannel()
    job = job_of(memory, turns, job_channel)
    assert job.run(120).answered == 1
    assert job_channel.sent == ["You will be told to stretch."]
    asked_again = fake_anthropic.requests[-2]
    assert [tool["name"] for tool in asked_again["tools"]] == [
        "schedule_follow_up",
        "list_follow_ups",
        "cancel_follow_up",
        "set_timezone",
    ]
    [listed] = tool_results(fake_anthropic.requests[-1])
    assert "Stretch." in str(listed["content"])


def test_a_declined_owed_message_is_answered_once_and_never_given_up(
    memory: Memory, fake_anthropic: FakeAnthropic
) -> None:
    """The model was down for the person's turn (the fallback, the message owed); the job's try,
    its last, is declined: the declined answer is sent and stored, the run counts it answered, and
    no fallback follows it. Seen failing with the fallback sent after the declined answer."""
    turns = claude_turns(memory, fake_anthropic)
    fake_anthropic.behaviour = "529"
    asked = TurnRequest(Surface.TELEGRAM, f"hi {REFUSAL_TRIGGER}", "owed-declined", sender_id="4141")
    assert turns.run(asked, RecordingChannel()).outcome is Outcome.FALLBACK
    fake_anthropic.behaviour = "ok"
    job_channel = RecordingChannel()
    job = job_of(memory, turns, job_channel, max_tries=1)
    assert job.run(120).answered == 1
    declined = (
        "I can't help with that one, so I'll leave it out of our conversation from here on. Ask me anything else."
    )
    assert job_channel.sent == [declined]
    assert memory.claim_owed_replies([Surface.TELEGRAM], 600, 30, limit=10) == []


def test_a_message_declined_with_a_later_turn_is_not_owed(memory: Memory, fake_anthropic: FakeAnthropic) -> None:
    """The model was down for A on Telegram (A owed); B's turn merged A in and was declined for it:
    A is part of that declined turn, answered with it, and the job leaves it alone."""
    turns = claude_turns(memory, fake_anthropic)
    fake_anthropic.behaviour = "529"
    first = TurnRequest(Surface.TELEGRAM, f"hi {REFUSAL_TRIGGER}", "owed-merged-a", sender_id="4242")
    assert turns.run(first, RecordingChannel()).outcome is Outcome.FALLBACK
    fake_anthropic.behaviour = "ok"
    second = TurnRequest(Surface.TELEGRAM, "never mind", "owed-merged-b", sender_id="4242")
    assert turns.run(second, RecordingChannel()).outcome is Outcome.DECLINED
    job_channel = RecordingChannel()
    job = job_of(memory, turns, job_channel)
    assert job.run(120) == OwedRun(answered=0, failed=0)  # nothing claimed
    assert job_channel.sent == [] and len(fake_anthropic.requests) == 2
