"""A follow-up said again after its first parts went out starts from the part it stopped at
(follow_ups.sql's unsent_from), on every surface that says it in parts."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from core.models import Delivery, Sent
from core.surfaces import SayFollowUp, not_pushed, sms, telegram, whatsapp

NOW = datetime(2026, 12, 2, 18, 0, tzinfo=UTC)


class Recorded:
    def __init__(self) -> None:
        self.asked: list[tuple[str, str, int]] = []

    def __call__(self, to: Any, text: str, first_part: int) -> Sent:
        self.asked.append((str(to), text, first_part))
        return Sent(Delivery.DELIVERED, 3)


SAYING: dict[str, Callable[[Recorded], SayFollowUp]] = {
    "telegram": telegram.say_follow_up,
    "sms": sms.say_follow_up,
    "whatsapp": lambda send: whatsapp.say_follow_up(send, None),
}


@pytest.mark.parametrize("surface", sorted(SAYING))
@pytest.mark.parametrize("unsent_from", [None, 2])
def test_a_follow_up_is_said_from_its_first_part_not_sent(surface: str, unsent_from: int | None) -> None:
    send = Recorded()
    inside_the_window = (NOW - timedelta(hours=1)).isoformat()
    row = {"content": "the plan", "unsent_from": unsent_from, "window_opened_at": inside_the_window}
    said = SAYING[surface](send)("4242", row, NOW)
    assert said == (Sent(Delivery.DELIVERED, 3), "sent")
    assert [first for _, _, first in send.asked] == [unsent_from or 0]


def test_a_surface_that_cannot_push_keeps_the_part_for_its_retry() -> None:
    assert not_pushed("4242", {"content": "the plan", "unsent_from": 2}, NOW) == (Sent(Delivery.OWED, 2), "retry")
