"""The tool loop's rounds (core/turn/tool_loop.py, TOOL_ROUNDS): a call in the answer to tool results
runs too; past the last round the model answers with `tool_choice` none; every request's tokens
count; the answer streams (the web) and drafts (Telegram) across rounds. Through `Turns`, the
real Anthropic SDK against the local fake as Sonnet 5.5 (a continuation must carry its thinking
back), and real Postgres."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from core.errors import ModelUnavailable
from core.identity.policy import IdentityPolicy
from core.memory.service import Memory
from core.model.llm import AnthropicModel, ToolCall
from core.models import Delivery, Role, Sent, Surface
from core.stores.postgres_store import PostgresStore
from core.turn import tool_loop
from core.turn.capabilities import DEFAULT_SYSTEM_PROMPT
from core.turn.context import ModelMessage
from core.turn.operator_tools import ANSWER_AFTER_S, OperatorTool, OperatorTools, OperatorToolset
from core.turn.request import Outcome, TurnRequest, TurnResult, TurnSettings
from core.turn.tool_loop import Toolbox, ToolResult
from core.turn.turns import Turns
from tests.fakes.anthropic_api import Answer, FakeAnthropic, text_block, tool_results, tool_use
from tests.helpers import MovedClock, context_limits, rows, turn_budget, web_turn

SONNET = "claude-sonnet-5-5"
READ = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


class Weather:
    """A tool that records each call it runs."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def __call__(self, arguments: dict[str, Any]) -> str:
        self.asked.append(arguments["city"])
        return f"{arguments['city']}: 21 degrees, clear."


@pytest.fixture
def fake() -> Iterator[FakeAnthropic]:
    server = FakeAnthropic()
    yield server
    server.close()


@pytest.fixture
def weather() -> Weather:
    return Weather()


def turns_with(
    store: PostgresStore, fake: FakeAnthropic, weather: Callable[[dict[str, Any]], str], rounds: int = 4
) -> Turns:
    tool = OperatorTool("weather", "Today's weather in a city.", SCHEMA, weather)
    settings = TurnSettings(
        DEFAULT_SYSTEM_PROMPT, "FALLBACK", "NO", capabilities=(OperatorTools((tool,)),), tool_rounds=rounds
    )
    model = AnthropicModel(api_key="sk-ant-test", model=SONNET, max_tokens=321, base_url=fake.url, max_retries=0)
    memory = Memory(store, context_limits(), turn_budget(tokens_per_day=10_000_000, reply_tokens=321))
    return Turns(memory, lambda: model, IdentityPolicy("auto"), settings)


def rounds_done(body: dict[str, Any]) -> int:
    """How many rounds of tool results the request carries."""
    return sum(1 for m in body["messages"] if m["role"] == "user" and tool_results({"messages": [m]}))


