"""A WhatsApp message that is no message of the thread: the 24-hour window it opens, and the held
follow-ups it lets go.

Some of a person's messages are no turn, and nothing of them is stored: a chat command, a notice
(an empty message, a place without coordinates), or words past the day's budget. For WhatsApp each is a message like any
other, which opens the 24-hour window for the number that wrote it (Twilio's error 63016: a
free-form message is refused "more than 24 hours after the user's last inbound message"). The
thread's messages cannot show it, so it is recorded (follow_ups.sql's `wrote_outside_thread`, one
round trip, after the answer): a reminder due inside that window goes out free-form to that
number, not through the template nor held. A turn records nothing here: its message is stored, and
is its own record.

A follow-up due while the window was closed, without an approved template, is held: the answer to
the person's next message says it first (follow_ups.sql's `turn_follow_ups`). What each message
that is no turn does with a held reminder is what the person would expect of it:

- `forget` asks first, and counts the reminders it would delete: a reminder beside that question
  is noise, and its confirmation deletes it. Neither lets it go; it stays held, for their next
  message if they do not confirm.
- `unlink`: the reminders asked here stay with the person who asked, off this number (its answer
  says how many); none is said here, and the number's window leaves with it.
- A link (a code, a code mistyped), a notice or words over the budget: harmless, and the person
  is there. Their held
  reminders are let go: the follow-up job's next run, within a minute, says them through the
  Messages API inside the window the message opened, after the answer, once, as it says any other.
  An answer to a command is not stored, so it cannot carry them as a turn's does, again with every
  redelivery of the message.
"""

from __future__ import annotations

import logging

from core.errors import StoreUnavailable
from core.identity.policy import IdentityPolicy, identity_key
from core.models import Surface
from core.stores.store import MemoryStore

log = logging.getLogger("crossmem.follow_ups")


class MessagesOutsideThread:
    """One surface's messages that are no turn, as the follow-ups see them."""

    def __init__(self, store: MemoryStore, identity: IdentityPolicy, surface: Surface) -> None:
        self._store = store
        self._identity = identity
        self._surface = surface

    def record(self, sender_id: str, let_go_held: bool) -> int:
        """Record that the sender wrote (the window it opened) and, with `let_go_held`, let their
        person's held follow-ups go to the follow-up job; how many were let go. A stranger records
        nothing; a database that failed neither: the window waits for the person's next message."""
        person = self._identity.resolve(self._surface, sender_id)
        if person is None:
            return 0
        arguments = {
            "p_user_id": str(person.user_id) if person.user_id else None,
            "p_surface": self._surface.value,
            # whose window it opened: the reminders are said there (the owner's too, by number)
            "p_sender": identity_key(self._surface, sender_id),
            "p_let_go_held": let_go_held,
        }
        try:
            released = int(self._store.call("wrote_outside_thread", arguments)["released"])
        except StoreUnavailable as exc:
            log.warning("a message outside the thread not recorded; its window is not used", extra={"error": str(exc)})
            return 0
        if released:
            log.info("held follow-ups let go, for the follow-up job", extra={"count": released})
        return released
