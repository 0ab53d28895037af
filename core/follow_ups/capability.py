"""Follow-ups, the capability: the agent messages the person later on its own. Its tools, its
part of the system prompt, and the rules.

The model gets four tools in every turn (`TOOLS`, a constant: it sits in the cached prefix
before the system prompt and never changes): schedule a follow-up, list the pending ones, cancel
one, set the person's timezone. A tool runs here, on what `begin_turn` brought (the person's
pending follow-ups and timezone), and only records intent: `finish_turn` writes it, so a turn
still costs two round trips; but a schedule first holds the follow-up's place among the person's
FOLLOW_UPS_PER_PERSON (`reserve_follow_up`, one round trip, in a turn that schedules only), so
that of two turns of the person's racing for the last place the second is told it is not set,
never refused by its finish_turn after the person read "I'll remind you". A tool call costs a
second model request only when the model needs its result to answer: a list, a refusal, a
follow-up that may wait past its time, a time of day read on a timezone the person never gave,
"tomorrow" said after midnight, or a call that came with no text (core/turn/tool_loop.py).
FOLLOW_UPS_PER_PERSON=0 switches it off: no tools, and the prompt says the agent cannot.
"Friday at 9" is read on the person's wall clock (core/follow_ups/wall_clock.py).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any
from uuid import UUID
from zoneinfo import ZoneInfo

from core.errors import StoreUnavailable
from core.follow_ups.listing import pushed_on, said_on
from core.follow_ups.wall_clock import InvalidTime, resolve_when, shown, zone_named
from core.model.llm import ToolCall
from core.models import FollowUp, PushApp, Surface
from core.surfaces import rules as surface_rules
from core.turn.tool_loop import ToolResult

if TYPE_CHECKING:
    from core.stores.store import MemoryStore
    from core.turn.capabilities import TurnState

log = logging.getLogger("crossmem.follow_ups")

SCHEDULE, LIST, CANCEL, SET_TIMEZONE = "schedule_follow_up", "list_follow_ups", "cancel_follow_up", "set_timezone"

# How long a schedule tool's place is held for its turn (reserve_follow_up): longer than any attempt
# lasts (the job's, the longest, holds its message LEASE_S, 360 s), so only a turn that died loses it.
PLACE_HELD_S = 600

# The tool definitions: the same bytes in every turn (the prompt cache's prefix).
TOOLS: tuple[dict[str, Any], ...] = (
    {
        "name": SCHEDULE,
        "description": (
            "Schedule a follow-up: a message you will send the person on your own at a later time, said once, "
            "on the app they are using now, or, asked on the web, on the app they last wrote from (the result "
            "says which) (a reminder, a check-in). Give either in_minutes, or day "
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
        "description": "List the person's pending follow-ups, with their ids, local times and the app each comes on.",
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
- Each follow-up is said once: nothing repeats it. For something that repeats ("every Monday"), \
schedule the next one, or the next few if they want, say when the last one is, and never say you \
will keep reminding them on your own.
- The web pushes nothing: a follow-up asked there is pushed to the app linked to their account \
that they last wrote from (Telegram, WhatsApp or SMS), and schedule_follow_up's result names it. \
When they have none, its result says so: it then appears only in that web conversation, for them \
to see when they open it.
"""

# How late after its due time the scheduled job (every minute) may say a follow-up, with room.
JOB_LAG = timedelta(minutes=2)
# A follow-up due past the surface's window after the person's message (this one): said only if
# they write there again before it is due, else with their next message (core/surfaces/whatsapp.py).
WAITS = (
    " This app lets it reach them only within {hours} hours of their last message here: unless they write"
    " here again before it is due, it comes with their next message, not at that time. Tell them so, and"
    " for anything that matters suggest a reminder on their phone too."
)

# A time of day read in CONTEXT_TIMEZONE for a person who never said where they live (Telegram and
# Twilio say nothing of it): the model must not promise "at 9" on a clock it was never told of.
ASSUMED = (
    " They have not said where they live, so this reads their time in {zone}, the default here: say the time"
    " with that timezone, and ask where they are. Once they say, call set_timezone; if theirs is another,"
    " cancel this one (list_follow_ups gives its id) and schedule it again at their time."
)

# "Tomorrow" said between midnight and this hour, before the person has slept: they may mean the
# coming morning, which is today; the tool reads the next date, and the model must say which.
SMALL_HOURS_END = 5
AFTER_MIDNIGHT = (
    " It is {now:%a %H:%M} there: tomorrow is {due:%A}, not the coming morning. Say the day with its date,"
    " so that they can say if they meant today."
)

