"""The model turn against a local fake of Anthropic's API, with the real SDK and Postgres."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterator
from dataclasses import replace
from zoneinfo import ZoneInfo

import psycopg
import pytest

from core.follow_ups.capability import FollowUpRules, FollowUps
from core.identity.policy import IdentityPolicy
from core.memory.service import Memory
from core.model.llm import AnthropicModel
from core.model.offline_model import OfflineModel
from core.models import Role, Surface
from core.stores.postgres_store import PostgresStore
from core.turn.capabilities import DEFAULT_SYSTEM_PROMPT, standing_instructions
from core.turn.context import ContextItem, build_model_messages
from core.turn.request import Outcome, TurnRequest, TurnResult, TurnSettings
from core.turn.turns import Turns
from tests.fakes.anthropic_api import FakeAnthropic, text_block, tool_results, tool_use
from tests.helpers import context_limits, rows, turn_budget, web_turn

SETTINGS = TurnSettings(system_prompt=DEFAULT_SYSTEM_PROMPT, fallback_reply="FALLBACK", stranger_reply="NO")


@pytest.fixture
def fake() -> Iterator[FakeAnthropic]:
    server = FakeAnthropic()
    yield server
    server.close()


def claude(fake: FakeAnthropic, retries: int = 0) -> AnthropicModel:
    return AnthropicModel(
        api_key="sk-ant-test", model="claude-test-1", max_tokens=321, base_url=fake.url, max_retries=retries
    )


@pytest.fixture
def turns(memory: Memory, fake: FakeAnthropic) -> Turns:
    model = claude(fake)
    return Turns(memory, lambda: model, IdentityPolicy("auto"), SETTINGS)


def say(turns: Turns, surface: Surface, text: str, user: uuid.UUID, external_id: str | None = None) -> TurnResult:
    request = TurnRequest(surface, text, external_id or uuid.uuid4().hex, user_id=user, deadline_s=30)
    return turns.run(request)


def test_the_request_carries_the_cross_surface_context(turns: Turns, fake: FakeAnthropic) -> None:
    person = uuid.uuid4()
    say(turns, Surface.WHATSAPP, "my budget is 900 euros", person)
    say(turns, Surface.TELEGRAM, "and I leave on Friday", person)
    result = say(turns, Surface.WHATSAPP, "what was my budget?", person)
    assert (
        result.outcome is Outcome.ANSWERED
        and result.reply == "Claude heard: " + fake.requests[-1]["messages"][-1]["content"][0]["text"]
    )
    body = fake.requests[-1]
    assert body["model"] == "claude-test-1" and body["max_tokens"] == 321
    assert body["system"] == [{"type": "text", "text": DEFAULT_SYSTEM_PROMPT, "cache_control": {"type": "ephemeral"}}]
    roles = [message["role"] for message in body["messages"]]
    assert roles == ["user", "assistant", "user", "assistant", "user"]
    texts = [message["content"][0]["text"] for message in body["messages"]]
    assert texts[0].startswith("[whatsapp · ") and texts[0].endswith("] my budget is 900 euros")
    assert texts[2].startswith("[telegram · ") and texts[2].endswith("] and I leave on Friday")
    assert texts[1] == "Claude heard: " + fake.requests[0]["messages"][0]["content"][0]["text"]
    marked = [i for i, m in enumerate(body["messages"]) if "cache_control" in m["content"][-1]]
    assert marked == [4]
    sent = fake.headers[-1]
    assert sent.get("x-api-key") == "sk-ant-test" or sent.get("authorization") == "Bearer sk-ant-test"


def test_thirty_turns_over_three_surfaces_keep_the_prefix_except_at_steps(turns: Turns, fake: FakeAnthropic) -> None:
    person = uuid.uuid4()
    surfaces = [Surface.TELEGRAM, Surface.WHATSAPP, Surface.WEB]
    web = turns.memory.create_conversation(person)
    for turn in range(30):
        surface = surfaces[turn % 3]
        request = TurnRequest(
            surface,
            f"turn {turn}: something worth remembering",
            f"e{turn}",
            user_id=person,
            conversation_id=web.id if surface is Surface.WEB else None,
            deadline_s=30,
        )
        assert turns.run(request).outcome is Outcome.ANSWERED
    limits = turns.memory.limits

    def window_start(turn: int) -> int:
        count = 2 * turn + 1
        if count <= limits.max_messages:
            return 0
        return -(-(count - limits.max_messages) // limits.window_step) * limits.window_step

    # The web sees its own thread plus the other surfaces: compare the secondary turns' requests.
    secondary = [(turn, body) for turn, body in enumerate(fake.requests) if surfaces[turn % 3].is_secondary]
    breaks, steps = [], []
    for (before_turn, before), (turn, after) in zip(secondary, secondary[1:], strict=False):
        assert after["system"] == before["system"]
        old = [m["content"][0]["text"] for m in before["messages"]]
        new = [m["content"][0]["text"] for m in after["messages"]]
        if new[: len(old)] != old:
            breaks.append(turn)
        if window_start(turn) != window_start(before_turn):
            steps.append(turn)
    assert steps, "the conversation is long enough for the window to move"
    assert breaks == steps
    assert len(fake.requests) == 30
    assert all(len(body["messages"]) <= limits.max_messages for _, body in secondary)


def test_odd_histories_still_make_a_valid_request(memory: Memory, fake: FakeAnthropic) -> None:
    items = [
        ContextItem(Role.ASSISTANT, "a reply whose question fell out of the window", Surface.TELEGRAM),
        ContextItem(Role.USER, "   ", Surface.WEB),
        ContextItem(Role.USER, "first question (its reply was lost)", Surface.TELEGRAM),
        ContextItem(Role.USER, "second question", Surface.WHATSAPP),
        ContextItem(Role.ASSISTANT, "", Surface.WHATSAPP),
        ContextItem(Role.ASSISTANT, "an answer", Surface.WHATSAPP),
        ContextItem(Role.USER, "latest", Surface.WEB),
        ContextItem(Role.ASSISTANT, "trailing", Surface.WEB),
    ]
    messages = build_model_messages(items, annotate=False)
    assert [(m.role, m.content) for m in messages] == [
        (Role.USER, "first question (its reply was lost)\n\nsecond question"),
        (Role.ASSISTANT, "an answer"),
        (Role.USER, "latest"),
    ]
    reply = claude(fake).reply("system", messages, 5)
    assert reply.text == "Claude heard: latest"
    # Through the store: two user messages in a row are merged in the request.
    person = uuid.uuid4()
    turns = Turns(memory, lambda: claude(fake), IdentityPolicy("auto"), SETTINGS)
    fake.behaviour = "500"
    assert say(turns, Surface.TELEGRAM, "one", person).outcome is Outcome.FALLBACK
    fake.behaviour = "ok"
    say(turns, Surface.TELEGRAM, "two", person)
    sent = fake.requests[-1]["messages"]
    assert [m["role"] for m in sent] == ["user"]
    assert sent[0]["content"][0]["text"].endswith("] one\n\n" + sent[0]["content"][0]["text"].split("\n\n")[1])
    assert sent[0]["content"][0]["text"].endswith("] two")


@pytest.mark.parametrize("behaviour", ["500", "529", "slow", "malformed"])
def test_a_failing_model_gets_the_fallback_and_the_message_is_kept_once(
    memory: Memory, fake: FakeAnthropic, database_url: str, caplog: pytest.LogCaptureFixture, behaviour: str
) -> None:
    fake.behaviour = behaviour
    model = claude(fake, retries=1)
    turns = Turns(memory, lambda: model, IdentityPolicy("auto"), SETTINGS)
    person = uuid.uuid4()
    with caplog.at_level(logging.INFO, logger="crossmem"):
        result = turns.run(TurnRequest(Surface.TELEGRAM, "are you there?", "u1", user_id=person, deadline_s=1.5))
    assert result.outcome is Outcome.FALLBACK and result.reply == "FALLBACK"
    with psycopg.connect(database_url) as connection:
        rows = connection.execute("select role, content from messages where user_id = %s", (person,)).fetchall()
    assert rows == [("user", "are you there?")]
    turn_lines = [record for record in caplog.records if record.getMessage() == "turn"]
    assert len(turn_lines) == 1
    reason = turn_lines[0].error  # type: ignore[attr-defined]
    expected = {"500": "answered 500", "529": "answered 529", "slow": "within 1.5 s", "malformed": "unusable"}
    assert expected[behaviour] in reason


def test_one_json_log_line_per_turn_with_its_figures(
    turns: Turns, fake: FakeAnthropic, capsys: pytest.CaptureFixture[str]
) -> None:
    from functions.logs import configure_json_logging

    configure_json_logging()
    person = uuid.uuid4()
    long_text = "I keep a long note here. " * 200  # past the minimum cacheable length with the system prompt
    say(turns, Surface.TELEGRAM, long_text, person)
    say(turns, Surface.TELEGRAM, "and a short follow-up", person)
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if '"message": "turn"' in line]
    assert len(lines) == 2
    second = lines[1]
    assert second["severity"] == "INFO" and second["surface"] == "telegram" and second["outcome"] == "answered"
    assert second["round_trips"] == 2 and second["latency_ms"] > 0
    assert second["cache_read_tokens"] > 1000 and second["cache_creation_tokens"] > 0
    assert "sk-ant-test" not in json.dumps(lines)
    logging.getLogger("crossmem").handlers.clear()


def test_streaming_turn_yields_chunks_and_stores_the_streamed_text(
    turns: Turns, fake: FakeAnthropic, database_url: str
) -> None:
    person = uuid.uuid4()
    web = turns.memory.create_conversation(person)
    events = list(
        turns.stream(TurnRequest(Surface.WEB, "tell me a story", "c1", user_id=person, conversation_id=web.id))
    )
    *chunks, result = events
    assert isinstance(result, TurnResult) and result.outcome is Outcome.ANSWERED
    assert len(chunks) > 1
    with psycopg.connect(database_url) as connection:
        stored = connection.execute(
            "select content from messages where user_id = %s and role = 'assistant'", (person,)
        ).fetchone()
    assert stored == ("".join(str(chunk) for chunk in chunks),)


def test_a_stream_the_client_leaves_counts_at_least_the_text_it_was_sent(
    store: PostgresStore, fake: FakeAnthropic, database_url: str
) -> None:
    """The stream's last event, which says what the model wrote, never comes: the text the client
    was sent since the model last said counts (about four characters a token), beside what the
    model reported."""
    model = claude(fake)
    budgeted = Memory(store, context_limits(), turn_budget(tokens_per_day=1_000_000))
    turns = Turns(budgeted, lambda: model, IdentityPolicy("auto"), SETTINGS)
    fake.answer = lambda body: "alpha bravo charlie delta echo foxtrot golf hotel india juliet"
    person = uuid.uuid4()
    web = budgeted.create_conversation(person)
    stream = turns.stream(TurnRequest(Surface.WEB, "a long story", "c-left", user_id=person, conversation_id=web.id))
    assert [next(stream), next(stream), next(stream)] == ["alpha ", "bravo ", "charlie "]
    stream.close()  # the tab is closed
    reported = fake.usages[-1]  # message_start's: the input, and 1 output token so far
    read = reported["input_tokens"] + reported["cache_creation_input_tokens"] + reported["cache_read_input_tokens"]
    assert reported["output_tokens"] == 1 and read > 0
    with psycopg.connect(database_url) as connection:
        counted = connection.execute(
            "select u.tokens from turn_usage u join messages m on m.id = u.message_id where m.external_id = 'c-left'"
        ).fetchall()
    assert counted == [(read + 1 + len("alpha bravo charlie ") // 4,)]


def test_a_stream_left_after_a_tool_call_counts_both_requests_and_the_text_since(
    store: PostgresStore, fake: FakeAnthropic, database_url: str
) -> None:
    """The first request asks for the follow-ups' list and its count arrives; the second streams
    text and the client leaves: both requests' reported tokens and the text since count."""
    model = claude(fake)
    budgeted = Memory(store, context_limits(), turn_budget(tokens_per_day=1_000_000))
    tools_on = replace(SETTINGS, capabilities=(FollowUps(FollowUpRules()),))
    turns = Turns(budgeted, lambda: model, IdentityPolicy("auto"), tools_on)
    fake.answer = lambda body: (
        "alpha bravo charlie delta echo foxtrot golf hotel" if tool_results(body) else [tool_use("list_follow_ups", {})]
    )
    person = uuid.uuid4()
    web = budgeted.create_conversation(person)
    asked = TurnRequest(Surface.WEB, "what is planned?", "c-tools", user_id=person, conversation_id=web.id)
    stream = turns.stream(asked)
    assert [next(stream), next(stream)] == ["alpha ", "bravo "]
    stream.close()
    assert len(fake.usages) == 2  # each as the stream first reports it: 1 output token so far
    reported = sum(
        usage[key]
        for usage in fake.usages
        for key in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens", "output_tokens")
    )
    with psycopg.connect(database_url) as connection:
        counted = connection.execute(
            "select u.tokens from turn_usage u join messages m on m.id = u.message_id where m.external_id = 'c-tools'"
        ).fetchall()
    assert counted == [(reported + len("alpha bravo ") // 4,)]


def test_a_stream_left_while_the_fallback_is_sent_counts_no_output_for_it(
    store: PostgresStore, fake: FakeAnthropic, database_url: str
) -> None:
    """The model failed before writing (a 500): the fallback is ours, not the model's output."""
    model = claude(fake)
    budgeted = Memory(store, context_limits(), turn_budget(tokens_per_day=1_000_000))
    turns = Turns(budgeted, lambda: model, IdentityPolicy("auto"), SETTINGS)
    fake.behaviour = "500"
    person = uuid.uuid4()
    web = budgeted.create_conversation(person)
    stream = turns.stream(TurnRequest(Surface.WEB, "hello?", "c-down", user_id=person, conversation_id=web.id))
    assert next(stream) == "FALLBACK"
    stream.close()
    with psycopg.connect(database_url) as connection:
        counted = connection.execute(
            "select u.tokens from turn_usage u join messages m on m.id = u.message_id where m.external_id = 'c-down'"
        ).fetchall()
    assert counted == [(0,)]


def test_the_offline_model_shows_the_memory_at_work(store: PostgresStore) -> None:
    turns = Turns(Memory(store, context_limits()), OfflineModel, IdentityPolicy("auto"), SETTINGS)
    person = uuid.uuid4()
    say(turns, Surface.TELEGRAM, "my cat is called Mishka", person)
    reply = say(turns, Surface.WHATSAPP, "what's my cat's name?", person).reply or ""
    assert "offline stand-in" in reply.lower()
    assert "2 earlier messages" in reply and "from telegram" in reply
    assert '"my cat is called Mishka"' in reply
    assert OfflineModel.compose([]) == OfflineModel.compose([])


def test_the_context_tags_read_the_persons_clock_else_the_configured_one(
    memory: Memory, fake: FakeAnthropic, database_url: str
) -> None:
    """A person with a timezone (set by the web client or a follow-up) sees their messages'
    times in it, as the follow-up tools read "now"; anyone else in CONTEXT_TIMEZONE."""
    model = claude(fake)
    turns = Turns(memory, lambda: model, IdentityPolicy("auto"), replace(SETTINGS, timezone="America/New_York"))
    abroad, other = uuid.uuid4(), uuid.uuid4()
    with psycopg.connect(database_url, autocommit=True) as connection:
        connection.execute("insert into person_timezones (user_id, timezone) values (%s, 'Asia/Kathmandu')", (abroad,))
    for person, zone in ((abroad, ZoneInfo("Asia/Kathmandu")), (other, ZoneInfo("America/New_York"))):
        for text in ("the dentist is at nine", "when is it?"):
            # A deadline no cold start of the SDK can miss: a fallback would store no reply.
            result = turns.run(TurnRequest(Surface.TELEGRAM, text, uuid.uuid4().hex, user_id=person, deadline_s=60))
            assert result.outcome is Outcome.ANSWERED
        with psycopg.connect(database_url) as connection:
            row = connection.execute(
                "select created_at from messages where user_id = %s and content = 'the dentist is at nine'", (person,)
            ).fetchone()
        assert row is not None
        shown = row[0].astimezone(zone)
        first = fake.requests[-1]["messages"][0]["content"][0]["text"]
        day = f"{shown:%a} {shown.day} {shown:%b %Y}"  # its day's first message: the whole date
        assert first == f"[telegram · {day} · {shown.hour:02d}:{shown.minute:02d}] the dentist is at nine"


def test_the_turn_that_brings_a_web_clients_timezone_tags_its_context_on_it(
    memory: Memory, fake: FakeAnthropic, database_url: str
) -> None:
    """The browser's zone becomes the person's at the turn's end, and the follow-up tools read "now"
    on it in that turn already: its tags did not, and a person in Kathmandu writing for the first
    time (or back from Tokyo) read their own message tagged on CONTEXT_TIMEZONE's (or Tokyo's) clock,
    another day near midnight, in the very turn whose "tomorrow at 9" the tools read on theirs."""
    model = claude(fake)
    turns = Turns(memory, lambda: model, IdentityPolicy("auto"), replace(SETTINGS, timezone="America/New_York"))
    new, back = uuid.uuid4(), uuid.uuid4()
    with psycopg.connect(database_url, autocommit=True) as connection:
        connection.execute("insert into person_timezones (user_id, timezone) values (%s, 'Asia/Tokyo')", (back,))
    for person in (new, back):
        web = memory.create_conversation(person).id
        asked = TurnRequest(
            Surface.WEB,
            "remind me tomorrow at 9",
            uuid.uuid4().hex,
            user_id=person,
            conversation_id=web,
            timezone="Asia/Kathmandu",
            deadline_s=60,
        )
        assert turns.run(asked).outcome is Outcome.ANSWERED
        [(created,)] = rows(
            database_url, "select created_at from messages where user_id = %s and role = 'user'", person
        )
        shown = created.astimezone(ZoneInfo("Asia/Kathmandu"))
        said = fake.requests[-1]["messages"][-1]["content"][0]["text"]
        assert said == (f"[web · {shown:%a} {shown.day} {shown:%b %Y} · {shown:%H:%M}] remind me tomorrow at 9")


@pytest.mark.parametrize("follow_ups", [20, 0])
def test_the_web_clients_timezone_becomes_the_persons_with_follow_ups_on_or_off(
    memory: Memory, fake: FakeAnthropic, database_url: str, follow_ups: int
) -> None:
    """docs/api.md: the browser's Intl timezone becomes the person's when it differs. It was set
    by the follow-up tools alone: with FOLLOW_UPS_PER_PERSON=0, never (a review's finding)."""
    able = (FollowUps(FollowUpRules(max_pending=follow_ups)),)
    settings = replace(SETTINGS, system_prompt=standing_instructions("Be brief.", able), capabilities=able)
    model = claude(fake)
    turns = Turns(memory, lambda: model, IdentityPolicy("auto"), settings)
    person = uuid.uuid4()
    web = memory.create_conversation(person).id
    asked = TurnRequest(
        Surface.WEB, "hello", uuid.uuid4().hex, user_id=person, conversation_id=web, timezone="Asia/Tokyo"
    )
    assert turns.run(asked).outcome is Outcome.ANSWERED
    assert rows(database_url, "select timezone from person_timezones where user_id = %s", person) == [("Asia/Tokyo",)]
    assert ("tools" in fake.requests[-1]) is (follow_ups > 0)


@pytest.mark.parametrize("streamed", [False, True])
def test_a_tool_call_cut_by_max_tokens_is_never_run(
    memory: Memory, fake: FakeAnthropic, database_url: str, streamed: bool
) -> None:
    """The model ran out of tokens writing a call: the SDK parses its input as far as it goes
    ({"content": "Call the" of "Call the dentist about Friday"}), which must not be done. The turn
    falls back, the tokens count, nothing is scheduled, and the message is owed to be asked again.
    Seen failing with the cut reminder scheduled."""
    model = claude(fake)
    turns = Turns(
        memory, lambda: model, IdentityPolicy("auto"), replace(SETTINGS, capabilities=(FollowUps(FollowUpRules()),))
    )
    fake.stop_reason = "max_tokens"
    call = tool_use("schedule_follow_up", {"content": "Call the dentist about Friday", "in_minutes": 30})
    fake.answer = lambda body: [text_block("I'll remind you."), call]
    person = uuid.uuid4()
    web = memory.create_conversation(person)
    asked = TurnRequest(Surface.WEB, "remind me", f"cut-{streamed}", user_id=person, conversation_id=web.id)
    if streamed:
        *chunks, result = turns.stream(asked)
        assert "".join(str(chunk) for chunk in chunks) == "I'll remind you.\n\nFALLBACK"
    else:
        result = turns.run(asked)
        assert result.reply == "FALLBACK"
    assert isinstance(result, TurnResult) and result.outcome is Outcome.FALLBACK
    assert result.figures.error == "the model's answer was cut inside a tool call (max_tokens)"
    assert result.figures.output_tokens == len("I'll remind you.") // 4 and len(fake.requests) == 1
    with psycopg.connect(database_url) as connection:
        scheduled = connection.execute("select count(*) from follow_ups where user_id = %s", (person,)).fetchone()
        stored = connection.execute("select role from messages where user_id = %s", (person,)).fetchall()
    assert scheduled == (0,) and stored == [("user",)]


@pytest.mark.parametrize("streamed", [False, True])
def test_an_unfinished_answer_is_not_stored_as_one(
    turns: Turns, fake: FakeAnthropic, database_url: str, streamed: bool
) -> None:
    """A stream that ended cleanly before the model said why it stopped: the person gets the
    fallback, nothing of it is stored, and the message stays owed. Seen failing with the cut text
    stored as the answer. (A refusal: test_declined_turns.py.)"""
    fake.ends_early = True
    fake.answer = lambda body: "Sure, here is how to"
    person = uuid.uuid4()
    result = web_turn(turns, person, "how?", f"unfinished-{streamed}", streamed=streamed)
    assert result.outcome is Outcome.FALLBACK and result.figures.error == "the model's answer ended before its end"
    with psycopg.connect(database_url) as connection:
        stored = connection.execute("select role from messages where user_id = %s", (person,)).fetchall()
    assert stored == [("user",)]


@pytest.mark.parametrize("streamed", [False, True])
def test_a_turn_the_database_cannot_begin_is_told_its_tools_are_not_there(
    store: PostgresStore, fake: FakeAnthropic, streamed: bool
) -> None:
    """The database is down as the person asks "remind me tomorrow at 9": the turn answers from
    nothing, without tools (nothing they decide could be written). Seen failing: the model was
    sent no tools under a prompt that says it can schedule follow-ups, so it could say "I'll remind
    you" for a reminder that never existed. The prompt now ends by saying its tools are not there
    for this message; a turn with its tools is sent the prompt alone."""
    from core.turn.capabilities import DEFAULT_CAPABILITIES, WITHOUT_TOOLS
    from tests.helpers import FailingStore

    model = claude(fake)
    settings = replace(SETTINGS, capabilities=DEFAULT_CAPABILITIES)
    down = FailingStore(store, {"begin_turn"})
    turns = Turns(Memory(down, context_limits()), lambda: model, IdentityPolicy("auto"), settings)
    fake.answer = lambda body: "I can't set that just now."
    person = uuid.uuid4()
    asked = TurnRequest(Surface.TELEGRAM, "remind me tomorrow at 9", "down-1", user_id=person, deadline_s=30)
    result = list(turns.stream(asked))[-1] if streamed else turns.run(asked)
    assert isinstance(result, TurnResult) and result.figures.degraded
    assert "tools" not in fake.requests[-1]
    assert fake.requests[-1]["system"][0]["text"] == DEFAULT_SYSTEM_PROMPT + WITHOUT_TOOLS
    assert WITHOUT_TOOLS == (
        "\nJust now\n- None of the tools described above can be used for this message: do not say you did what"
        " one of them does (a reminder set or cancelled, a search made). If the person asks for one, say you"
        " cannot do it at this moment and ask them to send it again in a few minutes.\n"
    )
    down.failing = set()
    say(
        Turns(Memory(down, context_limits()), lambda: model, IdentityPolicy("auto"), settings),
        Surface.TELEGRAM,
        "hi",
        person,
    )
    assert "tools" in fake.requests[-1] and fake.requests[-1]["system"][0]["text"] == DEFAULT_SYSTEM_PROMPT
