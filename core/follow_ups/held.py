"""Held follow-ups let go by a message that is no message of the thread.

A WhatsApp follow-up due while the person's 24-hour window was closed, without an approved
template, is held: the answer to their next message says it first (follow_ups.sql's
`turn_follow_ups`). Some of their messages are no turn, and nothing of them is stored: a chat
command, or a notice (an empty message, a place without coordinates). What each does with a held
reminder is what the person would expect of it:

- `forget` asks first, and counts the reminders it would delete: a reminder beside that question
  is noise, and its confirmation deletes it. Neither lets it go; it stays held, for their next
  message if they do not confirm.
- `unlink`: the reminders asked here stay with the person who asked, off this number (its answer
  says how many); none is said here.
- A link (a code, a code mistyped) or a notice: harmless, and the person is there. Their held
  reminders are let go (`release_held_follow_ups`): the follow-up job's next run, within a minute,
  says them through the Messages API inside the window the message opened, after the answer, once,
  as it says any other. An answer to a command is not stored, so it cannot carry them as a turn's
  does, again with every redelivery of the message.
"""

from __future__ import annotations

import logging

from core.errors import StoreUnavailable
from core.identity.policy import IdentityPolicy, identity_key
from core.models import Surface
from core.stores.store import MemoryStore

log = logging.getLogger("crossmem.follow_ups")


class HeldFollowUps:
    """One surface's held follow-ups, let go by a sender's message that is no turn."""

    def __init__(self, store: MemoryStore, identity: IdentityPolicy, surface: Surface) -> None:
        self._store = store
        self._identity = identity
        self._surface = surface

    def release(self, sender_id: str) -> int:
        """Let the sender's person's held follow-ups go to the follow-up job; how many. A stranger,
        or a database that failed, lets none go: they wait for the person's next message."""
        person = self._identity.resolve(self._surface, sender_id)
        if person is None:
            return 0
        arguments = {
            "p_user_id": str(person.user_id) if person.user_id else None,
            "p_surface": self._surface.value,
            # whose window it opened: the reminders are said there (the owner's too, by number)
            "p_sender": identity_key(self._surface, sender_id),
        }
        try:
            released = int(self._store.call("release_held_follow_ups", arguments)["released"])
        except StoreUnavailable as exc:
            log.warning("held follow-ups not let go; they wait for the next message", extra={"error": str(exc)})
            return 0
        if released:
            log.info("held follow-ups let go, for the follow-up job", extra={"count": released})
        return released