# Asked on the web: pushed on the person's app they last wrote from (core/follow_ups/moves.py), or,
# with none, said in the web conversation only; and past that app's window after their last
# message there, it waits (WhatsApp's, as WAITS).
PUSHED = (
    " It will be pushed to them on {app}, the app linked to their account they last wrote from (on another of"
    " theirs if they write from that one last before it is due)."
)
NOT_PUSHED = (
    " They have no app linked to this account that it can be pushed to: it will only appear in this web"
    " conversation, with no notification. Tell them so, and for anything that matters suggest asking on one of"
    " their other apps, or a reminder on their phone."
)
WAITS_THERE = (
    " {app} lets it reach them only within {hours} hours of their last message there: unless they write there"
    " again before it is due, it comes with their next message there, not at that time. Tell them so, and"
    " for anything that matters suggest a reminder on their phone too."
)

# Pending follow-ups of earlier turns read on another clock than the one set_timezone sets (ASSUMED's):
# they keep their moment, which is another time of day there.
OTHER_CLOCK = (
    " Pending follow-ups set on another clock stay at the same moment (cancel and schedule again at their time"
    " one they meant at a time of day on their own clock), which there is: {pending}"
)

# A web client's timezone that became the person's in this turn (no set_timezone: the model was told
# nothing) with pending follow-ups read on another clock: said after the system prompt, whether or
# not the model calls a tool, as OTHER_CLOCK says it to set_timezone.
BROWSER_CLOCK = """
Just now
- Their browser says they are in {zone}, now their timezone (it was {old}). Their pending follow-ups set on \
another clock stay at the same moment; if they meant a time of day on their own clock, tell them, and offer \
to move them (cancel and schedule again). There they are at: {pending}
"""

# A pending one the job held (WhatsApp outside its window without a template, an SMS number that
# opted out), as the list says it: when it is said, by the surface's rules (`held_until`).
HELD = ", its time passed: said {until}"

SWITCHED_OFF = """\
Reminders and follow-ups
- You cannot set reminders or message the person later on your own: say so, and suggest they \
set one on their phone.
"""


