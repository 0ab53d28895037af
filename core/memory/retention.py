"""Retention: messages older than an age are deleted, in bounded batches; the budget's counts
older than a day too (`expire_usage`, every run of the scheduled job).

`crossmem purge --older-than 90d` (or MESSAGE_RETENTION_DAYS, from a scheduled job) calls
`purge_messages` once per batch: each call is one statement, in its own transaction, that
deletes at most `batch_size` messages (a message's reply goes with it or before it, never
beyond the limit), so a purge of millions of rows never holds locks or a transaction for
long. Each batch starts where the previous one stopped, so none rescans deleted rows.

A turn goes whole: a message whose reply is younger than the age waits for it. A turn in
flight is never touched: a message without a reply is kept for `in_flight`, the longest
model deadline and a margin for storing the reply.

The memory notes' lines about what goes, go too: each batch also rewrites the notes of at most a
fortieth of `batch_size` people that hold a line whose day is over everywhere before the cutoff
(or, for a line without a day, whose notes cover nothing younger), keeping every other line as it
was (schemas/memory_notes.sql's purge_note_lines). The batches go on until one finds nothing of
either to do.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TypeVar

from core.errors import StoreUnavailable
from core.stores.store import MemoryStore

log = logging.getLogger("crossmem.retention")
T = TypeVar("T")

# Past a surface's deadline the turn answers with the fallback, which is not stored; the margin
# covers storing a reply that made the deadline (finish_turn's round trip, a connect timeout).
FINISH_MARGIN = timedelta(minutes=1)
_AGE = re.compile(r"^\s*(\d+)\s*([dh])\s*$", re.IGNORECASE)
# The oldest age a purge takes (MESSAGE_RETENTION_DAYS too): older than any message. Past it the
# cutoff soon leaves what Postgres's intervals and Python's dates hold (999999d is a date in BC).
MAX_AGE_DAYS = 36_500


def parse_age(text: str) -> timedelta:
    """`90d` or `36h`: a positive number of days or hours, at most MAX_AGE_DAYS."""
    match = _AGE.match(text)
    hours = 0 if match is None else int(match[1]) * (24 if match[2].lower() == "d" else 1)
    if not 0 < hours <= MAX_AGE_DAYS * 24:
        raise ValueError(
            f"{text!r} is not an age like 90d or 36h (a positive number of days or hours, at most {MAX_AGE_DAYS}d)"
        )
    return timedelta(hours=hours)


def describe_age(age: timedelta) -> str:
    return f"{age.days}d" if age.seconds == 0 else f"{int(age.total_seconds() // 3600)}h"


def in_flight_window(*model_deadlines_s: float) -> timedelta:
    """How long a message without a reply may still get one: the longest deadline and the margin."""
    return timedelta(seconds=max(model_deadlines_s)) + FINISH_MARGIN


@dataclass(frozen=True)
class PurgeBatch:
    number: int
    deleted: int
    total: int
    seconds: float
    notes: int  # the people whose notes lost lines in this batch


@dataclass(frozen=True)
class PurgeReport:
    cutoff: datetime
    deleted: int
    batches: int
    dry_run: bool
    longest_statement_s: float
    notes: int  # the people whose notes lost lines (with dry_run: would lose them)


class Retention:
    def __init__(
        self,
        store: MemoryStore,
        *,
        batch_size: int,
        in_flight: timedelta,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._store = store
        self._batch_size = batch_size
        self._in_flight = in_flight
        self._clock = clock

    def purge(
        self,
        older_than: timedelta,
        *,
        dry_run: bool = False,
        on_batch: Callable[[PurgeBatch], None] | None = None,
    ) -> PurgeReport:
        """Delete the messages older than `older_than`, and the note lines about them, a batch per
        call; with `dry_run`, count them in one read and delete nothing."""
        total = batches = notes = 0
        longest = 0.0
        below: tuple[str | None, int | None] = (None, None)  # where the previous batch stopped
        # Each batch reads its own cutoff off the clock, but scans only below the first one's: a
        # message that aged past the age during the purge is the next purge's, and the report
        # names the first cutoff, before which nothing is left (but a turn waiting for its reply).
        cutoff: datetime | None = None
        while True:
            began = self._clock()
            row = self._store.call(
                "purge_messages",
                {
                    "p_older_than_seconds": int(older_than.total_seconds()),
                    "p_in_flight_seconds": int(self._in_flight.total_seconds()),
                    "p_limit": None if dry_run else self._batch_size,
                    "p_dry_run": dry_run,
                    "p_below_at": below[0],
                    "p_below_id": below[1],
                },
            )
            seconds = self._clock() - began
            longest = max(longest, seconds)
            cutoff = cutoff or datetime.fromisoformat(row["cutoff"])
            if dry_run:
                return PurgeReport(cutoff, int(row["candidates"]), 0, True, longest, int(row["notes"]))
            deleted, rewritten = int(row["deleted"]), int(row["notes"])
            if deleted == 0 and rewritten == 0:
                return PurgeReport(cutoff, total, batches, False, longest, notes)
            batches += 1
            total += deleted
            notes += rewritten
            if deleted:  # a batch of notes alone leaves the messages' place where it was
                below = (row["below_at"], row["below_id"])
            if on_batch is not None:
                on_batch(PurgeBatch(batches, deleted, total, seconds, rewritten))

    def housekeeping(self, older_than: timedelta) -> dict[str, int | None]:
        """The scheduled job's last steps: purge what is older than `older_than` (zero: the retention
        is off, nothing), then drop the budget's old counts. {"purged": the messages deleted,
        "purged_notes": the people whose notes lost the lines about them, "usage_expired": the rows
        dropped}, as `crossmem purge` and `expire_usage` say them; a step the database fails is
        null, logged, and the next run does it."""
        done: dict[str, int | None] = {"purged": 0, "purged_notes": 0}
        if older_than:
            report = _step("purge", lambda: self.purge(older_than))
            done = {"purged": None, "purged_notes": None}
            if report is not None:
                done = {"purged": report.deleted, "purged_notes": report.notes}
            if report is not None and (report.deleted or report.notes):
                log.info("purged", extra={"messages": report.deleted, "notes": report.notes, "batches": report.batches})
        return {**done, "usage_expired": _step("expire_usage", self.expire_usage)}

    def expire_usage(self) -> int:
        """Drop the budget's counts older than a day (turn_usage, voice_usage: budget.sql), a batch
        per call, whoever they belong to; how many rows went."""
        total = 0
        while True:
            row = self._store.call("expire_usage", {"p_limit": self._batch_size})
            turns, voice = int(row["turn_usage"]), int(row["voice_usage"])
            total += turns + voice
            if max(turns, voice) < self._batch_size:
                return total


def _step(step: str, run: Callable[[], T]) -> T | None:
    """A housekeeping step's result; None when the database failed it (logged)."""
    try:
        return run()
    except StoreUnavailable as exc:
        log.error("housekeeping failed; the next run tries again", extra={"step": step, "error": str(exc)})
        return None
