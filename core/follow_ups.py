"""Follow-ups, the capability: the agent messages the person later on its own. Its tools, its
part of the system prompt, the rules, and the person's time.

The model gets four tools in every turn (`TOOLS`, a constant: it sits in the cached prefix
before the system prompt and never changes): schedule a follow-up, list the pending ones, cancel
one, set the person's timezone. A tool runs here, on what `begin_turn` brought (the person's
pending follow-ups and timezone), and only records intent: `finish_turn` writes it, so a turn
still costs two round trips. A tool call costs a second model request only when the model needs
its result to answer: a list, a refusal, or a call that came with no text (core/tool_loop.py).
FOLLOW_UPS_PER_PERSON=0 switches it off: no tools, and the prompt says the agent cannot.

Time as the person lives it: "Friday at 9" arrives as `day` ("friday") and `time` ("09:00"),
resolved here in the person's timezone (theirs, else CONTEXT_TIMEZONE) with the clock the turn
is given, stored in UTC, and shown back in the same timezone. A wall time that daylight saving
skips moves forward by the gap; one it repeats is the first of the two.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from core.model.llm import ToolCall
from core.models import FollowUp
from core.tool_loop import ToolResult

if TYPE_CHECKING:
    from core.capabilities import TurnState

MAX_AHEAD = timedelta(days=365)
WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
TIME = re.compile(r"^([01]?\d|2[0-3]):([0-5]\d)$")

SCHEDULE, LIST, CANCEL, SET_TIMEZONE = "schedule_follow_up", "list_follow_ups", "cancel_follow_up", "set_timezone"

# The tool definitions: the same bytes in every turn (the prompt cache's prefix).
TOOLS: tuple[dict[str, Any], ...] = (
    {
        "name": SCHEDULE,
        "description": (
            "Schedule a follow-up: a message you will send the person on your own at a later time, "
            "on the app they are using now (a reminder, a check-in). Give either in_minutes, or day "
            "and time as the person said them; they are read in the person's timezone. content is "
            "exactly what you will say then, addressed to the person. Only when the person asks."
        ),
        "input_schema": {
            "type": "object",
            "properties": {
                "content": {"type": "string", "description": "What to say then, e.g. 'Time to call the dentist.'"},
                "day": {
                    "type": "string",
                    "description": "today, tomorrow, a weekday (monday..sunday: the next one) or YYYY-MM-DD",
                },
                "time": {"type": "string", "description": "HH:MM, 24-hour, the person's local time"},
                "in_minutes": {"type": "integer", "description": "From now, instead of day and time"},
            },
            "required": ["content"],
        },
    },
    {
        "name": LIST,
        "description": "List the person's pending follow-ups, with their ids and local times.",
        "input_schema": {"type": "object", "properties": {}},
    },
    {
        "name": CANCEL,
        "description": "Cancel one of the person's pending follow-ups by its id (from list_follow_ups).",
        "input_schema": {
            "type": "object",
            "properties": {"id": {"type": "integer"}},
            "required": ["id"],
        },
    },
    {
        "name": SET_TIMEZONE,
        "description": (
            "Set the person's timezone when they tell you where they are or that they moved "
            "(an IANA name such as Europe/Madrid)."
        ),
        "input_schema": {
            "type": "object",
            "properties": {"timezone": {"type": "string"}},
            "required": ["timezone"],
        },
    },
)


INSTRUCTIONS = """\
Reminders and follow-ups
- You can message the person later on your own: schedule_follow_up sends them what you write, \
at the time they asked (their timezone), on the app they use. Use it when they ask for a \
reminder or a check-in, and say when it will come. list_follow_ups and cancel_follow_up show \
and cancel the pending ones; set_timezone records where they live when they tell you.
"""

SWITCHED_OFF = """\
Reminders and follow-ups
- You cannot set reminders or message the person later on your own: say so, and suggest they \
set one on their phone.
"""


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


def on_wall_clock(day: date, at: time, zone: ZoneInfo) -> datetime:
    """That wall time in that zone, as an aware UTC time. A time the clocks skip (02:30 on the
    night they spring forward) becomes the same time after the jump (03:30); a time they repeat
    (02:30 on the night they fall back) is the first."""
    # fold=0 reads a skipped time with the offset from before the jump, which lands after it.
    return datetime.combine(day, at).replace(tzinfo=zone, fold=0).astimezone(UTC)


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
        if ahead == 0 and on_wall_clock(target, wall, zone) <= now:
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
    due = on_wall_clock(target, wall, zone)
    if due <= now:
        raise InvalidTime(f"{shown(due, zone)} has already passed")
    if due - now > MAX_AHEAD:
        raise InvalidTime("a follow-up can be at most a year ahead")
    return due


def shown(moment: datetime, zone: ZoneInfo) -> str:
    """A UTC time as the person reads it: `Fri 4 Dec 2026 09:00 (Europe/Madrid)`."""
    local = moment.astimezone(zone)
    return f"{local:%a} {local.day} {local:%b %Y %H:%M} ({zone.key})"


@dataclass(frozen=True)
class FollowUpRules:
    max_pending: int = 20  # FOLLOW_UPS_PER_PERSON; 0 turns follow-ups off
    max_chars: int = 16000  # MAX_MESSAGE_CHARS: the text is bounded like a message


@dataclass
class TurnTools:
    """One turn's tools: what they answer the model, and the changes `finish_turn` writes."""

    rules: FollowUpRules
    pending: list[FollowUp]
    zone: ZoneInfo
    now: datetime
    scheduled: list[dict[str, Any]] = field(default_factory=list)
    cancelled: list[int] = field(default_factory=list)
    timezone: str | None = None  # set in this turn (a tool, or the web client's Intl zone)
    definitions: tuple[dict[str, Any], ...] = TOOLS
    round_trips: int = 0  # they only record intent: finish_turn writes it

    def must_answer(self, result: ToolResult) -> bool:
        """A list is for the model to read; a schedule or a cancel is only recorded."""
        return result.call.name == LIST

    def recorded(self) -> dict[str, Any]:
        """finish_turn's arguments for what the tools changed, within the person's limit."""
        changes = self.changes()
        return {"follow_ups": changes, "max_follow_ups": self.rules.max_pending} if changes else {}

    def changes(self) -> dict[str, Any]:
        """What finish_turn writes: empty when the tools changed nothing."""
        changes: dict[str, Any] = {}
        if self.scheduled:
            changes["schedule"] = self.scheduled
        if self.cancelled:
            changes["cancel"] = self.cancelled
        if self.timezone:
            changes["timezone"] = self.timezone
        return changes

    def run(self, call: ToolCall) -> ToolResult:
        try:
            if call.name == SCHEDULE:
                return ToolResult(call, self._schedule(call.input))
            if call.name == LIST:
                return ToolResult(call, self._list())
            if call.name == CANCEL:
                return ToolResult(call, self._cancel(call.input))
            if call.name == SET_TIMEZONE:
                return ToolResult(call, self._set_timezone(call.input))
        except InvalidTime as exc:
            return ToolResult(call, f"Not done: {exc}.", is_error=True)
        return ToolResult(call, f"Not done: there is no tool {call.name!r}.", is_error=True)

    def _schedule(self, arguments: dict[str, Any]) -> str:
        content = str(arguments.get("content") or "").replace("\x00", "").strip()
        if not content:
            raise InvalidTime("content is empty")
        if len(content) > self.rules.max_chars:
            raise InvalidTime(f"content is longer than {self.rules.max_chars} characters")
        live = len(self.pending) - len(self.cancelled) + len(self.scheduled)
        if live >= self.rules.max_pending:
            raise InvalidTime(
                f"the person already has {live} pending follow-ups, the most allowed; one must be cancelled first"
            )
        minutes = arguments.get("in_minutes")
        due = resolve_when(
            self.now,
            self.zone,
            day=_text(arguments.get("day")),
            at=_text(arguments.get("time")),
            in_minutes=minutes if minutes is not None else None,
        )
        self.scheduled.append({"content": content, "due_at": due.isoformat(), "timezone": self.zone.key})
        return f"Scheduled for {shown(due, self.zone)}."

    def _list(self) -> str:
        pending = [f for f in self.pending if f.id not in self.cancelled]
        lines = [f"#{f.id} {shown(f.due_at, self.zone)}: {f.content}" for f in pending]
        lines += [
            f"(new) {shown(datetime.fromisoformat(s['due_at']), self.zone)}: {s['content']}" for s in self.scheduled
        ]
        return "\n".join(lines) if lines else "No pending follow-ups."

    def _cancel(self, arguments: dict[str, Any]) -> str:
        wanted = arguments.get("id")
        match = next((f for f in self.pending if f.id == wanted and f.id not in self.cancelled), None)
        if match is None:
            raise InvalidTime(f"no pending follow-up #{wanted}")
        self.cancelled.append(match.id)
        return f"Cancelled #{match.id} ({shown(match.due_at, self.zone)})."

    def _set_timezone(self, arguments: dict[str, Any]) -> str:
        zone = zone_named(_text(arguments.get("timezone")))
        if zone is None:
            raise InvalidTime("not an IANA timezone name (like Europe/Madrid)")
        self.zone, self.timezone = zone, zone.key
        return f"Timezone set to {zone.key}; it is {self.now.astimezone(zone):%a %H:%M} there now."


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def turn_tools(
    rules: FollowUpRules, pending: list[FollowUp], zone: ZoneInfo, now: datetime, client_zone: str | None
) -> TurnTools:
    """A turn's tools; a web client's Intl timezone, when it differs from the person's, is set."""
    tools = TurnTools(rules, pending, zone, now)
    if (sent := zone_named(client_zone)) is not None and str(sent) != str(zone):
        tools.zone, tools.timezone = sent, sent.key
    return tools


@dataclass(frozen=True, eq=False)
class FollowUps:
    """The capability (core/capabilities.py), on while `rules.max_pending` is above 0."""

    rules: FollowUpRules

    @property
    def instructions(self) -> str:
        return INSTRUCTIONS if self.rules.max_pending > 0 else SWITCHED_OFF

    @property
    def definitions(self) -> tuple[dict[str, Any], ...]:
        return TOOLS if self.rules.max_pending > 0 else ()

    def toolset(self, turn: TurnState) -> TurnTools | None:
        if self.rules.max_pending <= 0:
            return None
        return turn_tools(self.rules, turn.start.follow_ups, turn.zone, turn.now, turn.client_zone)
