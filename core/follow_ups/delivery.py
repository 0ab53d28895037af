"""Delivering due follow-ups, once each, on the app the person asked on: the scheduled job's part.

The job (functions/digest.py, every minute) claims the due ones in the database
(`claim_due_follow_ups`, `for update skip locked`: two runs at once share them out, never both
take one) and says each where it was asked, through its surface's adapter (core/surfaces/):

- Telegram: the Bot API's sendMessage to the chat.
- WhatsApp: Twilio's Messages API. Free-form inside WhatsApp's 24-hour window (the person's last
  WhatsApp message); outside it, the approved template TWILIO_FOLLOW_UP_CONTENT_SID with the
  text as its variable, or, without one, held: begin_turn says it first on their next message.
- The web: nothing to push. Asked there, it goes to the app the person last wrote from (a chat
  or number linked to them); with none, it appears in their web conversation as the agent's message.

Refused for good with nothing of it out (a blocked bot, a refused number, no chat or number of
theirs there any more), it moves once to another app of the person's before it is given up
(core/follow_ups/moves.py).

The registry names every surface (core/surfaces/`registry`): a follow-up on a surface without
an adapter cannot be recorded as sent, since there is no such delivery to build.

Said to the chat or number the person last wrote from on that app (a WhatsApp user may write by
number one day and by business-scoped id the next), if it is still theirs, else to the one it was
asked from, if that still is: linked to them (`auto`), or in the owner's allow-list (`owner`).
When neither is (unlinked since, passed to someone else, dropped from the allow-list), it reaches
nobody: given up and logged, never stored in the thread nor counted as sent. One whose chat or
number has opted out (an SMS number's STOP: core/identity/opt_outs.py) is refused for good alike,
with no send tried (the person asked for no more texts, and Twilio would refuse it): moved once to
another app of theirs, as any refused one (core/follow_ups/moves.py), else held until the number
opts in again, for a week at most (core/follow_ups/opted_out.py): past it, the claim gives it up.
So is one whose own send the platform refuses as opted out (`Sent.opted_out`: a STOP we missed,
recorded then by the sender), from the part it got to.

Sent, it is stored in the thread as the agent's message (`finish_follow_up`), in the conversation
of the app it was said on, so every app's memory knows it was said. A failure that may pass
(5xx, 429, the network) is tried again with backoff (1, 2, 4 ... minutes, MAX_ATTEMPTS in all);
one that cannot (a blocked bot, an unknown chat, a refused number) is given up and logged, where
it does not move. Said more than a few minutes after its time,
what reaches the person ends with when it was due (core/follow_ups/lateness.py); the thread
keeps the text alone.

A claim lasts LEASE_S, at least the scheduled function's timeout (serverless.yml; a test checks
it): a live run never sees its claims expire, whatever its sends take. Only a run that died
between claiming and recording leaves claims to expire: the next run gives up the ones it had
begun to send (each is marked just before its send, `try_follow_up`) rather than risk saying one
twice, and claims the ones it never reached again. A live run checks its time budget before
every send, not only before every claim: once it is spent, the claimed ones it has not tried go
back to pending in one round trip (`release_follow_ups`, the claim's attempt taken back), for the
next minute's run rather than after the lease, and so do the ones after a sender that raised. A
follow-up sent but no longer this run's to record (another run gave its claim up, or the person
forgot it meanwhile), or whose outcome the database did not take, is logged as not in the
thread and counted `unrecorded`, never as sent. Each claim has its id: a run marks, finishes
and hands back only what its own claim holds, so a call it retries after the connection died
(the store tries once more) recognises its own recorded outcome and never touches a claim a
later run has taken since.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID, uuid4
from zoneinfo import ZoneInfo

from core.errors import StoreUnavailable
from core.follow_ups.lateness import said_late
from core.follow_ups.moves import FollowUpMoves
from core.follow_ups.opted_out import HELD, held_for_opt_in, held_until
from core.follow_ups.wall_clock import zone_named
from core.identity.policy import IdentityPolicy
from core.memory.service import retried_call
from core.models import Delivery, Sent, Surface
from core.phrases.catalogue import Catalogue
from core.stores.store import MemoryStore
from core.surfaces import Surfaces, complete, rules

log = logging.getLogger("crossmem.follow_ups")

# Why a follow-up was not tried, as its log line says.
NOBODY = "no chat or number of the person's reaches them any more: said to nobody"
OPTED_OUT = "its chat or number opted out (STOP): nothing is sent there"
MAX_ATTEMPTS = 6  # 1 + 2 + 4 + 8 + 16 minutes of retries: a platform outage of half an hour
# At least the scheduled function's timeout (serverless.yml's memory_digest, 300 s), with a minute
# for the instances' clocks: a claim older than this is a run that died, never one still sending.
LEASE_S = 360


def backoff(attempts: int) -> timedelta:
    """How long after its `attempts`-th failed try a follow-up is tried again."""
    return timedelta(minutes=2 ** max(attempts - 1, 0))


@dataclass
class FollowUpRun:
    sent: int = 0
    retried: int = 0
    held: int = 0
    given_up: int = 0
    lost: int = 0  # claims of a run that died mid-send, given up
    expired: int = 0  # held a week for an opt-in that never came, given up by the claim
    # Tried, its outcome not recorded (no longer this run's claim, or the database did not take
    # it): a sent one is not in the thread. Its row is counted where its fate is decided (a later
    # run gives a claim left `sending` up, as `lost`), so not among this run's given up.
    unrecorded: int = 0
    released: int = 0  # claimed, never tried (the time budget ran out, a sender raised): pending again

    def as_json(self) -> dict[str, int]:
        return {
            "follow_ups_sent": self.sent,
            "follow_ups_retried": self.retried,
            "follow_ups_held": self.held,
            "follow_ups_given_up": self.given_up + self.lost + self.expired,
            "follow_ups_released": self.released,
            "follow_ups_unrecorded": self.unrecorded,
        }


class FollowUpDelivery:
    def __init__(
        self,
        store: MemoryStore,
        surfaces: Surfaces,
        identity: IdentityPolicy,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
        batch: int = 50,
        clock: Callable[[], float] = time.monotonic,
        catalogue: Catalogue | None = None,
    ) -> None:
        self._store = store
        self._surfaces = complete(surfaces, "the surface registry")
        self._identity = identity
        self._now = now
        self._batch = batch
        self._clock = clock
        self._catalogue = catalogue or Catalogue()
        self._moves = FollowUpMoves(store, identity)

    def run(self, time_budget_s: float) -> FollowUpRun:
        """Deliver the due follow-ups in batches while the time budget lasts."""
        done = FollowUpRun()
        ends = self._clock() + time_budget_s
        while self._clock() < ends:
            now = self._now()
            claim = str(uuid4())  # drawn here: the store's retry of the call finds the same claim
            try:
                claimed = self._store.call(
                    "claim_due_follow_ups",
                    {"p_now": now.isoformat(), "p_limit": self._batch, "p_lease_seconds": LEASE_S, "p_claim": claim},
                )
            except StoreUnavailable as exc:
                log.error("follow-ups could not be claimed", extra={"error": str(exc)})
                break
            if claimed["lost"]:
                done.lost += int(claimed["lost"])
                log.error("follow-ups given up: a run died while sending them", extra={"count": claimed["lost"]})
            if claimed["expired"]:
                done.expired += len(claimed["expired"])
                # a STOP meant for good is no fault; by id, never the number
                log.warning(
                    "follow-ups given up: held a week for an opt-in that never came",
                    extra={"expired": claimed["expired"]},
                )
            rows: list[dict[str, Any]] = claimed["claimed"]
            tried = 0
            try:
                for row in rows:
                    if self._clock() >= ends:
                        break
                    tried += 1
                    if self._still_this_runs(row, claim):
                        self._deliver(row, claim, self._now(), done)
            except StoreUnavailable as exc:
                log.error("a follow-up could not be marked tried; not sent", extra={"error": str(exc)})
                tried -= 1  # handed back with the rest, unless its mark did land (then it is kept)
                break
            finally:
                # Never tried: back to pending. The one a raising sender was on may have gone out.
                if tried < len(rows):
                    self._release(rows[tried:], claim, done)
            if tried < len(rows) or len(rows) < self._batch:
                break
        return done

    def _still_this_runs(self, row: dict[str, Any], claim: str) -> bool:
        """Marked tried just before its send (`try_follow_up`): should the run die from here, it
        is given up, never said twice; the ones it never reached are due again. False when it is
        no longer this claim's (a later run took it over, the person forgot it, its lease ran out):
        not sent."""
        marking = {"p_id": row["id"], "p_claim": claim, "p_now": self._now().isoformat()}
        if self._store.call("try_follow_up", marking)["ok"]:
            return True
        log.warning("a claimed follow-up is no longer this run's: not sent", extra={"id": row["id"]})
        return False

    def _release(self, rows: list[dict[str, Any]], claim: str, done: FollowUpRun) -> None:
        ids = [int(row["id"]) for row in rows]
        try:
            released = self._store.call("release_follow_ups", {"p_ids": json.dumps(ids), "p_claim": claim})
        except StoreUnavailable as exc:
            # Untried, their claims expire into pending: the first run after the lease sends them.
            log.error("follow-ups not tried could not be handed back", extra={"ids": ids, "error": str(exc)})
            return
        done.released += int(released["released"])
        log.warning(
            "follow-ups handed back untried, for the next run",
            extra={"ids": ids, "released": int(released["released"])},
        )

    def _deliver(self, row: dict[str, Any], claim: str, now: datetime, done: FollowUpRun) -> None:
        # Asked on the web, said on the app the person last wrote from; refused for good there, on
        # another of theirs, once (core/follow_ups/moves.py).
        row = self._moves.placed(row, claim)
        sent, outcome, unsaid = self._say(row, now)
        if (moved := self._moves.moved_on(row, claim, sent)) is not None:
            row = moved
            sent, outcome, unsaid = self._say(row, now)
        elif unsaid == OPTED_OUT and held_for_opt_in(datetime.fromisoformat(row["due_at"]), now):
            # no other app of theirs: held until the number opts in (core/follow_ups/opted_out.py)
            outcome, unsaid = "opted_out", HELD
        surface = Surface(row["surface"])
        delivery = sent.delivery
        if outcome not in ("held", "opted_out"):
            outcome = {Delivery.DELIVERED: "sent", Delivery.OWED: "retry", Delivery.GIVEN_UP: "given_up"}[delivery]
        if outcome == "retry" and int(row["attempts"]) >= MAX_ATTEMPTS:
            outcome = "given_up"
        retry_at = now + backoff(int(row["attempts"]))
        due = datetime.fromisoformat(row["due_at"])
        shown = "held" if outcome == "opted_out" else outcome  # the log's: `reason` says what for
        extra = {"id": row["id"], "surface": surface.value, "outcome": shown, "attempts": row["attempts"]}
        if unsaid is not None:
            extra["reason"] = unsaid
        why = "no longer this run's: another run gave its claim up, or it was forgotten"
        try:
            finished = self._finished(
                {
                    "p_id": row["id"],
                    "p_claim": claim,
                    "p_outcome": outcome,
                    "p_retry_at": retry_at.isoformat(),
                    # how far it got, when it did not get through: where a retry starts
                    "p_unsent_from": None if delivery is Delivery.DELIVERED else sent.parts or None,
                    # what SMS's numbered parts were cut from: the rest is said from it, the count kept
                    "p_said_as": self._as_said(row, now)["content"]
                    if rules(surface).carried_as_sms and sent.parts and delivery is not Delivery.DELIVERED
                    else None,
                    # held on the person's last message there the claim saw: one since opens the window
                    "p_seen_at": row.get("window_opened_at"),
                    # held for its number's opt-in: the claim gives it up after this
                    "p_held_until": held_until(due).isoformat(),
                }
            )
        except StoreUnavailable as exc:
            # Its claim expires and the next run gives it up: never said twice.
            finished, why = {"done": False}, str(exc)
        if not finished["done"]:
            done.unrecorded += 1
            if outcome == "sent":
                log.error("a follow-up was sent but is not stored in its thread", extra={**extra, "reason": why})
            else:
                log.error("a follow-up's outcome was not recorded", extra={**extra, "reason": why})
            return
        if outcome == "sent":
            done.sent += 1
            log.info("follow-up", extra={**extra, "lag_s": round((now - due).total_seconds(), 1)})
        elif outcome == "retry":
            done.retried += 1
            log.warning("follow-up", extra={**extra, "retry_at": retry_at.isoformat()})
        elif shown == "held":
            done.held += 1
            log.info("follow-up", extra=extra)
        else:
            done.given_up += 1
            log.log(
                logging.WARNING if unsaid == OPTED_OUT else logging.ERROR, "follow-up", extra=extra
            )  # a STOP is no fault

    def _finished(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """finish_follow_up, tried again while the database is away for a moment (every wait of
        FINISH_RETRY_WAITS_S: its claim holds the follow-up for the lease), as a turn's reply is
        stored: an outcome not recorded lets the claim expire, tried, into a dead run's, given up
        (a reminder that never went out, lost). A retried call that committed finds its own outcome."""
        return dict(retried_call(self._store, "finish_follow_up", arguments, math.inf))

    def _say(self, row: dict[str, Any], now: datetime) -> tuple[Sent, str, str | None]:
        """Said on its surface: a secondary surface's to a chat or number that still reaches the
        person, the web's in their thread. What became of it, the outcome, and why it was not
        said (NOBODY, OPTED_OUT: refused for good before any send, or the send refused as opted
        out, so moved, else held for an opt-out, given up for nobody)."""
        surface = Surface(row["surface"])
        to = self._reachable(surface, row) if surface.is_secondary else None
        if surface.is_secondary and to is None:
            return Sent(Delivery.GIVEN_UP, 0), "given_up", NOBODY
        if to in row.get("opted_out", ()):
            return Sent(Delivery.GIVEN_UP, 0), "given_up", OPTED_OUT
        sent, outcome = self._surfaces[surface].say_follow_up(to, self._as_said(row, now), now)
        # refused as opted out (a STOP we missed): as one known before the send, moved or held
        return sent, outcome, OPTED_OUT if sent.opted_out else None

    def _as_said(self, row: dict[str, Any], now: datetime) -> dict[str, Any]:
        """The row with its text as the person reads it: said late, it says when it was due
        (core/follow_ups/lateness.py), in their language (remembered, else the one the agent wrote
        it in) and on their clock (theirs, else the one it was asked in). By SMS, one whose first
        parts went out says the rest of what they were cut from (`said_as`): a note added, or said
        anew, now would renumber its parts ("(1/2)", then "(2/3)")."""
        if row.get("said_as"):
            return {**row, "content": row["said_as"]}
        content = str(row["content"])
        language = self._catalogue.choose(None, content, remembered=row.get("language"))
        zone = zone_named(row.get("timezone")) or ZoneInfo("UTC")
        due = datetime.fromisoformat(row["due_at"])
        return {**row, "content": said_late(content, due, now, zone, self._catalogue.phrases(language))}

    def _reachable(self, surface: Surface, row: dict[str, Any]) -> str | None:
        """The chat or number to say it to: the one the person last wrote from on its app, else
        the one it was asked from, whichever still reaches the person who asked; None for neither."""
        person = UUID(row["user_id"])
        for sender, owned_by in (
            (row.get("last_sender"), row.get("last_sender_user")),
            (row["sender"], row.get("identity_user")),
        ):
            if sender and self._identity.reaches(surface, str(sender), UUID(owned_by) if owned_by else None, person):
                return str(sender)
        return None