def spent(fake: FakeAnthropic, *texts: str) -> int:
    """Every token of the requests: what each read, and what each wrote (the fake counts a text's
    characters / 4, and one token for an answer that only calls a tool)."""
    return sum(usage[key] for usage in fake.usages for key in READ) + sum(max(1, len(t) // 4) for t in texts)


def stored_tokens(database_url: str, external_id: str) -> list[tuple[int, int]]:
    return rows(
        database_url,
        "select u.tokens, u.reserved from turn_usage u join messages m on m.id = u.message_id where m.external_id = %s",
        external_id,
    )


def madrid_then_lisbon(body: dict[str, Any]) -> Answer:
    done = rounds_done(body)
    if done == 0:
        return [tool_use("weather", {"city": "Madrid"}, id="w1")]
    if done == 1:  # the answer to the first results calls the tool again
        return [text_block("Madrid is warm. And Lisbon:"), tool_use("weather", {"city": "Lisbon"}, id="w2")]
    return "Both are sunny today."


def test_a_tool_call_in_the_answer_to_tool_results_runs_in_a_second_round(
    store: PostgresStore, fake: FakeAnthropic, weather: Weather, database_url: str
) -> None:
    """Seen failing with the loop ending after one round (the second call dropped, as before
    issue 33): the reply was "Madrid is warm. And Lisbon:" and Lisbon's weather never asked."""
    fake.answer = madrid_then_lisbon
    result = turns_with(store, fake, weather).run(
        TurnRequest(Surface.TELEGRAM, "weather in Madrid and Lisbon?", "r2-1", user_id=uuid.uuid4())
    )
    assert result.outcome is Outcome.ANSWERED
    assert result.reply == "Madrid is warm. And Lisbon:\n\nBoth are sunny today."
    assert weather.asked == ["Madrid", "Lisbon"]
    assert [tool_results(body) for body in fake.requests] == [
        [],
        [{"type": "tool_result", "tool_use_id": "w1", "content": "Madrid: 21 degrees, clear."}],
        [{"type": "tool_result", "tool_use_id": "w2", "content": "Lisbon: 21 degrees, clear."}],
    ]
    assert all("tool_choice" not in body for body in fake.requests)  # rounds left: the default, auto
    # Three requests, every one's tokens the turn's; two database round trips (the tool is not ours).
    assert (result.figures.model_requests, result.figures.round_trips) == (3, 2)
    assert (result.figures.tool_calls, result.figures.tool_errors) == (2, 0)  # the turn's log line
    written = ("", "Madrid is warm. And Lisbon:", "Both are sunny today.")
    assert result.figures.model_tokens == spent(fake, *written)
    assert stored_tokens(database_url, "r2-1") == [(spent(fake, *written), 0)]


def test_a_model_that_always_calls_a_tool_gets_tool_rounds_rounds_then_answers_without_tools(
    store: PostgresStore, fake: FakeAnthropic, weather: Weather, database_url: str
) -> None:
    """TOOL_ROUNDS=2: two rounds run, then one request with tool_choice none (the tools still
    defined: the results refer to them) whose text is the answer. Seen failing with that last
    request taken out (the turn answered "the model answered with no text": the fallback), and
    with the rounds not capped (a fourth request, the tool asked a third time)."""

    def always(body: dict[str, Any]) -> Answer:
        if body.get("tool_choice") == {"type": "none"}:
            return "From what I found: warm in both."
        return [tool_use("weather", {"city": f"City {rounds_done(body)}"}, id=f"c{rounds_done(body)}")]

    fake.answer = always
    result = turns_with(store, fake, weather, rounds=2).run(
        TurnRequest(Surface.TELEGRAM, "weather everywhere?", "cap-1", user_id=uuid.uuid4())
    )
    assert (result.outcome, result.reply) == (Outcome.ANSWERED, "From what I found: warm in both.")
    assert weather.asked == ["City 0", "City 1"]
    assert [body.get("tool_choice") for body in fake.requests] == [None, None, {"type": "none"}]
    assert all(body["tools"] == fake.requests[0]["tools"] for body in fake.requests)
    assert [len(tool_results(body)) for body in fake.requests] == [0, 1, 1]
    assert result.figures.model_requests == 3
    assert stored_tokens(database_url, "cap-1") == [(spent(fake, "", "", "From what I found: warm in both."), 0)]
    # The reservation covered every request the turn could make: the rounds and the answer after them.
    assert result.figures.reserved_tokens >= 3 * 321


class Drafts:
    """A Telegram-like channel: the drafts it was shown, and what it sent."""

    def __init__(self) -> None:
        self.drafts: list[str] = []
        self.sent: list[str] = []

    def show_typing(self, until: float) -> None:
        pass

    def draft(self, text: str) -> None:
        self.drafts.append(text)

    def send(self, text: str, until: float, first_part: int = 0) -> Sent:
        self.sent.append(text)
        return Sent(Delivery.DELIVERED, 1)


def test_drafts_and_the_web_stream_follow_the_answer_across_rounds(
    store: PostgresStore, fake: FakeAnthropic, weather: Weather, database_url: str
) -> None:
    fake.answer = madrid_then_lisbon
    turns = turns_with(store, fake, weather)
    channel = Drafts()
    turns.run(TurnRequest(Surface.TELEGRAM, "weather?", "d-1", user_id=uuid.uuid4()), channel)
    assert channel.drafts[0] == "Madrid "
    assert channel.drafts[-1] == channel.sent[-1] == "Madrid is warm. And Lisbon:\n\nBoth are sunny today."
    assert "Madrid is warm. And Lisbon:\n\nBoth " in channel.drafts  # the second round's text follows the first

    person = uuid.uuid4()
    web = turns.memory.create_conversation(person)
    streamed = list(turns.stream(TurnRequest(Surface.WEB, "weather?", "w-1", user_id=person, conversation_id=web.id)))
    *chunks, result = streamed
    assert isinstance(result, TurnResult) and result.outcome is Outcome.ANSWERED
    assert "".join(str(chunk) for chunk in chunks) == "Madrid is warm. And Lisbon:\n\nBoth are sunny today."
    assert len(chunks) > 2 and result.figures.model_requests == 3
    assert weather.asked == ["Madrid", "Lisbon", "Madrid", "Lisbon"]


class FailingToolset:
    """A built-in toolset with a bug: its run raises."""

    definitions = ({"name": "broken", "description": "fails", "input_schema": {"type": "object"}},)
    round_trips = 0

    def run(self, call: ToolCall) -> ToolResult:
        raise OverflowError("date value out of range")

    def must_answer(self, result: ToolResult) -> bool:
        return False

    def recorded(self) -> dict[str, Any]:
        return {}


def test_a_failure_of_ours_in_a_tool_is_said_back_as_an_error_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    call = ToolCall("t-1", "broken", {})
    result, must_see = Toolbox([FailingToolset()], 4).run(call)
    failed = "Not done: the tool failed. Answer without it, and tell the person you could not do this now."
    assert (result, must_see) == (ToolResult(call, failed, is_error=True), True)
    assert [(r.getMessage(), r.__dict__["tool"], r.__dict__["error"]) for r in caplog.records] == [
        ("tool failed", "broken", "OverflowError")
    ]
    assert caplog.records[0].__dict__["where"][-1].startswith("test_tool_rounds.py:")  # the frame that raised
    assert "date value out of range" not in caplog.text  # its message is not logged


def test_a_tool_that_raises_is_said_back_and_the_turn_answers(
    store: PostgresStore, fake: FakeAnthropic, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(arguments: dict[str, Any]) -> str:
        raise TimeoutError("the weather service did not answer")

    fake.answer = lambda body: "No weather now." if tool_results(body) else [tool_use("weather", {"city": "Oslo"})]
    result = turns_with(store, fake, broken).run(
        TurnRequest(Surface.TELEGRAM, "weather in Oslo?", "e-1", user_id=uuid.uuid4())
    )
    assert (result.outcome, result.reply) == (Outcome.ANSWERED, "No weather now.")
    [said] = tool_results(fake.requests[-1])
    assert (said["content"], said.get("is_error")) == ("Not done: weather failed. Answer without it.", True)
    [failed] = [record for record in caplog.records if record.getMessage() == "an operator's tool failed"]
    assert (failed.__dict__["tool"], failed.__dict__["error"]) == ("weather", "TimeoutError")
    assert failed.__dict__["where"][-1].endswith(" broken")  # the operator's function that raised
    assert "did not answer" not in caplog.text  # its message is not logged: it may hold the person's words


def test_a_tool_that_raises_a_base_exception_is_said_back_as_its_own_failure(
    store: PostgresStore, fake: FakeAnthropic, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """asyncio's CancelledError is no Exception. Seen failing (an extension's try): it ended the
    tool's thread, Python printed it on stderr with its message (here a key), and the empty outcome
    failed the toolset, logged as a ValueError of operator_tools.py."""
    printed: list[object] = []
    monkeypatch.setattr(threading, "excepthook", printed.append)  # what Python prints a thread's end with

    def cancelled(arguments: dict[str, Any]) -> str:
        raise asyncio.CancelledError("upstream cancelled: key=sk_live_SECRET")

    fake.answer = lambda body: "No weather now." if tool_results(body) else [tool_use("weather", {"city": "Oslo"})]
    result = turns_with(store, fake, cancelled).run(
        TurnRequest(Surface.TELEGRAM, "weather in Oslo?", "base-1", user_id=uuid.uuid4())
    )
    assert (result.outcome, result.reply) == (Outcome.ANSWERED, "No weather now.")
    [said] = tool_results(fake.requests[-1])
    assert (said["content"], said.get("is_error")) == ("Not done: weather failed. Answer without it.", True)
    failures = [r for r in caplog.records if r.name == "crossmem.tools"]
    assert [(r.getMessage(), r.__dict__["tool"], r.__dict__["error"]) for r in failures] == [
        ("an operator's tool failed", "weather", "CancelledError")
    ]
    assert failures[0].__dict__["where"][-1].endswith(" cancelled")
    assert printed == [] and "SECRET" not in caplog.text
    # The turn's own line says a tool failed in it: the tools' line names no person nor turn.
    assert (result.figures.tool_calls, result.figures.tool_errors) == (1, 1)


def test_a_tool_result_utf8_cannot_carry_reaches_the_model_readable(store: PostgresStore, fake: FakeAnthropic) -> None:
    """A lone surrogate in a tool's text (a file name decoded with surrogateescape): seen failing,
    the request with the result could not be encoded (UnicodeEncodeError), so the person got the
    fallback and the model never saw the result."""
    fake.answer = lambda body: "Found it." if tool_results(body) else [tool_use("weather", {"city": "Oslo"})]
    listing = b"caf\xe9.txt".decode("utf-8", "surrogateescape")
    result = turns_with(store, fake, lambda arguments: f"files: {listing} \U0001f600").run(
        TurnRequest(Surface.TELEGRAM, "which files?", "surrogate-1", user_id=uuid.uuid4())
    )
    assert (result.outcome, result.reply) == (Outcome.ANSWERED, "Found it.")
    [said] = tool_results(fake.requests[-1])
    assert said["content"] == "files: caf\ufffd.txt \U0001f600"


@pytest.mark.parametrize("streamed", [False, True])
def test_a_tool_that_hangs_is_answered_as_not_done_while_the_model_can_still_answer(
    store: PostgresStore, fake: FakeAnthropic, streamed: bool
) -> None:
    """An operator's tool making a network call without a timeout: it is waited for until the model
    would have too little of the turn's time left to answer (`ANSWER_AFTER_S`), then said back as
    not done, and the turn answers on time, the call still hanging. A reliability review's finding:
    the web's stream waited for the whole hang, and on Telegram the model was asked again after the
    turn had given up."""
    release = threading.Event()
    hanging: list[dict[str, Any]] = []

    def weather(arguments: dict[str, Any]) -> str:
        hanging.append(arguments)
        release.wait(30)
        return "sunny"

    fake.answer = lambda body: "No weather now." if tool_results(body) else [tool_use("weather", {"city": "Oslo"})]
    turns = turns_with(store, fake, weather)
    person = uuid.uuid4()
    web = turns.memory.create_conversation(person)
    asked = TurnRequest(
        Surface.WEB, "weather?", f"hang-{streamed}", user_id=person, conversation_id=web.id, deadline_s=3.5
    )
    try:
        if streamed:
            *chunks, result = turns.stream(asked)
            assert "".join(str(chunk) for chunk in chunks) == "No weather now."
        else:
            result = turns.run(asked)
        assert not release.is_set() and hanging == [{"city": "Oslo"}]  # answered while the call hangs
    finally:
        release.set()
    assert isinstance(result, TurnResult) and (result.outcome, result.reply) == (Outcome.ANSWERED, "No weather now.")
    [said] = tool_results(fake.requests[-1])
    assert (said["content"], said.get("is_error")) == (
        "weather did not answer in time: it may or may not have been done. Answer without it.",
        True,
    )
    assert len(fake.requests) == 2


def test_no_round_is_asked_once_the_turn_has_given_up(fake: FakeAnthropic) -> None:
    """The turn stopped waiting while a tool ran (its time is up): the loop asks the model nothing
    more, a request nobody would read and nobody would count. Seen failing with a second request."""
    fake.answer = lambda body: "Sunny." if tool_results(body) else [tool_use("weather", {"city": "Oslo"})]
    tool = OperatorTool("weather", "Today's weather in a city.", SCHEMA, lambda arguments: "sunny")
    tools = Toolbox([OperatorToolset((tool,), (tool.definition,))], 4)
    model = AnthropicModel(api_key="sk-ant-test", model=SONNET, max_tokens=321, base_url=fake.url, max_retries=0)
    asked = [ModelMessage(Role.USER, "weather?", ())]
    with pytest.raises(ModelUnavailable, match="ran out during a tool's call"):
        list(tool_loop.answered(model, "be brief", asked, 30.0, "", tools, lambda: True))
    assert len(fake.requests) == 1


@pytest.mark.parametrize("streamed", [False, True])
def test_what_led_into_a_tool_is_no_answer_when_the_turns_time_ran_out_during_it(
    store: PostgresStore, fake: FakeAnthropic, database_url: str, streamed: bool
) -> None:
    """ "Let me check." and a call whose round ends past the turn's deadline: the person gets the
    fallback and the message stays owed; the lead-in is not stored as the answer (a diff review's
    finding, when the loop's stop returned quietly)."""
    clock = MovedClock()

    def weather(arguments: dict[str, Any]) -> str:
        clock.now += 31.0  # a slow call: the turn's 30 s are up when it returns
        return "sunny"

    fake.answer = lambda body: (
        "Sunny in Oslo." if tool_results(body) else [text_block("Let me check."), tool_use("weather", {"city": "Oslo"})]
    )
    turns = turns_with(store, fake, weather)
    turns._clock = clock
    person = uuid.uuid4()
    result = web_turn(turns, person, "weather?", f"lead-{streamed}", streamed=streamed)
    assert result.outcome is Outcome.FALLBACK and len(fake.requests) == 1
    stored = rows(database_url, "select role from messages where user_id = %s", person)
    assert stored == [("user",)]


def test_a_tool_called_with_no_time_left_to_wait_for_it_is_not_run() -> None:
    """With ANSWER_AFTER_S or less of the turn left, the call is not started: a call the model is
    told was not done is never done behind its back (a diff review's finding: a booking made while
    the model said it had not been)."""
    ran = threading.Event()

    def book(arguments: dict[str, Any]) -> str:
        ran.set()
        return "booked"

    tool = OperatorTool("book", "Book a table.", SCHEMA, book)
    call = ToolCall("t1", "book", {"city": "Oslo"})
    result = OperatorToolset((tool,), (tool.definition,), lambda: ANSWER_AFTER_S).run(call)
    assert result == ToolResult(call, "Not done: no time was left to run book. Answer without it.", is_error=True)
    assert not ran.wait(0.2)