@dataclass(frozen=True)
class FollowUpRules:
    max_pending: int = 20  # FOLLOW_UPS_PER_PERSON; 0 turns follow-ups off
    max_chars: int = 16000  # MAX_MESSAGE_CHARS: the text is bounded like a message
    # How long after the person's last message a surface can still say a follow-up (its adapter's
    # `said_within`: WhatsApp's 24-hour window without an approved template); None: any time.
    said_within: Callable[[Surface], timedelta | None] = lambda surface: None
    # Whether a chat or number (surface, sender, whose it is now) still reaches a person: the
    # identity policy's `reaches`, as the job that pushes a web-asked follow-up asks it.
    reaches: Callable[[Surface, str, UUID | None, UUID], bool] = lambda surface, sender, owner, person: owner == person


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
    stated: bool = False  # `timezone` is the person's word (set_timezone), not a browser's
    just_now: str = ""  # what the model must know before it answers (BROWSER_CLOCK), else ''
    surface: Surface | None = None  # the turn's: where a follow-up it schedules is said
    # The person's app a follow-up asked on the web is pushed on, None when they have none (said
    # in the conversation only): what the schedule tool says on the web, and the list on every app.
    pushed_on: PushApp | None = None
    # The zone is CONTEXT_TIMEZONE's, not one the person gave (set_timezone, a web client's)
    assumed: bool = False
    # the calls the person must be told of (WAITS, ASSUMED, AFTER_MIDNIGHT)
    told: set[str] = field(default_factory=set)
    # Each of `scheduled`'s day and time as the model gave them (None: minutes from now), read
    # again when set_timezone changes the clock later in the turn
    walls: list[tuple[str | None, str | None] | None] = field(default_factory=list)
    definitions: tuple[dict[str, Any], ...] = TOOLS
    round_trips: int = 0  # a schedule's place (`reserve`); the rest only record intent: finish_turn writes it
    # Holds the place of the `position`-th follow-up this turn schedules, given what it is and the
    # ids the turn cancelled: False when the person has none left (another turn of theirs took it).
    # None: no place held (a turn with no stored message), finish_turn counts alone.
    reserve: Callable[[int, dict[str, Any], list[int]], bool] | None = None

    def must_answer(self, result: ToolResult) -> bool:
        """A list is for the model to read, and a schedule whose follow-up may wait past its time,
        was read on a timezone only assumed, or is "tomorrow" said after midnight (the person must
        be told); a schedule or a cancel is otherwise only recorded."""
        return result.call.name == LIST or result.call.id in self.told

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
            if self.stated:
                changes["timezone_stated"] = True
        return changes

    def run(self, call: ToolCall) -> ToolResult:
        try:
            if call.name == SCHEDULE:
                return ToolResult(call, self._schedule(call.input, call.id))
            if call.name == LIST:
                return ToolResult(call, self._list())
            if call.name == CANCEL:
                return ToolResult(call, self._cancel(call.input))
            if call.name == SET_TIMEZONE:
                return ToolResult(call, self._set_timezone(call.input, call.id))
        except InvalidTime as exc:
            return ToolResult(call, f"Not done: {exc}.", is_error=True)
        return ToolResult(call, f"Not done: there is no tool {call.name!r}.", is_error=True)

    def _schedule(self, arguments: dict[str, Any], call_id: str) -> str:
        content = str(arguments.get("content") or "").replace("\x00", "").strip()
        if not content:
            raise InvalidTime("content is empty")
        if len(content) > self.rules.max_chars:
            raise InvalidTime(f"content is longer than {self.rules.max_chars} characters")
        live = len(self.pending) - len(self.cancelled) + len(self.scheduled)
        if live >= self.rules.max_pending:
            raise InvalidTime(
                f"the person already has {_follow_ups(live)}, the most allowed; one must be cancelled first"
            )
        minutes = arguments.get("in_minutes")
        due = resolve_when(
            self.now,
            self.zone,
            day=_text(arguments.get("day")),
            at=_text(arguments.get("time")),
            in_minutes=minutes if minutes is not None else None,
        )
        entry = {"content": content, "due_at": due.isoformat(), "timezone": self.zone.key}
        self._hold_place(entry)
        said = f"Scheduled for {shown(due, self.zone)}."  # the answer first: what it records, it then says
        if self.surface is not None and not self.surface.is_secondary:
            if self.pushed_on is None:
                said += NOT_PUSHED
                self.told.add(call_id)
            else:
                said += PUSHED.format(app=surface_rules(self.pushed_on.surface).label)
        if waits := self._waits(due):
            said += waits
            self.told.add(call_id)
        if not self.assumed and (late := self._after_midnight(_text(arguments.get("day")), due)):
            said += late  # on a clock that is theirs (else ASSUMED)
            self.told.add(call_id)
        if self.assumed and minutes is None:  # a time of day, on a clock the person never gave
            said += ASSUMED.format(zone=self.zone.key)
            self.told.add(call_id)
        self.scheduled.append(entry)
        self.walls.append(None if minutes is not None else (_text(arguments.get("day")), _text(arguments.get("time"))))
        return said

    def _hold_place(self, entry: dict[str, Any]) -> None:
        """The place of the follow-up `entry` among the person's, held for this turn; InvalidTime
        (said back to the model, which is asked again) when there is none, or the database cannot
        hold it: the person must not read that it is set."""
        if self.reserve is None:
            return
        self.round_trips += 1
        try:
            held = self.reserve(len(self.scheduled) + 1, entry, self.cancelled)
        except StoreUnavailable as exc:
            log.warning("a follow-up's place could not be held; not scheduled", extra={"error": str(exc)})
            raise InvalidTime("it could not be saved just now; ask them to ask again in a few minutes") from exc
        if not held:
            raise InvalidTime(
                f"the person already has {_follow_ups(self.rules.max_pending)}, the most allowed (one just"
                " scheduled from another of their conversations); one must be cancelled first"
            )

    def _after_midnight(self, day: str | None, due: datetime) -> str:
        """AFTER_MIDNIGHT, for "tomorrow" said in the small hours of the turn's clock; else ''."""
        local = self.now.astimezone(self.zone)
        if local.hour >= SMALL_HOURS_END or (day or "").strip().lower() != "tomorrow":
            return ""
        return AFTER_MIDNIGHT.format(now=local, due=due.astimezone(self.zone))

    def _waits(self, due: datetime) -> str:
        """WAITS, for a follow-up due past the window in which the turn's surface can say it (the
        web's: WAITS_THERE, the app it is pushed on, from their last message there); else ''."""
        on: Surface | None = self.surface
        said, since = WAITS, self.now
        if self.pushed_on is not None and on is not None and not on.is_secondary:
            said, on, since = WAITS_THERE, self.pushed_on.surface, self.pushed_on.last_at
        window = self.rules.said_within(on) if on is not None else None
        # Due near the window's end is past it too: the job says it only while `now - last` is under
        # the window (core/surfaces/whatsapp.py), in its first run at or after the due time.
        if window is None or on is None or due - since < window - JOB_LAG:
            return ""
        return said.format(hours=round(window.total_seconds() / 3600), app=surface_rules(on).label)

    def _list(self) -> str:
        pending = [f for f in self.pending if f.id not in self.cancelled]
        # Each is said on the app it was asked on, one asked on the web on the app it is pushed on;
        # a held one (WhatsApp's window closed, an SMS number's STOP) waits.
        lines = [
            f"#{f.id} {shown(f.due_at, self.zone)}, on {self._on(f.surface).value}{self._held(f)}: {f.content}"
            for f in pending
        ]
        where = f", on {self._on(self.surface).value}" if self.surface is not None else ""
        lines += [
            f"(new) {shown(datetime.fromisoformat(s['due_at']), self.zone)}{where}: {s['content']}"
            for s in self.scheduled
        ]
        return "\n".join(lines) if lines else "No pending follow-ups."

    def _held(self, follow_up: FollowUp) -> str:
        if follow_up.status != "held":
            return ""
        return HELD.format(until=surface_rules(follow_up.surface).held_until)

    def _on(self, surface: Surface) -> Surface:
        """The app a follow-up asked on `surface` comes on: the one it is pushed on, from the web."""
        return said_on(surface, self.pushed_on)

    def _cancel(self, arguments: dict[str, Any]) -> str:
        wanted = arguments.get("id")
        match = next((f for f in self.pending if f.id == wanted and f.id not in self.cancelled), None)
        if match is None:
            raise InvalidTime(f"no pending follow-up #{wanted}")
        if match.status == "sending":  # the job has it: finish_turn cancels only pending and held ones
            raise InvalidTime(f"#{match.id} is being sent right now: too late to cancel")
        said = f"Cancelled #{match.id} ({shown(match.due_at, self.zone)})."
        self.cancelled.append(match.id)
        return said

    def _set_timezone(self, arguments: dict[str, Any], call_id: str) -> str:
        zone = zone_named(_text(arguments.get("timezone")))
        if zone is None:
            raise InvalidTime("not an IANA timezone name (like Europe/Madrid)")
        said = f"Timezone set to {zone.key}; it is {self.now.astimezone(zone):%a %H:%M} there now."
        self.zone, self.timezone, self.assumed, self.stated = zone, zone.key, False, True
        # A time of day this turn scheduled on another clock ("I'm in Sydney: remind me tomorrow at
        # 9", the calls in either order) is that time on this one.
        moved, kept = [], []
        for entry, wall in zip(self.scheduled, self.walls, strict=True):
            if wall is None or entry["timezone"] == self.timezone:
                continue
            try:
                due = resolve_when(self.now, zone, day=wall[0], at=wall[1])
            except InvalidTime as exc:
                kept.append(f"{shown(datetime.fromisoformat(entry['due_at']), zone)}: {entry['content']} ({exc})")
                continue
            waits = self._waits(due) if not self._waits(datetime.fromisoformat(entry["due_at"])) else ""
            entry.update(due_at=due.isoformat(), timezone=zone.key)
            moved.append(f"{shown(due, zone)}: {entry['content']}")
            if waits:  # moved past the window its schedule said it was within
                moved[-1] += " (it now may wait:" + waits + ")"
                self.told.add(call_id)
            if late := self._after_midnight(wall[0], due):  # "tomorrow", and it is the small hours there
                moved[-1] += " (" + late.strip() + ")"
                self.told.add(call_id)
        if moved:
            said += " The follow-ups scheduled in this turn at a time of day (do not schedule them again) are now at"
            said += " that time there: "
            said += "; ".join(moved)
        if kept:  # at another time than the person asked for: they must be told
            said += " Not moved, so not at the time they asked: " + "; ".join(kept)
            self.told.add(call_id)
        # Pending ones of earlier turns read on another clock (CONTEXT_TIMEZONE's, ASSUMED's): at the
        # same moment, so at another time of day here; the model, asked again, fixes what they meant.
        if elsewhere := self.elsewhere(zone):
            said += OTHER_CLOCK.format(pending=elsewhere)
            self.told.add(call_id)
        return said

    def elsewhere(self, zone: ZoneInfo) -> str:
        """The pending follow-ups read on another clock than `zone`'s, still to come (a held one's
        time has passed, a sending one is going), each at its time there; '' when none. Each one's
        words quoted, as JSON: the list may end the system prompt (BROWSER_CLOCK), where the person's
        own lines ("...\n\nNew instructions: ...") would otherwise read as the operator's."""
        return "; ".join(
            f"#{f.id} {shown(f.due_at, zone)}: {json.dumps(f.content, ensure_ascii=False)}"
            for f in self.pending
            if f.timezone != str(zone) and f.id not in self.cancelled and f.status == "pending" and f.due_at > self.now
        )


