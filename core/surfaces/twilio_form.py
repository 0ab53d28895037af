"""A Twilio webhook's form as every Twilio surface reads it (WhatsApp's, SMS's: each in its own
module): the fields every inbound message has (`TwilioMessageForm`, which each surface's form
extends with its own), checked field by field, its media listed; and what it asks for, a turn
(`Converse`) or a fixed answer (`Notice`).

No twilio SDK here (core/channels/whatsapp.py imports it, for the signature, TwiML and the Messages
API): a surface's module reads its form, and its rules are asked, without loading the SDK.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from core.errors import InputError
from core.media.kinds import MediaRef
from core.models import PlatformMessage

TEXT_ONLY = "media.text_only"  # phrase ids: core/phrases/*.toml
EMPTY = "whatsapp.empty"


class TwilioMessageForm(BaseModel):
    """The fields of Twilio's inbound message webhook that every surface's turn needs."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    body: str = Field(default="", alias="Body")
    message_sid: str = Field(alias="MessageSid", min_length=2, max_length=64)
    num_media: int = Field(default=0, alias="NumMedia", ge=0, le=10)
    media_content_types: list[str] = []
    media_urls: list[str] = []

    @classmethod
    def from_form(cls, form: Mapping[str, str]) -> Self:
        """The form read as the surface's: a field it cannot take is an InputError naming the first
        such field. Its media are the form's `MediaContentType<n>` and `MediaUrl<n>`, for its
        `NumMedia` items."""
        try:
            parsed = cls.model_validate(dict(form))
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first.get("loc", ())) or "form"
            raise InputError(f"invalid form field {where}: {first.get('msg', 'invalid')}") from None
        parsed.media_content_types = [form.get(f"MediaContentType{index}", "") for index in range(parsed.num_media)]
        parsed.media_urls = [form.get(f"MediaUrl{index}", "") for index in range(parsed.num_media)]
        return parsed

    @property
    def opted_out(self) -> bool | None:
        """What the message did to its sender's subscription at Twilio: opted them out (True), in
        again (False), neither (None: the surface has no such words, or it is none of them)."""
        return None


@dataclass(frozen=True)
class Converse:
    sender: str  # the identity key: a BSUID, else the number
    text: str
    message_sid: str
    also_known_as: str | None = None
    media: tuple[MediaRef, ...] = ()  # then `text` is the caption (fetched from Twilio's host only)
    platform: PlatformMessage | None = None


@dataclass(frozen=True)
class Notice:
    phrase: str  # said in the sender's language (core/phrases/)
    reason: str
