"""WhatsApp through Twilio: a sender by business-scoped id or number, follow-ups inside the
24-hour window free-form, outside it through an approved template or held for their next message;
the inbound form (`WhatsAppForm`) and what it asks for (`classify`), read as every Twilio surface's
is (core/surfaces/twilio_form.py). The signature, TwiML and the Messages API are the twilio SDK's,
in core/channels/whatsapp.py."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any, ClassVar

from pydantic import Field

from core.channels.places import forwarded_text, location_text
from core.media.kinds import twilio_media, twilio_refs
from core.models import PlatformMessage
from core.surfaces.adapter import Delivery, SayFollowUp, Sent, Surface, SurfaceRules, mask_number, unsent_part
from core.surfaces.commands import ChatCommand, chat_command
from core.surfaces.twilio_form import EMPTY, Converse, Notice, TwilioMessageForm

# Meta's business-scoped user id: a two-letter country code, a period and up to 128 alphanumerics
# (`US.13491208655302741918`); a parent BSUID has `ENT` between them (`US.ENT.11815799212886844830`).
BSUID = re.compile(r"^[A-Z]{2}(?:\.ENT)?\.[A-Za-z0-9]{1,128}$")
WHATSAPP_WINDOW = timedelta(hours=24)
# The longest message body Twilio takes (its error 21617), counted in UTF-16 code units (an emoji
# is two): a longer reply or follow-up goes in several (core/channels/whatsapp.py).
WHATSAPP_LIMIT = 1600
LOCATION = "whatsapp.location"  # a phrase id: core/phrases/*.toml


def normalise_phone(number: str) -> str:
    """`whatsapp:+34 600-000-000` -> `+34600000000`."""
    digits = "".join(ch for ch in number.removeprefix("whatsapp:") if ch.isdigit())
    return f"+{digits}" if digits else ""


def whatsapp_key(sender: str) -> str:
    """A WhatsApp sender as `identities` keys it: a BSUID exactly as received, a number as `+digits`."""
    bare = sender.strip().removeprefix("whatsapp:")
    return bare if BSUID.match(bare) else normalise_phone(bare)


class Rules(SurfaceRules):
    surface: ClassVar[Surface] = Surface.WHATSAPP
    label: ClassVar[str] = "WhatsApp"
    sender_form: ClassVar[str] = "a WhatsApp number (+digits) or BSUID"
    held_until: ClassVar[str] = "with their next WhatsApp message"  # outside its 24-hour window

    @classmethod
    def key(cls, sender: str) -> str:
        return whatsapp_key(sender)

    @classmethod
    def mask(cls, key: str) -> str:
        return mask_number(key)


def say_follow_up(
    send_parts: Callable[[str, str, int], Sent] | None, send_template: Callable[[str, str, int], Sent | None] | None
) -> SayFollowUp:
    """Free-form inside the 24-hour window after the person's last WhatsApp message; outside it
    the approved template (TWILIO_FOLLOW_UP_CONTENT_SID) or, without one, held: begin_turn says it
    first on their next message (`send_template` answers None without one). Without a Twilio
    account, tried again later."""

    def say(to: str | None, row: Mapping[str, Any], now: datetime) -> tuple[Sent, str]:
        if to is None:
            raise ValueError("a WhatsApp follow-up needs a number")
        to = to if to.startswith("whatsapp:") else f"whatsapp:{to}"
        last = row.get("window_opened_at")
        inside = last is not None and now - datetime.fromisoformat(last) < WHATSAPP_WINDOW
        first_part = unsent_part(row)
        if inside and send_parts is not None:
            return send_parts(to, str(row["content"]), first_part), "sent"
        if not inside and send_template is not None and (said := send_template(to, str(row["content"]), first_part)):
            return said, "sent"
        if not inside:
            return Sent(Delivery.DELIVERED, first_part), "held"
        return Sent(Delivery.OWED, first_part), "retry"  # no Twilio account configured: perhaps after a deploy

    return say


class WhatsAppForm(TwilioMessageForm):
    """Twilio's inbound WhatsApp webhook.

    `From` is whatever id WhatsApp gives the sender: `whatsapp:+34600111222`, or, for a person
    with a WhatsApp username whose number Meta withholds, their business-scoped user id
    (`whatsapp:US.13491208655302741918`). `WaId` carries the number when Meta shares it, and
    `ExternalUserIdentifier` the BSUID (docs/api.md, WhatsApp)."""

    sender: str = Field(
        alias="From", pattern=r"^whatsapp:(\+?[0-9][0-9 ()-]{4,20}|[A-Z]{2}(\.ENT)?\.[A-Za-z0-9]{1,128})$"
    )
    external_user_identifier: str | None = Field(default=None, alias="ExternalUserIdentifier", max_length=140)
    profile_name: str | None = Field(default=None, alias="ProfileName")
    wa_id: str | None = Field(default=None, alias="WaId")
    message_type: str | None = Field(default=None, alias="MessageType")
    latitude: float | None = Field(default=None, alias="Latitude")
    longitude: float | None = Field(default=None, alias="Longitude")
    # A shared place's name and address, when WhatsApp has them (core/channels/places.py).
    label: str | None = Field(default=None, alias="Label")
    address: str | None = Field(default=None, alias="Address")
    # A reply: the Sid of the message replied to (the person's own, or one of ours) and who sent it.
    replied_sid: str | None = Field(default=None, alias="OriginalRepliedMessageSid", max_length=64)
    replied_sender: str | None = Field(default=None, alias="OriginalRepliedMessageSender", max_length=140)
    # "true" when the message is a forward (WhatsApp's "Forwarded", "Forwarded many times"): words
    # that came from someone else. Twilio names no origin.
    forwarded_flag: str | None = Field(default=None, alias="Forwarded", max_length=10)
    frequently_forwarded_flag: str | None = Field(default=None, alias="FrequentlyForwarded", max_length=10)

    @property
    def platform(self) -> PlatformMessage:
        """The message as Twilio names it, and the one it replies to: only its Sid comes, so what
        it says is looked up among the person's stored messages (begin_turn). One of ours is not
        stored by a Sid (a TwiML answer's is never told us): it is not found, and nothing quoted."""
        return PlatformMessage(self.message_sid, self.replied_sid or None)

    @property
    def forwarded(self) -> bool:
        return "true" in ((self.forwarded_flag or "").lower(), (self.frequently_forwarded_flag or "").lower())

    def said(self, text: str) -> str:
        """The text as the thread keeps it: a forward's after `[forwarded]`, so that no one else's
        message is remembered as the person's (docs/decisions.md, Corrections and replies)."""
        return f"{forwarded_text()} {text}".strip() if self.forwarded else text

    @property
    def bsuid(self) -> str | None:
        for candidate in (self.sender.removeprefix("whatsapp:"), self.external_user_identifier or ""):
            if BSUID.match(candidate):
                return candidate
        return None

    @property
    def phone(self) -> str | None:
        if not BSUID.match(self.sender.removeprefix("whatsapp:")):
            return normalise_phone(self.sender)
        # A number only as WhatsApp gives one, all digits (E.164: at most 15): never digits
        # pulled out of something else.
        wa_id = (self.wa_id or "").strip()
        return f"+{wa_id}" if wa_id.isdigit() and 5 <= len(wa_id) <= 15 else None

    @property
    def identity(self) -> str:
        """Who is writing, as `identities` keys them: the BSUID when there is one (it survives a
        hidden number), else the number."""
        return self.bsuid or normalise_phone(self.sender)

    @property
    def also_known_as(self) -> str | None:
        """The number beside a BSUID, when Meta shares both: the same person."""
        return self.phone if self.bsuid else None


def classify(form: WhatsAppForm, commands: bool = True) -> Converse | Notice | ChatCommand:
    """What a form asks for; `commands` false: its text is a message of the thread even when it reads
    as a command (a code alone that no code has: core/identity/linking.py)."""
    text = form.body.strip()
    # A chat command (core/surfaces/commands.py) is never a message of the thread: `link CODE` with the
    # code as typed (even a mistyped one gets a clear answer, and counts), a code alone that a code
    # has, `unlink`, `forget`. A forward is never one: a person tricked into forwarding a stranger's
    # `link CODE` would have their thread moved to the stranger's account.
    if (
        commands
        and not form.forwarded
        and (
            command := chat_command(
                Surface.WHATSAPP, form.identity, text, also_known_as=form.also_known_as, delivery=form.message_sid
            )
        )
    ):
        return command
    if media := twilio_media(form.media_urls, form.media_content_types):
        caption = form.said(text)
        return Converse(form.identity, caption, form.message_sid, form.also_known_as, media, form.platform)
    if text:
        return Converse(form.identity, form.said(text), form.message_sid, form.also_known_as, platform=form.platform)
    if form.latitude is not None or form.message_type == "location":
        if place := location_text(form.latitude, form.longitude, form.label, form.address):
            return Converse(
                form.identity, form.said(place), form.message_sid, form.also_known_as, platform=form.platform
            )
        return Notice(LOCATION, "location")
    if form.num_media:
        # Only files no model reads (a GIF, which WhatsApp sends as a video; a contact's vCard), and no
        # word: a turn all the same, answered with what cannot be read (core/media/turn_media.py), so
        # that the thread keeps what was sent, and what waits for the person's next message (a
        # follow-up held outside the 24-hour window) is said first.
        unread = twilio_refs(form.media_urls, form.media_content_types)
        return Converse(form.identity, form.said(""), form.message_sid, form.also_known_as, unread, form.platform)
    return Notice(EMPTY, "empty body")
