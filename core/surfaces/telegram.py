"""Telegram: a chat id, commands with a slash, follow-ups through the Bot API's sendMessage."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, ClassVar

from core.surfaces.adapter import Delivery, SayFollowUp, Surface, SurfaceRules


class Rules(SurfaceRules):
    surface: ClassVar[Surface] = Surface.TELEGRAM
    label: ClassVar[str] = "Telegram"
    command_prefix: ClassVar[str] = "/"


def say_follow_up(send_text: Callable[[int, str], Delivery]) -> SayFollowUp:
    """A follow-up as one message (split past 4096 characters) to the chat."""

    def say(to: str | None, row: Mapping[str, Any], now: datetime) -> tuple[Delivery, str]:
        if to is None:
            raise ValueError("a Telegram follow-up needs a chat")
        return send_text(int(to), str(row["content"])), "sent"

    return say
