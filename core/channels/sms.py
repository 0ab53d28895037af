"""SMS through Twilio: the inbound webhook form, what it asks for (core/surfaces/sms.py has the
surface's rules). The signature and the TwiML answer are WhatsApp's (core/channels/whatsapp.py):
Twilio signs and reads both the same way on either channel."""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field

from core.channels.whatsapp import EMPTY, TEXT_ONLY, Converse, Notice, media_fields, validated_form
from core.media.kinds import twilio_media
from core.models import PlatformMessage, Surface
from core.surfaces.commands import ChatCommand, chat_command
from core.surfaces.sms import Rules, is_keyword


class SmsForm(BaseModel):
    """The fields of Twilio's inbound SMS and MMS webhook that a turn needs. `OptOutType`: STOP,
    START or HELP, when the number is in a Messaging Service with Advanced Opt-Out."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    sender: str = Field(alias="From", pattern=r"^\+?[0-9][0-9 ()-]{4,20}$")
    body: str = Field(default="", alias="Body")
    message_sid: str = Field(alias="MessageSid", min_length=2, max_length=64)
    num_media: int = Field(default=0, alias="NumMedia", ge=0, le=10)
    opt_out_type: str | None = Field(default=None, alias="OptOutType", max_length=16)
    media_content_types: list[str] = []
    media_urls: list[str] = []

    @classmethod
    def from_form(cls, form: Mapping[str, str]) -> SmsForm:
        parsed = validated_form(cls, form)
        parsed.media_content_types, parsed.media_urls = media_fields(form, parsed.num_media)
        return parsed

    @property
    def identity(self) -> str:
        return Rules.key(self.sender)


class Keyword(Notice):
    """STOP, START or HELP: Twilio has answered it; nothing to say, nothing stored."""


def classify(form: SmsForm) -> Converse | Notice | ChatCommand:
    text = form.body.strip()
    if is_keyword(text, form.opt_out_type):
        return Keyword("", f"keyword {form.opt_out_type or text.upper()}: Twilio answers it")
    if command := chat_command(Surface.SMS, form.identity, text):
        return command
    platform = PlatformMessage(form.message_sid, None)
    if media := twilio_media(form.media_urls, form.media_content_types):
        return Converse(form.identity, text, form.message_sid, media=media, platform=platform)
    if text:
        return Converse(form.identity, text, form.message_sid, platform=platform)
    if form.num_media:
        return Notice(TEXT_ONLY, "media:" + ",".join(form.media_content_types))
    return Notice(EMPTY, "empty body")
