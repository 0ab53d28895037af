"""A capability: one thing the agent can do, one module behind one small protocol.

    instructions     its part of the system prompt: what the agent can do with it, or, switched
                     off, what it cannot (so the prompt never denies what is on, nor claims what
                     is not); empty when it has nothing to say
    definitions      its tools as the model sees them (name, description, input_schema): the
                     same bytes in every turn of a deployment, in the prompt cache's prefix
    toolset(turn)    its tools for one turn, from what `begin_turn` brought (`TurnState`), or
                     None; a toolset runs the calls and says what `finish_turn` records
                     (core/turn/tool_loop.py's `Toolset`)

The capabilities are the follow-ups (core/follow_ups/capability.py), the memory search
(core/memory/search.py), media (core/media/capability.py: a part of the prompt, no tools) and the
tools an operator adds by setting (core/turn/operator_tools.py). The turn asks each one in order and
knows none by name; `functions/runtime.py` builds the list from the settings.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol
from uuid import UUID
from zoneinfo import ZoneInfo

from core.errors import ConfigurationError
from core.follow_ups.capability import FollowUpRules, FollowUps
from core.follow_ups.wall_clock import zone_named
from core.media.capability import Media
from core.memory.search import MemorySearch, SearchRules
from core.model.prompt import CANNOT, DEFAULT_PERSONA, MECHANICS, MECHANICS_UNTAGGED, untagged
from core.surfaces import Surface, rules

if TYPE_CHECKING:
    from core.memory.service import Memory
    from core.models import TurnStart
    from core.turn.context import ContextItem
    from core.turn.tool_loop import Toolbox, Toolset


@dataclass(frozen=True)
class TurnState:
    """What one turn's tools start from: the person, what `begin_turn` brought for them (their
    pending follow-ups, their timezone, the messages the model already sees) and the request's
    own (the web client's timezone and history), read on the turn's clock."""

    memory: Memory
    user_id: UUID
    start: TurnStart
    zone: ZoneInfo  # the person's (theirs, else CONTEXT_TIMEZONE)
    now: datetime
    client_zone: str | None = None  # the web client's Intl timezone
    client_history: Sequence[ContextItem] | None = None  # the web client's own thread, when it sent one
    history_is_page: bool = False  # that thread is its page's whole one (TurnRequest's)
    time_left: Callable[[], float] = lambda: math.inf  # seconds before the turn must have answered
    surface: Surface | None = None  # the app the turn answers on

    @property
    def clock(self) -> ZoneInfo:
        """The zone this turn shows times on (`turn_clock`)."""
        return turn_clock(self.zone, self.client_zone, self.start.timezone_stated)


def turn_clock(zone: ZoneInfo, client_zone: str | None, stated: bool = False) -> ZoneInfo:
    """The zone a turn shows times on: the person's `zone` when they `stated` it (a browser may say
    UTC, or where a trip took the laptop), else the web client's when it names one (the turn makes it
    the person's, and its follow-up tools read "now" on it), else `zone`."""
    return zone if stated else zone_named(client_zone) or zone


class Capability(Protocol):
    @property
    def instructions(self) -> str: ...

    @property
    def definitions(self) -> tuple[dict[str, Any], ...]: ...

    def toolset(self, turn: TurnState) -> Toolset | None: ...


def standing_instructions(persona: str, capabilities: Sequence[Capability], *, tagged: bool = True) -> str:
    """The whole system prompt: the persona (SYSTEM_PROMPT), how the conversation reaches the
    agent (with the `[telegram · 09:12]` tags, or without: CONTEXT_ANNOTATIONS, and then none in the
    persona's examples either), each capability's part in order, and what no capability lets it do."""
    # What the model must know of each surface (SMS's keywords), from its rules: none named here.
    surfaces = "".join(rules(surface).instructions for surface in Surface)
    parts = [
        (persona if tagged else untagged(persona)).strip() + "\n",
        (MECHANICS if tagged else MECHANICS_UNTAGGED) + surfaces,
    ]
    parts += [capability.instructions for capability in capabilities if capability.instructions]
    parts.append(CANNOT)
    return "\n".join(part.strip("\n") + "\n" for part in parts)


def checked(capabilities: Sequence[Capability]) -> tuple[Capability, ...]:
    """The capabilities, once no two of their tools share a name (the model could not say which
    one it calls): a ConfigurationError names them."""
    names = [definition["name"] for capability in capabilities for definition in capability.definitions]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ConfigurationError("two tools share a name: " + ", ".join(twice))
    return tuple(capabilities)


# After the prompt in a turn sent no tools although some are on (the database could not begin it,
# so nothing they decided could be written): the prompt describes them, and the agent must not
# say it did what they do ("I'll remind you") for this message.
WITHOUT_TOOLS = """
Just now
- None of the tools described above can be used for this message: do not say you did what one of \
them does (a reminder set or cancelled, a search made). If the person asks for one, say you cannot \
do it at this moment and ask them to send it again in a few minutes.
"""


def prompt_for(system_prompt: str, capabilities: Sequence[Capability], tools: Toolbox | None) -> str:
    """The system prompt of one request: WITHOUT_TOOLS after it when the capabilities' tools are
    not sent (no `tools`), else what the turn's tools found the model must know before it answers
    (the toolbox's `just_now`: this request's only, so the cached prompt before it stays)."""
    if tools is not None:
        return system_prompt + tools.just_now
    if not any(capability.definitions for capability in capabilities):
        return system_prompt
    return system_prompt + WITHOUT_TOOLS


# Everything on, at its defaults: the prompt the benchmarks measure.
DEFAULT_CAPABILITIES: tuple[Capability, ...] = (Media(), FollowUps(FollowUpRules()), MemorySearch(SearchRules()))
DEFAULT_SYSTEM_PROMPT = standing_instructions(DEFAULT_PERSONA, DEFAULT_CAPABILITIES)
