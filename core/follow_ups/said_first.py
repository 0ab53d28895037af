"""Held follow-ups said before a turn's answer: WhatsApp's, held while the person's 24-hour window
was shut (core/follow_ups/outside_thread.py), go before whatever answers their next message.

`begin_turn` brings them (`TurnStart.delivered_first`); they are said as the person reads them,
late, each saying when it was due (core/follow_ups/lateness.py), on the person's clock (theirs,
else the one it was asked in) and in the turn's language. A surface that pushes (a channel) sends
them first, each from the part not out yet; one that answers in its response carries as many as it
has room for (`first_room`, the request's), and the turn's last round trip leaves the rest to the
follow-up job (never a round trip of their own after it: the database failing then would leave
them marked said)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime
from zoneinfo import ZoneInfo

from core.follow_ups.lateness import said_late
from core.follow_ups.wall_clock import zone_named
from core.models import Delivery, SaidFirst, TurnStart
from core.phrases.catalogue import Phrases
from core.turn.request import ReplyChannel

# How many of the held follow-ups a caller's response has room for beside a text.
Room = Callable[[str, Sequence[SaidFirst]], int]


class HeldFirst:
    def __init__(self, phrases: Callable[[str | None], Phrases], now: Callable[[], datetime], zone: ZoneInfo) -> None:
        self._phrases = phrases
        self._now = now
        self._zone = zone  # CONTEXT_TIMEZONE: the clock of a person and a follow-up with none

    def as_said(self, start: TurnStart) -> list[SaidFirst]:
        """The held follow-ups as the person reads them, in `start.language`."""
        if not start.delivered_first:  # nearly every turn: nothing held
            return []
        phrases, now = self._phrases(start.language), self._now()
        told: list[SaidFirst] = []
        for said in start.delivered_first:
            if said.due_at is not None:
                zone = zone_named(start.timezone) or zone_named(said.timezone) or self._zone
                said = replace(said, content=said_late(said.content, said.due_at, now, zone, phrases))
            told.append(said)
        return told

    def pushed(
        self, start: TurnStart, channel: ReplyChannel | None, until: float
    ) -> tuple[list[SaidFirst], list[SaidFirst]]:
        """Sent through a channel that pushes; else returned first, for the caller's response to
        carry. Second, when one did not go for a reason that may pass: the ones pushed, each from
        the part not out yet (its count of parts when all went), which the next answer starts them
        from. One refused for good (the number cannot receive) is passed over: waiting would never
        say it."""
        first = self.as_said(start)
        if channel is None:
            return first, []
        pushed: list[SaidFirst] = []
        for said in first:
            sent = channel.send(said.content, until, said.from_part)
            pushed.append(replace(said, from_part=sent.parts))
            if sent.delivery is Delivery.OWED:
                return [], pushed
        return [], []


def with_room(first: list[SaidFirst], text: str, room: Room | None) -> tuple[list[SaidFirst], list[SaidFirst]]:
    """The held follow-ups said first that the caller's response has room for beside `text`, and
    the rest, which the turn's last round trip leaves to the follow-up job."""
    if room is None or not first:
        return first, []
    fits = room(text, first)
    return first[:fits], first[fits:]
