"""WhatsApp through Twilio: a sender by business-scoped id or number, follow-ups inside the
24-hour window free-form, outside it through an approved template or held for their next message."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any, ClassVar

from core.surfaces.adapter import Delivery, SayFollowUp, Surface, SurfaceRules, mask_number

# Meta's business-scoped user id: a two-letter country code, a period and up to 128 alphanumerics
# (`US.13491208655302741918`); a parent BSUID has `ENT` between them (`US.ENT.11815799212886844830`).
BSUID = re.compile(r"^[A-Z]{2}(?:\.ENT)?\.[A-Za-z0-9]{1,128}$")
WHATSAPP_WINDOW = timedelta(hours=24)


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

    @classmethod
    def key(cls, sender: str) -> str:
        return whatsapp_key(sender)

    @classmethod
    def mask(cls, key: str) -> str:
        return mask_number(key)


def say_follow_up(
    send_text: Callable[[str, str], Delivery] | None, send_template: Callable[[str, str], Delivery | None] | None
) -> SayFollowUp:
    """Free-form inside the 24-hour window after the person's last WhatsApp message; outside it
    the approved template (TWILIO_FOLLOW_UP_CONTENT_SID) or, without one, held: begin_turn says it
    first on their next message (`send_template` answers None without one). Without a Twilio
    account, tried again later."""

    def say(to: str | None, row: Mapping[str, Any], now: datetime) -> tuple[Delivery, str]:
        if to is None:
            raise ValueError("a WhatsApp follow-up needs a number")
        to = to if to.startswith("whatsapp:") else f"whatsapp:{to}"
        last = row.get("last_whatsapp_at")
        inside = last is not None and now - datetime.fromisoformat(last) < WHATSAPP_WINDOW
        if inside and send_text is not None:
            return send_text(to, str(row["content"])), "sent"
        if not inside and send_template is not None and (sent := send_template(to, str(row["content"]))):
            return sent, "sent"
        if not inside:
            return Delivery.DELIVERED, "held"
        return Delivery.OWED, "retry"  # no Twilio account configured: perhaps after a deploy

    return say
