"""Recall after three days: do facts a person planted reach what the model is sent?

Simulated people write on Telegram, WhatsApp and the web for three days (a morning and an
evening session a day, changing app with probability 0.15 a turn) and plant six facts
("my sister's name is …", "the appointment moved to …"), two a day, among ordinary
messages (some of them about themselves too). After the last evening, one final turn on
each surface; a fact is recalled on that surface when its text is in the request: system
blocks (our notes), window, prepend.

Ours: the real context code and request builder, the default window, and the memory notes
written every DIGEST_EVERY by the offline extractive digest on the due rule. The seed: its
last 14 messages within 24 hours on Telegram and WhatsApp; on the web, its frontend's
whole thread with the last 8 Telegram/WhatsApp messages within 24 hours before it.

With the offline digest this measures the plumbing (the digest's due rule, what the notes
keep within MEMORY_NOTES_MAX_TOKENS, the block reaching the request), not how well a model
summarises: a model's notes condense, so they would keep more within the same budget.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from bench.caching import (
    DEFAULTS,
    SEED_WINDOW,
    SINGLETONS,
    SURFACES,
    WEB_ID,
    NotesSimulation,
    Window,
    message,
    sentence,
)
from core.model.llm import messages_request
from core.models import Role, StoredMessage, Surface
from core.turn.capabilities import DEFAULT_SYSTEM_PROMPT
from core.turn.context import ContextItem, build_model_messages, stepped_tail, web_items

PEOPLE = 8
DAYS = 3
SESSIONS = ((8, 0), (19, 0))  # a morning and an evening session each day
TURNS_PER_SESSION = 12
SWITCH_RATE = 0.15
ABOUT_THEMSELVES = 0.3  # the share of ordinary messages that are about the person too
WINDOW_HOURS = 24
NAMES = ["Ana", "Bruno", "Chiara", "Dmitri", "Elif", "Farah", "Goran", "Hana", "Ines", "Jonas", "Kemal", "Lucia"]
DAYS_OF_WEEK = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"]
FACTS = [
    "My sister's name is {name}.",
    "The appointment moved to {day}.",
    "My landlord is called {name}.",
    "Remember that the gate code is {number}.",
    "My daughter's teacher is {name}.",
    "The dentist moved my checkup to {day} at {number}.",
]
CHATTER = ["I think", "My plan:", "I need to", "We should", "I might"]


@dataclass
class Thread:
    """One person's three days: every message, the facts, and when the final turns come."""

    messages: list[StoredMessage]
    facts: list[str]
    final_at: datetime


def generate(person: int) -> Thread:
    rng = random.Random(7000 + person)
    facts = [
        template.format(name=rng.choice(NAMES), day=rng.choice(DAYS_OF_WEEK), number=rng.randint(1000, 9999))
        for template in FACTS
    ]
    total = DAYS * len(SESSIONS) * TURNS_PER_SESSION
    planted = {slot: fact for slot, fact in zip(fact_slots(rng, total), facts, strict=True)}
    messages: list[StoredMessage] = []
    surface = Surface.TELEGRAM
    turn = 0
    first = datetime(2026, 11, 27, tzinfo=UTC)
    for day in range(DAYS):
        for hour, minute in SESSIONS:
            at = first + timedelta(days=day, hours=hour, minutes=minute)
            surface = rng.choice(SURFACES)
            for _ in range(TURNS_PER_SESSION):
                if rng.random() < SWITCH_RATE:
                    surface = rng.choice([s for s in SURFACES if s is not surface])
                at += timedelta(seconds=rng.randint(120, 240))
                text = planted.get(turn) or ordinary(rng)
                conversation = WEB_ID if surface is Surface.WEB else SINGLETONS[surface]
                messages.append(message(2 * turn, conversation, surface, Role.USER, text, at))
                reply = sentence(rng, 40, 140)
                messages.append(
                    message(2 * turn + 1, conversation, surface, Role.ASSISTANT, reply, at + timedelta(seconds=9))
                )
                turn += 1
    final_at = first + timedelta(days=DAYS - 1, hours=22)
    return Thread(messages, facts, final_at)


