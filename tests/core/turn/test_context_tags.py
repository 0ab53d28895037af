"""The tags on the person's messages (core/turn/context.py): where and when, on the person's clock,
and the whole date on each day's first message, the model's one view of today's date and year."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

from core.errors import HistoryTooLong
from core.models import Role, Surface
from core.turn.context import ContextItem, build_model_messages, client_window, merged_into_last

MADRID = ZoneInfo("Europe/Madrid")


def said(role: Role, surface: Surface, text: str, at: str) -> ContextItem:
    return ContextItem(role, text, surface, datetime.fromisoformat(at).replace(tzinfo=UTC))


THREAD = [
    said(Role.USER, Surface.TELEGRAM, "I fly home on the 24th", "2026-12-05T21:40:00"),
    said(Role.ASSISTANT, Surface.TELEGRAM, "Noted.", "2026-12-05T21:40:05"),
    said(Role.USER, Surface.WHATSAPP, "morning!", "2026-12-06T07:05:00"),
    said(Role.USER, Surface.WHATSAPP, "coffee first", "2026-12-06T07:06:00"),
    said(Role.ASSISTANT, Surface.WHATSAPP, "Good morning.", "2026-12-06T07:06:05"),
    said(Role.USER, Surface.WEB, "how many days until my flight?", "2026-12-06T08:12:00"),
]


def test_each_days_first_message_bears_the_whole_date_on_the_persons_clock() -> None:
    messages = build_model_messages(THREAD, zone=MADRID)
    assert [(message.role, message.content) for message in messages] == [
        (Role.USER, "[telegram · Sat 5 Dec 2026 · 22:40] I fly home on the 24th"),
        (Role.ASSISTANT, "Noted."),
        (Role.USER, "[whatsapp · Sun 6 Dec 2026 · 08:05] morning!\n\n[whatsapp · 08:06] coffee first"),
        (Role.ASSISTANT, "Good morning."),
        (Role.USER, "[web · 09:12] how many days until my flight?"),
    ]


def test_a_message_is_tagged_alike_from_one_turn_to_the_next_so_the_prefix_stays_cached() -> None:
    """The date goes on a day's first message, never on the latest one alone: a message keeps its
    tag once later ones follow it, the same day's."""
    earlier = build_model_messages(THREAD[:4], zone=MADRID)
    later = build_model_messages(THREAD, zone=MADRID)
    assert later[: len(earlier)] == earlier


def test_without_annotations_no_tag_and_no_date() -> None:
    messages = build_model_messages(THREAD, annotate=False, zone=MADRID)
    assert messages[0].content == "I fly home on the 24th"


def test_across_midnight_the_earlier_messages_keep_their_tags() -> None:
    """Saturday's later messages gained a weekday once Sunday began (`[web · Sat 23:50]`), and the
    cached prefix changed at midnight (a re-review); a day's first message dates its day now."""
    saturday = [
        said(Role.USER, Surface.WEB, "x", "2026-12-05T20:00:00"),
        said(Role.ASSISTANT, Surface.WEB, "ok", "2026-12-05T20:00:05"),
        said(Role.USER, Surface.WEB, "y", "2026-12-05T22:50:00"),
    ]
    sunday = said(Role.USER, Surface.WEB, "z", "2026-12-05T23:10:00")  # 00:10 in Madrid
    before = build_model_messages(saturday, zone=MADRID)
    after = build_model_messages([*saturday, sunday], zone=MADRID)
    assert [message.content for message in before] == ["[web · Sat 5 Dec 2026 · 21:00] x", "ok", "[web · 23:50] y"]
    assert after[: len(before) - 1] == before[:-1]
    assert after[-1].content == "[web · 23:50] y\n\n[web · Sun 6 Dec 2026 · 00:10] z"


BURST = [
    ContextItem(Role.USER, "what time is it in Lima?", Surface.TELEGRAM, datetime(2026, 12, 6, 7, 0, tzinfo=UTC), 1),
    ContextItem(Role.USER, "I'm at the station", Surface.TELEGRAM, datetime(2026, 12, 6, 7, 5, tzinfo=UTC), 2),
    ContextItem(Role.USER, "which train?", Surface.TELEGRAM, datetime(2026, 12, 6, 7, 6, tzinfo=UTC), 3),
]


def test_a_message_another_attempt_is_answering_is_shown_so_and_not_merged_into_this_turn() -> None:
    """A chat's burst: "I'm at the station" (2) is being answered by its own turn while "which
    train?" (3) is: this turn reads it marked, tagged or not (the prompt's MECHANICS says what the
    mark means), and does not count it among the messages its answer answers, nor an owed one read
    before it (1: the prompt says to answer what follows the mark), so that one whose own attempt
    fails stays owed."""
    tagged = build_model_messages(BURST, zone=MADRID, elsewhere=frozenset({2}))
    assert [message.content for message in tagged] == [
        "[telegram · Sun 6 Dec 2026 · 08:00] what time is it in Lima?\n\n"
        "[telegram · 08:05 · answered separately] I'm at the station\n\n"
        "[telegram · 08:06] which train?"
    ]
    untagged = build_model_messages(BURST, annotate=False, elsewhere=frozenset({2}))
    assert [message.content for message in untagged] == [
        "what time is it in Lima?\n\n[answered separately] I'm at the station\n\nwhich train?"
    ]
    assert merged_into_last(BURST, 3, frozenset({2})) == ()
    assert merged_into_last(BURST, 3, frozenset({1})) == (2,)
    assert merged_into_last(BURST, 3) == (1, 2)


def test_a_client_window_past_its_characters_is_refused_or_fitted() -> None:
    """A history the client could shorten (today's body) is refused past `max_chars`; one posted
    whole by a client that cannot (useChat) has its start moved on until it fits: `step` messages
    at a time while more than that are left, then one at a time, so a few long messages leave the
    last ones that fit, not none."""
    items = [
        ContextItem(Role.USER if i % 2 == 0 else Role.ASSISTANT, f"{i:02d}" + "x" * 98, Surface.WEB) for i in range(30)
    ]
    options = {"limit": 39, "step": 10}
    assert client_window(items, max_chars=3_000, **options) == items
    with pytest.raises(HistoryTooLong):
        client_window(items, max_chars=2_999, **options)
    fitted = client_window(items, max_chars=2_999, fit=True, **options)
    assert [item.content[:2] for item in fitted] == [f"{i:02d}" for i in range(10, 30)]
    fitted = client_window(items, max_chars=950, fit=True, **options)
    assert [item.content[:2] for item in fitted] == [f"{i:02d}" for i in range(21, 30)]
    assert client_window(items, max_chars=99, fit=True, **options) == []
