"""Memory search: months of a person's life, and whether what they ask about reaches the model.

A synthetic conversation of four months (`DAYS`), written here: every day a few sessions on
Telegram, WhatsApp and the web, ordinary messages in English and Spanish (some about the very
things the facts are about: "I should call my sister", "el médico siempre llega tarde"), and
`FACTS` planted 1 to 120 days before the questions, each asked later in other words than it was
said ("We had dinner at Casa Lucio, the paella was amazing" -> "what was the name of that
restaurant where I had paella?"). Stored in a real Postgres through the schema, so the search is
the real `search_memory`.

A fact reaches the model's request when its message's text is in it: the window and the notes
(ours: the real context code, the default window, the offline digest on its schedule), or the
tool's result when the stand-in searches with the question exactly as it was asked
(`notes_only` vs `with_search`). Beside it, the configurations compared for docs/benchmarks.md,
each over the same rows and the same questions, a fact found when it is among the hits a search
shows (SEARCH_MAX_HITS): ours; every word required (`plainto_tsquery`, simple + unaccent); English
stemming with the words ranked by ts_rank; trigram word similarity (pg_trgm).

Latency: `search_ms_p50` / `search_ms_p95` of `search_memory` over 1,000,000 stored messages, the
searching person's 10,000 of them, with the person's questions.
"""

from __future__ import annotations

import json
import random
import statistics
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import psycopg

from bench.caching import SURFACES, NotesSimulation, Window
from core.memory.search import SearchRules, rendered
from core.memory.service import Memory
from core.model.llm import messages_request
from core.models import Role, StoredMessage, Surface
from core.stores.postgres_store import PostgresStore
from core.surfaces import rules as surface_rules
from core.turn.capabilities import DEFAULT_SYSTEM_PROMPT
from core.turn.context import ContextItem, build_model_messages, stepped_tail
from functions.runtime import context_limits
from functions.settings import Settings

DAYS = 120
SESSIONS_A_DAY = 3
TURNS_A_SESSION = 8
ZONE = ZoneInfo("Europe/Madrid")
NOW = datetime(2026, 12, 2, 18, 0, tzinfo=UTC)

