"""Memory search, the capability: the `search_memory` tool over everything the person ever
said and was answered, on every surface and all time, beyond the window and the notes.

A search is one round trip (`Memory.search`, the SQL function `search_memory`) and its result
always goes back to the model, so a turn that searches makes one more database call and one
more model request than a turn that does not; a turn that does not search costs what it did.
What the model already sees is left out; the hits come best first, each with its surface, the
person's local date and time, who said it and the messages around it, within `max_tokens`.
A search that fails tells the model it could not search: the turn still answers.
MEMORY_SEARCH=false switches it off: no tool, and the prompt says older messages may be out of
sight.
"""

from __future__ import annotations

import logging
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from typing import TYPE_CHECKING, Any
from uuid import UUID
from zoneinfo import ZoneInfo

from core.channels.splitting import fitting
from core.errors import StoreUnavailable
from core.memory.service import Memory
from core.model.llm import ToolCall, approximate_tokens, token_eighths
from core.models import MemoryHit, Neighbour, Role, Surface
from core.turn.context import from_their_first, read_after_page
from core.turn.tool_loop import ToolResult

if TYPE_CHECKING:
    from core.turn.capabilities import TurnState

log = logging.getLogger("crossmem.memory_search")

SEARCH_MEMORY = "search_memory"

TOOL: dict[str, Any] = {
    "name": SEARCH_MEMORY,
    "description": (
        "Search everything the person said, and you answered, on every app and all time: older "
        "messages than the ones you see. Use it when they refer to something you cannot see. "
        "query: the words they would have used (their question as they asked it works too). "
        "Optionally only one app, or a period of their local dates: when no message there holds the "
        "words, you get what was said there, newest first."
    ),
    "input_schema": {
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "What to look for, e.g. 'restaurant in March'"},
            "surface": {
                "type": "string",
                "enum": [surface.value for surface in Surface],
                "description": "Only what was said on this app",
            },
            "from_date": {"type": "string", "description": "YYYY-MM-DD: only from this local day on"},
            "to_date": {"type": "string", "description": "YYYY-MM-DD: only up to this local day, included"},
        },
        "required": ["query"],
    },
}

INSTRUCTIONS = """\
Your memory
- What you see is the recent part of the thread, and your notes. Everything older that the \
person said, and you answered, on any app, is still stored: search_memory finds it. When they \
refer to something you cannot see ("what was that restaurant?", "when did I say my sister \
arrives?"), search before you answer, with the words they would have used; narrow it to an \
app or a period when they say one. Say where and when it was said. If the search finds \
nothing, say so plainly; never invent what they said.
"""

# With MESSAGE_RETENTION_DAYS the scheduled job deletes what is older: the agent must not promise it.
KEPT = """\
Your memory
- What you see is the recent part of the thread, and your notes. What the person said, and you \
answered, on any app in the last {days} days is still stored: search_memory finds it; older ones \
are deleted. When they refer to something you cannot see ("what was that restaurant?", "when \
did I say my sister arrives?"), search before you answer, with the words they would have used; \
narrow it to an app or a period when they say one. Say where and when it was said. If the \
search finds nothing, say so plainly (it may be older than {days} days); never invent what they said.
"""

SWITCHED_OFF = """\
Your memory
- The conversation you see is the recent part of a longer thread across all the apps. Older \
messages may have been left out. If the person refers to something you cannot see, say so \
plainly and ask them to remind you; never invent what they said.
"""

# The ranker of hits that matched no word: the app's or period's messages (messages.sql's search_memory).
PERIOD = "period"
# A hit's text, and a neighbour's, as the model reads them: enough to answer from, not a whole essay.
HIT_CHARS = 1200
NEIGHBOUR_CHARS = 300
# A longer hit whose words come past what its start shows: its start (what it is about), then from
# a little before the first word it was found by (a voice note's fact at its end).
HIT_HEAD_CHARS = 300
BEFORE_MATCH_CHARS = 200
# What a hit shown from its start shows after the word it was found by, at least.
AFTER_MATCH_CHARS = 100
# Kanji, kana and hangul, which messages.sql's searchable also reads as pairs of letters.
CJK_LETTERS = "\u3005\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
CJK = re.compile(f"[{CJK_LETTERS}]")
# A letter of a word of its own: not of a run of kanji, kana or hangul ("MacBook" in "出したMacBookは").
OWN_LETTER = f"[^\\W{CJK_LETTERS}]"


@dataclass(frozen=True)
class SearchRules:
    max_tokens: int = 1500  # SEARCH_MAX_TOKENS: the most one search adds to the request
    max_hits: int = 8  # SEARCH_MAX_HITS
    kept_days: int = 0  # MESSAGE_RETENTION_DAYS: what is older is deleted; 0 keeps everything
    notes: bool = True  # MEMORY_NOTES: the person's notes go with every turn

    @property
    def tool(self) -> dict[str, Any]:
        """The tool as the model sees it: over all time, or over the days a retention keeps."""
        if not self.kept_days:
            return TOOL
        kept = f"on every app in the last {self.kept_days} days (older ones are deleted)"
        return TOOL | {"description": TOOL["description"].replace("on every app and all time", kept)}


