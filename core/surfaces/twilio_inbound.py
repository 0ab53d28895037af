"""A Twilio webhook's form answered, on every Twilio surface (WhatsApp, SMS): what the form asks
for, done, and said back as TwiML.

The surface brings how its form is read and what it asks for (core/surfaces/whatsapp.py,
core/surfaces/sms.py): a chat command, a notice (a fixed phrase; none for the keywords Twilio
answers itself), or a turn. Twilio says nothing of the person's language: a
command's or a notice's answer goes by the person's remembered language (a command's SQL function
answers it; a notice asks `person_language`), else the words, else DEFAULT_LANGUAGE; a turn's
likewise (core/turn/turns.py). The function module (functions/twilio.py) only checks the
signature and sends the TwiML back.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from core.channels.whatsapp import carried_first, twiml
from core.errors import InputError, OverBudget, StillAnswering
from core.identity.linking import LinkRequest
from core.identity.opt_outs import OptOuts
from core.identity.remembered_language import RememberedLanguage
from core.phrases.catalogue import Catalogue, Phrases
from core.phrases.refusals import input_refused, over_budget
from core.surfaces import rules
from core.surfaces.adapter import Surface
from core.surfaces.commands import ChatCommand, Commands
from core.surfaces.twilio_form import Converse, Notice
from core.turn.request import TurnRequest
from core.turn.turns import Turns

# Twilio waits 15 s for the TwiML answer; a second of it is the way here and back. Counted from
# the request's arrival at the instance: a cold start's imports before the turn spend it too.
TWIML_WITHIN_S = 14.0


class TwilioForm(Protocol):
    @property
    def body(self) -> str: ...

    @property
    def identity(self) -> str: ...

    @property
    def opted_out(self) -> bool | None: ...


Form = TypeVar("Form", bound=TwilioForm)
TwilioAction = Converse | Notice | ChatCommand


@dataclass(frozen=True)
class TwilioInbound(Generic[Form]):
    """One Twilio surface's inbound messages. `parse`: the form as the surface reads it (InputError
    when it cannot); `classify`: what it asks for; `limit`: the longest message it takes (its
    module's WHATSAPP_LIMIT, SMS_LIMIT); `typing`: shows the person a message is being answered (by
    its Sid), where the surface has that; `off_thread`: records a message that is no turn (a chat
    command, a notice, words over the day's budget), the window it opens, and with True lets the
    sender's held follow-ups go to the follow-up job, where the surface has a window (WhatsApp:
    core/follow_ups/outside_thread.py). What a form did to its sender's subscription (`opted_out`:
    SMS's STOP and START) is recorded before anything else is done with it (`opt_outs`:
    core/identity/opt_outs.py)."""

    surface: Surface
    parse: Callable[[Mapping[str, str]], Form]
    classify: Callable[[Form, bool], TwilioAction]
    limit: int
    turns: Turns
    commands: Commands
    catalogue: Catalogue
    remembered: RememberedLanguage
    opt_outs: OptOuts
    deadline_s: float
    typing: Callable[[str], None] | None = None
    off_thread: Callable[[str, bool], object] | None = None

    def answer(self, fields: Mapping[str, str], arrived: float | None) -> str:
        """The TwiML answering a verified form that reached the instance at `arrived`
        (`time.monotonic()`; None: now); InputError for a form the surface cannot read."""
        arrived = time.monotonic() if arrived is None else arrived
        form = self.parse(fields)
        if form.opted_out is not None:
            self.opt_outs.heard(self.surface, form.identity, form.opted_out)
        action = self.classify(form, True)
        sms = rules(self.surface).carried_as_sms
        if isinstance(action, Notice):
            if action.phrase and self.turns.identity.resolve(self.surface, form.identity) is None:
                # Turned away (the owner policy): the stranger's answer, not an invitation to write.
                return twiml(self.turns.stranger_reply(None, form.body), self.limit, sms=sms)
            self._off_thread(form.identity, let_go_held=True)
            return twiml(self._noticed_in(form).say(action.phrase) if action.phrase else None, self.limit, sms=sms)
        if not isinstance(action, Converse):
            answered = self.commands.answer(action, None, form.body)
            if not answered.for_the_thread:
                # after the answer: a forget or an unlink leaves nothing of the person's to record it on
                self._off_thread(form.identity, let_go_held=isinstance(action, LinkRequest))
                return twiml(answered.text, self.limit, sms=sms)
            action = self.classify(form, False)  # a code alone that no code has: what they wrote
            assert isinstance(action, Converse)
        phrases = self.catalogue.phrases(self.catalogue.choose(None, form.body))
        turn = TurnRequest(
            self.surface,
            action.text,
            action.message_sid,
            sender_id=action.sender,
            sender_alias=action.also_known_as,
            deadline_s=self.deadline_s,
            media=action.media,
            platform=action.platform,
            reply_within_s=TWIML_WITHIN_S - (time.monotonic() - arrived),
            first_room=lambda text, first: len(carried_first(text, first, self.limit, sms=sms)),
        )
        if self.typing is not None:
            self.typing(action.message_sid)
        try:
            result = self.turns.run(turn)
            # The first answer to the message left to the job, as it ended, what it had no room for
            # (`first_room`); one repeated (Twilio's redelivery) says again what the first one said.
            carried = carried_first(result.reply, result.follow_ups_first, self.limit, sms=sms)
            return twiml(result.reply, self.limit, carried, sms=sms)
        except OverBudget as exc:
            self._off_thread(form.identity, let_go_held=True)  # nothing of it stored: it writes no turn
            return twiml(over_budget(phrases, exc), self.limit, sms=sms)
        except StillAnswering:
            return twiml(None, self.limit)  # the first attempt, or the scheduled job once it cannot, answers
        except InputError as exc:
            return twiml(input_refused(phrases, exc), self.limit, sms=sms)

    def _off_thread(self, sender: str, let_go_held: bool) -> None:
        if self.off_thread is not None:
            self.off_thread(sender, let_go_held)

    def _noticed_in(self, form: Form) -> Phrases:
        """A notice's phrases (an empty message, a file we cannot read): the person's remembered
        language (a round trip, for these alone), else the words, else DEFAULT_LANGUAGE."""
        remembered = self.remembered.of(self.surface, form.identity)
        return self.catalogue.phrases(self.catalogue.choose(None, form.body, remembered=remembered))
