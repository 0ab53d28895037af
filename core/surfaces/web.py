"""The web: the person is the token's subject, and what the agent says appears in their thread."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, ClassVar

from core.surfaces.adapter import Delivery, Sent, Surface, SurfaceRules


class Rules(SurfaceRules):
    surface: ClassVar[Surface] = Surface.WEB
    label: ClassVar[str] = "Web"


def say_follow_up(to: str | None, row: Mapping[str, Any], now: datetime) -> tuple[Sent, str]:
    """Nothing to push: stored in the thread, it appears in their conversation."""
    return Sent(Delivery.DELIVERED, 1), "sent"
