"""Memory search: the search_memory tool in a turn (the real SDK against the fake Anthropic
server), and the SQL function behind it on the real Postgres: privacy, forgetting, ranking."""

from __future__ import annotations

import json
import logging
import random
import uuid
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest

from core.identity.policy import IdentityPolicy
from core.memory.search import SEARCH_MEMORY, TOOL, MemorySearch, MemorySearchTools, SearchRules, rendered
from core.memory.service import Memory
from core.model.llm import AnthropicModel, ToolCall, approximate_tokens
from core.model.offline_model import OfflineModel
from core.models import Role, StoredMessage, Surface, TurnStart
from core.stores.postgres_store import PostgresStore
from core.stores.store import UnavailableStore
from core.turn.capabilities import DEFAULT_SYSTEM_PROMPT, TurnState
from core.turn.context import ContextItem
from core.turn.request import Outcome, TurnRequest, TurnSettings
from core.turn.turns import Turns
from tests.fakes.anthropic_api import Answer, FakeAnthropic, text_block, tool_results, tool_use
from tests.helpers import FailingStore, as_role, context_limits, execute, rows, turn_budget

MADRID = ZoneInfo("Europe/Madrid")
SETTINGS = TurnSettings(
    system_prompt=DEFAULT_SYSTEM_PROMPT,
    fallback_reply="FALLBACK",
    stranger_reply="NO",
    timezone="Europe/Madrid",
    capabilities=(MemorySearch(SearchRules()),),
)


def searching(query: str) -> Any:
    """A model that searches for `query` first, then answers with what the search returned."""

    def answer(body: dict[str, Any]) -> Answer:
        results = tool_results(body)
        if results:
            return "From memory: " + str(results[0]["content"])
        return [tool_use(SEARCH_MEMORY, {"query": query}, id="toolu_search")]

    return answer


@pytest.fixture
def fake() -> Iterator[FakeAnthropic]:
    server = FakeAnthropic()
    yield server
    server.close()


def turns_with(memory: Memory, fake: FakeAnthropic, settings: TurnSettings = SETTINGS) -> Turns:
    model = AnthropicModel(api_key="sk-ant-test", model="claude-test-1", max_tokens=321, base_url=fake.url)
    return Turns(memory, lambda: model, IdentityPolicy("auto"), settings)


def planted(database_url: str, user: uuid.UUID, surface: str, role: str, text: str, days_ago: float) -> int:
    """A message stored `days_ago` days ago in the person's conversation of that surface."""
    with psycopg.connect(database_url, autocommit=True) as connection:
        found = connection.execute(
            "select id from conversations where user_id = %s and surface = %s and surface <> 'web'", (user, surface)
        ).fetchone()
        if found is None:
            title = "web" if surface == "web" else f"[{surface.title()}]"
            found = connection.execute(
                "insert into conversations (user_id, surface, title) values (%s, %s, %s) returning id",
                (user, surface, title),
            ).fetchone()
        assert found is not None
        inserted = connection.execute(
            """insert into messages (conversation_id, user_id, surface, role, content, created_at)
               values (%s, %s, %s, %s, %s, now() - %s * interval '1 day') returning id""",
            (found[0], user, surface, role, text, days_ago),
        ).fetchone()
        assert inserted is not None
        return int(inserted[0])


def created_at(database_url: str, message_id: int) -> datetime:
    return rows(database_url, "select created_at from messages where id = %s", message_id)[0][0]


