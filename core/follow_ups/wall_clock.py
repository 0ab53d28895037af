"""Time as the person lives it: "Friday at 9" arrives as `day` ("friday") and `time` ("09:00"),
resolved in the person's timezone (theirs, else CONTEXT_TIMEZONE) with the clock the turn is
given, stored in UTC, and shown back in the same timezone. A wall time that daylight saving skips
moves forward by the gap; one it repeats is the first of the two still to come. The follow-ups' tools read it
(core/follow_ups/capability.py), and so do the context's tags and the notes' dates (a person's zone).
"""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

MAX_AHEAD = timedelta(days=365)
WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
TIME = re.compile(r"^([01]?\d|2[0-3]):([0-5]\d)$")


class InvalidTime(ValueError):
    """A time the person cannot have meant, said back to the model."""


def zone_named(name: str | None) -> ZoneInfo | None:
    """The IANA timezone of that name, or None for anything else (a browser's bad guess)."""
    if not name or len(name) > 64 or "/" not in name and name != "UTC":
        return None
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):  # OSError: a folder of zones ("America/Argentina")
        return None


def on_wall_clock(day: date, at: time, zone: ZoneInfo, after: datetime | None = None) -> datetime:
    """That wall time in that zone, as an aware UTC time. A time the clocks skip (02:30 on the
    night they spring forward) becomes the same time after the jump (03:30); a time they repeat
    (02:30 on the night they fall back) is the first, or the second when the first is not after
    `after` and the second is (at the second 02:10, "02:30" is in 20 minutes)."""
    # fold=0 reads a skipped time with the offset from before the jump, which lands after it.
    first = datetime.combine(day, at).replace(tzinfo=zone, fold=0).astimezone(UTC)
    # fold=1 is later only for a repeated time (for a skipped one it lands before the jump)
    second = datetime.combine(day, at).replace(tzinfo=zone, fold=1).astimezone(UTC)
    return second if after is not None and first <= after < second else first


def resolve_when(
    now: datetime, zone: ZoneInfo, *, day: str | None = None, at: str | None = None, in_minutes: int | None = None
) -> datetime:
    """When a follow-up is due, in UTC: `in_minutes` from `now`, or `day` at `at` in `zone`."""
    if in_minutes is not None:
        if isinstance(in_minutes, bool) or not isinstance(in_minutes, int) or in_minutes < 1:
            raise InvalidTime("in_minutes must be a whole number of minutes, at least 1")
        if in_minutes > MAX_AHEAD.total_seconds() // 60:
            raise InvalidTime("a follow-up can be at most a year ahead")
        return now.astimezone(UTC) + timedelta(minutes=in_minutes)
    if not at or not (match := TIME.match(at.strip())):
        raise InvalidTime("give time as HH:MM (24-hour), or in_minutes")
    wall = time(int(match[1]), int(match[2]))
    today = now.astimezone(zone).date()
    word = (day or "today").strip().lower()
    if word == "today":
        target = today
    elif word == "tomorrow":
        target = today + timedelta(days=1)
    elif word in WEEKDAYS:
        ahead = (WEEKDAYS.index(word) - today.weekday()) % 7
        target = today + timedelta(days=ahead)
        if ahead == 0 and on_wall_clock(target, wall, zone, now) <= now:
            target += timedelta(days=7)  # "on Friday" said on a Friday after that time: next week's
    else:
        try:
            target = date.fromisoformat(word)
        except ValueError as exc:
            raise InvalidTime("day must be today, tomorrow, a weekday or YYYY-MM-DD") from exc
    # Days far off are refused before a clock reads them: 9999-12-31 in New York is past what a
    # datetime holds once in UTC (and 0001-01-01 in Tokyo before it).
    if target - today > MAX_AHEAD + timedelta(days=1):
        raise InvalidTime("a follow-up can be at most a year ahead")
    if today - target > timedelta(days=1):
        raise InvalidTime(f"{target.isoformat()} has already passed")
    due = on_wall_clock(target, wall, zone, now)
    if due <= now:
        raise InvalidTime(f"{shown(due, zone)} has already passed")
    if due - now > MAX_AHEAD:
        raise InvalidTime("a follow-up can be at most a year ahead")
    return due


def shown(moment: datetime, zone: ZoneInfo) -> str:
    """A UTC time as the person reads it: `Fri 4 Dec 2026 09:00 (Europe/Madrid)`."""
    local = moment.astimezone(zone)
    return f"{local:%a} {local.day} {local:%b %Y %H:%M} ({zone.key})"
