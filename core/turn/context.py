"""What the model sees: the stored window turned into a valid, cache-stable conversation.

Rules (DESIGN.md): the conversation starts with the person, never has two turns of one
role in a row (they are merged), holds nothing empty, and ends with the person's new
message. Each of the person's messages may carry where and when it was written,
`[telegram · 09:12]`, so the agent can say where something was said. The tag is fixed
per message, so the rendered prefix is the same from one turn to the next.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone
from typing import Final
from zoneinfo import ZoneInfo

from core.errors import DateOutOfRange, HistoryTooLong
from core.media.kinds import Attachment
from core.models import Role, StoredMessage, Surface


# ContextItem, Source and ModelMessage are immutable as StoredMessage is, and for its reason
# (core/models.py): a turn builds each for every message of its window.
@dataclass(slots=True, unsafe_hash=True)
class ContextItem:
    """One message before rendering: stored, or sent by the web client as its history."""

    role: Final[Role]
    content: Final[str]
    surface: Final[Surface]
    created_at: Final[datetime | None] = None
    id: Final[int | None] = None
    attachments: Final[tuple[Attachment, ...]] = ()  # this turn's images and PDFs (never stored)

    @classmethod
    def from_stored(cls, message: StoredMessage) -> ContextItem:
        return cls(message.role, message.content, message.surface, message.created_at, message.id)


@dataclass(slots=True, unsafe_hash=True)
class Source:
    surface: Final[Surface]
    text: Final[str]


@dataclass(slots=True, unsafe_hash=True)
class ModelMessage:
    role: Final[Role]
    content: Final[str]
    sources: Final[tuple[Source, ...]]
    attachments: Final[tuple[Attachment, ...]] = ()  # before the text, as Claude reads best


# What the tag of a message another attempt is answering now says (a chat's burst: the first of two
# sent before its answer came), `[telegram · 09:12 · answered separately]`; the system prompt says
# what it means (core/model/prompt.py's MECHANICS).
ANSWERED_SEPARATELY = "answered separately"


def tag(surface: Surface, local: datetime | None, *, dated: bool = False, separately: bool = False) -> str:
    """Where and when (`local`: the message's time on the person's clock), `[telegram · 09:12]`, and
    the whole date when `dated` (the day's first message in the window), `[telegram · Sun 6 Dec 2026
    · 09:12]`: the model reads each message's day, today's and its year there. A tag depends on the
    message and the one before it only, so it stays the same from turn to turn, across midnight too;
    but for `separately` (ANSWERED_SEPARATELY), said only until the message's reply is in the window."""
    after = f" · {ANSWERED_SEPARATELY}]" if separately else "]"
    if local is None:
        return f"[{surface.value}{after}"
    # %H:%M without strftime, which cost more than the rest of the tag (and every turn tags each of
    # the person's messages in its window).
    time = local.time().isoformat("minutes")
    if dated:
        return f"[{surface.value} · {local:%a} {local.day} {local:%b %Y} · {time}{after}"
    return f"[{surface.value} · {time}{after}"


def from_their_first(items: Sequence[ContextItem | StoredMessage]) -> list[ContextItem | StoredMessage]:
    """Of `items`, the messages with words from the person's first on: the model's conversation
    never starts with its own turn (a reply at the start of a window whose question has left it is
    not shown: memory search finds it)."""
    kept = [item for item in items if item.content.strip()]
    first = next((index for index, item in enumerate(kept) if item.role is Role.USER), len(kept))
    return kept[first:]


def shown(items: Sequence[ContextItem | StoredMessage]) -> list[ContextItem | StoredMessage]:
    """The messages the model is shown of `items`: from the person's first to their last (nor
    does its conversation end with its own turn)."""
    kept = from_their_first(items)
    last = next((index for index in range(len(kept) - 1, -1, -1) if kept[index].role is Role.USER), -1)
    return kept[: last + 1]


def build_model_messages(
    items: Sequence[ContextItem | StoredMessage],
    *,
    annotate: bool = True,
    zone: ZoneInfo | None = None,
    elsewhere: frozenset[int] = frozenset(),
) -> list[ModelMessage]:
    """`elsewhere`: the ids of messages another attempt is answering now (TurnStart's
    answered_elsewhere), shown as answered separately, untagged too (`[answered separately]`)."""
    zone = zone or ZoneInfo("UTC")
    kept = [(item, item.content.strip()) for item in shown(items)]
    merged: list[tuple[Role, list[str], list[Source], list[Attachment]]] = []
    day: date | None = None  # the day of the person's latest message so far
    for item, text in kept:
        rendered = text
        separately = item.id in elsewhere if elsewhere else False
        if annotate and item.role is Role.USER:
            local = item.created_at.astimezone(zone) if item.created_at is not None else None
            # The day's first message in the window bears the date, the same from turn to turn (the
            # window's start moves by steps), so the prefix stays cached.
            dated = local is not None and local.date() != day
            rendered = f"{tag(item.surface, local, dated=dated, separately=separately)} {text}"
            day = local.date() if local is not None else day
        elif separately:
            rendered = f"[{ANSWERED_SEPARATELY}] {text}"
        if merged and merged[-1][0] is item.role:
            merged[-1][1].append(rendered)
            merged[-1][2].append(Source(item.surface, text))
            merged[-1][3].extend(item.attachments)
        else:
            merged.append((item.role, [rendered], [Source(item.surface, text)], list(item.attachments)))
    return [
        ModelMessage(role, "\n\n".join(parts), tuple(sources), tuple(attached))
        for role, parts, sources, attached in merged
    ]


def merged_into_last(
    items: Sequence[ContextItem | StoredMessage], message_id: int | None, elsewhere: frozenset[int] = frozenset()
) -> tuple[int, ...]:
    """The stored messages besides `message_id` that the context's last turn holds: the person's
    messages after the latest reply shown, merged into one turn with it (build_model_messages), and
    after the latest shown as answered separately (`elsewhere`): the prompt tells the model to answer
    only what follows that one, so this turn's answer is neither its nor an earlier one's (an owed
    one read before it), and one whose own attempt fails meanwhile stays owed. A turn the model
    declines is theirs too (turn.sql's mark_declined)."""
    merged: list[int] = []
    for item in reversed(items):
        if not item.content.strip():
            continue  # not shown
        if item.role is not Role.USER or item.id in elsewhere:
            break
        if item.id is not None and item.id != message_id:
            merged.append(item.id)
    return tuple(reversed(merged))


def stepped_tail(items: Sequence[ContextItem], limit: int, step: int) -> list[ContextItem]:
    """The last messages, at most `limit`, whose start moves `step` messages at a time
    (the rule of the SQL function `context_window`, for a history the web client sent)."""
    if limit <= 0:
        return []
    total, step = len(items), max(min(step, limit), 1)
    if total <= limit:
        return list(items)
    keep = total - -(-(total - limit) // step) * step
    return list(items[total - keep :])


# The farthest a time zone's clock is from UTC, either way (a zone's earliest offset, its local mean
# time, may pass ±14:00): a date that can be shown at both can be shown in any zone.
ANY_ZONE = (timezone(timedelta(hours=23, minutes=59)), timezone(-timedelta(hours=23, minutes=59)))


def client_window(
    items: Sequence[ContextItem], *, limit: int, step: int, max_chars: int, fit: bool = False
) -> list[ContextItem]:
    """What the context can use of a history the web client sent, checked before anything
    is stored: its stepped window (the rest would never be shown, so it is neither kept nor
    counted), at most `max_chars` characters in all, and only dates that can be shown in
    any time zone (the person's, remembered from an earlier turn, may be another than
    CONTEXT_TIMEZONE). `fit`: for a client that cannot shorten what it sends (useChat posts its
    whole thread), a window past `max_chars` has its start moved on until it fits, rather than
    being refused: `step` messages at a time, as the stored window's, while more than that are
    left, then one at a time."""
    window = stepped_tail(items, limit, step)
    length = sum(len(item.content) for item in window)
    while fit and length > max_chars:
        window = window[step if len(window) > step else 1 :]
        length = sum(len(item.content) for item in window)
    if length > max_chars:
        raise HistoryTooLong(length, max_chars)
    for item in window:
        if item.created_at is not None:
            try:
                for zone in ANY_ZONE:
                    item.created_at.astimezone(zone)
            except (OverflowError, ValueError, OSError):
                raise DateOutOfRange(item.created_at) from None
    return window


def undeclined(items: Sequence[tuple[ContextItem, bool]]) -> list[ContextItem]:
    """A web client's history, each item with whether it is marked declined, without the turns the
    model declined, as the stored window leaves them out (context.sql): a marked message, and a
    marked reply with the person's unmarked messages right before it (the turn it answered, as the
    model read it: merged_into_last). A page that keeps the history route's marks has the person's
    messages marked already: a reply after a marked message of the person's takes nothing more (one
    sent while the declined turn ran, unmarked, was answered by its own turn, and stays)."""
    kept: list[ContextItem] = []
    marked_in_turn = False  # one of the person's messages since the last reply is marked: the route's marks
    for item, declined in items:
        if not declined:
            kept.append(item)
        elif item.role is Role.ASSISTANT and not marked_in_turn:
            while kept and kept[-1].role is Role.USER:  # the whole turn it answered (merged_into_last)
                kept.pop()
        marked_in_turn = (marked_in_turn or declined) if item.role is Role.USER else False
    return kept


def read_after_page(history: Sequence[StoredMessage], page: Sequence[ContextItem]) -> list[StoredMessage]:
    """What another app said in the thread (`history`: its window) after a page's whole thread
    (`page`) and the page never showed: its messages (the phone's, with their answers) after the
    newest of the thread's own the page shows, else after its first. The page's web turns since,
    which read what the phone said before them, take none of it off the next one's reading."""
    on_page = {item.id for item in page if item.id is not None}
    shown = [index for index, message in enumerate(history) if message.id in on_page]
    thread = [index for index in shown if history[index].surface is not Surface.WEB] or shown[:1]
    since = thread[-1] + 1 if thread else len(history)
    return [message for message in history[since:] if message.id not in on_page and message.surface is not Surface.WEB]


def in_place(
    page: Sequence[ContextItem], later: Sequence[StoredMessage], history: Sequence[StoredMessage]
) -> list[ContextItem]:
    """The page's thread with `later` (read_after_page's) each where the thread (`history`) has it:
    before the first of the page's messages stored after it (its web turns since), else at the end.
    Read after them, a message one of those turns answered (merged with its question, owed) would
    end the thread beside the new question, unanswered, and be answered again."""
    order = {message.id: index for index, message in enumerate(history)}
    pending = [(order[message.id], ContextItem.from_stored(message)) for message in later]
    placed: list[ContextItem] = []
    for item in page:
        at = order.get(item.id) if item.id is not None else None
        while at is not None and pending and pending[0][0] < at:
            placed.append(pending.pop(0)[1])
        placed.append(item)
    return placed + [item for _, item in pending]


def web_items(
    prepend: Sequence[StoredMessage],
    history: Sequence[StoredMessage],
    client_history: Sequence[ContextItem] | None,
    current: ContextItem,
    elsewhere: frozenset[int] = frozenset(),
    since_page: bool = False,
) -> list[ContextItem]:
    """The web's context: its own thread (the client's, else the stored one) after the
    secondary surfaces' recent messages, each message once (by id). A client's thread is its page's:
    another tab's question its own attempt is still answering (`elsewhere`) was never shown there,
    and is read before this message, marked (build_model_messages), as the stored thread has it.
    The person's messages the page shows under stored ids the thread holds (another app's, in its
    thread on the page) are read as stored: corrected on that app (a Telegram edit) since the page
    loaded them, the model reads the correction, not the words the page still shows. `since_page`:
    the client's thread is its page's whole one, and what another app said in the thread since
    (`read_after_page`) is read in it too, where it was said (`in_place`)."""
    if client_history is None:
        own = [ContextItem.from_stored(message) for message in history] or [current]
    else:
        stored = {message.id: message for message in history if message.role is Role.USER}
        client_history = [
            ContextItem.from_stored(stored[item.id]) if item.role is Role.USER and item.id in stored else item
            for item in client_history
        ]
        on_page = {item.id for item in client_history if item.id is not None}
        if since_page:
            later = [
                m for m in read_after_page(history, client_history) if m.id not in elsewhere and m.id != current.id
            ]
            client_history = in_place(client_history, later, history)
        others = [
            ContextItem.from_stored(message)
            for message in history
            if message.id in elsewhere and message.id not in on_page and message.id != current.id
        ]
        own = [*client_history, *others, current]
    seen = {item.id for item in own if item.id is not None}
    before = [ContextItem.from_stored(message) for message in prepend if message.id not in seen]
    return before + own
