"""SMS through Twilio: a sender by number, replies and follow-ups through the Messages API.

Who is writing: an SMS number is its own identity (`+digits`, keyed as Twilio's `From` gives it),
never the same person as a WhatsApp sender with that number: the two reach the agent through
different apps, and a number passes to someone else on one and not the other. Under `auto` a new
number is a new person until it is linked to a web account with a code (`link ABC234XYZ`), as a
Telegram chat or a WhatsApp sender is, and then the six digits that answer sent to the number
(`link ABC234XYZ 123456`: a caller ID can be forged, SECURITY.md); under `owner` it is the owner
only when OWNER_SMS_NUMBERS lists it.

How long a reply may be (`SMS_LIMIT`): Twilio takes a message body of at most 1,600 characters
counted in UTF-16 code units, so an emoji counts two, and refuses a longer one (its error 21617);
carriers carry it as concatenated segments (153 GSM-7 characters each, or 67 when any character is
outside GSM-7: an emoji, `á`, `í`, `ó`, `ú`, most accented capitals); the phone shows one message.
A longer reply, owed reply or follow-up is split into messages of at most 1,600 such units at
paragraph, line or sentence ends (core/channels/splitting.py), each sent in order; Twilio bills
each segment. The carriers deliver those messages in any order, so each says its place, `(1/3) `;
and typographic punctuation goes as GSM-7's look-alikes, `’` as `'`, `—` as `-`, so that one
of them does not send the whole message in UCS-2 (`Rules.carried_as_sms`).

Keywords: Twilio answers STOP, START and HELP itself (its default opt-out handling, or Advanced
Opt-Out's messages), and still posts them to the webhook. Those messages are not the thread's:
no turn, no reply (any answer to STOP would be refused, error 21610), nothing stored in the thread
(what they do to the number is, below). But YES, one of Twilio's opt-in words, is also the
person's answer to the advisor's question: a turn.

Opted out (`SmsForm.opted_out`, core/identity/opt_outs.py): after STOP (or another of its opt-out
words, or Advanced Opt-Out's `OptOutType` STOP, whatever word the operator set) Twilio refuses
every send to the number until it texts START, UNSTOP or YES (`OptOutType` START); no other
message opts it in (Twilio's "Twilio support for opt-out keywords (SMS STOP filtering)", error
21610's page). So the number's identity remembers it, from that delivery or from a send Twilio
refused with 21610 (the STOP may have come while the webhook was down). A message it sends
meanwhile is stored, with no turn (begin_turn answers it: no model, nothing reserved, an empty
TwiML answer), and the scheduled job sends nothing there and asks no model for it: an owed reply is
given up unwritten (an answer after START would read as a stranger's); a follow-up due goes to
another app of the person's (core/follow_ups/moves.py), else is held until START, then said late,
if due within the week before (core/follow_ups/opted_out.py). The opt-in words clear it, but on a
toll-free number (the `To` the message was sent to: `is_toll_free`) only START and UNSTOP do: the
carriers keep that block themselves, and YES or an Advanced Opt-Out word does not lift it (Twilio's
"Opt-out keyword handling (SMS STOP Filtering) for Toll-Free SMS").

What an inbound message asks for (`SmsForm`, `classify`): a keyword (nothing said), a chat command,
a turn, or a notice. The form is read as every Twilio surface's is (core/surfaces/twilio_form.py),
and answered by core/surfaces/twilio_inbound.py; the signature and the TwiML are WhatsApp's
(core/channels/whatsapp.py): Twilio signs and reads both the same way on either channel.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, ClassVar

from pydantic import Field

from core.media.kinds import twilio_media
from core.models import PlatformMessage
from core.surfaces.adapter import SayFollowUp, Sent, Surface, SurfaceRules, mask_number, unsent_part
from core.surfaces.commands import ChatCommand, chat_command
from core.surfaces.twilio_form import EMPTY, TEXT_ONLY, Converse, Notice, TwilioMessageForm
from core.surfaces.whatsapp import normalise_phone

SMS_LIMIT = 1600  # UTF-16 code units in one Twilio message body
# Twilio's default opt-out, opt-in and help keywords: a body that is exactly one of them, in any
# case, with spaces around it ("stop please" is a message). With Advanced Opt-Out, `OptOutType`
# names the kind as well. Letters and spaces as ASCII has them: Python's upper() makes "ſtop"
# STOP and strip() takes an ideographic space, which Twilio does not take for the keyword (and a
# message dropped as one would be answered by nobody).
OPT_OUT_WORDS = frozenset({"STOP", "STOPALL", "UNSUBSCRIBE", "CANCEL", "END", "QUIT", "REVOKE", "OPTOUT"})
KEYWORDS = OPT_OUT_WORDS | {"START", "UNSTOP"} | {"HELP", "INFO"}
# Twilio's opt-in keyword that is also how people answer a question ("Shall I remind you at 9?"):
# Twilio opts the number in (and may say so), and the advisor hears it too, with or without
# `OptOutType`; nothing the person meant for the advisor is dropped.
ANSWERS = frozenset({"YES"})
TOLL_FREE_OPT_IN_WORDS = frozenset({"START", "UNSTOP"})
OPT_IN_WORDS = TOLL_FREE_OPT_IN_WORDS | ANSWERS
# The North American Numbering Plan's toll-free area codes in use (US and Canada).
TOLL_FREE_PREFIXES = tuple(f"+1{code}" for code in ("800", "833", "844", "855", "866", "877", "888"))
# What the model must know of the keywords (`Rules.instructions`, in the system prompt): said alone
# by SMS, Twilio answers them itself and the message never reaches the advisor; the opt-out words
# end every text from it (Twilio refuses them, error 21610). Each of KEYWORDS is named
# (tests/functions/test_prompt.py).
INSTRUCTIONS = """\
- By SMS, a reply of only STOP, STOPALL, CANCEL, END, QUIT, UNSUBSCRIBE, REVOKE or OPTOUT (any \
case) stops every text from you until the person sends START, and a reply of only HELP, INFO, \
START or UNSTOP is answered automatically: none of them reaches you. Never ask a question that \
one of those words alone would answer ("keep the reminder or cancel it?", "want help or more \
info?"); ask one that "yes" or "no" answers ("shall I drop the reminder?").
"""


def keyword_of(body: str) -> str:
    """The body as Twilio reads a keyword: upper case, without the ASCII spaces around it; "" for
    one outside ASCII."""
    word = body.strip(" \t\r\n")
    return word.upper() if word.isascii() else ""


def is_toll_free(number: str) -> bool:
    """Whether a number is a US or Canadian toll-free one, by its NANP area code."""
    return normalise_phone(number).startswith(TOLL_FREE_PREFIXES)


def is_keyword(body: str, opt_out_type: str | None = None) -> bool:
    """Whether Twilio handles this message itself (it has answered it already), and no one else."""
    if keyword_of(body) in ANSWERS:
        return False
    return bool(opt_out_type) or keyword_of(body) in KEYWORDS


class Rules(SurfaceRules):
    surface: ClassVar[Surface] = Surface.SMS
    label: ClassVar[str] = "SMS"
    sender_vouched_for: ClassVar[bool] = False  # a caller ID: forgetting and linking repeat a code sent to it
    sender_form: ClassVar[str] = "an SMS number (+digits)"
    carried_as_sms: ClassVar[bool] = True
    opts_out: ClassVar[bool] = True
    # held only for an opt-out (core/follow_ups/opted_out.py): SMS has no window
    held_until: ClassVar[str] = "once their number texts START (it texted STOP), if within a week"
    instructions: ClassVar[str] = INSTRUCTIONS

    @classmethod
    def key(cls, sender: str) -> str:
        return normalise_phone(sender)

    @classmethod
    def mask(cls, key: str) -> str:
        return mask_number(key)


def say_follow_up(send_parts: Callable[[str, str, int], Sent]) -> SayFollowUp:
    """Free-form at any time (SMS has no window): the Messages API, split as a reply is, from its
    first part not sent."""

    def say(to: str | None, row: Mapping[str, Any], now: datetime) -> tuple[Sent, str]:
        if to is None:
            raise ValueError("an SMS follow-up needs a number")
        return send_parts(to, str(row["content"]), unsent_part(row)), "sent"

    return say


class SmsForm(TwilioMessageForm):
    """Twilio's inbound SMS and MMS webhook: the sender's number, the number it texted (`To`), and
    `OptOutType` (STOP, START or HELP), when the number is in a Messaging Service with Advanced
    Opt-Out."""

    sender: str = Field(alias="From", pattern=r"^\+?[0-9][0-9 ()-]{4,20}$")
    to: str = Field(default="", alias="To", max_length=32)
    opt_out_type: str | None = Field(default=None, alias="OptOutType", max_length=16)

    @property
    def identity(self) -> str:
        return Rules.key(self.sender)

    @property
    def opted_out(self) -> bool | None:
        """Advanced Opt-Out names the kind (`OptOutType`, whatever the word); without it, Twilio's
        default words. Texted to a toll-free number, only START and UNSTOP opt in, whatever the kind."""
        kind = (self.opt_out_type or "").upper()
        word = keyword_of(self.body)
        if kind == "STOP" or not kind and word in OPT_OUT_WORDS:
            return True
        if is_toll_free(self.to):
            return False if word in TOLL_FREE_OPT_IN_WORDS else None
        if kind == "START" or not kind and word in OPT_IN_WORDS:
            return False
        return None


class Keyword(Notice):
    """STOP, START or HELP: Twilio has answered it; nothing to say, nothing stored in the thread."""


def classify(form: SmsForm, commands: bool = True) -> Converse | Notice | ChatCommand:
    """What a form asks for; `commands` false: its text is a message of the thread even when it reads
    as a command (a code alone that no code has: core/identity/linking.py)."""
    text = form.body.strip()
    if is_keyword(form.body, form.opt_out_type):
        return Keyword("", f"keyword {form.opt_out_type or text.upper()}: Twilio answers it")
    if commands and (command := chat_command(Surface.SMS, form.identity, text, delivery=form.message_sid)):
        return command
    platform = PlatformMessage(form.message_sid, None)
    if media := twilio_media(form.media_urls, form.media_content_types):
        return Converse(form.identity, text, form.message_sid, media=media, platform=platform)
    if text:
        return Converse(form.identity, text, form.message_sid, platform=platform)
    if form.num_media:
        return Notice(TEXT_ONLY, "media:" + ",".join(form.media_content_types))
    return Notice(EMPTY, "empty body")