class InvalidSearch(ValueError):
    """A search the model asked for that cannot run, said back to it."""


@dataclass
class MemorySearchTools:
    """One turn's search tool, for one person, leaving out what the turn already shows."""

    memory: Memory
    user_id: UUID
    zone: ZoneInfo
    seen_ids: frozenset[int]
    rules: SearchRules = SearchRules()
    definitions: tuple[dict[str, Any], ...] = (TOOL,)
    round_trips: int = 0

    def must_answer(self, result: ToolResult) -> bool:
        return True  # what was found is what the answer needs

    def recorded(self) -> dict[str, Any]:
        return {}  # a search changes nothing

    def run(self, call: ToolCall) -> ToolResult:
        try:
            query, surface, since, until = self._arguments(call.input)
        except InvalidSearch as exc:
            return ToolResult(call, f"Not searched: {exc}.", is_error=True)
        self.round_trips += 1
        try:
            hits = self.memory.search(
                self.user_id,
                query,
                surface=surface,
                since=since,
                until=until,
                exclude_ids=sorted(self.seen_ids),
                limit=self.rules.max_hits + 1,  # one more than shown: whether there are more
                or_latest=True,
            )
        except StoreUnavailable as exc:
            log.error("memory search failed", extra={"error": str(exc)})
            return ToolResult(
                call,
                "Could not search the memory just now. Answer from what you see, and tell the person "
                "you could not look further back this time.",
                is_error=True,
            )
        return ToolResult(call, rendered(hits, self.zone, self.rules.max_tokens, self.rules.max_hits).text)

    def _arguments(self, given: dict[str, Any]) -> tuple[str, Surface | None, datetime | None, datetime | None]:
        query = given.get("query")
        if not isinstance(query, str) or not query.strip():
            raise InvalidSearch("query is empty")
        surface = None
        if given.get("surface") not in (None, ""):
            try:
                surface = Surface(str(given["surface"]))
            except ValueError:
                raise InvalidSearch("surface must be one of " + ", ".join(s.value for s in Surface)) from None
        since = self._local_day(given.get("from_date"), "from_date")
        last = self._local_day(given.get("to_date"), "to_date")
        until = None
        if last is not None and last.date() < date.max:  # through the calendar's last day: no end
            until = last + timedelta(days=1)
        if since is not None and until is not None and since >= until:
            raise InvalidSearch("from_date is after to_date")
        return query.strip(), surface, since, until

    def _local_day(self, value: object, name: str) -> datetime | None:
        """The start of that day where the person lives."""
        if value in (None, ""):
            return None
        try:
            day = date.fromisoformat(str(value))
        except ValueError:
            raise InvalidSearch(f"{name} must be YYYY-MM-DD") from None
        return datetime.combine(day, time(), tzinfo=self.zone)


@dataclass(frozen=True, eq=False)
class MemorySearch:
    """The capability (core/turn/capabilities.py), on with `rules` (MEMORY_SEARCH), off without."""

    rules: SearchRules | None

    @property
    def instructions(self) -> str:
        if self.rules is None:
            return SWITCHED_OFF
        said = KEPT.format(days=self.rules.kept_days) if self.rules.kept_days else INSTRUCTIONS
        return said if self.rules.notes else said.replace(", and your notes.", ".")  # none are sent

    @property
    def definitions(self) -> tuple[dict[str, Any], ...]:
        return (self.rules.tool,) if self.rules is not None else ()

    def toolset(self, turn: TurnState) -> MemorySearchTools | None:
        """The turn's search, leaving out what the model already sees: the message it answers, what
        the web puts before its thread, and the thread: the web client's own history when it sent
        one (the stored window then is not shown, so what it holds can be found), else the window;
        of them, only what the model is shown (`from_their_first`: a reply at the window's start is not);
        and the messages read as answered separately, shown after a client's history too (web_items),
        and what another app said in the page's thread since (`read_after_page`), shown after it."""
        if self.rules is None:
            return None
        own = turn.start.history if turn.client_history is None else turn.client_history
        if turn.client_history is not None and turn.history_is_page:
            own = [*own, *read_after_page(turn.start.thread(), turn.client_history)]
        # the message it answers comes after them: a reply that ends them is shown
        seen = {item.id for item in from_their_first([*turn.start.prepend, *own]) if item.id is not None}
        seen |= turn.start.answered_elsewhere
        if turn.start.message_id is not None:
            seen.add(turn.start.message_id)  # the message it answers, stored as the turn began
        return MemorySearchTools(turn.memory, turn.user_id, turn.clock, frozenset(seen), self.rules, self.definitions)


@dataclass(frozen=True)
class Rendered:
    text: str
    count: int  # how many hits it holds


