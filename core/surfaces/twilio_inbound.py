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
from dataclasses import dataclass
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


@dataclass(frozen=True)
class TwilioInbound(Generic[Form]):
    """One Twilio surface's inbound messages. `parse`: the form as the surface reads it (InputError
    when it cannot); `classify`: what it asks for; `typing`: shows the person a message is being
    answered (by its Sid), where the surface has that."""

    surface: Surface
    parse: Callable[[Mapping[str, str]], Form]
    classify: Callable[[Form], TwilioAction]
    turns: Turns
    commands: Commands
    catalogue: Catalogue
    deadline_s: float
    typing: Callable[[str], None] | None = None

    def answer(self, fields: Mapping[str, str]) -> str:
        """The TwiML answering a verified form; InputError for a form the surface cannot read."""
        form = self.parse(fields)
        action = self.classify(form)
        phrases = self.catalogue.phrases(self.catalogue.choose(None, form.body))
        if isinstance(action, Notice):
            return twiml(phrases.say(action.phrase) if action.phrase else None)
        if not isinstance(action, Converse):
            return twiml(self.commands.answer(action, phrases.language).text)
        turn = TurnRequest(
            self.surface,
            action.text,
            action.message_sid,
            sender_id=action.sender,
            sender_alias=action.also_known_as,
            deadline_s=self.deadline_s,
            media=action.media,
            platform=action.platform,
            reply_within_s=TWIML_WITHIN_S,
        )
        if self.typing is not None:
            self.typing(action.message_sid)
        try:
            result = self.turns.run(turn)
            return twiml(result.reply, result.follow_ups_first)
        except OverBudget as exc:
            return twiml(over_budget(phrases, exc))
        except StillAnswering:
            return twiml(None)  # the first attempt, or the scheduled job once it cannot, answers
        except InputError as exc:
            return twiml(input_refused(phrases, exc))