def fact_slots(rng: random.Random, total: int) -> list[int]:
    """Two turns a day, in different sessions of it."""
    per_day = total // DAYS
    half = per_day // 2
    slots = []
    for day in range(DAYS):
        slots.append(day * per_day + rng.randrange(half))
        slots.append(day * per_day + half + rng.randrange(half))
    return slots


def ordinary(rng: random.Random) -> str:
    text = sentence(rng, 8, 45)
    return f"{rng.choice(CHATTER)} {text[0].lower()}{text[1:]}" if rng.random() < ABOUT_THEMSELVES else text


def ours_request(thread: Thread, surface: Surface) -> dict[str, Any]:
    window = Window()  # the defaults
    memory = NotesSimulation(window)
    memory.catch_up(thread.messages, thread.messages[0].created_at)  # the schedule starts with the thread
    memory.catch_up(thread.messages, thread.final_at)
    since = thread.final_at - timedelta(hours=WINDOW_HOURS)
    current = final_message(surface, thread.final_at)
    if surface is Surface.WEB:
        own = [ContextItem.from_stored(m) for m in thread.messages if str(m.conversation_id) == WEB_ID]
        own = stepped_tail([*own, current], window.max_messages, window.step)
        secondary = [m for m in thread.messages if str(m.conversation_id) != WEB_ID and m.created_at >= since]
        items = web_items(secondary[-window.web_prepend :], [], own[:-1], own[-1])
    else:
        recent = [ContextItem.from_stored(m) for m in thread.messages if m.created_at >= since]
        items = stepped_tail([*recent, current], window.max_messages, window.step)
    return messages_request("bench", 1024, DEFAULT_SYSTEM_PROMPT, build_model_messages(items), memory.notes)


def seed_request(thread: Thread, surface: Surface) -> dict[str, Any]:
    since = thread.final_at - timedelta(hours=WINDOW_HOURS)
    recent = [m for m in thread.messages if m.created_at >= since]
    if surface is Surface.WEB:
        secondary = [m for m in recent if m.surface is not Surface.WEB][-DEFAULTS.web_prepend :]
        window = secondary + [m for m in thread.messages if m.surface is Surface.WEB]
    else:
        window = recent[-(SEED_WINDOW - 1) :]
    texts = [m.content for m in window] + ["What do you remember about me?"]
    return {"system": [{"type": "text", "text": DEFAULT_SYSTEM_PROMPT}], "messages": texts}


def final_message(surface: Surface, at: datetime) -> ContextItem:
    return ContextItem(Role.USER, "What do you remember about me?", surface, at)


def request_text(body: dict[str, Any]) -> str:
    parts = [block["text"] for block in body["system"]]
    for item in body["messages"]:
        parts += [item] if isinstance(item, str) else [block["text"] for block in item["content"]]
    return "\n".join(parts)


def recalled(body: dict[str, Any], facts: list[str]) -> int:
    text = request_text(body)
    return sum(fact in text for fact in facts)


def run() -> dict[str, Any]:
    found = {"ours": 0, "seed": 0}
    asked = 0
    by_day = {"ours": [0] * DAYS, "seed": [0] * DAYS}
    for person in range(1, PEOPLE + 1):
        thread = generate(person)
        for surface in SURFACES:
            asked += len(thread.facts)
            for design, body in (("ours", ours_request(thread, surface)), ("seed", seed_request(thread, surface))):
                found[design] += recalled(body, thread.facts)
                for day in range(DAYS):
                    by_day[design][day] += recalled(body, thread.facts[2 * day : 2 * day + 2])
    per_day = asked // DAYS
    return {
        "fact_recall_after_3_days": {design: round(found[design] / asked, 3) for design in found},
        "fact_recall_by_day": {design: [round(n / per_day, 3) for n in counts] for design, counts in by_day.items()},
        "recall_setup": {
            "people": PEOPLE,
            "days": DAYS,
            "turns_a_day": len(SESSIONS) * TURNS_PER_SESSION,
            "facts_each": len(FACTS),
            "ordinary_messages_about_themselves": ABOUT_THEMSELVES,
            "digest": "offline extractive",
        },
    }
