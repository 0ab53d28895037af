"""Listening: the seconds of voice a person has transcribed in a day, on every app, within
VOICE_SECONDS_PER_DAY (infra/supabase/schemas/budget.sql).

A note's seconds are reserved before it goes to the transcriber (what it says it lasts, never
less than its bytes imply: core/media/turn_media.py) and settled at what the transcriber heard: a
client that lies about a note's length pays for what was heard, and one note of a person's is at
the transcriber at a time, so parallel requests cannot each slip a lie under the day. A store
that fails lets the note through: the turn goes on without memory anyway, and an outage's notes
cost little."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from core.errors import MediaUnreadable, StoreUnavailable
from core.stores.store import JsonScalar, MemoryStore

log = logging.getLogger("crossmem.listening")

WAIT_STEP_S = 0.25  # how often a note behind another asks again


@dataclass(frozen=True)
class Listening:
    """One turn's share of its person's day of listening (0 seconds a day: no limit)."""

    store: MemoryStore
    user_id: UUID
    message_id: int
    seconds_per_day: int

    def reserve(self, seconds: int, wait_s: float = 0.0) -> MediaUnreadable | None:
        """None when a note of `seconds` may go to the transcriber (it is then counted, and the
        person's other notes wait until it is settled); else why not, to raise. A
        note behind another of the person's waits for it up to `wait_s` (people send voice notes
        in a row, and Telegram delivers them in parallel)."""
        if self.seconds_per_day <= 0:
            return None
        until = time.monotonic() + wait_s
        while True:
            try:
                answer = str(
                    self._call("reserve_voice_seconds", p_seconds=seconds, p_seconds_per_day=self.seconds_per_day)
                )
            except StoreUnavailable as exc:
                log.warning("reserve_voice_seconds failed; the note is transcribed", extra={"error": str(exc)})
                return None
            if answer != "busy" or time.monotonic() + WAIT_STEP_S > until:
                return refusal(answer)
            time.sleep(WAIT_STEP_S)

    def settle(self, reserved: int, heard: int) -> None:
        """The reservation at what the transcriber heard (at what was reserved when it failed)."""
        if self.seconds_per_day <= 0:
            return
        try:
            self._call("settle_voice_seconds", p_reserved=reserved, p_heard=heard)
        except StoreUnavailable as exc:
            log.warning("settle_voice_seconds failed", extra={"error": str(exc)})

    def _call(self, function: str, **values: JsonScalar) -> Any:
        return self.store.call(function, {"p_user_id": str(self.user_id), "p_message_id": self.message_id, **values})


# Why a note is not transcribed: as the thread keeps it, and the phrase the person reads
# (core/phrases/*.toml's media.reason table, in "Sorry, I couldn't use what you sent (…)").
REFUSALS = {
    "used_up": ("today's voice notes are used up", "voice_used_up"),  # VOICE_SECONDS_PER_DAY
    "busy": ("another of your voice notes is still being transcribed", "voice_busy"),
}


def refusal(answer: str) -> MediaUnreadable | None:
    """reserve_voice_seconds' answer as the refusal it is, None when it is not one."""
    if answer not in REFUSALS:
        return None
    reason, phrase = REFUSALS[answer]
    return MediaUnreadable(reason, phrase)
