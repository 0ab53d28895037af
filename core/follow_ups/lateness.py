"""A follow-up said late says when it was due.

A reminder that reaches the person noticeably after its time (the scheduled job was down, a
platform failed for a while, WhatsApp's 24-hour window was closed and it waited for their next
message) reads as if it were on time unless it says otherwise. Past LATE_AFTER it ends with when
it was due, on the person's clock and in their language: "Time to call the dentist.\n\n(due at
09:00, sent late)". The job runs every minute and tries a failure again after 1 and 2 minutes
(core/follow_ups/delivery.py): a few minutes' lag is not late, and says nothing.

The note goes after the text, never before it: a follow-up said in parts is tried again from a
later part (`unsent_from`), and a note at its end leaves where the parts before it were cut as they
were. By SMS that retry says the rest of the very text its first parts were cut from (`said_as`),
the note as it was or none, never one added or said anew then: the cuts would hold, but the parts'
numbers would not ("(1/2)", then "(2/3)" and "(3/3)" for the note in a part of its own). Only what
reaches the person carries it: the thread keeps the text as the agent wrote it, and its message's
time says when it was said.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from core.phrases.catalogue import Phrases

# Past the job's lag (a run a minute, JOB_LAG's 2 minutes with room) and its first two retries.
LATE_AFTER = timedelta(minutes=5)


def said_late(content: str, due_at: datetime, now: datetime, zone: ZoneInfo, phrases: Phrases) -> str:
    """`content` as said at `now`: with when it was due after it, when that is past LATE_AFTER."""
    if now - due_at <= LATE_AFTER:
        return content
    return f"{content}\n\n{late_note(due_at, now, zone, phrases)}"


def late_note(due_at: datetime, now: datetime, zone: ZoneInfo, phrases: Phrases) -> str:
    """ "(due at 09:00, sent late)": the hour alone when it was due today on the person's clock,
    "yesterday at" the day after, the day and date before that ("on Thu 3 Dec at", its year when not
    this one's)."""
    due, today = due_at.astimezone(zone), now.astimezone(zone).date()
    time = f"{due:%H:%M}"
    if due.date() == today:
        return phrases.count("follow_up.late_today", due.hour, time=time)
    if due.date() == today - timedelta(days=1):
        return phrases.count("follow_up.late_yesterday", due.hour, time=time)
    weekday, month = phrases.say(f"follow_up.weekdays.{due.isoweekday()}"), phrases.say(f"follow_up.months.{due.month}")
    form = "follow_up.date" if due.year == today.year else "follow_up.date_in_year"
    date = phrases.say(form, weekday=weekday, day=due.day, month=month, year=due.year)
    return phrases.count("follow_up.late_on", due.hour, time=time, date=date)