def test_a_turn_finds_what_was_said_90_days_ago_on_whatsapp_and_counts_both_requests(
    store: PostgresStore, fake: FakeAnthropic, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    memory = Memory(store, context_limits(), turn_budget(tokens_per_day=10_000_000))
    person = uuid.uuid4()
    before = planted(database_url, person, "whatsapp", "assistant", "How did the appointment go?", 90.001)
    fact = planted(database_url, person, "whatsapp", "user", "The doctor said 400 mg of ibuprofen, twice a day", 90)
    after = planted(database_url, person, "whatsapp", "assistant", "Noted: 400 mg twice a day.", 89.999)
    for day in range(60, 0, -3):
        planted(database_url, person, "telegram", "user", f"ordinary day {day}, nothing special", day)
    fake.answer = searching("doctor dose ibuprofen")
    turns = turns_with(memory, fake)

    with caplog.at_level(logging.INFO, logger="crossmem.turn"):
        result = turns.run(TurnRequest(Surface.TELEGRAM, "what dose did the doctor give me?", "u-1", user_id=person))

    when = created_at(database_url, fact).astimezone(MADRID)
    said = f"{when:%a} {when.day} {when:%b %Y %H:%M}"

    def beside(message_id: int) -> str:  # a neighbour's time that day, else its date (near midnight)
        at = created_at(database_url, message_id).astimezone(MADRID)
        return f"{at:%H:%M}" if at.date() == when.date() else f"{at:%a} {at.day} {at:%b %Y %H:%M}"

    expected = (
        "Found 1 older message, best match first:\n\n"
        f"1. [whatsapp · {said}] the person: The doctor said 400 mg of ibuprofen, twice a day\n"
        f"   just before, [{beside(before)}] you: How did the appointment go?\n"
        f"   just after, [{beside(after)}] you: Noted: 400 mg twice a day."
    )
    assert tool_results(fake.requests[-1]) == [
        {"type": "tool_result", "tool_use_id": "toolu_search", "content": expected}
    ]
    assert result.outcome is Outcome.ANSWERED and result.reply == "From memory: " + expected
    assert (before, after) == (fact - 1, fact + 1)
    figures = result.figures
    assert (figures.model_requests, figures.round_trips) == (2, 3)  # begin, search, finish
    # Both requests' tokens are the turn's: its log line and the person's budget.
    assert figures.input_tokens == sum(usage["input_tokens"] for usage in fake.usages[-2:])
    line = [record for record in caplog.records if record.getMessage() == "turn"][-1]
    assert (line.__dict__["model_requests"], line.__dict__["round_trips"]) == (2, 3)
    assert (line.__dict__["tool_calls"], line.__dict__["tool_errors"]) == (1, 0)
    tokens = rows(database_url, "select coalesce(sum(tokens), 0) from turn_usage where user_id = %s", person)[0][0]
    assert tokens == figures.model_tokens

    fake.answer = lambda body: "Fine."
    quiet = turns.run(TurnRequest(Surface.TELEGRAM, "thanks", "u-2", user_id=person))
    assert (quiet.figures.model_requests, quiet.figures.round_trips) == (1, 2)
    # The tool's definition is the same bytes in every turn: the cached prefix holds.
    assert fake.requests[-1]["tools"] == fake.requests[0]["tools"] == [TOOL]


def test_two_people_with_the_same_words_each_find_only_their_own(memory: Memory, database_url: str) -> None:
    ana, bruno = uuid.uuid4(), uuid.uuid4()
    mine = planted(database_url, ana, "telegram", "user", "my locker code is 4471 at the swimming pool", 20)
    theirs = planted(database_url, bruno, "telegram", "user", "my locker code is 9902 at the swimming pool", 20)
    assert [hit.message.id for hit in memory.search(ana, "swimming pool locker code")] == [mine]
    assert [hit.message.id for hit in memory.search(bruno, "swimming pool locker code")] == [theirs]
    # Neighbours too are read by the person's id, not only by the conversation's: a row of Bruno's
    # filed under Ana's conversation (no constraint forbids it; a Citus shard is chosen by user_id)
    # is never shown as the message before hers.
    execute(
        database_url,
        """insert into messages (conversation_id, user_id, surface, role, content, created_at)
           select conversation_id, %s, surface, 'user', 'Bruno''s stray row', created_at - interval '1 minute'
             from messages where id = %s""",
        bruno,
        mine,
    )
    hit = memory.search(ana, "swimming pool")[0]
    assert (hit.message.id, hit.before, hit.after) == (mine, None, None)


def test_a_forgotten_conversation_is_never_found(memory: Memory, database_url: str) -> None:
    person = uuid.uuid4()
    planted(database_url, person, "telegram", "user", "the surprise party is at Marta's flat", 10)
    kept = planted(database_url, person, "whatsapp", "user", "the surprise party needs balloons", 5)
    conversation = rows(
        database_url, "select id from conversations where user_id = %s and surface = 'telegram'", person
    )[0][0]
    assert len(memory.search(person, "surprise party")) == 2
    memory.store.call("forget_conversations", {"p_user_id": str(person), "p_conversation_id": str(conversation)})
    assert [hit.message.id for hit in memory.search(person, "surprise party")] == [kept]


def test_what_the_model_already_sees_is_not_repeated(memory: Memory, database_url: str) -> None:
    person = uuid.uuid4()
    old = planted(database_url, person, "web", "user", "the plumber comes on Thursday", 40)
    recent = planted(database_url, person, "web", "user", "the plumber cancelled", 0.01)
    assert [hit.message.id for hit in memory.search(person, "plumber")] == [recent, old]
    assert [hit.message.id for hit in memory.search(person, "plumber", exclude_ids=[recent])] == [old]


@pytest.mark.parametrize("client_history", [None, "sent"])
def test_a_web_turn_leaves_out_of_its_search_the_thread_it_shows(
    memory: Memory, fake: FakeAnthropic, client_history: str | None
) -> None:
    """The stored window is what the model sees, unless the web client sent its own thread: then
    that thread is left out of the hits, and a stored message it does not hold can be found."""
    person = uuid.uuid4()
    conversation = memory.create_conversation(person).id
    fake.answer = lambda body: "Noted."
    turns = turns_with(memory, fake)
    stored = turns.run(
        TurnRequest(Surface.WEB, "The garage door code is 7788", "g-1", user_id=person, conversation_id=conversation)
    )
    assert stored.outcome is Outcome.ANSWERED
    said = ContextItem(Role.USER, "hello there", Surface.WEB)
    fake.answer = searching("garage door code")
    asked = TurnRequest(
        Surface.WEB,
        "what was the garage code?",
        "g-2",
        user_id=person,
        conversation_id=conversation,
        client_history=[said] if client_history else None,
    )
    answered = turns.run(asked)
    assert answered.reply is not None
    if client_history:
        assert "the person: The garage door code is 7788" in answered.reply
        assert "what was the garage code?" not in answered.reply  # the message it answers, never a hit
    else:
        assert answered.reply == "From memory: Nothing found in older messages."


def test_a_period_and_a_surface_narrow_the_search(memory: Memory, database_url: str) -> None:
    person = uuid.uuid4()
    march = planted(database_url, person, "telegram", "user", "dinner at Casa Pepe was lovely", 100)
    june = planted(database_url, person, "whatsapp", "user", "dinner at Casa Pepe again", 10)
    assert [h.message.id for h in memory.search(person, "Casa Pepe", surface=Surface.TELEGRAM)] == [march]
    since = datetime.now(UTC) - timedelta(days=50)
    assert [h.message.id for h in memory.search(person, "Casa Pepe", since=since)] == [june]
    assert [h.message.id for h in memory.search(person, "Casa Pepe", until=since)] == [march]


def test_a_question_as_a_person_asks_it_finds_its_message_in_either_language(memory: Memory, database_url: str) -> None:
    person = uuid.uuid4()
    group = planted(database_url, person, "telegram", "user", "Went to the support group on Tuesday evening", 30)
    sister = planted(database_url, person, "whatsapp", "user", "Mi hermana llega el 14 de marzo en el tren", 60)
    for day in range(1, 80):
        planted(database_url, person, "web", "user", f"did you see the news today? I went out, day {day}", day)
    assert memory.search(person, "when did I go to the support group?")[0].message.id == group
    assert memory.search(person, "¿cuándo llegaba mi hermana?")[0].message.id == sister
    # Accents never matter, in the question or the message.
    assert memory.search(person, "cuando llegó mi HERMANA")[0].message.id == sister
    # A question of stopwords alone finds nothing rather than everything.
    assert memory.search(person, "what did I say?") == []


def test_spanish_stopwords_written_with_their_accents_are_dropped_from_the_question(
    memory: Memory, database_url: str
) -> None:
    """Postgres's Spanish list writes "más", "también", "tenía" with their accents; the question's
    words are compared unaccented, so these went on being searched for."""
    person = uuid.uuid4()
    rent = planted(database_url, person, "whatsapp", "user", "Ya pagué el alquiler de marzo, también", 30)
    for day in range(1, 20):
        planted(database_url, person, "web", "user", f"también quería decirte algo más, el día {day}", day)
    # A question of stopwords alone finds nothing rather than everything.
    assert memory.search(person, "¿Y qué más había también?") == []
    assert [hit.message.id for hit in memory.search(person, "¿Qué más te dije del alquiler? También")] == [rent]
    with psycopg.connect(database_url) as connection:
        [(terms,)] = connection.execute(
            "select crossmem_private.search_terms(%s)", ("¿Qué más tenía que pagar también? Estaré en Sevilla",)
        ).fetchall()
    assert terms == ["pagar", "sevilla"]


@pytest.mark.parametrize(
    ("question", "terms"),
    [
        # English words that are Spanish stopwords: "what did Sean say about my son?" searched "say".
        ("What did Sean say about my son?", ["say", "sean", "son"]),
        ("the sea trip in that era, no sin", ["era", "sea", "sin", "trip"]),
        # A question that reads Spanish drops them, as it drops every Spanish stopword.
        ("¿Qué dijo Sean? Son las luces del mar", ["dijo", "luces", "mar"]),
        ("¿Y qué más había también?", []),
        # Typed without its accents, as a phone does: "más", "había", "también" are stopwords still.
        ("y que mas habia tambien", []),
        ("que mas te dije del alquiler", ["alquiler", "dije"]),
        ("What did Mia say about my son?", ["mia", "say", "son"]),
    ],
)
def test_spanish_stopwords_are_dropped_from_a_question_that_reads_spanish(
    database_url: str, question: str, terms: list[str]
) -> None:
    with psycopg.connect(database_url) as connection:
        [(found,)] = connection.execute("select crossmem_private.search_terms(%s)", (question,)).fetchall()
    assert found == terms


def test_an_english_question_finds_the_son_the_spanish_list_would_drop(memory: Memory, database_url: str) -> None:
    person = uuid.uuid4()
    fact = planted(database_url, person, "telegram", "user", "My son starts at the new school on Monday", 30)
    for day in range(1, 20):
        planted(database_url, person, "web", "user", f"an ordinary message number {day} about nothing", day)
    assert [hit.message.id for hit in memory.search(person, "what did I say about my son?")] == [fact]


def found_alone(memory: Memory, database_url: str, said: str, asked: str) -> bool:
    """Whether `asked` finds what was `said` a month ago, and only it, among nineteen ordinary messages."""
    person = uuid.uuid4()
    fact = planted(database_url, person, "telegram", "user", said, 30)
    for day in range(1, 20):
        planted(database_url, person, "web", "user", f"an ordinary message number {day} about nothing", day)
    return [hit.message.id for hit in memory.search(person, asked)] == [fact]


@pytest.mark.parametrize(
    ("said", "asked"),
    [
        ("I left the key with Marta", "where are my keys?"),
        ("I left the keys with Marta", "where did I leave the key?"),
        ("Bought a new bag at Zara", "where did I buy those bags?"),
        ("paid the taxes yesterday", "when did I pay the tax?"),
        ("washed the dishes after dinner", "who did the dish?"),
        ("las mesas llegan el lunes", "¿cuándo llega la mesa?"),
        ("se fundió la luz del portal", "¿qué dije de las luces?"),
        ("me quedé sin voz", "¿cuándo perdí las voces?"),
        ("las luces del coche no van", "¿qué le pasa a la luz?"),
        ("fui dos veces al médico", "¿cuántas vez fui?"),
        ("pusimos la cruz en el monte", "¿dónde están las cruces?"),
    ],
)
def test_a_plural_finds_its_singular_and_back(memory: Memory, database_url: str, said: str, asked: str) -> None:
    assert found_alone(memory, database_url, said, asked)


def test_a_question_of_a_thousand_characters_searches_by_its_sixteen_longest_words(
    memory: Memory, database_url: str
) -> None:
    """Some 140 words `or`-ed read everyone's messages (the planner took them for most of the
    table); the longest words are the rarer, as a rule, and the ones kept."""
    person = uuid.uuid4()
    found = planted(database_url, person, "telegram", "user", "The physiotherapist moved me to Thursdays", 40)
    filler = " ".join(f"w{n:03d}" for n in range(200))  # 200 words of four characters
    question = f"when does the physiotherapist see me? {filler}"[:1000]  # as long as a search may be
    with psycopg.connect(database_url) as connection:
        [(terms,)] = connection.execute("select crossmem_private.search_terms(%s)", (question,)).fetchall()
    assert len(terms) == 16 and "physiotherapist" in terms
    assert terms == sorted(["physiotherapist", *[f"w{n:03d}" for n in range(15)]])
    assert memory.search(person, question)[0].message.id == found


def test_a_search_that_fails_tells_the_model_and_the_turn_still_answers(
    store: PostgresStore, fake: FakeAnthropic
) -> None:
    memory = Memory(FailingStore(store, ["search_memory"]), context_limits())
    fake.answer = searching("anything")
    result = turns_with(memory, fake).run(
        TurnRequest(Surface.WHATSAPP, "what did I say about the trip?", "f-1", user_id=uuid.uuid4())
    )
    sent = tool_results(fake.requests[-1])
    assert sent[0]["is_error"] is True and sent[0]["content"].startswith("Could not search the memory just now.")
    assert result.outcome is Outcome.ANSWERED and result.reply is not None
    assert result.reply.startswith("From memory: Could not search")


def test_the_cap_keeps_the_best_hits_and_says_how_many_more(memory: Memory, database_url: str) -> None:
    person = uuid.uuid4()
    for day in range(1, 9):
        planted(database_url, person, "telegram", "user", f"gym session number {day}: " + "squats " * 40, day)
    hits = memory.search(person, "gym session")
    assert len(hits) == 8
    shown = rendered(hits, MADRID, max_tokens=600)
    assert shown.count == 3  # the second's neighbour is the first, named by its number: a third fits
    assert shown.text.endswith("\n(5 more matched; search with other words or a period to see them.)")
    assert len(shown.text) // 4 <= 600 + 30  # the cap, plus the head and the tail lines


def test_the_best_hit_alone_too_long_is_cut_to_the_cap_in_tokens_in_japanese_too(
    memory: Memory, database_url: str
) -> None:
    """The best hit, alone longer than the cap, is shown from its start, cut where the cap is:
    counted in characters (four a token), a Japanese one was four times the cap."""
    person = uuid.uuid4()
    planted(database_url, person, "telegram", "user", "gym session: " + "運動の記録。" * 400, 2)
    [hit] = memory.search(person, "gym session")
    shown = rendered([hit], MADRID, max_tokens=100)
    block = shown.text.split("\n", 1)[1]  # after the head line
    assert block.endswith("…") and 90 < approximate_tokens(block) <= 100


def test_authenticated_reads_only_its_own_words_and_cannot_call_the_search(memory: Memory, database_url: str) -> None:
    ana, bruno = uuid.uuid4(), uuid.uuid4()
    planted(database_url, ana, "telegram", "user", "the key is under the blue flowerpot", 3)
    planted(database_url, bruno, "telegram", "user", "the key is under the red flowerpot", 3)
    with as_role(database_url, "authenticated", ana) as connection:
        found = connection.execute(
            "select content from messages where search_text @@ 'flowerpot'::tsquery order by content"
        ).fetchall()
        assert found == [("the key is under the blue flowerpot",)]
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            connection.execute(
                "select public.search_memory(%s, 'flowerpot', null, null, null, '[]', 8, 0, false)", (str(bruno),)
            )


def test_the_tool_refuses_bad_arguments_without_a_round_trip(memory: Memory) -> None:
    tools = MemorySearchTools(memory, uuid.uuid4(), MADRID, frozenset())
    empty = tools.run(ToolCall("a", SEARCH_MEMORY, {"query": "  "}))
    app = tools.run(ToolCall("b", SEARCH_MEMORY, {"query": "x", "surface": "fax"}))
    day = tools.run(ToolCall("c", SEARCH_MEMORY, {"query": "x", "from_date": "March"}))
    assert [r.content for r in (empty, app, day)] == [
        "Not searched: query is empty.",
        "Not searched: surface must be one of web, telegram, whatsapp, sms.",
        "Not searched: from_date must be YYYY-MM-DD.",
    ]
    assert all(r.is_error for r in (empty, app, day)) and tools.round_trips == 0


def test_a_local_day_is_the_persons_day(memory: Memory, database_url: str) -> None:
    person = uuid.uuid4()
    # 23:30 in Madrid on 1 March is 22:30 UTC: it belongs to 1 March there.
    late = planted(database_url, person, "telegram", "user", "booked the flight to Lisbon", 0)
    execute(database_url, "update messages set created_at = '2026-03-01 22:30+00' where id = %s", late)
    tools = MemorySearchTools(memory, person, MADRID, frozenset())
    on_day = tools.run(
        ToolCall("a", SEARCH_MEMORY, {"query": "flight Lisbon", "from_date": "2026-03-01", "to_date": "2026-03-01"})
    )
    next_day = tools.run(ToolCall("b", SEARCH_MEMORY, {"query": "flight Lisbon", "from_date": "2026-03-02"}))
    assert "[telegram · Sun 1 Mar 2026 23:30] the person: booked the flight to Lisbon" in on_day.content
    assert next_day.content == "Nothing found in older messages."
    assert tools.round_trips == 2


def test_a_web_turn_searches_on_the_clock_its_browser_names(
    memory: Memory, fake: FakeAnthropic, database_url: str
) -> None:
    """The browser's timezone becomes the person's in the turn that sends it, whose tags and follow-up
    tools read it: its search read the person's earlier clock (Madrid's here), another day and hour."""
    person = uuid.uuid4()
    late = planted(database_url, person, "telegram", "user", "booked the flight to Lisbon", 30)
    execute(database_url, "update messages set created_at = '2026-03-01 22:30+00' where id = %s", late)
    fake.answer = searching("flight Lisbon")
    web = memory.create_conversation(person).id
    asked = TurnRequest(
        Surface.WEB, "when did I book it?", "w-1", user_id=person, conversation_id=web, timezone="Asia/Tokyo"
    )
    assert turns_with(memory, fake).run(asked).outcome is Outcome.ANSWERED
    found = str(tool_results(fake.requests[-1])[0]["content"])
    assert "1. [telegram · Mon 2 Mar 2026 07:30] the person: booked the flight to Lisbon" in found


@pytest.mark.parametrize("zone", ["Pacific/Kiritimati", "Pacific/Pago_Pago"])
def test_the_calendars_first_and_last_days_are_open_ends(memory: Memory, database_url: str, zone: str) -> None:
    """ "Everything up to 9999-12-31" (as a person may ask, and the model pass on) has no end; the day
    after it is past the calendar, which raised and ended the turn with a 500."""
    person = uuid.uuid4()
    planted(database_url, person, "telegram", "user", "booked the flight to Lisbon", 3)
    tools = MemorySearchTools(memory, person, ZoneInfo(zone), frozenset())
    found = tools.run(
        ToolCall("a", SEARCH_MEMORY, {"query": "flight Lisbon", "from_date": "0001-01-01", "to_date": "9999-12-31"})
    )
    assert not found.is_error and "the person: booked the flight to Lisbon" in found.content
    assert tools.round_trips == 1


def test_the_offline_stand_in_searches_what_it_is_asked_about(memory: Memory, database_url: str) -> None:
    person = uuid.uuid4()
    planted(database_url, person, "whatsapp", "user", "the dentist moved me to Friday at 10", 45)
    model = OfflineModel()
    turns = Turns(memory, lambda: model, IdentityPolicy("auto"), SETTINGS)
    result = turns.run(TurnRequest(Surface.WEB, "What did I tell you about the dentist?", "o-1", user_id=person))
    assert result.reply is not None and result.reply.startswith("(Offline stand-in model.) Found 1 older message")
    assert "the person: the dentist moved me to Friday at 10" in result.reply
    assert (result.figures.model_requests, result.figures.round_trips) == (2, 3)


def test_search_off_gives_the_model_no_search_tool(memory: Memory, fake: FakeAnthropic) -> None:
    turns = turns_with(memory, fake, replace(SETTINGS, capabilities=(MemorySearch(None),)))
    turns.run(TurnRequest(Surface.TELEGRAM, "hello", "s-1", user_id=uuid.uuid4()))
    assert "tools" not in fake.requests[-1]


def test_a_second_round_of_tools_is_answered(memory: Memory, fake: FakeAnthropic, database_url: str) -> None:
    person = uuid.uuid4()
    planted(database_url, person, "telegram", "user", "my niece is called Lola", 50)

    def twice(body: dict[str, Any]) -> Answer:
        done = len([m for m in body["messages"] if m["role"] == "user" and tool_results({"messages": [m]})])
        if done == 0:
            return [tool_use(SEARCH_MEMORY, {"query": "nephew"}, id="t1")]
        if done == 1:
            return [text_block("Let me try another word."), tool_use(SEARCH_MEMORY, {"query": "niece"}, id="t2")]
        return "Your niece is Lola."

    fake.answer = twice
    asked = TurnRequest(Surface.TELEGRAM, "what's my niece's name?", "r-1", user_id=person)
    result = turns_with(memory, fake).run(asked)
    assert result.reply == "Let me try another word.\n\nYour niece is Lola."
    assert (result.figures.model_requests, result.figures.round_trips) == (3, 4)
    assert json.dumps(fake.requests[-1]["messages"][-1]).count("Lola") == 1


def test_what_a_link_merged_into_the_person_is_found_and_no_longer_by_the_chat(memory: Memory) -> None:
    from core.identity.linking import Linking
    from core.models import Person

    chat, web_person = f"{uuid.uuid4().int % 10**9}", uuid.uuid4()
    start = memory.begin_turn(Person(sender_id=chat), Surface.TELEGRAM, "my gym locker is number 212", "g-1")
    assert start.user_id is not None and start.message_id is not None
    memory.finish_turn(start.user_id, start.message_id, "Locker 212, noted.")
    chat_person = start.user_id
    Linking(memory.store, IdentityPolicy.build("auto", None, {})).link(web_person, Surface.TELEGRAM, chat)
    found = memory.search(web_person, "gym locker")
    assert [(hit.message.content, hit.message.surface) for hit in found] == [
        ("my gym locker is number 212", Surface.TELEGRAM),
        ("Locker 212, noted.", Surface.TELEGRAM),
    ]
    assert memory.search(chat_person, "gym locker") == []
    # Unlinked, the chat is a new person, who finds nothing of the account's, not even what the
    # chat itself said before (docs/design.md, Unlinking); the account keeps finding all of it.
    assert Linking(memory.store, IdentityPolicy.build("auto", None, {})).unlink(Surface.TELEGRAM, chat) == 1
    again = memory.begin_turn(Person(sender_id=chat), Surface.TELEGRAM, "what is my gym locker?", "g-2")
    assert again.user_id not in (None, web_person, chat_person) and again.message_id is not None
    assert memory.search(again.user_id, "gym locker", exclude_ids=[again.message_id]) == []
    assert [hit.message.content for hit in memory.search(web_person, "gym locker")] == [
        "my gym locker is number 212",
        "Locker 212, noted.",
    ]


def test_a_purged_message_is_never_found(memory: Memory, database_url: str) -> None:
    from core.memory.retention import Retention

    person = uuid.uuid4()
    planted(database_url, person, "telegram", "user", "the old tax office was on Calle Alcalá 12", 800)
    kept = planted(database_url, person, "telegram", "user", "the new tax office is near the station", 3)
    assert len(memory.search(person, "tax office")) == 2
    Retention(memory.store, batch_size=5000, in_flight=timedelta(minutes=5)).purge(timedelta(days=700))
    assert [hit.message.id for hit in memory.search(person, "tax office")] == [kept]


def test_the_offline_stand_in_answers_from_the_window_when_the_search_has_nothing_older(
    memory: Memory, database_url: str
) -> None:
    person = uuid.uuid4()
    model = OfflineModel()
    turns = Turns(memory, lambda: model, IdentityPolicy("auto"), SETTINGS)
    turns.run(TurnRequest(Surface.TELEGRAM, "I moved my dentist appointment to Friday", "w-1", user_id=person))
    result = turns.run(TurnRequest(Surface.WEB, "what did I tell you about the dentist?", "w-2", user_id=person))
    assert result.reply == (
        '(Offline stand-in model.) You told me on telegram: "I moved my dentist appointment to Friday".'
    )
    # "on" says where, not what: the answer quotes the other app, as for "what did I tell you today?"
    # (a newcomer's finding: it searched for "my other apps" and found nothing).
    where = turns.run(TurnRequest(Surface.WEB, "what did I tell you on my other apps?", "w-3", user_id=person))
    assert (
        where.reply is not None and 'You told me on telegram: "I moved my dentist appointment to Friday"' in where.reply
    )


def test_a_long_message_shows_the_model_the_words_it_was_found_by(
    store: PostgresStore, fake: FakeAnthropic, database_url: str
) -> None:
    """A voice note of two minutes is some 1,800 characters, and a hit showed its first 1,200: what
    the search matched at its end (the landlord, the rent) was found, ranked first, and never shown
    to the model, which then answers without it."""
    memory = Memory(store, context_limits(), turn_budget(tokens_per_day=10_000_000))
    person = uuid.uuid4()
    chatter = "bueno pues nada, el fin de semana estuvimos en la sierra con los niños y " * 22
    fact = "antes de que se me olvide, el casero me dijo que en abril el alquiler sube a 950 euros"
    planted(database_url, person, "whatsapp", "user", f"[voice note, 1:58] {chatter}{fact}", 40)
    for day in range(1, 20):
        planted(database_url, person, "web", "user", f"an ordinary message number {day} about nothing", day)
    fake.answer = searching("casero alquiler")

    result = turns_with(memory, fake).run(
        TurnRequest(Surface.TELEGRAM, "¿qué me dijo el casero del alquiler?", "v-1", user_id=person)
    )

    sent = tool_results(fake.requests[-1])[0]["content"]
    assert result.outcome is Outcome.ANSWERED
    assert sent.startswith("Found 1 older message, best match first:\n\n1. [whatsapp · ")
    assert fact in sent


def test_an_app_and_a_period_alone_find_what_was_said_then(
    store: PostgresStore, fake: FakeAnthropic, database_url: str
) -> None:
    """ "Remind me what we decided last week on WhatsApp": the model searches that app and that week
    with the person's question, whose words the week's messages do not hold. The search required a
    word, found nothing, and the agent, as its prompt tells it, said nothing was said; the week's
    messages were in the database all along."""
    memory = Memory(store, context_limits(), turn_budget(tokens_per_day=10_000_000))
    person = uuid.uuid4()
    decision = "ok, let's take the flat on Calle Mayor, I sign the lease on Friday"
    decided = planted(database_url, person, "whatsapp", "user", decision, 6)
    planted(database_url, person, "whatsapp", "assistant", "Agreed: the Calle Mayor flat, signed on Friday.", 5.999)
    planted(database_url, person, "whatsapp", "user", "the other flat had no lift anyway", 40)
    planted(database_url, person, "telegram", "user", "an ordinary message about nothing", 5)
    today = datetime.now(MADRID).date()
    said = created_at(database_url, decided).astimezone(MADRID)
    asked = "remind me what we decided last week on WhatsApp"

    def answer(body: dict[str, Any]) -> Answer:
        results = tool_results(body)
        if results:
            return "From memory: " + str(results[0]["content"])
        period = {"from_date": str(today - timedelta(days=8)), "to_date": str(today - timedelta(days=1))}
        return [tool_use(SEARCH_MEMORY, {"query": asked, "surface": "whatsapp", **period}, id="toolu_week")]

    fake.answer = answer
    result = turns_with(memory, fake).run(TurnRequest(Surface.TELEGRAM, asked, "w-1", user_id=person))

    sent = tool_results(fake.requests[-1])[0]["content"]
    assert result.outcome is Outcome.ANSWERED
    assert sent != "Nothing found in older messages."
    assert f"[whatsapp · {said:%a} {said.day} {said:%b %Y %H:%M}] the person: {decision}" in sent
    hits = [line for line in sent.splitlines() if line[:1].isdigit()]  # a neighbour may be older
    assert [line for line in hits if "the other flat had no lift anyway" in line] == []  # outside the week


def test_a_neighbour_says_when_it_was_said(memory: Memory, database_url: str) -> None:
    """A hit's neighbour is the next message in its conversation, however long after: shown as "just
    after" with no date, a message of this week reads as said in the same breath as one of March."""
    person = uuid.uuid4()
    planted(database_url, person, "telegram", "user", "my landlord wants the keys back by June", 40)
    later = planted(database_url, person, "telegram", "user", "I moved into the new flat, all good", 3)
    tools = MemorySearchTools(memory, person, MADRID, frozenset())

    found = tools.run(ToolCall("a", SEARCH_MEMORY, {"query": "landlord keys"}))

    when = created_at(database_url, later).astimezone(MADRID)
    [after] = [line for line in found.content.splitlines() if line.startswith("   just after")]
    assert after.endswith("the person: I moved into the new flat, all good")
    assert f"{when:%a} {when.day} {when:%b %Y}" in after


def test_a_neighbour_shown_as_a_hit_is_named_by_its_number(memory: Memory, database_url: str) -> None:
    """A message and its answer both found: each is the other's neighbour, shown in full as a hit;
    named by its number rather than said twice (tokens of the turn's budget)."""
    person = uuid.uuid4()
    asked = planted(database_url, person, "telegram", "user", "my sister Carmen moved to Lima in May", 40.001)
    answered = planted(database_url, person, "telegram", "assistant", "Carmen in Lima since May, noted.", 40)
    tools = MemorySearchTools(memory, person, MADRID, frozenset())

    found = tools.run(ToolCall("a", SEARCH_MEMORY, {"query": "Carmen Lima"}))

    def when(message_id: int) -> str:
        at = created_at(database_url, message_id).astimezone(MADRID)
        return f"{at:%a} {at.day} {at:%b %Y %H:%M}"

    assert found.content == (  # the answer first: its words are a larger share of it
        "Found 2 older messages, best match first:\n\n"
        f"1. [telegram · {when(answered)}] you: Carmen in Lima since May, noted.\n"
        "   just before, number 2 below\n\n"
        f"2. [telegram · {when(asked)}] the person: my sister Carmen moved to Lima in May\n"
        "   just after, number 1 above"
    )


@pytest.mark.parametrize(
    ("said", "asked"),
    [
        # A plural of a short word in -es, asked for: its start ("bare", "pane", "rede") is no word.
        ("el bar de la esquina cierra tarde", "¿qué bares te recomendé?"),
        ("el pan de la panadería nueva es bueno", "¿dónde compro los panes?"),
        ("la red del wifi de casa va fatal", "¿qué dije de las redes?"),
        # A singular of four letters in -s, taken for a plural: "país" searched "pai", "lens" "len".
        ("visité tres países en verano", "¿qué país me gustó?"),
        ("my new lenses arrive on Monday", "when do I get the lens?"),
    ],
)
def test_a_plural_in_es_and_a_singular_in_s_find_each_other(
    memory: Memory, database_url: str, said: str, asked: str
) -> None:
    assert found_alone(memory, database_url, said, asked)


def test_a_reply_at_the_windows_start_is_shown_or_found(
    store: PostgresStore, fake: FakeAnthropic, database_url: str
) -> None:
    """The window's start moves in steps, so it can fall on a reply whose question has left it (the
    person wrote twice in a row before). The model is not shown a conversation that starts with its
    own turn, so that reply is dropped; and the search leaves out every id of the window, so it is
    not found either: "what was the Miramar's phone?" found nothing, with the answer stored."""
    memory = Memory(store, context_limits(window_hours=24, max_messages=16, window_step=8))
    person = uuid.uuid4()
    hours = iter(range(23, 0, -1))

    def said(role: str, text: str) -> int:
        return planted(database_url, person, "telegram", role, text, next(hours) / 24)

    for n in range(3):
        said("user", f"an ordinary question number {n}")
        said("assistant", f"an ordinary answer number {n}")
    said("user", "an ordinary question number 3")
    said("user", "we go to Cádiz in May, which hotel would you pick?")  # twice in a row: the 8th to leave
    advice = "I'd pick Hotel Miramar on Playa Victoria: 95 EUR a night, phone 956 22 11 00."
    said("assistant", advice)  # the window's first message
    for n in range(4, 8):
        said("user", f"an ordinary question number {n}")
        said("assistant", f"an ordinary answer number {n}")
    fake.answer = searching("Miramar phone")

    result = turns_with(memory, fake).run(
        TurnRequest(Surface.TELEGRAM, "what was the Miramar's phone?", "m-1", user_id=person)
    )

    assert result.outcome is Outcome.ANSWERED
    assert advice in json.dumps(fake.requests[-1]["messages"], ensure_ascii=False)


def test_a_message_read_as_answered_separately_is_not_found_again() -> None:
    """A web page sending its own thread reads another tab's question still being answered after it,
    marked (core/turn/context.py's web_items): the model sees it, so the search leaves it out, as it
    does the page's thread. Seen failing: only the page's thread was left out."""
    page = [ContextItem(Role.USER, "what is the capital of Peru?", Surface.WEB, datetime.now(UTC), 7)]
    start = TurnStart(uuid.uuid4(), uuid.uuid4(), 9, duplicate=False, reply=None, answered_elsewhere=frozenset({8}))
    memory = Memory(UnavailableStore("no database"), context_limits())
    turn = TurnState(memory, uuid.uuid4(), start, ZoneInfo("UTC"), datetime.now(UTC), client_history=page)
    tools = MemorySearch(SearchRules()).toolset(turn)
    assert tools is not None and tools.seen_ids == {7, 8, 9}


def test_what_a_page_of_another_apps_thread_reads_after_it_is_not_found_again() -> None:
    """A web page of the person's [Telegram] thread, sending a new message, reads what was said on
    Telegram since it loaded, after its thread (core/turn/context.py's read_after_page): the model
    sees it, so the search leaves it out, as it does the page's thread. Seen failing with "her train
    is delayed to noon" and its answer findable again, read twice."""
    thread, now = uuid.uuid4(), datetime.now(UTC)
    history = [
        StoredMessage(1, thread, Surface.TELEGRAM, Role.USER, "Carmen arrives Thursday", now),
        StoredMessage(2, thread, Surface.TELEGRAM, Role.ASSISTANT, "Noted.", now),
        StoredMessage(3, thread, Surface.TELEGRAM, Role.USER, "Her train is delayed to noon", now),
        StoredMessage(4, thread, Surface.TELEGRAM, Role.ASSISTANT, "Noted.", now),
        StoredMessage(5, thread, Surface.WEB, Role.USER, "When should I leave?", now),
    ]
    page = [ContextItem.from_stored(message) for message in history[:2]]
    start = TurnStart(uuid.uuid4(), thread, 5, duplicate=False, reply=None, history=history)
    memory = Memory(UnavailableStore("no database"), context_limits())
    turn = TurnState(memory, uuid.uuid4(), start, ZoneInfo("UTC"), now, client_history=page, history_is_page=True)
    tools = MemorySearch(SearchRules()).toolset(turn)
    assert tools is not None and tools.seen_ids == {1, 2, 3, 4, 5}


def test_an_app_and_a_period_list_only_the_persons_own_messages_and_only_for_the_agents_tool(
    memory: Memory, database_url: str
) -> None:
    """When no word matches, the app's or period's messages are the person's alone; and only the
    agent's tool asks for them (a search of the web's route or the command finds nothing)."""
    person, other = uuid.uuid4(), uuid.uuid4()
    mine = planted(database_url, person, "whatsapp", "user", "we settled on the blue sofa", 3)
    planted(database_url, other, "whatsapp", "user", "someone else's plan for the weekend", 2)
    since = datetime.now(MADRID) - timedelta(days=7)

    # one hit: the other person's message, newer, would take it if the listing read theirs
    listed = memory.search(person, "what did we decide", surface=Surface.WHATSAPP, since=since, limit=1, or_latest=True)
    plain = memory.search(person, "what did we decide", surface=Surface.WHATSAPP, since=since)

    assert [(hit.message.id, hit.ranker) for hit in listed] == [(mine, "period")]
    assert plain == []


SIERRA = "bueno pues nada, el fin de semana estuvimos en la sierra con los niños y " * 22
HILLS = "so anyway, at the weekend we went hiking in the hills with the kids and " * 22


def voice_note_searched(memory: Memory, database_url: str, note: str, asked: str) -> str:
    """What the model's search for `asked` reads when a person's one message, 40 days old on
    WhatsApp, is the voice note `note`."""
    person = uuid.uuid4()
    planted(database_url, person, "whatsapp", "user", note, 40)
    tools = MemorySearchTools(memory, person, MADRID, frozenset())
    return tools.run(ToolCall("a", SEARCH_MEMORY, {"query": asked})).content


@pytest.mark.parametrize(
    ("said", "asked", "fact"),
    [
        # the query's plural, the message's singular: the search finds it, the excerpt looked for "keys"
        (HILLS, "where are my keys?", "before I forget, I left the spare key with Marta on the third floor"),
        (HILLS, "when did I pay the taxes?", "and the tax return went in on Monday, 312 euros back"),
        (SIERRA, "¿qué dije de las luces?", "y al final se fundió la luz del portal, llamo al del taller el lunes"),
        (SIERRA, "¿qué bares te recomendé?", "y el bar de la esquina de Lavapiés cierra a las tres"),
        # a short word looked for as a start: "barrio" (no hit of the search's) taken for "bar"
        (
            SIERRA + "en el barrio ya lo sabían todos, " + SIERRA[:900],
            "¿qué dije del bar?",
            "el bar de la esquina de Lavapiés cierra a las tres",
        ),
    ],
)
def test_a_long_message_shows_the_words_it_was_found_by_in_their_other_form(
    memory: Memory, database_url: str, said: str, asked: str, fact: str
) -> None:
    """The search finds a plural's singular ("keys": key, "luces": luz, "bares": bar), and a short
    word only as itself; the excerpt looks for the query's word as typed, by its start, so a long
    hit found by the other form is shown from its start, without what it was found by."""
    found = voice_note_searched(memory, database_url, f"[voice note, 1:58] {said}{fact}", asked)

    assert found.startswith("Found 1 older message, best match first:\n\n1. [whatsapp · ")
    assert fact in found


def test_a_web_turn_with_its_clients_thread_leaves_the_reply_it_shows_out_of_its_search(
    memory: Memory, fake: FakeAnthropic, database_url: str
) -> None:
    """The web client sends its thread, which ends with the agent's last reply; the model is shown it
    (the message it answers comes after it), so it is no older message to find."""
    person = uuid.uuid4()
    conversation = memory.create_conversation(person).id
    fake.answer = lambda body: "Noted: the garage door code is 7788."
    turns = turns_with(memory, fake)
    stored = turns.run(
        TurnRequest(Surface.WEB, "The garage door code is 7788", "g-1", user_id=person, conversation_id=conversation)
    )
    assert stored.outcome is Outcome.ANSWERED
    thread = [
        ContextItem(Role(role), content, Surface.WEB, at, id)
        for id, role, content, at in rows(
            database_url,
            "select id, role, content, created_at from messages where user_id = %s order by id",
            person,
        )
    ]
    assert [item.role for item in thread] == [Role.USER, Role.ASSISTANT]
    fake.answer = searching("garage door code")

    answered = turns.run(
        TurnRequest(
            Surface.WEB,
            "what was the garage code?",
            "g-2",
            user_id=person,
            conversation_id=conversation,
            client_history=thread,
        )
    )

    assert answered.reply == "From memory: Nothing found in older messages."


def test_a_message_past_8000_characters_shows_the_words_it_was_found_by(memory: Memory, database_url: str) -> None:
    """A message may hold MAX_MESSAGE_CHARS (16,000 by default: a long voice note's transcript, a
    pasted text); search_memory hands over its first 8,000 characters, so words found past them are
    looked for in a text that no longer holds them, and the hit is shown from its start."""
    person = uuid.uuid4()
    chatter = SIERRA * 6  # some 8,700 characters
    fact = "antes de que se me olvide, el casero me dijo que en abril el alquiler sube a 950 euros"
    planted(database_url, person, "whatsapp", "user", f"[voice note, 9:40] {chatter}{fact}", 40)
    assert 8000 < len(f"[voice note, 9:40] {chatter}{fact}") <= 16000
    tools = MemorySearchTools(memory, person, MADRID, frozenset())

    found = tools.run(ToolCall("a", SEARCH_MEMORY, {"query": "¿qué me dijo el casero del alquiler?"}))

    assert found.content.startswith("Found 1 older message, best match first:\n\n1. [whatsapp · ")
    assert fact in found.content


def test_an_app_and_a_period_holding_more_than_a_search_shows_say_there_are_more(
    memory: Memory, database_url: str
) -> None:
    """A busy week on WhatsApp: the listing shows its newest eight and says the week "holds these 8
    older messages", with nothing to say there are more; the decision of the week's start, never
    shown, reads to the model as never said."""
    person = uuid.uuid4()
    planted(database_url, person, "whatsapp", "user", "decided: we take the flat on Calle Mayor", 6)
    for n in range(11):
        planted(database_url, person, "whatsapp", "user", f"an ordinary message number {n} about nothing", 5 - n / 4)
    today = datetime.now(MADRID).date()
    tools = MemorySearchTools(memory, person, MADRID, frozenset())
    week = {"from_date": str(today - timedelta(days=8)), "to_date": str(today - timedelta(days=1))}

    found = tools.run(ToolCall("a", SEARCH_MEMORY, {"query": "what was agreed", "surface": "whatsapp", **week}))

    assert found.content.startswith(
        "No older message there holds those words (what this conversation shows is not searched)."
    )
    assert "decided: we take the flat on Calle Mayor" not in found.content  # the newest eight only
    assert "more there; narrow the period to see them.)" in found.content


@pytest.mark.parametrize(
    ("said", "asked", "fact"),
    [
        (
            HILLS[:1330] + "and I have to say the weather was great, " + HILLS[:900],
            "what did the landlord say about the rent?",
            "the landlord called: the rent goes up to 950 euros in April",
        ),
        (
            SIERRA[:1330] + "y mi madre me dijo que fuéramos el domingo, " + SIERRA[:900],
            "¿qué me dijo el casero del alquiler?",
            "el casero llamó: en abril el alquiler sube a 950 euros",
        ),
    ],
)
def test_a_long_message_is_shown_around_what_it_was_found_for_not_the_first_common_word(
    memory: Memory, database_url: str, said: str, asked: str, fact: str
) -> None:
    """The question's common word ("say", "dijo") comes early in a long voice note, its rare ones
    (the landlord, the rent) at its end: the excerpt is cut around the first of any of them, and the
    fact the hit was ranked for is left out."""
    found = voice_note_searched(memory, database_url, f"[voice note, 2:40] {said}{fact}", asked)

    assert found.startswith("Found 1 older message, best match first:\n\n1. [whatsapp · ")
    assert fact in found


@pytest.mark.parametrize(
    ("said", "asked"),
    [
        ("https://www.booking.com/hotel/es/casa-sol.html", "the booking link"),
        ("https://www.booking.com/hotel/es/casa-sol.html", "casa sol"),
        ("Call Sam on 555-0142", "0142"),
        ("Pagué 1.250 euros por el sofá", "1250"),
    ],
)
def test_words_and_digits_inside_a_link_or_a_number_are_found(
    memory: Memory, database_url: str, said: str, asked: str
) -> None:
    """Postgres's parser keeps a link's host, a number after a hyphen and a number with a thousands
    separator as one word each ('www.booking.com', '-0142', '1.250'): a word or the digits inside one
    were never found (a review's finding). Such a text is read once more with them apart."""
    assert found_alone(memory, database_url, said, asked)


def test_an_english_question_about_al_searches_al(memory: Memory, database_url: str) -> None:
    """A Spanish stopword that is an English name or word too ('al', 'les', 'como', 'con', 'le') made
    an English question read Spanish, and was dropped from it: "what is Al's number?" searched
    "number" alone and found another number first, and "Al" found nothing (a review's finding)."""
    person = uuid.uuid4()
    fact = planted(database_url, person, "telegram", "user", "Al's number is 612 345 678, call him after six", 30)
    for day in range(1, 6):
        planted(database_url, person, "web", "user", f"my new number {day}", day)
    assert [hit.message.id for hit in memory.search(person, "what is Al's number?")][:1] == [fact]
    assert [hit.message.id for hit in memory.search(person, "Al")] == [fact]


def test_a_word_inside_japanese_chinese_or_korean_text_is_found(memory: Memory, database_url: str) -> None:
    """Japanese and Chinese put no space between words, and Korean none before a particle: a run of
    them was one word, so "東京" never found "来週、東京に行きます", nor "서울" "서울에서" (a review's
    finding: a person writing in Japanese found nothing but a whole sentence typed again)."""
    person = uuid.uuid4()
    tokyo = planted(database_url, person, "telegram", "user", "来週、東京に行きます", 3)
    hotel = planted(database_url, person, "whatsapp", "user", "我下周去北京出差，住在王府井附近的酒店", 4)
    seoul = planted(database_url, person, "web", "user", "다음 주에 서울에서 친구를 만나요", 5)
    sister = planted(database_url, person, "telegram", "user", "妹の誕生日は5月3日です", 6)
    ramen = planted(database_url, person, "telegram", "user", "火曜日は東京駅の一蘭で昼ごはん", 9)
    assert [hit.message.id for hit in memory.search(person, "東京に")] == [tokyo, ramen]
    assert [hit.message.id for hit in memory.search(person, "王府井的酒店")] == [hotel]
    assert [hit.message.id for hit in memory.search(person, "서울")] == [seoul]
    # A word of another alphabet inside such a run is a word of its own.
    laptop = planted(database_url, person, "telegram", "user", "修理に出したMacBookは金曜日に戻る", 2)
    assert [hit.message.id for hit in memory.search(person, "MacBook")] == [laptop]
    assert [hit.message.id for hit in memory.search(person, "妹の誕生日はいつ？")] == [sister, ramen]  # "日は" too
    # A long question keeps its words, not its grammar: of its pairs of letters, the sixteen it is
    # searched by are the ones with the fewest kana of grammar ("火曜", "東京"), not "だけ", "かな".
    asked = "先週の火曜日に東京駅で食べたラーメン屋さんの名前は何だったのかな、また行きたいんだけど"
    assert memory.search(person, asked)[0].message.id == ramen


def test_a_long_chinese_document_is_stored_and_its_start_found(memory: Memory, database_url: str) -> None:
    """Its pairs of letters are read from its first 5,000 characters: 200,000 characters of words
    all different, each paired, took its search words past a tsvector's megabyte, and the message
    could not be stored."""
    person = uuid.uuid4()
    letters = random.Random(7)
    words = ["".join(chr(0x4E00 + letters.randrange(20000)) for _ in range(3)) for _ in range(50_000)]
    document = ("会议纪要 " + " ".join(words))[:200_000]
    pasted = planted(database_url, person, "web", "user", document, 1)
    assert [hit.message.id for hit in memory.search(person, "纪要")] == [pasted]


@pytest.mark.parametrize(
    ("chatter", "fact", "asked"),
    [
        (
            "えーと、週末は子供たちと山に行って、バーベキューをしました。",
            "大家さんから四月に家賃が九万五千円に上がると言われた",
            "家賃",
        ),
        ("주말에는 아이들이랑 산에 가서 바비큐를 했어요. ", "집주인이 사월에 월세를 구십오만 원으로 올린대요", "월세"),
        (
            "えーと、週末は子供たちと山に行って、バーベキューをしました。",
            "修理に出したMacBookは金曜日に戻る",
            "MacBook",
        ),
    ],
)
def test_a_long_message_in_japanese_or_korean_shows_the_words_it_was_found_by(
    memory: Memory, database_url: str, chatter: str, fact: str, asked: str
) -> None:
    """A word inside a run of kanji or hangul has no space around it, and a letter with its voicing
    mark (バ) or any hangul was read as its first part: a long voice note found by "家賃" (rent)
    showed the model its first 1,200 characters, never the rent."""
    person = uuid.uuid4()
    planted(database_url, person, "whatsapp", "user", f"[voice note, 1:58] {chatter * 45}{fact}", 40)
    [hit] = memory.search(person, asked)
    assert fact in rendered([hit], MADRID, max_tokens=1500).text
