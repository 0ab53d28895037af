"""Owed replies: messages stored and never answered, answered by the scheduled job.

A message is owed when it has no reply and its attempt can no longer answer (its instance
died, its model call ended in the fallback). The same delivery again answers it (a Telegram
redelivery, a web retry), but Twilio does not redeliver and Telegram gives up, so the
scheduled job answers the Telegram and WhatsApp ones younger than OWED_REPLY_MAX_AGE: it
takes each over in the database (one attempt at a time, whoever asks), asks the model once,
sends the reply through the Bot API or Twilio's Messages API and stores it. Older ones are
left to the person's next message, as a reply minutes late reads as an answer and one an
hour late as a stranger's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from core.errors import StoreUnavailable
from core.memory import Memory
from core.models import Surface
from core.turn import ANSWER_MARGIN_S, Turns
from core.turn_request import Outcome, ReplyChannel

log = logging.getLogger("crossmem.owed")


@dataclass(frozen=True)
class OwedRun:
    answered: int
    failed: int


class OwedReplies:
    def __init__(
        self,
        memory: Memory,
        turns: Turns,
        channels: Mapping[Surface, Callable[[str], ReplyChannel]],
        deadlines: Mapping[Surface, float],
        max_age_s: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`channels`: for each surface the job can reach, the channel to a sender (a chat id,
        a `whatsapp:` address); a surface without one is left alone."""
        self._memory = memory
        self._turns = turns
        self._channels = channels
        self._deadlines = deadlines
        self._max_age_s = max_age_s
        self._clock = clock

    def run(self, time_budget_s: float) -> OwedRun:
        """Answer owed messages one at a time, oldest first, while the time budget lasts. One
        that fails (the model is down) ends the run: the next run tries again. One that cannot be
        used (its sender cannot be reached) is skipped and logged, and the run goes on."""
        answered = failed = 0
        if not self._channels or self._max_age_s <= 0:
            return OwedRun(0, 0)
        ends = self._clock() + time_budget_s
        surfaces = sorted(self._channels)
        answer_within = max(self._deadlines[surface] for surface in surfaces) + ANSWER_MARGIN_S
        while self._clock() + answer_within < ends:
            try:
                claimed = self._memory.claim_owed_replies(surfaces, self._max_age_s, answer_within, limit=1)
            except StoreUnavailable as exc:
                log.error("owed replies could not be claimed", extra={"error": str(exc)})
                break
            if not claimed:
                break
            owed = claimed[0]
            try:
                channel = self._channels[owed.surface](owed.sender)
            except ValueError as exc:
                # A row no channel can reach (a Telegram sender that is not a chat id): skipped, said
                # once for this claim, and the others still answered. Its claim holds it until
                # answer_by, so this run does not take it again.
                log.error(
                    "an owed message could not be answered: its sender cannot be reached",
                    extra={"surface": owed.surface.value, "message_id": str(owed.start.message_id), "error": str(exc)},
                )
                failed += 1
                continue
            result = self._turns.answer_owed(owed, channel, self._deadlines[owed.surface])
            if result.outcome is Outcome.ANSWERED and result.reply_id is not None:
                answered += 1
            else:
                failed += 1
                break
        return OwedRun(answered, failed)
