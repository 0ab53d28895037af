"""Owed replies: messages stored and never answered, answered by the scheduled job.

A message is owed when it has no reply and its attempt can no longer answer (its instance
died, its model call ended in the fallback), or when its reply is stored but owed a send (the
surface refused it for a reason that may pass, maybe after its first parts): that reply is sent
from the part it stopped at, no model asked, at each run while the message is young enough; a
run whose sends fail for two people for a reason that may pass stops (the surface is down for
everyone). The same delivery again answers it (a Telegram redelivery, a web retry), but Twilio
does not redeliver and Telegram gives up, so the scheduled job answers the Telegram and
WhatsApp ones younger than OWED_REPLY_MAX_AGE: it takes each over in the database (one
attempt at a time, whoever asks), asks the model once, sends the reply through the Bot API or
Twilio's Messages API and stores it. Older ones are left to the person's next message, as a
reply minutes late reads as an answer and one an hour late as a stranger's. One owed to a chat or
number that has opted out (an SMS number's STOP: core/identity/opt_outs.py) is given up at its
claim, with no model asked and nothing sent, whatever it is: no longer owed, logged, and counted
with the ones the run could not send.

Fair and bounded. Nobody waits on the job, so its model call is not given the webhook's
deadline again but up to half the run's time (a long answer that missed 12 s on WhatsApp gets
written now; one that never comes leaves the other half to everyone else). A message it could
not answer goes behind every message tried fewer times, and its person behind every person tried
less; after OWED_REPLY_MAX_TRIES tries it gets the fallback, once, sent and stored: it is no
longer owed. At most PER_PERSON_PER_RUN of one person's messages a run, and none more after one
of theirs failed, so one person's cannot hold everyone else's. One message failing does not end
the run (it may be that message: an answer too long for any deadline); the model failing for two
people in a row does (it is down for everyone: the next run tries again, at the cost of two calls
a minute). A person past their budget is not asked for: the claim checks it as begin_turn does,
and reserves the answer's tokens of their day (a claim not answered gives them back).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from uuid import UUID

from core.errors import StoreUnavailable
from core.memory.service import Memory, OwedMessage
from core.models import Delivery, Sent, Surface
from core.turn.request import Outcome, ReplyChannel
from core.turn.turns import ANSWER_MARGIN_S, STORE_MARGIN_S, Turns

log = logging.getLogger("crossmem.owed")
# The most of one person's owed messages a run answers: the rest wait for the next run, behind
# everyone else's.
PER_PERSON_PER_RUN = 2
# What a claim holds beyond the model's deadline for the send: a part through Twilio's client may
# take its 10 s timeout to connect and as long to read (no part starts that could end past the
# claim: core/channels/whatsapp.py), so an answer written at the deadline still goes out.
SEND_ROOM_S = 20.0


@dataclass(frozen=True)
class OwedRun:
    answered: int
    failed: int


@dataclass
class FailedSends:
    """Whose send last failed in a run for a reason that may pass, with none sent since."""

    last: UUID | None = None

    def down_for_everyone(self, person: UUID, delivery: Delivery) -> bool:
        """What a send for `person` came to: when it failed for a reason that may pass, whether
        one did for another person before it, with none sent since (the surface is down: the next
        run tries again)."""
        if delivery is Delivery.DELIVERED:
            self.last = None
        if delivery is not Delivery.OWED:
            return False
        if self.last is not None and self.last != person:
            return True
        self.last = person
        return False


class OwedReplies:
    def __init__(
        self,
        memory: Memory,
        turns: Turns,
        channels: Mapping[Surface, Callable[[str], ReplyChannel]],
        deadlines: Mapping[Surface, float],
        max_age_s: int,
        max_tries: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`channels`: for each surface the job can reach, the channel to a sender (a chat id,
        a `whatsapp:` address); a surface without one is left alone. `deadlines`: each surface's
        webhook deadline, the least time a try is worth starting with."""
        self._memory = memory
        self._turns = turns
        self._channels = channels
        self._deadlines = deadlines
        self._max_age_s = max_age_s
        self._max_tries = max_tries
        self._clock = clock

    def run(self, time_budget_s: float) -> OwedRun:
        """Answer owed messages one at a time, the least tried first, while the time budget lasts
        (each with up to half of it). One that cannot be used (its sender cannot be reached) is
        skipped and logged, and the run goes on. One whose chat no longer reaches its person is
        held by its claim until the run ends, then gives back what the claim reserved: given back
        at once, the same run would claim it again."""
        unanswered: list[OwedMessage] = []
        try:
            return self._run(time_budget_s, unanswered)
        finally:
            for owed in unanswered:
                self._release(owed)

    def _run(self, time_budget_s: float, unanswered: list[OwedMessage]) -> OwedRun:
        answered = failed = 0
        if not self._channels or self._max_age_s <= 0:
            return OwedRun(0, 0)
        ends = self._clock() + time_budget_s
        surfaces = sorted(self._channels)
        least = max(self._deadlines[surface] for surface in surfaces) + ANSWER_MARGIN_S + SEND_ROOM_S
        longest = time_budget_s / 2  # one try's most: an answer that never comes leaves half the run
        taken: Counter[UUID] = Counter()
        resting: set[UUID] = set()  # people with a failure this run: theirs wait for the next
        failing: UUID | None = None  # whose message the model last failed, with no answer since
        unsent = FailedSends()
        estimate = self._turns.owed_estimate()  # what each claim reserves of the person's day

        while (left := ends - self._clock()) >= least:
            done = resting | {person for person, count in taken.items() if count >= PER_PERSON_PER_RUN}
            claimed_at, answer_within = self._clock(), min(left, longest + ANSWER_MARGIN_S + SEND_ROOM_S)
            # What the job sends for a claim goes out while the claim holds, as a turn's reply does.
            send_by = claimed_at + answer_within - STORE_MARGIN_S
            try:
                claimed = self._memory.claim_owed_replies(
                    surfaces, self._max_age_s, answer_within, limit=1, skip_users=sorted(done), estimate=estimate
                )
            except StoreUnavailable as exc:
                log.error("owed replies could not be claimed", extra={"error": str(exc)})
                break
            if not claimed:
                break
            owed = claimed[0]
            person = owed.start.user_id
            assert person is not None  # a claimed message is a stored one
            taken[person] += 1
            if owed.opted_out:
                failed += 1
                self._give_up_opted_out(owed)
                continue
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
                resting.add(person)
                self._release(owed)
                continue
            if not self._turns.identity.reaches(owed.surface, owed.sender, owed.sender_user, person):
                # Unlinked, forgotten or off the owner's list since: whoever has that chat or number
                # now is told nothing of this person's (claimed again while young enough: no more).
                log.warning(
                    "an owed message was left: its chat or number no longer reaches its person",
                    extra={"surface": owed.surface.value, "message_id": str(owed.start.message_id)},
                )
                failed += 1  # their messages elsewhere are still answered in this run
                unanswered.append(owed)
                continue
            if owed.start.reply is not None:  # its reply is stored, owed a send
                sent = self._send_stored(owed, channel, send_by)
                if sent.delivery is Delivery.DELIVERED:
                    answered += 1
                else:
                    failed += 1
                    resting.add(person)
                if unsent.down_for_everyone(person, sent.delivery):  # not for a refusal for good (a blocked bot)
                    break
                continue
            if owed.tries > self._max_tries:  # its last try ended with the job's instance
                failed += 1
                resting.add(person)
                if unsent.down_for_everyone(person, self._give_up(owed, channel, send_by)):
                    break
                continue
            model_s = min(answer_within - ANSWER_MARGIN_S - SEND_ROOM_S, longest)
            # Given up at its last try; with held follow-ups, at the next run's claim, which knows how far
            # this try said them (a give-up from this claim's would say again what this try said).
            last_try = owed.tries >= self._max_tries and not owed.start.delivered_first
            result = self._turns.answer_owed(owed, channel, model_s, until=send_by, last_try=last_try)
            # A declined turn is answered too: its answer is stored, and owes nothing (docs/decisions.md).
            if result.outcome in (Outcome.ANSWERED, Outcome.DECLINED) and result.reply_id is not None:
                answered, failing = answered + 1, None
                if result.reply_owed:  # stored, its surface down: sent from where it stopped next run
                    resting.add(person)
                else:
                    unsent.last = None
                continue
            failed += 1
            resting.add(person)
            # A fallback's try left its claim and what it spent to the give-up; any other ended its attempt.
            spent = result.figures.model_tokens if result.outcome is Outcome.FALLBACK else None
            if last_try and unsent.down_for_everyone(person, self._give_up(owed, channel, send_by, spent)):
                break
            if result.outcome is Outcome.FALLBACK:
                if failing is not None and failing != person:
                    break
                failing = person
        return OwedRun(answered, failed)

    def _give_up(self, owed: OwedMessage, channel: ReplyChannel, send_by: float, spent: int | None = 0) -> Delivery:
        """The fallback, once: sent, and stored as the reply, so the message is no longer owed. The
        held follow-ups its attempts took go first; when one does not, the message stays owed with
        them (from the part each got to) for the next run's give-up. What became of the sends.
        `spent`: what this claim's try spent, which the give-up counts as it gives back what the
        claim reserved (its fallback kept the claim: answer_owed's `last_try`; 0: none was made);
        None: the try ended its attempt, which counted it and gave the reservation back."""
        start = owed.start
        assert start.user_id is not None and start.message_id is not None
        if not self._turns.said_held_first(start, channel, send_by):
            log.warning(
                "an owed message's held follow-ups could not be sent before its fallback; the next run tries again",
                extra={"surface": owed.surface.value, "message_id": str(start.message_id), "tries": owed.tries},
            )
            self._release(owed, spent or 0)
            return Delivery.OWED
        said = next((m.content for m in start.history if m.id == start.message_id), "")
        # In the person's language as remembered (claim_owed_replies answers it), else that of their words.
        fallback = self._turns.fallback_reply(said, start.language)
        sent = channel.send(fallback, send_by)
        self._memory.finish_turn(
            start.user_id,
            start.message_id,
            fallback,
            delivered=sent.delivery is Delivery.DELIVERED,
            unsent_from=sent.unsent_from,
            attempt=start.attempt,
            tokens=spent or 0,
            reserved=0 if spent is None else start.reserved_tokens,
            # tried again while the claim holds the message, as a turn's reply is: the fallback went
            # out, and one not stored would be given up, and sent, again by the next run
            retry_for_s=send_by + STORE_MARGIN_S - self._clock(),
        )
        log.warning(
            "an owed message was given up: the fallback was sent",
            extra={"surface": owed.surface.value, "message_id": str(start.message_id), "tries": owed.tries},
        )
        return sent.delivery

    def _give_up_opted_out(self, owed: OwedMessage) -> None:
        """A message owed to a chat or number that opted out: no longer owed, its stored reply
        never sent (owed_replies.sql's give_up_owed); the database down, its claim lapses and a
        later run gives it up."""
        start = owed.start
        assert start.user_id is not None and start.message_id is not None
        extra = {"surface": owed.surface.value, "message_id": str(start.message_id), "tries": owed.tries}
        try:
            given_up = self._memory.give_up_owed(start.user_id, start.message_id, start.attempt)
        except StoreUnavailable as exc:
            log.error("an owed message to a number that opted out was not given up", extra={**extra, "error": str(exc)})
            return
        log.warning(
            "an owed message was given up: its chat or number opted out; no model asked, nothing sent",
            extra={**extra, "given_up": given_up},
        )

    def _release(self, owed: OwedMessage, spent: int = 0) -> None:
        """A claim the job does not answer gives back what it reserved and counts what its try
        `spent` (the message is owed again at once: its person rests for the rest of the run, or it
        is theirs no more)."""
        start = owed.start
        if (start.reserved_tokens or spent) and start.user_id is not None and start.message_id is not None:
            self._memory.end_attempt(
                start.user_id, start.message_id, start.attempt, spent, reserved=start.reserved_tokens
            )

    def _send_stored(self, owed: OwedMessage, channel: ReplyChannel, send_by: float) -> Sent:
        """A reply stored but owed a send (its surface was down when it was written, or took only
        its first parts): sent from the part it stopped at, no model asked, and what became of it
        recorded. Tried at each run while the message is younger than OWED_REPLY_MAX_AGE (the
        claim's), then left: the rest of a reply that late would read as a stranger's."""
        start, reply = owed.start, owed.start.reply
        assert reply is not None and start.user_id is not None
        first_part = reply.unsent_from or 0
        extra = {"surface": owed.surface.value, "message_id": str(start.message_id), "tries": owed.tries}
        sent = channel.send(reply.content, send_by, first_part)
        # tried again while the claim holds the message: one not recorded would be sent again next run
        self._memory.record_delivery(
            start.user_id, reply.id, start.attempt, sent, retry_for_s=send_by + STORE_MARGIN_S - self._clock()
        )
        log.log(
            logging.INFO if sent.delivery is Delivery.DELIVERED else logging.WARNING,
            "an owed reply was sent" if sent.delivery is Delivery.DELIVERED else "an owed reply could not be sent",
            extra={**extra, "from_part": first_part + 1},
        )
        return sent