# (what the person said, what they ask later), {slots} filled per person.
FACTS = [
    (
        "We had dinner at {restaurant}, the paella there was amazing",
        "what was the name of that restaurant where I had paella?",
    ),
    ("The doctor said I should take {mg} mg of the new pills every morning", "what dose did the doctor tell me?"),
    ("My sister {name} arrives on the {day}th by train", "when did I say my sister arrives?"),
    ("I went to the support group on {weekday} evening, it really helped", "when did I go to the support group?"),
    ("The new code for my bike lock is {code}", "what's the code of my bike lock?"),
    ("{name} the plumber is coming on {weekday} to fix the boiler", "who was coming to fix the boiler?"),
    ("I booked the flight to {city} for {month}", "what flight did I book?"),
    ("My landlord is called {name}, he lives upstairs", "what's my landlord's name?"),
    ("The vet said {pet} needs the rabies vaccine in {month}", "what did the vet say about {pet}?"),
    ("Our wedding anniversary is on the {day}th of {month}", "when is our anniversary?"),
    ("Mi hermana {name} llega el {day} en el tren de la tarde", "¿cuándo llega mi hermana?"),
    ("La contraseña del wifi de casa es {code}", "¿cuál era la contraseña del wifi?"),
    ("El médico me dijo que tomara {mg} mg de ibuprofeno después de comer", "¿qué me dijo el médico del ibuprofeno?"),
    ("Cenamos en el restaurante {restaurant} y estaba buenísimo", "¿cómo se llamaba el restaurante donde cenamos?"),
    ("La reunión con el banco es el {weekday} a las {hour}", "¿cuándo era la reunión con el banco?"),
    ("Mi jefe nuevo se llama {name}", "¿cómo se llama mi jefe?"),
    ("El cumpleaños de mi madre es el {day} de {month_es}", "¿cuándo es el cumpleaños de mi madre?"),
    ("Aparqué el coche en la planta {floor} del parking del hospital", "¿dónde aparqué el coche?"),
    ("My passport expires in {month}, I need to renew it", "when does my passport expire?"),
    ("The insurance policy number is {code}", "what was my insurance policy number?"),
]
# What people also say, about the same things: the ranking must still find the fact.
DISTRACTORS = [
    "I should call my sister at some point this week",
    "the doctor was late again today",
    "that restaurant near the office closed down",
    "my landlord never answers the phone",
    "the flight prices are crazy this month",
    "el médico siempre llega tarde",
    "tengo que llamar a mi hermana",
    "el banco me ha vuelto a cobrar una comisión",
    "the boiler is making that noise again",
    "necesito cambiar la contraseña del correo",
    "the vet bills are getting expensive",
    "mi madre me ha llamado tres veces hoy",
    "I forgot my bike at work",
    "group chats are exhausting",
    "my passport photo is terrible",
    "the insurance company sent another letter",
    "el parking del centro está carísimo",
    "mi jefe está de vacaciones",
]
EVERYDAY = [
    "good morning!",
    "ok thanks",
    "I'm on the bus",
    "buenos días",
    "vale, gracias",
    "what should I cook tonight?",
    "qué día más largo",
    "can you help me write an email?",
    "estoy cansadísimo",
    "remind me what we talked about",
    "perfect, thank you",
    "jaja sí",
]
# Ordinary sentences: a broad everyday vocabulary in both languages, as a life's chat has.
SUBJECTS_EN = ["I", "We", "My partner", "The kids", "My friend Sam", "My colleague", "Everyone at work", "My neighbour"]
VERBS_EN = ["need to", "want to", "forgot to", "finally managed to", "might", "have to", "tried to", "would love to"]
ACTIONS_EN = [
    "buy groceries",
    "clean the kitchen",
    "finish the report",
    "go running",
    "watch that series",
    "fix the shelf",
    "answer those emails",
    "plan the weekend",
    "water the plants",
    "call the bank about the card",
    "pick up the parcel",
    "paint the hallway",
    "read the new book",
    "bake something",
    "sort out the taxes",
    "renew the gym membership",
    "walk along the river",
    "visit the museum",
    "try the new cafe",
    "learn some Italian",
]
WHEN_EN = ["today", "tomorrow", "this weekend", "tonight", "before Friday", "next week", "after lunch", "soon"]
SUBJECTS_ES = ["Yo", "Mi pareja", "Los niños", "Mi amiga Carla", "Mi compañero", "Mi vecino", "Todos en casa"]
VERBS_ES = ["tengo que", "quiero", "se me olvidó", "por fin pude", "intento", "debería", "me encantaría"]
ACTIONS_ES = [
    "hacer la compra",
    "limpiar la cocina",
    "terminar el informe",
    "salir a correr",
    "ver esa serie",
    "arreglar la estantería",
    "contestar los correos",
    "organizar el finde",
    "regar las plantas",
    "recoger el paquete",
    "pintar el pasillo",
    "leer el libro nuevo",
    "hacer un bizcocho",
    "ir al mercado",
    "pasear por el parque",
    "llevar el abrigo a la tintorería",
    "preparar la maleta",
    "ordenar el armario",
]
WHEN_ES = ["hoy", "mañana", "este finde", "esta noche", "antes del viernes", "la semana que viene", "luego"]
REPLIES = [
    "That sounds like a good plan. Start with the smallest step and see how it goes.",
    "Good idea. Do you want me to help you break it into steps?",
    "Understood. Let me know how it goes.",
    "Buena idea. ¿Quieres que lo dividamos en pasos pequeños?",
    "Entendido, avísame qué tal va.",
    "Noted. Anything else on your mind today?",
    "That can wait until tomorrow if you are tired.",
    "Suena bien. Empieza por lo más fácil.",
]


def ordinary(rng: random.Random) -> str:
    roll = rng.random()
    if roll < 0.06:
        return rng.choice(DISTRACTORS)
    if roll < 0.25:
        return rng.choice(EVERYDAY)
    if roll < 0.6:
        return f"{rng.choice(SUBJECTS_EN)} {rng.choice(VERBS_EN)} {rng.choice(ACTIONS_EN)} {rng.choice(WHEN_EN)}"
    return f"{rng.choice(SUBJECTS_ES)} {rng.choice(VERBS_ES)} {rng.choice(ACTIONS_ES)} {rng.choice(WHEN_ES)}"


