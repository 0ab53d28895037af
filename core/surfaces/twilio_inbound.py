"""A Twilio webhook's form answered, on every Twilio surface (WhatsApp, SMS): what the form asks
for, done, and said back as TwiML.

The surface brings how its form is read and what it asks for (core/channels/whatsapp.py,
core/channels/sms.py): a chat command, a notice (a fixed phrase; none for the keywords Twilio
answers itself), or a turn. Twilio says nothing of the person's language: a command's or a
notice's answer goes by the words, else DEFAULT_LANGUAGE; a turn's by the person's remembered
language first (core/turn.py). The function module (functions/twilio.py) only checks the
signature and sends the TwiML back.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Generic, Protocol, TypeVar

from core.channels.whatsapp import Converse, Notice, twiml
from core.commands import ChatCommand, Commands
from core.errors import InputError, OverBudget, StillAnswering
from core.phrases.catalogue import Catalogue
from core.phrases.refusals import input_refused, over_budget
from core.surfaces.adapter import Surface
from core.turn import Turns
from core.turn_request import TurnRequest

# Twilio waits 15 s for the TwiML answer; a second of it is the way here and back.
TWIML_WITHIN_S = 14.0


class TwilioForm(Protocol):
    @property
    def body(self) -> str: ...


Form = TypeVar("Form", bound=TwilioForm)
TwilioAction = Converse | Notice | ChatCommand


class TwilioInbound(Generic[Form]):
    """One Twilio surface's inbound messages. `parse`: the form as the surface reads it (InputError
    when it cannot); `classify`: what it asks for; `typing`: shows the person a message is being
    answered (by its Sid), where the surface has that."""

    def __init__(
        self,
        surface: Surface,
        parse: Callable[[Mapping[str, str]], Form],
        classify: Callable[[Form], TwilioAction],
        turns: Turns,
        commands: Commands,
        catalogue: Catalogue,
        deadline_s: float,
        typing: Callable[[str], None] | None = None,
    ) -> None:
        self._surface = surface
        self._parse = parse
        self._classify = classify
        self._turns = turns
        self._commands = commands
        self._catalogue = catalogue
        self._deadline_s = deadline_s
        self._typing = typing

    def answer(self, fields: Mapping[str, str]) -> str:
        """The TwiML answering a verified form; InputError for a form the surface cannot read."""
        form = self._parse(fields)
        action = self._classify(form)
        phrases = self._catalogue.phrases(self._catalogue.choose(None, form.body))
        if isinstance(action, Notice):
            return twiml(phrases.say(action.phrase) if action.phrase else None)
        if not isinstance(action, Converse):
            return twiml(self._commands.answer(action, phrases.language).text)
        turn = TurnRequest(
            self._surface,
            action.text,
            action.message_sid,
            sender_id=action.sender,
            sender_alias=action.also_known_as,
            deadline_s=self._deadline_s,
            media=action.media,
            platform=action.platform,
            reply_within_s=TWIML_WITHIN_S,
        )
        if self._typing is not None:
            self._typing(action.message_sid)
        try:
            result = self._turns.run(turn)
            return twiml(result.reply, result.follow_ups_first)
        except OverBudget as exc:
            return twiml(over_budget(phrases, exc))
        except StillAnswering:
            return twiml(None)  # the first attempt, or the scheduled job once it cannot, answers
        except InputError as exc:
            return twiml(input_refused(phrases, exc))
