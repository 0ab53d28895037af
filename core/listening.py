"""Listening: the seconds of voice a person has transcribed in a day, on every app, within
VOICE_SECONDS_PER_DAY (infra/supabase/schemas/budget.sql).

A note's seconds are reserved before it goes to the transcriber (what it says it lasts, else the
longest a note may be) and settled at what the transcriber heard: a client that lies about a
note's length pays for what was heard. A store that fails lets the note through: the turn goes
on without memory anyway, and an outage's notes cost little."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from uuid import UUID

from core.errors import StoreUnavailable
from core.stores.store import JsonScalar, MemoryStore

log = logging.getLogger("crossmem.listening")


@dataclass(frozen=True)
class Listening:
    """One turn's share of its person's day of listening (0 seconds a day: no limit)."""

    store: MemoryStore
    user_id: UUID
    message_id: int
    seconds_per_day: int

    def reserve(self, seconds: int) -> bool:
        """Whether a note of `seconds` still fits in the person's day; it is counted if so."""
        if self.seconds_per_day <= 0:
            return True
        arguments: dict[str, JsonScalar] = {
            "p_user_id": str(self.user_id),
            "p_message_id": self.message_id,
            "p_seconds": seconds,
            "p_seconds_per_day": self.seconds_per_day,
        }
        try:
            return bool(self.store.call("reserve_voice_seconds", arguments))
        except StoreUnavailable as exc:
            log.warning("reserve_voice_seconds failed; the note is transcribed", extra={"error": str(exc)})
            return True

    def settle(self, reserved: int, heard: int) -> None:
        """The reservation at what the transcriber heard (0: nothing was transcribed)."""
        if self.seconds_per_day <= 0 or heard == reserved:
            return
        arguments: dict[str, JsonScalar] = {
            "p_user_id": str(self.user_id),
            "p_message_id": self.message_id,
            "p_reserved": reserved,
            "p_heard": heard,
        }
        try:
            self.store.call("settle_voice_seconds", arguments)
        except StoreUnavailable as exc:
            log.warning("settle_voice_seconds failed", extra={"error": str(exc)})
