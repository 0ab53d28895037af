"""Prompt caching over a 60-turn conversation of one person on three surfaces.

Ours: the real context code (stepped window, role rules, surface tags), the real request
builder (breakpoints after the system prompt, after the person's memory notes and on the
last message) and the real offline digest writing the notes every DIGEST_EVERY on the due
rule of the SQL function `claim_memory_digests`. Each person starts with a full budget of
notes from earlier days. The seed: its sliding window of the last 14 messages, with the
best its pattern allows, one breakpoint after the system prompt, and the same follow-up tools
as ours (a seed with the same abilities: the comparison is of memory, not of what the tools
add). Anthropic's automatic
caching (one top-level `cache_control`, the breakpoint following the conversation) is
priced on our requests too. All priced with Anthropic's caching rules by
`bench.prompt_cache`, the minimum cacheable length taken from MIN_CACHEABLE by model.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.prompt_cache import CacheUsage, PromptCache, count_tokens
from core.follow_ups.capability import TOOLS as FOLLOW_UP_TOOLS
from core.memory.digest import ExtractiveDigester
from core.model.llm import messages_request
from core.models import Role, StoredMessage, Surface
from core.turn.capabilities import DEFAULT_SYSTEM_PROMPT
from core.turn.context import ContextItem, build_model_messages, stepped_tail, web_items
from functions.runtime import context_limits
from functions.settings import Settings

DEFAULTS = context_limits(Settings.defaults())
MODEL, MAX_TOKENS, SEED_WINDOW = Settings.model_fields["anthropic_model"].default, 1024, 14
NOTES_MAX_TOKENS = Settings.model_fields["memory_notes_max_tokens"].default
# Anthropic's minimum cacheable prompt length by model, as documented in 2026.
MIN_CACHEABLE = {
    "claude-sonnet-4-5": 1024,
    "claude-sonnet-4-6": 1024,
    "claude-sonnet-5": 1024,
    # Both 5.5 models cache from 512 tokens (their model pages, read 2 December 2026; docs/research/).
    "claude-sonnet-5-5": 512,
    "claude-haiku-5-5": 512,
    "claude-opus-4-7": 2048,
    "claude-haiku-4-5": 4096,
    "claude-opus-4-5": 4096,
    "claude-opus-4-6": 4096,
}
# What every turn sends, ours and the seed's (FOLLOW_UPS_PER_PERSON > 0): the follow-up tools, first
# in the cache's order.
TOOLS: tuple[dict[str, Any], ...] = FOLLOW_UP_TOOLS
SMALL_CACHE_MODEL = "claude-haiku-4-5"  # a 4,096-token minimum: the system prompt alone caches nothing
DIGEST_EVERY = timedelta(minutes=15)  # the memory_digest schedule (README, Deploy)
WINDOW_HOURS = 24
CACHE_LIFETIME = timedelta(minutes=5)
WORDS = (
    "plan budget train friday dentist sister flight meeting invoice rent landlord lease gym week morning "
    "call remind booked change price hotel dinner project deadline report doctor insurance car repair "
    "weekend groceries birthday gift savings transfer visa passport appointment schedule evening office"
).split()


SWITCH_RATE = 0.15  # people write in sessions: about 7 changes of app over the 60 turns
PEOPLE = 8
WEB_ID = "00000000-0000-4000-8000-0000000000aa"
# The surfaces the benchmarks' people write on: the three measured before SMS, so the figures
# stay comparable with bench/results.json's earlier ones.
SURFACES = (Surface.WEB, Surface.TELEGRAM, Surface.WHATSAPP)
SINGLETONS = {
    Surface.TELEGRAM: "00000000-0000-4000-8000-0000000000bb",
    Surface.WHATSAPP: "00000000-0000-4000-8000-0000000000cc",
}


@dataclass(frozen=True)
class Window:
    max_messages: int = DEFAULTS.max_messages
    step: int = DEFAULTS.window_step
    web_prepend: int = DEFAULTS.web_prepend


@dataclass
class Conversation:
    """A simulated person: 60 turns, 2 to 4 minutes apart, in sessions on one surface."""

    turns: list[tuple[Surface, datetime, str, str]]

    @classmethod
    def generate(
        cls, turns: int = 60, seed: int = 1, switch_rate: float = SWITCH_RATE, start: datetime | None = None
    ) -> Conversation:
        rng = random.Random(seed)
        at = start or datetime(2026, 11, 30, 8, 0, tzinfo=UTC)
        surface = Surface.TELEGRAM
        made = []
        for _ in range(turns):
            if rng.random() < switch_rate:
                surface = rng.choice([s for s in SURFACES if s is not surface])
            at += timedelta(seconds=rng.randint(120, 240))
            made.append((surface, at, sentence(rng, 8, 45), sentence(rng, 40, 140)))
        return cls(made)

    def stored(self, first_id: int = 0) -> list[StoredMessage]:
        """Every message of the conversation as the store would hold it."""
        messages = []
        for index, (surface, at, text, reply) in enumerate(self.turns):
            conversation_id = WEB_ID if surface is Surface.WEB else SINGLETONS[surface]
            messages.append(message(first_id + 2 * index, conversation_id, surface, Role.USER, text, at))
            messages.append(
                message(
                    first_id + 2 * index + 1, conversation_id, surface, Role.ASSISTANT, reply, at + timedelta(seconds=9)
                )
            )
        return messages


def sentence(rng: random.Random, low: int, high: int) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(low, high))]
    return " ".join(words).capitalize() + "."


class NotesSimulation:
    """The digest on a schedule, with the due rule of `claim_memory_digests`: at least one
    window step of the person's messages before the start of the window Telegram and
    WhatsApp show (the latest within the window's hours, stepped) and not covered yet, once
    the person has paused for the prompt cache's lifetime; or some, once they have been
    quiet for the window's hours."""

    def __init__(self, window: Window, notes: str = "", covered: int = 0) -> None:
        self.window = window
        self.notes = notes
        self.covered = covered  # how many of the thread's first messages the notes cover
        self.digester = ExtractiveDigester(NOTES_MAX_TOKENS)
        self.next_run: datetime | None = None

    def catch_up(self, stored: list[StoredMessage], now: datetime) -> None:
        """Every scheduled run up to `now`, on the messages stored by then."""
        if self.next_run is None:
            self.next_run = now - (now - now.replace(minute=0, second=0, microsecond=0)) % DIGEST_EVERY
        while self.next_run <= now:
            self.run(stored, self.next_run)
            self.next_run += DIGEST_EVERY

    def run(self, stored: list[StoredMessage], at: datetime) -> None:
        held = [m for m in stored if m.created_at <= at]
        aged = at - timedelta(hours=WINDOW_HOURS)
        recent = [m for m in held if m.created_at >= aged]
        shown = len(stepped_tail(recent, self.window.max_messages, self.window.step))
        window_start = len(held) - shown
        outside = window_start - self.covered
        if outside <= 0:
            return
        newest = held[-1].created_at
        if (outside >= self.window.step and newest < at - CACHE_LIFETIME) or newest < aged:
            self.notes = self.digester.digest(self.notes, held[self.covered : window_start])
            self.covered = window_start


def earlier_notes(person: int) -> str:
    """A person with days of history: a full budget of notes from an earlier conversation."""
    before = Conversation.generate(seed=1000 + person, start=datetime(2026, 11, 27, 8, 0, tzinfo=UTC))
    return ExtractiveDigester(NOTES_MAX_TOKENS).digest("", before.stored())


@dataclass
class Requests:
    bodies: list[dict[str, Any]]
    shown: list[int]  # messages in each turn's context


def ours_requests(conversation: Conversation, window: Window = Window(), notes: str = "") -> Requests:
    stored: list[StoredMessage] = []
    memory = NotesSimulation(window, notes)
    everything = conversation.stored()
    bodies, shown = [], []
    for index, (surface, at, _, _) in enumerate(conversation.turns):
        stored.append(everything[2 * index])
        memory.catch_up(stored, at)
        if surface is Surface.WEB:
            own = stepped_tail(
                [ContextItem.from_stored(m) for m in stored if str(m.conversation_id) == WEB_ID],
                window.max_messages,
                window.step,
            )
            prepend = [m for m in stored if str(m.conversation_id) != WEB_ID][-window.web_prepend :]
            items = web_items(prepend, [], own[:-1], own[-1])
        else:
            items = stepped_tail([ContextItem.from_stored(m) for m in stored], window.max_messages, window.step)
        messages = build_model_messages(items)
        bodies.append(messages_request(MODEL, MAX_TOKENS, DEFAULT_SYSTEM_PROMPT, messages, memory.notes, tools=TOOLS))
        shown.append(len(items))
        stored.append(everything[2 * index + 1])
    return Requests(bodies, shown)


def automatic(bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The same requests with Anthropic's automatic caching instead of our breakpoints."""
    plain = []
    for body in bodies:
        system = [{k: v for k, v in block.items() if k != "cache_control"} for block in body["system"]]
        messages = [
            {**m, "content": [{k: v for k, v in block.items() if k != "cache_control"} for block in m["content"]]}
            for m in body["messages"]
        ]
        plain.append({**body, "system": system, "messages": messages, "cache_control": {"type": "ephemeral"}})
    return plain


def seed_requests(conversation: Conversation) -> Requests:
    history: list[tuple[Surface, str, str]] = []  # (surface, role, content)
    bodies, shown = [], []
    for surface, _, text, reply in conversation.turns:
        history.append((surface, "user", text))
        if surface is Surface.WEB:
            secondary = [h for h in history if h[0] is not Surface.WEB][-DEFAULTS.web_prepend :]
            window = secondary + [h for h in history if h[0] is Surface.WEB]
        else:
            window = history[-SEED_WINDOW:]
        body = {
            "model": MODEL,
            "max_tokens": MAX_TOKENS,
            "system": [{"type": "text", "text": DEFAULT_SYSTEM_PROMPT, "cache_control": {"type": "ephemeral"}}],
            "messages": [{"role": role, "content": [{"type": "text", "text": content}]} for _, role, content in window],
            "tools": list(TOOLS),
        }
        bodies.append(body)
        shown.append(len(window))
        history.append((surface, "assistant", reply))
    return Requests(bodies, shown)


def message(id_: int, conversation: str, surface: Surface, role: Role, content: str, at: datetime) -> StoredMessage:
    return StoredMessage.from_row(
        {
            "id": id_,
            "conversation_id": conversation,
            "surface": surface.value,
            "role": role.value,
            "content": content,
            "created_at": at.isoformat(),
        }
    )


def price(bodies: list[dict[str, Any]], conversation: Conversation, model: str = MODEL) -> list[CacheUsage]:
    cache = PromptCache(min_tokens=MIN_CACHEABLE[model])
    return [cache.request(body, at.timestamp()) for body, (_, at, _, _) in zip(bodies, conversation.turns, strict=True)]


def summary(usages: list[CacheUsage]) -> dict[str, float]:
    total = sum(u.total for u in usages)
    return {
        "cache_read_share": round(sum(u.cache_read_input_tokens for u in usages) / total, 3),
        "input_cost_ratio": round(sum(u.cost for u in usages) / total, 3),
    }


@dataclass
class Pooled:
    """Both designs (and ours with automatic caching) over PEOPLE simulated people."""

    usages: dict[str, list[CacheUsage]]
    shown: dict[str, list[int]]
    first: dict[str, list[CacheUsage]]

    def summary(self, design: str) -> dict[str, float]:
        return summary(self.usages[design])

    def cost(self, design: str) -> float:
        return sum(u.cost for u in self.usages[design])

    def mean_shown(self, design: str) -> float:
        return round(sum(self.shown[design]) / len(self.shown[design]), 1)

    def tokens_per_turn(self, design: str) -> dict[str, float]:
        """A turn's input tokens, mean: all of them, and those read from and written to the cache
        (what docs/deploy.md's cost per 1,000 turns multiplies by the prices)."""
        usages, count = self.usages[design], len(self.usages[design])
        return {
            "input": round(sum(u.total for u in usages) / count, 1),
            "cache_read": round(sum(u.cache_read_input_tokens for u in usages) / count, 1),
            "cache_write": round(sum(u.cache_creation_input_tokens for u in usages) / count, 1),
            "uncached": round(sum(u.input_tokens for u in usages) / count, 1),
        }


def pooled(switch_rate: float, window: Window = Window(), model: str = MODEL, people: int = PEOPLE) -> Pooled:
    result = Pooled({"ours": [], "seed": [], "automatic": []}, {"ours": [], "seed": []}, {})
    for person in range(1, people + 1):
        conversation = Conversation.generate(seed=person, switch_rate=switch_rate)
        ours = ours_requests(conversation, window, earlier_notes(person))
        seed = seed_requests(conversation)
        priced = {
            "ours": price(ours.bodies, conversation, model),
            "seed": price(seed.bodies, conversation, model),
            "automatic": price(automatic(ours.bodies), conversation, model),
        }
        result.first = result.first or priced
        for design, usages in priced.items():
            result.usages[design] += usages
        result.shown["ours"] += ours.shown
        result.shown["seed"] += seed.shown
    return result


def costs(run: Pooled) -> dict[str, float]:
    return {
        "ours": run.summary("ours")["input_cost_ratio"],
        "seed": run.summary("seed")["input_cost_ratio"],
        "automatic": run.summary("automatic")["input_cost_ratio"],
        "ours_vs_seed": round(run.cost("ours") / run.cost("seed"), 3),
        "automatic_vs_seed": round(run.cost("automatic") / run.cost("seed"), 3),
    }


# The window sizes the README's table compares; the default is one of them.
WINDOWS = (
    Window(16, 8, 8),
    Window(24, 8, 8),
    Window(32, 16, 8),
    Window(36, 20, 12),
    Window(40, 20, 8),
    Window(40, 24, 8),
    Window(48, 24, 8),
)


def run(chart: Path | None = None, people: int = PEOPLE, windows: tuple[Window, ...] = WINDOWS) -> dict[str, Any]:
    main = pooled(SWITCH_RATE, people=people)
    if chart is not None:
        draw(main.first["ours"], main.first["seed"], chart)
    sensitivity = {}
    for rate in (0.05, 0.15, 0.3):
        at_rate = main if rate == SWITCH_RATE else pooled(rate, people=people)
        sensitivity[str(rate)] = {"ours": at_rate.summary("ours"), "seed": at_rate.summary("seed")}
    by_window = []
    for window in windows:
        default = pooled(SWITCH_RATE, window, people=people)
        small = pooled(SWITCH_RATE, window, SMALL_CACHE_MODEL, people=people)
        by_window.append(
            {
                "max_messages": window.max_messages,
                "step": window.step,
                "web_prepend": window.web_prepend,
                "context_messages_mean": default.mean_shown("ours"),
                MODEL: costs(default),
                SMALL_CACHE_MODEL: costs(small),
            }
        )
    small = pooled(SWITCH_RATE, model=SMALL_CACHE_MODEL, people=people)
    return {
        "cache_read_share": {
            "ours": main.summary("ours")["cache_read_share"],
            "seed": main.summary("seed")["cache_read_share"],
            "automatic": main.summary("automatic")["cache_read_share"],
        },
        "input_cost_ratio": {
            "ours": main.summary("ours")["input_cost_ratio"],
            "seed": main.summary("seed")["input_cost_ratio"],
            "automatic": main.summary("automatic")["input_cost_ratio"],
        },
        "context_messages_mean": {"ours": main.mean_shown("ours"), "seed": main.mean_shown("seed")},
        "input_tokens_per_turn": {"ours": main.tokens_per_turn("ours"), "seed": main.tokens_per_turn("seed")},
        "input_cost_vs_seed": round(main.cost("ours") / main.cost("seed"), 3),
        "input_cost_by_model": {MODEL: costs(main), SMALL_CACHE_MODEL: costs(small)},
        "caching_setup": {
            "people": people,
            "turns_each": 60,
            "surface_switch_rate": SWITCH_RATE,
            "system_prompt_tokens": count_tokens(DEFAULT_SYSTEM_PROMPT),
            "model": MODEL,
            "min_cacheable_tokens": MIN_CACHEABLE[MODEL],
            "min_cacheable_by_model": MIN_CACHEABLE,
            "notes_max_tokens": NOTES_MAX_TOKENS,
            "digest_every_minutes": DIGEST_EVERY.seconds // 60,
            "window": {
                "max_messages": DEFAULTS.max_messages,
                "step": DEFAULTS.window_step,
                "web_prepend": DEFAULTS.web_prepend,
                "seed": SEED_WINDOW,
            },
        },
        "caching_by_switch_rate": sensitivity,
        "caching_by_window": by_window,
    }


def draw(ours: list[CacheUsage], seed: list[CacheUsage], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(2, 1, figsize=(11, 6.5), sharex=True, sharey=True)
    for axis, usages, title in (
        (axes[0], ours, "ours: stepped window and memory notes, 3 breakpoints"),
        (axes[1], seed, "seed: last 14 messages, 1 breakpoint after the system prompt"),
    ):
        turns = range(1, len(usages) + 1)
        read = [u.cache_read_input_tokens for u in usages]
        written = [u.cache_creation_input_tokens for u in usages]
        plain = [u.input_tokens for u in usages]
        axis.bar(turns, read, color="#2e9d5b", label="read from cache (0.1x)")
        axis.bar(turns, written, bottom=read, color="#f0a030", label="written to cache (1.25x)")
        axis.bar(
            turns,
            plain,
            bottom=[r + w for r, w in zip(read, written, strict=True)],
            color="#9aa3b5",
            label="uncached (1x)",
        )
        axis.set_title(title, fontsize=11, loc="left")
        axis.set_ylabel("input tokens")
    axes[1].set_xlabel("turn (60 turns, 2-4 minutes apart, over Telegram, WhatsApp and the web)")
    axes[0].legend(loc="upper left", fontsize=9, ncols=3)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
