"""A Twilio webhook's form as every Twilio surface reads it (WhatsApp's, SMS's: each in its own
module): checked field by field into the surface's pydantic model, its media listed, and what it
asks for, a turn (`Converse`) or a fixed answer (`Notice`).

No twilio SDK here (core/channels/whatsapp.py imports it, for the signature, TwiML and the Messages
API): a surface's module reads its form, and its rules are asked, without loading the SDK.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from core.errors import InputError
from core.media.kinds import MediaRef
from core.models import PlatformMessage

TEXT_ONLY = "media.text_only"  # phrase ids: core/phrases/*.toml
EMPTY = "whatsapp.empty"

Form = TypeVar("Form", bound=BaseModel)


def validated_form(model: type[Form], form: Mapping[str, str]) -> Form:
    """A Twilio webhook form read as `model` (WhatsApp's, SMS's): a field it cannot take is an
    InputError naming the first such field."""
    try:
        return model.model_validate(dict(form))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first.get("loc", ())) or "form"
        raise InputError(f"invalid form field {where}: {first.get('msg', 'invalid')}") from None


def media_fields(form: Mapping[str, str], count: int) -> tuple[list[str], list[str]]:
    """The form's `MediaContentType<n>` and `MediaUrl<n>`, for its `NumMedia` items."""
    return (
        [form.get(f"MediaContentType{index}", "") for index in range(count)],
        [form.get(f"MediaUrl{index}", "") for index in range(count)],
    )


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