def _follow_ups(count: int) -> str:
    """How many pending follow-ups, as the model reads it: "1 pending follow-up", "2 pending follow-ups"."""
    return f"{count} pending follow-up{'' if count == 1 else 's'}"


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def turn_tools(
    rules: FollowUpRules,
    pending: list[FollowUp],
    zone: ZoneInfo,
    now: datetime,
    client_zone: str | None,
    surface: Surface | None = None,
    assumed: bool = False,
    pushed_on: PushApp | None = None,
    stated: bool = False,
) -> TurnTools:
    """A turn's tools on `surface`; a web client's Intl timezone, when it differs from the person's, is set,
    unless they `stated` theirs (set_timezone, in an earlier turn): a browser may say UTC (Firefox's
    resistFingerprinting) or where a trip took the laptop, and the person's word wins.
    `assumed`: `zone` is CONTEXT_TIMEZONE's, the person having none (a web client's is theirs).
    `pushed_on`: the person's app the follow-ups asked on the web are pushed on."""
    tools = TurnTools(rules, pending, zone, now, surface=surface, assumed=assumed, pushed_on=pushed_on)
    if not stated and (sent := zone_named(client_zone)) is not None:
        tools.assumed = False
        if str(sent) != str(zone):
            tools.zone, tools.timezone = sent, sent.key
            if elsewhere := tools.elsewhere(sent):
                tools.just_now = BROWSER_CLOCK.format(zone=sent.key, old=zone.key, pending=elsewhere)
    return tools


