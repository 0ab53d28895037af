"""The 2026 models as their pages describe them (docs/research/model-changes-2026.md), through the
real SDK against the fake Anthropic server: a tool turn sends each answer back as the model gave
it, thinking blocks included; crossmem never forces a tool nor turns thinking off."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import anthropic
import pytest

from core.errors import ModelDeclined, ModelUnavailable
from core.identity.policy import IdentityPolicy
from core.memory.search import SEARCH_MEMORY, MemorySearch, SearchRules
from core.memory.service import Memory
from core.model.llm import AnthropicModel
from core.models import Role, Surface
from core.turn.capabilities import DEFAULT_SYSTEM_PROMPT
from core.turn.context import ModelMessage
from core.turn.request import Outcome, TurnRequest, TurnSettings
from core.turn.turns import Turns
from tests.fakes.anthropic_api import FORCED_TOOL, FakeAnthropic, text_block, tool_results, tool_use

SONNET = "claude-sonnet-5-5"


@pytest.fixture
def fake() -> Iterator[FakeAnthropic]:
    server = FakeAnthropic()
    yield server
    server.close()


def sdk(fake: FakeAnthropic) -> anthropic.Anthropic:
    return anthropic.Anthropic(api_key="sk-ant-test", base_url=fake.url, max_retries=0)


def test_a_tool_turn_sends_the_answer_back_as_the_model_gave_it(memory: Memory, fake: FakeAnthropic) -> None:
    def answer(body: dict[str, Any]) -> Any:
        return "Nothing older about that." if tool_results(body) else [tool_use(SEARCH_MEMORY, {"query": "x"}, "t1")]

    fake.answer = answer
    model = AnthropicModel(api_key="sk-ant-test", model=SONNET, max_tokens=300, base_url=fake.url, max_retries=0)
    settings = TurnSettings(DEFAULT_SYSTEM_PROMPT, "FALLBACK", "NO", capabilities=(MemorySearch(SearchRules()),))
    turns = Turns(memory, lambda: model, IdentityPolicy("auto"), settings)
    result = turns.run(TurnRequest(Surface.TELEGRAM, "what did I say about x?", "m-1", user_id=uuid.uuid4()))

    assert result.outcome is Outcome.ANSWERED and result.reply == "Nothing older about that."
    first, second = fake.requests[-2:]
    sent_back = second["messages"][len(first["messages"])]
    thinking = sent_back["content"][0]
    assert sent_back["role"] == "assistant" and thinking["type"] == "thinking" and thinking["thinking"] == ""
    assert len(thinking["signature"]) == 64  # the one the fake issued for the first request's prefix
    called = {"type": "tool_use", "id": "t1", "name": SEARCH_MEMORY, "input": {"query": "x"}}
    assert sent_back["content"][1:] == [called]
    # Never forced, never switched off: the 2026 models refuse both.
    assert all("tool_choice" not in body and "thinking" not in body for body in fake.requests)


def test_the_fake_refuses_a_rebuilt_turn_and_a_forced_tool(fake: FakeAnthropic) -> None:
    fake.answer = lambda body: [tool_use(SEARCH_MEMORY, {"query": "x"}, "t1")]
    client = sdk(fake)
    tools = [{"name": SEARCH_MEMORY, "description": "d", "input_schema": {"type": "object", "properties": {}}}]
    asked = [{"role": "user", "content": "hello"}]
    client.messages.create(model=SONNET, max_tokens=50, messages=asked, tools=tools)  # type: ignore[arg-type]
    rebuilt = [
        *asked,
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": SEARCH_MEMORY, "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "none"}]},
    ]
    with pytest.raises(anthropic.BadRequestError) as dropped:
        client.messages.create(model=SONNET, max_tokens=50, messages=rebuilt, tools=tools)  # type: ignore[arg-type]
    assert "thinking block is missing" in str(dropped.value)
    with pytest.raises(anthropic.BadRequestError) as forced:
        client.messages.create(
            model=SONNET,
            max_tokens=50,
            messages=asked,
            tools=tools,
            tool_choice={"type": "any"},  # type: ignore[arg-type]
        )
    assert FORCED_TOOL in str(forced.value)


def test_a_long_note_before_a_tool_call_lost_to_thinking_still_ends_in_an_answer(
    memory: Memory, fake: FakeAnthropic
) -> None:
    """Sonnet 5.5 returns such a note as an empty thinking block: the turn has no text yet, so the
    loop asks again with the tool's result, and the person gets the model's answer to it."""
    from core.follow_ups.capability import FollowUpRules, FollowUps

    note = "Sure. I will set that up for you now. It will come on this app. Give me a second."

    def answer(body: dict[str, Any]) -> Any:
        if tool_results(body):
            return "Done: I'll remind you in 30 minutes."
        scheduled = tool_use("schedule_follow_up", {"content": "Stretch.", "in_minutes": 30})
        return [{"type": "text", "text": note}, scheduled]

    fake.answer = answer
    model = AnthropicModel(api_key="sk-ant-test", model=SONNET, max_tokens=300, base_url=fake.url, max_retries=0)
    settings = TurnSettings(
        DEFAULT_SYSTEM_PROMPT, "FALLBACK", "NO", capabilities=(FollowUps(FollowUpRules(max_pending=5)),)
    )
    turns = Turns(memory, lambda: model, IdentityPolicy("auto"), settings)
    asked = TurnRequest(Surface.TELEGRAM, "remind me in 30 minutes to stretch", "n-1", user_id=uuid.uuid4())
    result = turns.run(asked)

    assert result.reply == "Done: I'll remind you in 30 minutes."
    assert result.figures.model_requests == 2
    first_answer = fake.requests[-1]["messages"][-2]["content"]
    assert [block["type"] for block in first_answer] == ["thinking", "thinking", "tool_use"]


def test_with_between_tools_a_long_note_before_a_tool_call_reaches_the_person(
    memory: Memory, fake: FakeAnthropic
) -> None:
    """ANTHROPIC_THINKING=between_tools (the default): no up-front thinking, and the note comes back
    as a thinking block with its text, said before the call: one request, as on Sonnet 5."""
    from core.follow_ups.capability import FollowUpRules, FollowUps

    note = "Sure. I will set that up for you now. It will come on this app. Give me a second."
    scheduled = tool_use("schedule_follow_up", {"content": "Stretch.", "in_minutes": 30}, "t1")
    fake.answer = lambda body: [{"type": "text", "text": note}, scheduled]
    model = AnthropicModel(
        api_key="sk-ant-test",
        model=SONNET,
        max_tokens=300,
        base_url=fake.url,
        max_retries=0,
        effort="low",
        thinking="between_tools",
    )
    settings = TurnSettings(
        DEFAULT_SYSTEM_PROMPT, "FALLBACK", "NO", capabilities=(FollowUps(FollowUpRules(max_pending=5)),)
    )
    turns = Turns(memory, lambda: model, IdentityPolicy("auto"), settings)
    asked = TurnRequest(Surface.TELEGRAM, "remind me in 30 minutes to stretch", "b-1", user_id=uuid.uuid4())
    result = turns.run(asked)

    assert result.outcome is Outcome.ANSWERED and result.reply == note
    assert result.figures.model_requests == 1
    (request,) = fake.requests
    assert request["thinking"] == {"type": "between_tools"} and request["output_config"] == {"effort": "low"}


def test_a_thinking_block_is_said_only_before_a_tool_call_and_only_with_between_tools(fake: FakeAnthropic) -> None:
    """Up-front reasoning never reaches the person: a thinking block followed by text is not said,
    nor any thinking block under adaptive thinking; a note before a call comes after the text
    already said, a paragraph apart."""
    signed = "s" * 64
    reasoning = {"type": "thinking", "thinking": "They want a reminder. Keep it short.", "signature": signed}
    called = tool_use("schedule_follow_up", {"content": "Stretch.", "in_minutes": 30}, "t1")
    asked = [ModelMessage(Role.USER, "remind me", ())]

    def said(thinking: Any, blocks: list[dict[str, Any]]) -> list[str]:
        fake.answer = lambda body: blocks
        model = AnthropicModel(
            api_key="sk-ant-test", model=SONNET, max_tokens=300, base_url=fake.url, thinking=thinking
        )
        return [chunk for chunk in model.stream("system", asked, 5.0, tools=[{"name": "x"}]) if isinstance(chunk, str)]

    note = {**reasoning, "thinking": "I will set that up now. One moment while I do."}
    assert said("between_tools", [reasoning, text_block("Fine.")]) == ["Fine."]
    assert said("between_tools", [text_block("Fine."), note, called]) == ["Fine.", "\n\n" + note["thinking"]]
    assert said("adaptive", [note, called]) == []


def test_the_fake_refuses_between_tools_where_the_model_does_not_take_it(fake: FakeAnthropic) -> None:
    client = sdk(fake)
    asked = [{"role": "user", "content": "hello"}]
    refused = {
        "claude-haiku-5-5": ({"type": "between_tools"}, None, "not supported for this model"),
        SONNET: ({"type": "between_tools"}, {"effort": "xhigh"}, "not supported at this effort"),
        "claude-sonnet-5-5 ": ({"type": "between_tools", "display": "summarized"}, None, "takes no other field"),
    }
    for model, (thinking, output, said) in refused.items():
        extra = {"output_config": output} if output else {}
        with pytest.raises(anthropic.BadRequestError, match=said):
            client.messages.create(
                model=model.strip(),
                max_tokens=50,
                messages=asked,  # type: ignore[arg-type]
                thinking=thinking,  # type: ignore[arg-type]
                **extra,  # type: ignore[arg-type]
            )
    taken = client.messages.create(
        model=SONNET,
        max_tokens=50,
        messages=asked,  # type: ignore[arg-type]
        thinking={"type": "between_tools"},
        output_config={"effort": "high"},
    )
    assert [block.type for block in taken.content] == ["text"]  # no up-front thinking block


def test_a_refused_answer_asked_whole_is_not_an_answer(fake: FakeAnthropic) -> None:
    """The digest's and a photo's description's request (not streamed): a refusal's text is no
    notes and no description."""
    fake.stop_reason = "refusal"
    fake.answer = lambda body: "The person said that"
    model = AnthropicModel(api_key="sk-ant-test", model=SONNET, max_tokens=300, base_url=fake.url, max_retries=0)
    with pytest.raises(ModelDeclined, match=r"^the model declined to answer \(cyber\)$") as declined:
        model.reply("summarise", [ModelMessage(Role.USER, "what did I say?", ())], 5.0)
    assert isinstance(declined.value, ModelUnavailable) and declined.value.category == "cyber"
