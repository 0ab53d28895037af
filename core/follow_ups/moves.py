"""Where a follow-up goes when the app it was asked on cannot push it, as "my advisor" would.

A follow-up is said on the app it was asked on when that app can push (Telegram, WhatsApp, SMS).
Two cases move it, once each, to another app of the same person's (`follow_up_elsewhere`: their
conversations on the other apps, the one they last wrote from first), said to the chat or number
they last wrote from there, if it still reaches them (core/identity/policy.py's `reaches`: linked
to them, or in the owner's allow-list):

- Asked on the web, which pushes nothing: it goes to the app they last wrote from; with none, it
  stays in the web conversation, as before (the schedule tool told the model which: capability.py).
- The app it was going to refuses it for good (a blocked bot, a deactivated user, a chat not
  found, a number Twilio refuses), or no chat or number of theirs reaches them there any more
  (unlinked since): before it is given up, it moves once to the app they last wrote from among
  the others; one asked on the web, with none left, goes back to the web conversation it was
  asked in. Only one of which nothing went out: the person read its first parts where they were
  said. A failure that may pass stays where it is, retried with backoff.

Moved (`move_follow_up`), it belongs to that app's conversation of the person's: it is tried
there as any follow-up of that app is (WhatsApp's 24-hour window, its template, held for the next
message; SMS split into numbered parts), stored in that conversation once said (the thread is one
per person: the web shows it too), and said late with the late note (core/follow_ups/lateness.py),
on the time it was due. Never to someone else: only the person's own conversations are looked at,
and a chat or number that is no longer theirs is passed over.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from core.errors import StoreUnavailable
from core.identity.policy import IdentityPolicy
from core.models import Delivery, Sent, Surface
from core.stores.store import MemoryStore

log = logging.getLogger("crossmem.follow_ups")


@dataclass(frozen=True)
class FollowUpMoves:
    store: MemoryStore
    identity: IdentityPolicy

    def placed(self, row: dict[str, Any], claim: str) -> dict[str, Any]:
        """A claimed follow-up where it is said: one asked on the web (and not moved yet) on the app
        the person last wrote from, if any reaches them; else the row as it is."""
        if Surface(row["surface"]).is_secondary:
            return row
        return self._moved(row, claim) or row

    def moved_on(self, row: dict[str, Any], claim: str, sent: Sent) -> dict[str, Any] | None:
        """Refused for good with nothing of it out: the follow-up on the next app of the person's
        that reaches them, unless it moved on after a refusal before (follow_ups.sql's
        `moved_from`); None: given up."""
        if sent.delivery is not Delivery.GIVEN_UP or sent.parts or row.get("unsent_from"):
            return None
        return self._moved(row, claim)

    def _moved(self, row: dict[str, Any], claim: str) -> dict[str, Any] | None:
        person = UUID(row["user_id"])
        try:
            apps = self.store.call("follow_up_elsewhere", {"p_id": row["id"], "p_claim": claim})["apps"]
            for app in apps:
                surface, owner = Surface(app["surface"]), app.get("sender_user")
                # the web (back where it was asked) is theirs; a chat or number, while it reaches them
                sender, whose = str(app["sender"]), UUID(owner) if owner else None
                if surface.is_secondary and not self.identity.reaches(surface, sender, whose, person):
                    continue
                arguments = {"p_id": row["id"], "p_claim": claim, "p_surface": surface.value, "p_sender": app["sender"]}
                if not self.store.call("move_follow_up", arguments)["moved"]:
                    return None
                log.info("follow-up moved", extra={"id": row["id"], "from": row["surface"], "to": surface.value})
                return {
                    **row,
                    "surface": surface.value,
                    "sender": app["sender"],
                    "identity_user": owner,
                    "last_sender": app["sender"],
                    "last_sender_user": owner,
                    # where a window counts (WhatsApp's): their last message there (follow_up_apps' last_at)
                    "window_opened_at": app["last_at"],
                    "unsent_from": None,
                    "said_as": None,
                }
        except StoreUnavailable as exc:
            log.warning("a follow-up could not be moved; said where it is", extra={"id": row["id"], "error": str(exc)})
        return None