def answer(rng: random.Random, said: str) -> str:
    """The agent's reply: a stock answer, or the person's words taken up again."""
    if rng.random() < 0.3:
        return f"About that: {said.rstrip('.!?')}. {rng.choice(REPLIES)}"
    return rng.choice(REPLIES)


SLOTS = {
    "restaurant": ["Casa Lucio", "La Tasquita", "Botín", "El Brillante", "Sacha"],
    "mg": ["200", "400", "600"],
    "name": ["Lucía", "Marta", "Jorge", "Aisha", "Tomasz", "Ingrid", "Kenji"],
    "day": [str(d) for d in range(3, 28)],
    "weekday": ["Monday", "Tuesday", "Thursday", "Friday"],
    "code": ["4471", "9902", "RIVER-88", "k7x2p9", "55120"],
    "city": ["Lisbon", "Oslo", "Marrakesh", "Porto", "Kraków"],
    "month": ["January", "February", "March", "April"],
    "month_es": ["enero", "febrero", "marzo", "abril"],
    "pet": ["Luna", "Toby", "Milo"],
    "hour": ["9:30", "11:00", "16:15"],
    "floor": ["-2", "-3", "4"],
}


@dataclass(frozen=True)
class Planted:
    said: str
    asked: str
    days_before: float
    message_id: int = 0


@dataclass
class Life:
    """One person's months: the stored rows (with their ids in the database) and the facts."""

    user_id: uuid.UUID
    messages: list[StoredMessage]
    facts: list[Planted]


def fill_slots(text: str, rng: random.Random, chosen: dict[str, str]) -> str:
    for slot, values in SLOTS.items():
        if "{" + slot + "}" in text:
            chosen.setdefault(slot, rng.choice(values))
    return text.format(**chosen) if "{" in text else text


def live(connection: psycopg.Connection[Any], person: int, days: int = DAYS, facts: int = len(FACTS)) -> Life:
    """Writes one person's months into the database, in order, and returns them."""
    rng = random.Random(29_000 + person)
    user = uuid.UUID(int=rng.getrandbits(128), version=4)
    conversations = {}
    for surface in SURFACES:
        title = "" if surface is Surface.WEB else surface_rules(surface).title()
        row = connection.execute(
            "insert into conversations (user_id, surface, title) values (%s, %s, %s) returning id",
            (user, surface.value, title),
        ).fetchone()
        assert row is not None
        conversations[surface] = row[0]
    chosen = [{} for _ in FACTS]  # type: list[dict[str, str]]
    wanted = rng.sample(range(len(FACTS)), facts)
    ages = sorted((rng.uniform(1, days), index) for index in wanted)
    pending = list(ages)  # the oldest last: taken first
    planted: list[Planted] = []
    rows: list[tuple[Any, ...]] = []
    start = NOW - timedelta(days=days)
    for day in range(days):
        for session in range(SESSIONS_A_DAY):
            at = start + timedelta(days=day, hours=8 + 5 * session, minutes=rng.randint(0, 50))
            surface = rng.choice(SURFACES)
            for _ in range(TURNS_A_SESSION):
                at += timedelta(seconds=rng.randint(60, 300))
                text = ordinary(rng)
                if pending and (NOW - at).total_seconds() / 86400 <= pending[-1][0]:
                    _, index = pending.pop()
                    said, asked = FACTS[index]
                    text = fill_slots(said, rng, chosen[index])
                    planted.append(Planted(text, fill_slots(asked, rng, chosen[index]), (NOW - at) / timedelta(days=1)))
                rows.append((conversations[surface], user, surface.value, "user", text, at))
                reply = answer(rng, text)
                later = at + timedelta(seconds=9)
                rows.append((conversations[surface], user, surface.value, "assistant", reply, later))
    with connection.cursor() as cursor:
        cursor.executemany(
            "insert into messages (conversation_id, user_id, surface, role, content, created_at)"
            " values (%s, %s, %s, %s, %s, %s)",
            rows,
        )
    stored = connection.execute(
        "select id, conversation_id, surface, role, content, created_at from messages where user_id = %s"
        " order by created_at, id",
        (user,),
    ).fetchall()
    messages = [StoredMessage(i, c, Surface(s), Role(r), t, at) for i, c, s, r, t, at in stored]
    ids = {m.content: m.id for m in messages if m.role is Role.USER}
    facts_with_ids = [Planted(f.said, f.asked, f.days_before, ids[f.said]) for f in planted]
    return Life(user, messages, facts_with_ids)


