"""Telegram's stop button (Bot API 10.3): the person stops a reply while it is being written.

Drafts go out with `can_stop` (core/channels/live_reply.py), so Telegram shows a stop button
under them; a tap reaches the webhook as a `stopped_message_generation` update naming the chat
and the draft. The turn writing that draft may run on another instance, so the stop travels
through the database: the webhook records it (`record`, SQL `stop_generation`), and the writing
turn's drafts thread asks before each draft after the first (`asked`, SQL `generation_stopped`):
one round trip a check, made beside the model's stream, never on the reply's way. The draft's id
is the update_id of the message the turn answers (core/surfaces/telegram_inbound.py), which is that message's
`external_id`.

A stop is kept when the instance writing died: the message is then owed, but not wanted. The
attempt that takes it over (Telegram's redelivery) asks first (`stopped_before`) and writes
nothing; the scheduled job's claim skips it (owed_replies.sql).
"""

from __future__ import annotations

import logging

from core.errors import StoreUnavailable
from core.identity.policy import IdentityPolicy
from core.models import Surface
from core.stores.store import JsonScalar, MemoryStore

log = logging.getLogger("crossmem.telegram")


class StoppedGenerations:
    """`identity`: whose a chat is. The owner policy keeps no identity row for the owner's chats,
    so the owner is named to the SQL functions; under `auto` they read the chat's identity."""

    def __init__(self, store: MemoryStore, identity: IdentityPolicy) -> None:
        self._store = store
        self._identity = identity

    def _whose(self, chat_id: int, draft_id: int) -> dict[str, JsonScalar] | None:
        """The SQL functions' arguments for the chat's person, or None for a stranger (the owner
        policy's), whose stop is nobody's."""
        person = self._identity.resolve(Surface.TELEGRAM, str(chat_id))
        if person is None:
            return None
        user_id = str(person.user_id) if person.user_id is not None else None
        return {"p_user_id": user_id, "p_chat": str(chat_id), "p_draft_id": str(draft_id)}

    def record(self, chat_id: int, draft_id: int) -> bool:
        """The person of `chat_id` tapped stop under the draft `draft_id`: whether this recorded it
        (False for a redelivered stop, a finished turn, a chat or draft that is nobody's, or a
        database that failed: then the turn writes on, as it would have without the button)."""
        whose = self._whose(chat_id, draft_id)
        if whose is None:
            return False
        try:
            return bool(self._store.call("stop_generation", whose))
        except StoreUnavailable as exc:
            log.error("recording a stop failed", extra={"error": str(exc)})
            return False

    def asked(self, chat_id: int, draft_id: int) -> bool:
        """Whether the person of `chat_id` stopped the draft `draft_id`; raises StoreUnavailable."""
        whose = self._whose(chat_id, draft_id)
        return whose is not None and bool(self._store.call("generation_stopped", whose))

    def stopped_before(self, chat_id: int, draft_id: int) -> bool:
        """Whether the person stopped the draft `draft_id` while an attempt that has since died
        wrote it: asked by the attempt that takes its message over, before any model call. False
        when the database cannot say (the reply is then written, as without the button)."""
        try:
            return self.asked(chat_id, draft_id)
        except StoreUnavailable as exc:
            log.error("asking for an earlier stop failed", extra={"error": str(exc)})
            return False