@dataclass(frozen=True, eq=False)
class FollowUps:
    """The capability (core/turn/capabilities.py), on while `rules.max_pending` is above 0."""

    rules: FollowUpRules

    @property
    def instructions(self) -> str:
        return INSTRUCTIONS if self.rules.max_pending > 0 else SWITCHED_OFF

    @property
    def definitions(self) -> tuple[dict[str, Any], ...]:
        return TOOLS if self.rules.max_pending > 0 else ()

    def toolset(self, turn: TurnState) -> TurnTools | None:
        assumed = zone_named(turn.start.timezone) is None  # the turn's zone is CONTEXT_TIMEZONE's
        # begin_turn brings the person's apps on the web, or while a web-asked one is pending;
        # the first that still reaches them
        pushed = pushed_on(turn.start.push_apps, self.rules.reaches, turn.user_id)
        tools = turn_tools(
            self.rules,
            turn.start.follow_ups,
            turn.zone,
            turn.now,
            turn.client_zone,
            turn.surface,
            assumed,
            pushed,
            turn.start.timezone_stated,
        )
        if self.rules.max_pending > 0:
            if turn.start.message_id is not None:
                tools.reserve = place_holder(turn.memory.store, turn.user_id, turn.start.message_id, self.rules)
            return tools
        # Off: no tools, but a web client's timezone still becomes the person's (the context's tags).
        tools.definitions = ()
        return tools if tools.timezone else None


def cancel_follow_up(store: MemoryStore, person: UUID, follow_up_id: int) -> bool:
    """Cancel one of the person's pending follow-ups; False when they have no such pending one."""
    done = store.call("cancel_follow_up", {"p_user_id": str(person), "p_id": follow_up_id})
    return bool(done["cancelled"])


def place_holder(
    store: MemoryStore, person: UUID, message_id: int, rules: FollowUpRules
) -> Callable[[int, dict[str, Any], list[int]], bool]:
    """A turn's `TurnTools.reserve`: the place of the follow-up its message (`message_id`) schedules
    at a position, held by the database for PLACE_HELD_S (follow_ups.sql's reserve_follow_up)."""

    def reserve(position: int, entry: dict[str, Any], cancelled: list[int]) -> bool:
        held = store.call(
            "reserve_follow_up",
            {
                "p_user_id": str(person),
                "p_message_id": message_id,
                "p_position": position,
                "p_content": entry["content"],
                "p_due_at": entry["due_at"],
                "p_timezone": entry["timezone"],
                "p_cancelled": json.dumps(cancelled),
                "p_max_pending": rules.max_pending,
                "p_hold_seconds": PLACE_HELD_S,
            },
        )
        return bool(held and held.get("reserved"))

    return reserve