def digested(life: Life) -> str:
    """The person's notes at the time of the questions: the offline digest on its schedule."""
    notes = NotesSimulation(Window())
    notes.catch_up(life.messages, life.messages[0].created_at)
    notes.catch_up(life.messages, NOW)
    return notes.notes


def window_and_notes(life: Life, notes: str, question: str) -> tuple[str, list[int]]:
    """The request a Telegram turn sends with the question (no search): its text, and the ids
    of the messages in its window."""
    window = Window()
    since = NOW - timedelta(hours=Settings.defaults().context_window_hours)
    recent = [m for m in life.messages if m.created_at >= since]
    kept = stepped_tail([ContextItem.from_stored(m) for m in recent], window.max_messages - 1, window.step)
    current = ContextItem(Role.USER, question, Surface.TELEGRAM, NOW)
    body = messages_request("bench", 1024, DEFAULT_SYSTEM_PROMPT, build_model_messages([*kept, current]), notes)
    text = "\n".join(block["text"] for block in body["system"])
    text += "\n".join(block["text"] for m in body["messages"] for block in m["content"])
    return text, [item.id for item in kept if item.id is not None]


# The configurations compared: each returns the ids of its best SEARCH_MAX_HITS messages.
ALTERNATIVES = {
    "all_words_simple_unaccent": """
        select m.id from messages m
         where m.user_id = %(user)s
           and m.search_text @@ plainto_tsquery('simple', extensions.unaccent(%(q)s))
         order by ts_rank(m.search_text, plainto_tsquery('simple', extensions.unaccent(%(q)s))) desc, m.id desc
         limit %(limit)s""",
    "english_stemming_ranked": """
        with q as (select replace(plainto_tsquery('english', %(q)s)::text, '&', '|')::tsquery as q)
        select m.id from messages m, q
         where m.user_id = %(user)s and q.q::text <> '' and to_tsvector('english', m.content) @@ q.q
         order by ts_rank(to_tsvector('english', m.content), q.q) desc, m.id desc
         limit %(limit)s""",
    "trigram_word_similarity": """
        select m.id from messages m
         where m.user_id = %(user)s
         order by extensions.word_similarity(lower(%(q)s), lower(m.content)) desc, m.id desc
         limit %(limit)s""",
}


def run(database_url: str, people: int = 3, days: int = DAYS, facts: int = len(FACTS)) -> dict[str, Any]:
    rules = SearchRules()
    memory = Memory(PostgresStore(database_url), context_limits(Settings.defaults()))
    asked = 0
    reached = {"notes_only": 0, "with_search": 0}
    found = {"ours_search_memory": 0, **dict.fromkeys(ALTERNATIVES, 0)}
    by_age = {"1-7": [0, 0], "8-30": [0, 0], "31-120": [0, 0]}  # [asked, reached with search]
    with psycopg.connect(database_url, autocommit=True) as connection:
        connection.execute("create extension if not exists pg_trgm with schema extensions")
        lives = [live(connection, person, days, facts) for person in range(people)]
        connection.execute("vacuum (analyze) messages")
        for life in lives:
            notes = digested(life)
            for fact in life.facts:
                asked += 1
                text, seen = window_and_notes(life, notes, fact.asked)
                in_reach = fact.said in text
                hits = memory.search(life.user_id, fact.asked, exclude_ids=seen, limit=rules.max_hits)
                shown = rendered(hits, ZONE, rules.max_tokens)
                searched = in_reach or " ".join(fact.said.split()) in shown.text
                reached["notes_only"] += in_reach
                reached["with_search"] += searched
                band = "1-7" if fact.days_before <= 7 else "8-30" if fact.days_before <= 30 else "31-120"
                by_age[band][0] += 1
                by_age[band][1] += searched
                # The configurations side by side search everything (the window's messages too).
                everything = memory.search(life.user_id, fact.asked, limit=rules.max_hits)
                found["ours_search_memory"] += fact.message_id in [h.message.id for h in everything]
                for name, query in ALTERNATIVES.items():
                    ids = [
                        row[0]
                        for row in connection.execute(
                            query, {"user": life.user_id, "q": fact.asked, "limit": rules.max_hits}
                        )
                    ]
                    found[name] += fact.message_id in ids
    memory.store.close()
    return {
        "memory_recall": {
            "with_search": round(reached["with_search"] / asked, 3),
            "notes_only": round(reached["notes_only"] / asked, 3),
            "with_search_by_days_before": {
                band: round(hit / count, 3) if count else None for band, (count, hit) in by_age.items()
            },
            "configurations": {name: round(n / asked, 3) for name, n in found.items()},
            "setup": {
                "people": people,
                "days": days,
                "messages_each": len(lives[0].messages),
                "facts_each": facts,
                "questions": asked,
                "languages": "English and Spanish",
                "search": f"search_memory, the question as asked, {rules.max_hits} hits, {rules.max_tokens} tokens",
                "notes": "offline extractive digest on its schedule",
            },
        }
    }