def rendered(hits: list[MemoryHit], zone: ZoneInfo, max_tokens: int, max_hits: int | None = None) -> Rendered:
    """The hits as the model reads them, best first, at most `max_hits` (a search asks one more,
    to know there are more) and as many as fit in `max_tokens`."""
    if not hits:
        return Rendered("Nothing found in older messages.", 0)
    # As many as fit, each costing what it costs with the hits before it named by their number;
    # then each neighbour that is a hit shown, above or below, is named so (never longer).
    shown: dict[int, int] = {}  # a shown hit's message id: its number
    used = 0
    for index, hit in enumerate(hits[:max_hits]):
        cost = approximate_tokens(_hit_block(index + 1, hit, zone, shown))
        if shown and used + cost > max_tokens:
            break
        used += cost
        shown[hit.message.id] = index + 1
    lines = [_hit_block(index + 1, hit, zone, shown) for index, hit in enumerate(hits[: len(shown)])]
    if approximate_tokens(lines[0]) > max_tokens:  # the best hit alone is too long: its start
        lines[0] = lines[0][: fitting(lines[0], 8 * max_tokens - token_eighths("…"), token_eighths)] + "…"
    head = f"Found {len(lines)} older message{'s' if len(lines) != 1 else ''}, best match first"
    more = len(hits) - len(lines)
    # past max_hits, how many more is not known: that there are
    counted = f"{more} " if more and (max_hits is None or len(hits) <= max_hits) else ""
    tail = f"\n({counted}more matched; search with other words or a period to see them.)" if more else ""
    if hits[0].ranker == PERIOD:  # no word matched: what was said on the app or in the period given
        head = (
            "No older message there holds those words (what this conversation shows is not searched)."
            " What was said there, newest first"
        )
        tail = f"\n({counted}more there; narrow the period to see them.)" if more else ""
    return Rendered(f"{head}:\n\n" + "\n\n".join(lines) + tail, len(lines))


def _hit_block(number: int, hit: MemoryHit, zone: ZoneInfo, shown: dict[int, int]) -> str:
    """A hit, and the messages just before and after it: one of the hits `shown`, by its number."""
    message = hit.message
    lines = [
        f"{number}. [{message.surface.value} · {_when(message.created_at, zone)}] {_who(message.role)}: "
        f"{_excerpt(message.content, hit.words)}"
    ]
    for side, neighbour in (("before", hit.before), ("after", hit.after)):
        if neighbour is not None and neighbour.id in shown:
            where = "above" if shown[neighbour.id] < number else "below"
            lines.append(f"   just {side}, number {shown[neighbour.id]} {where}")
        elif neighbour is not None:
            lines.append(f"   just {side}, {_neighbour(neighbour, message.created_at, zone)}")
    return "\n".join(lines)


def _neighbour(neighbour: Neighbour, beside: datetime, zone: ZoneInfo) -> str:
    """The message before or after a hit said `beside`, with when (the next one may come weeks
    later): its time that day, else its date."""
    local = neighbour.created_at.astimezone(zone)
    when = f"{local:%H:%M}" if local.date() == beside.astimezone(zone).date() else _when(local, zone)
    return f"[{when}] {_who(neighbour.role)}: {_cut(neighbour.content, NEIGHBOUR_CHARS)}"


def _who(role: Role) -> str:
    return "the person" if role is Role.USER else "you"


def _when(moment: datetime, zone: ZoneInfo) -> str:
    """`Tue 1 Sep 2026 09:12`, where the person lives."""
    local = moment.astimezone(zone)
    return f"{local:%a} {local.day} {local:%b %Y %H:%M}"


def _excerpt(text: str, words: Sequence[str]) -> str:
    """A hit's text on one line: whole up to HIT_CHARS; longer, its start, or, when the rarest of
    the words it was found by (`words`) comes past it, its start and the part around that word."""
    flat = " ".join(text.split())
    at = _first_match(flat, words)
    if len(flat) <= HIT_CHARS or at is None or at + AFTER_MATCH_CHARS <= HIT_CHARS - 1:
        return _cut(flat, HIT_CHARS)
    head = flat[:HIT_HEAD_CHARS].rstrip() + " … "
    room = HIT_CHARS - len(head)
    start = max(min(at - BEFORE_MATCH_CHARS, len(flat) - room), HIT_HEAD_CHARS)
    start = flat.find(" ", start) + 1 if flat[start - 1] != " " and " " in flat[start:at] else start
    return head + _cut(flat[start:], room)


def _first_match(text: str, words: Sequence[str]) -> int | None:
    """Where in `text` the first of `words` (the hit's own words the search matched, as it reads
    them: unaccented, lower-cased; the rarest query word's first) is first found, as a whole word
    (beside kanji, kana or hangul too), or anywhere for a pair of them (messages.sql's searchable:
    those languages put no space between words); None when none is (a letter unaccent spells with two)."""
    # unaccent leaves kana and hangul alone, which NFD takes apart (バ, 가): kept whole
    folded = "".join(ch if CJK.match(ch) else unicodedata.normalize("NFD", ch)[:1].lower()[:1] for ch in text)
    for word in words:
        pattern = re.escape(word) if CJK.search(word) else f"(?<!{OWN_LETTER}){re.escape(word)}(?!{OWN_LETTER})"
        if (match := re.search(pattern, folded)) is not None:
            return match.start()
    return None


def _cut(text: str, limit: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"
