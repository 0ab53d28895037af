"""On the web, a message whose own attempt is still answering it is never merged into another
turn: one page open in two tabs gets each message answered once; a chat's burst is still read
whole (docs/decisions.md). Real Postgres, the real SDK at the fake Anthropic; the first turn is held inside
its model call by an event, so the second runs while it is still answering."""

from __future__ import annotations

import threading
import uuid
from typing import Any

from core.identity.policy import IdentityPolicy
from core.memory.service import Memory
from core.model.llm import AnthropicModel
from core.models import Surface
from core.turn.capabilities import DEFAULT_SYSTEM_PROMPT
from core.turn.request import Outcome, TurnRequest, TurnResult, TurnSettings
from core.turn.turns import Turns
from tests.fakes.anthropic_api import FakeAnthropic
from tests.helpers import rows

SETTINGS = TurnSettings(system_prompt=DEFAULT_SYSTEM_PROMPT, fallback_reply="FALLBACK", stranger_reply="NO")


def texts(body: dict[str, Any]) -> list[tuple[str, str]]:
    """A model request's turns, each its role and its words without the `[web · 09:12]` tags."""
    return [
        (message["role"], "\n\n".join(part.split("] ", 1)[-1] for part in message["content"][0]["text"].split("\n\n")))
        for message in body["messages"]
    ]


def held_first_answer(fake: FakeAnthropic, held: str) -> tuple[threading.Event, threading.Event]:
    """The model answers each request with its last words; the one asking `held` waits, inside its
    model call, until released: (asked, release)."""
    asked, release = threading.Event(), threading.Event()

    def answer(body: dict[str, Any]) -> str:
        last = texts(body)[-1][1]
        if last == held:
            asked.set()
            assert release.wait(30)
        return f"answer to: {last}"

    fake.answer = answer
    return asked, release


def test_a_message_another_tab_is_still_answering_is_not_answered_with_the_next(
    memory: Memory, fake_anthropic: FakeAnthropic, database_url: str
) -> None:
    """Tab A sends a question; while it is answered, tab B (the same conversation, the page's body
    without history: the stored thread) sends another. B's turn reads B's message alone, and each
    question gets one answer: never A's question answered by both turns."""
    model = AnthropicModel(api_key="sk-ant-test", model="claude-test-1", max_tokens=321, base_url=fake_anthropic.url)
    turns = Turns(memory, lambda: model, IdentityPolicy("auto"), SETTINGS)
    person = uuid.uuid4()
    web = memory.create_conversation(person)
    asked, release = held_first_answer(fake_anthropic, "what is the capital of Peru?")
    first: list[TurnResult] = []
    tab_a = threading.Thread(
        target=lambda: first.append(
            turns.run(
                TurnRequest(
                    Surface.WEB,
                    "what is the capital of Peru?",
                    "tab-a-1",
                    user_id=person,
                    conversation_id=web.id,
                    deadline_s=30,
                )
            )
        )
    )
    tab_a.start()
    assert asked.wait(30)
    second = turns.run(
        TurnRequest(Surface.WEB, "and of Chile?", "tab-b-1", user_id=person, conversation_id=web.id, deadline_s=30)
    )
    release.set()
    tab_a.join(30)
    assert (first[0].outcome, first[0].reply) == (Outcome.ANSWERED, "answer to: what is the capital of Peru?")
    assert (second.outcome, second.reply) == (Outcome.ANSWERED, "answer to: and of Chile?")
    assert texts(fake_anthropic.requests[1]) == [("user", "and of Chile?")]
    listing = rows(
        database_url,
        "select role, content from messages where conversation_id = %s order by created_at, id",
        web.id,
    )
    assert listing == [
        ("user", "what is the capital of Peru?"),
        ("user", "and of Chile?"),
        ("assistant", "answer to: and of Chile?"),
        ("assistant", "answer to: what is the capital of Peru?"),
    ]
    # The next turn reads both questions and both answers, each once.
    third = turns.run(
        TurnRequest(Surface.WEB, "thanks", "tab-b-2", user_id=person, conversation_id=web.id, deadline_s=30)
    )
    assert third.outcome is Outcome.ANSWERED
    assert texts(fake_anthropic.requests[2]) == [
        ("user", "what is the capital of Peru?\n\nand of Chile?"),
        ("assistant", "answer to: and of Chile?\n\nanswer to: what is the capital of Peru?"),
        ("user", "thanks"),
    ]


def test_a_second_message_on_telegram_before_the_first_is_answered_reads_it(
    memory: Memory, fake_anthropic: FakeAnthropic, database_url: str
) -> None:
    """On a chat app a person writes in bursts: the second message's turn reads the first while its
    answer is being written (docs/decisions.md), so "which train?" is answered knowing the station.
    The first still gets its own answer."""
    model = AnthropicModel(api_key="sk-ant-test", model="claude-test-1", max_tokens=321, base_url=fake_anthropic.url)
    turns = Turns(memory, lambda: model, IdentityPolicy("auto"), SETTINGS)
    person = uuid.uuid4()
    asked, release = held_first_answer(fake_anthropic, "I'm at the station")
    first: list[TurnResult] = []
    one = TurnRequest(Surface.TELEGRAM, "I'm at the station", "tg-in-flight-1", user_id=person, deadline_s=30)
    thread = threading.Thread(target=lambda: first.append(turns.run(one)))
    thread.start()
    assert asked.wait(30)
    two = TurnRequest(Surface.TELEGRAM, "which train?", "tg-in-flight-2", user_id=person, deadline_s=30)
    second = turns.run(two)
    release.set()
    thread.join(30)
    assert [first[0].reply, second.reply] == [
        "answer to: I'm at the station",
        "answer to: I'm at the station\n\nwhich train?",
    ]
    assert texts(fake_anthropic.requests[1]) == [("user", "I'm at the station\n\nwhich train?")]


def test_a_chat_message_still_being_answered_is_not_answered_on_the_web_too(
    memory: Memory, fake_anthropic: FakeAnthropic
) -> None:
    """The web puts the other apps' latest before a new conversation (WEB_PREPEND_MESSAGES): a
    Telegram message whose answer is still being written is not among them, so the web's first
    message is answered alone, and the Telegram one once, on Telegram."""
    model = AnthropicModel(api_key="sk-ant-test", model="claude-test-1", max_tokens=321, base_url=fake_anthropic.url)
    turns = Turns(memory, lambda: model, IdentityPolicy("auto"), SETTINGS)
    person = uuid.uuid4()
    asked, release = held_first_answer(fake_anthropic, "remind me what I said about Lima")
    first: list[TurnResult] = []
    chat = TurnRequest(Surface.TELEGRAM, "remind me what I said about Lima", "tg-prepend-1", user_id=person)
    thread = threading.Thread(target=lambda: first.append(turns.run(chat)))
    thread.start()
    assert asked.wait(30)
    web = memory.create_conversation(person)
    second = turns.run(
        TurnRequest(Surface.WEB, "hello from the laptop", "web-prepend-1", user_id=person, conversation_id=web.id)
    )
    release.set()
    thread.join(30)
    assert [first[0].reply, second.reply] == [
        "answer to: remind me what I said about Lima",
        "answer to: hello from the laptop",
    ]
    assert texts(fake_anthropic.requests[1]) == [("user", "hello from the laptop")]