def search_latency(database_url: str, total: int = 1_000_000, own: int = 10_000, samples: int = 200) -> dict[str, Any]:
    """`search_memory` over `total` stored messages, the searching person's `own` of them (a life
    of questions and facts as above), everybody else's lives as many people of `own` messages."""
    memory = Memory(PostgresStore(database_url), context_limits(Settings.defaults()))
    rng = random.Random(29)
    with psycopg.connect(database_url, autocommit=True) as connection:
        days = max(own // (2 * SESSIONS_A_DAY * TURNS_A_SESSION), 1)
        life = live(connection, 99, days=days)
        others = max((total - len(life.messages)) // own, 0)
        for _ in range(others):
            person = uuid.UUID(int=rng.getrandbits(128), version=4)
            row = connection.execute(
                "insert into conversations (user_id, surface, title) values (%s, 'telegram', '[Telegram]')"
                " returning id",
                (person,),
            ).fetchone()
            assert row is not None
            first = NOW - timedelta(minutes=own)
            with (
                connection.cursor() as cursor,
                cursor.copy(
                    "copy messages (conversation_id, user_id, surface, role, content, created_at) from stdin"
                ) as copy,
            ):
                for n in range(own // 2):
                    said = ordinary(rng)
                    at = first + timedelta(minutes=2 * n)
                    copy.write_row((row[0], person, "telegram", "user", said, at))
                    copy.write_row((row[0], person, "telegram", "assistant", answer(rng, said), at))
        connection.execute("vacuum (analyze) messages")  # as autovacuum would after a bulk load
        stored = connection.execute("select count(*) from messages").fetchone()
    questions = [fact.asked for fact in life.facts]
    for question in questions:  # warm: pages read
        memory.search(life.user_id, question)
    times = []
    for index in range(samples):
        began = time.perf_counter()
        memory.search(life.user_id, questions[index % len(questions)])
        times.append((time.perf_counter() - began) * 1000)
    memory.store.close()
    times.sort()
    return {
        "search_ms_p50": round(statistics.median(times), 2),
        "search_ms_p95": round(times[int(0.95 * (len(times) - 1))], 2),
        "search_setup": {
            "stored_messages": stored[0] if stored else 0,
            "persons_messages": len(life.messages),
            "samples": samples,
            "questions": len(questions),
        },
    }


def measure(database_url: str, *, quick: bool = False) -> dict[str, Any]:
    """Both parts; `quick`: a month of one person and 20,000 messages, for `make test`."""
    if quick:
        figures = run(database_url, people=1, days=30, facts=8)
        figures.update(search_latency(database_url, total=20_000, own=2_000, samples=20))
    else:
        figures = run(database_url)
        figures.update(search_latency(database_url))
    return figures


if __name__ == "__main__":
    from bench.results import bench_database, save

    with bench_database() as database_url:
        measured = measure(database_url)
    for key, value in measured.items():
        save(key, value)
    print(json.dumps(measured, indent=2))
