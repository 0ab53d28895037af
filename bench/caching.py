"""Prompt caching over a 60-turn conversation of one person on three surfaces.

Ours: the real context code (stepped window, role rules, surface tags) and the real
request builder (a breakpoint after the system prompt and one on the last message).
The seed: its sliding window of the last 14 messages, with the best its pattern allows,
one breakpoint after the system prompt. Both priced with Anthropic's caching rules by
`bench.prompt_cache` (minimum cacheable length 1024 tokens, as for Claude Sonnet).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.prompt_cache import CacheUsage, PromptCache, count_tokens
from core.context import ContextItem, build_model_messages, stepped_tail, web_items
from core.llm import messages_request
from core.models import Role, StoredMessage, Surface
from core.prompt import DEFAULT_SYSTEM_PROMPT

MODEL, MAX_TOKENS, MIN_CACHEABLE = "claude-sonnet-4-5", 1024, 1024
MAX_MESSAGES, STEP, WEB_PREPEND, SEED_WINDOW = 16, 8, 8, 14
WORDS = (
    "plan budget train friday dentist sister flight meeting invoice rent landlord lease gym week morning "
    "call remind booked change price hotel dinner project deadline report doctor insurance car repair "
    "weekend groceries birthday gift savings transfer visa passport appointment schedule evening office"
).split()


SWITCH_RATE = 0.15  # people write in sessions: about 7 changes of app over the 60 turns
PEOPLE = 8


@dataclass
class Conversation:
    """A simulated person: 60 turns, 2 to 4 minutes apart, in sessions on one surface."""

    turns: list[tuple[Surface, datetime, str, str]]

    @classmethod
    def generate(cls, turns: int = 60, seed: int = 1, switch_rate: float = SWITCH_RATE) -> Conversation:
        rng = random.Random(seed)
        at = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)
        surface = Surface.TELEGRAM
        made = []
        for _ in range(turns):
            if rng.random() < switch_rate:
                surface = rng.choice([s for s in Surface if s is not surface])
            at += timedelta(seconds=rng.randint(120, 240))
            made.append((surface, at, sentence(rng, 8, 45), sentence(rng, 40, 140)))
        return cls(made)


def sentence(rng: random.Random, low: int, high: int) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(low, high))]
    return " ".join(words).capitalize() + "."


def ours_requests(conversation: Conversation) -> list[dict[str, Any]]:
    stored: list[StoredMessage] = []
    web_id = "00000000-0000-4000-8000-0000000000aa"
    singletons = {
        Surface.TELEGRAM: "00000000-0000-4000-8000-0000000000bb",
        Surface.WHATSAPP: "00000000-0000-4000-8000-0000000000cc",
    }
    requests = []
    for index, (surface, at, text, reply) in enumerate(conversation.turns):
        conversation_id = web_id if surface is Surface.WEB else singletons[surface]
        stored.append(message(2 * index, conversation_id, surface, Role.USER, text, at))
        if surface is Surface.WEB:
            own = stepped_tail(
                [ContextItem.from_stored(m) for m in stored if str(m.conversation_id) == web_id], MAX_MESSAGES, STEP
            )
            prepend = [m for m in stored if str(m.conversation_id) != web_id][-WEB_PREPEND:]
            items = web_items(prepend, [], own[:-1], own[-1])
        else:
            items = stepped_tail([ContextItem.from_stored(m) for m in stored], MAX_MESSAGES, STEP)
        messages = build_model_messages(items)
        requests.append(messages_request(MODEL, MAX_TOKENS, DEFAULT_SYSTEM_PROMPT, messages))
        stored.append(
            message(2 * index + 1, conversation_id, surface, Role.ASSISTANT, reply, at + timedelta(seconds=9))
        )
    return requests


def seed_requests(conversation: Conversation) -> list[dict[str, Any]]:
    history: list[tuple[Surface, str, str]] = []  # (surface, role, content)
    requests = []
    for surface, _, text, reply in conversation.turns:
        history.append((surface, "user", text))
        if surface is Surface.WEB:
            secondary = [h for h in history if h[0] is not Surface.WEB][-WEB_PREPEND:]
            window = secondary + [h for h in history if h[0] is Surface.WEB]
        else:
            window = history[-SEED_WINDOW:]
        body = {
            "model": MODEL,
            "max_tokens": MAX_TOKENS,
            "system": [{"type": "text", "text": DEFAULT_SYSTEM_PROMPT, "cache_control": {"type": "ephemeral"}}],
            "messages": [{"role": role, "content": [{"type": "text", "text": content}]} for _, role, content in window],
        }
        requests.append(body)
        history.append((surface, "assistant", reply))
    return requests


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


def price(requests: list[dict[str, Any]], conversation: Conversation) -> list[CacheUsage]:
    cache = PromptCache(min_tokens=MIN_CACHEABLE)
    return [
        cache.request(body, at.timestamp()) for body, (_, at, _, _) in zip(requests, conversation.turns, strict=True)
    ]


def summary(usages: list[CacheUsage]) -> dict[str, float]:
    total = sum(u.total for u in usages)
    return {
        "cache_read_share": round(sum(u.cache_read_input_tokens for u in usages) / total, 3),
        "input_cost_ratio": round(sum(u.cost for u in usages) / total, 3),
    }


def pooled(switch_rate: float) -> tuple[dict[str, float], dict[str, float], list[CacheUsage], list[CacheUsage]]:
    """Both designs over PEOPLE simulated people; the first person's turns for the chart."""
    ours: list[CacheUsage] = []
    seed: list[CacheUsage] = []
    first: tuple[list[CacheUsage], list[CacheUsage]] | None = None
    for person in range(1, PEOPLE + 1):
        conversation = Conversation.generate(seed=person, switch_rate=switch_rate)
        mine, theirs = (
            price(ours_requests(conversation), conversation),
            price(seed_requests(conversation), conversation),
        )
        first = first or (mine, theirs)
        ours += mine
        seed += theirs
    assert first is not None
    return summary(ours), summary(seed), first[0], first[1]


def run(chart: Path | None = None) -> dict[str, Any]:
    mine, theirs, first_ours, first_seed = pooled(SWITCH_RATE)
    if chart is not None:
        draw(first_ours, first_seed, chart)
    sensitivity = {}
    for rate in (0.05, 0.15, 0.3):
        ours_at, seed_at, _, _ = pooled(rate)
        sensitivity[str(rate)] = {"ours": ours_at, "seed": seed_at}
    return {
        "cache_read_share": {"ours": mine["cache_read_share"], "seed": theirs["cache_read_share"]},
        "input_cost_ratio": {"ours": mine["input_cost_ratio"], "seed": theirs["input_cost_ratio"]},
        "caching_setup": {
            "people": PEOPLE,
            "turns_each": 60,
            "surface_switch_rate": SWITCH_RATE,
            "system_prompt_tokens": count_tokens(DEFAULT_SYSTEM_PROMPT),
            "min_cacheable_tokens": MIN_CACHEABLE,
            "window": {"max_messages": MAX_MESSAGES, "step": STEP, "web_prepend": WEB_PREPEND, "seed": SEED_WINDOW},
        },
        "caching_by_switch_rate": sensitivity,
    }


def draw(ours: list[CacheUsage], seed: list[CacheUsage], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(2, 1, figsize=(11, 6.5), sharex=True, sharey=True)
    for axis, usages, title in (
        (axes[0], ours, "ours: stepped window, 2 breakpoints"),
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
