"""Where a pending follow-up will be said, as the web (`GET /follow-ups`) and `crossmem follow-ups`
list them, and as the model's list tool says it (core/follow_ups/capability.py).

One asked on an app (Telegram, WhatsApp, SMS) is said there. One asked on the web, which pushes
nothing, is pushed to the app linked to the person that they last wrote from, if it still reaches
them (the identity policy's `reaches`); with none, it is said in its web conversation only. The
scheduled job decides that at its time (core/follow_ups/moves.py), on the same reads
(follow_ups.sql's `follow_up_apps`): a list says where it would go now. A list is one call
(`follow_ups_with_apps`: the pending ones and, when one was asked on the web, the person's apps).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from core.models import FollowUp, PushApp, Surface
from core.stores.store import MemoryStore

# Whether a chat or number (surface, sender, whose it is now) still reaches a person.
Reaches = Callable[[Surface, str, UUID | None, UUID], bool]


def pushed_on(apps: Iterable[PushApp], reaches: Reaches, person: UUID) -> PushApp | None:
    """The app a follow-up `person` asked on the web is pushed on: the first of theirs (the one they
    last wrote from first) that still reaches them; None: said in the web conversation only."""
    return next((app for app in apps if reaches(app.surface, app.sender, app.owner, person)), None)


def said_on(asked_on: Surface, pushed: PushApp | None) -> Surface:
    """The app a follow-up asked on `asked_on` is said on: there, or from the web where it is pushed."""
    return pushed.surface if pushed is not None and not asked_on.is_secondary else asked_on


@dataclass(frozen=True)
class ListedFollowUp:
    follow_up: FollowUp
    said_on: Surface  # where it will be said; `follow_up.surface` is where it was asked (or moved to)

    def as_json(self) -> dict[str, Any]:
        return {**self.follow_up.as_json(), "said_on": self.said_on.value}


def pending_follow_ups(store: MemoryStore, person: UUID, reaches: Reaches) -> list[ListedFollowUp]:
    """A person's pending follow-ups, soonest first, each with the app it will be said on (raises
    StoreUnavailable)."""
    listed = store.call("follow_ups_with_apps", {"p_user_id": str(person)})
    pushed = pushed_on((PushApp.from_row(app) for app in listed["apps"]), reaches, person)
    follow_ups = [FollowUp.from_row(row) for row in listed["follow_ups"]]
    return [ListedFollowUp(f, said_on(f.surface, pushed)) for f in follow_ups]
