"""A follow-up due to a chat or number that has opted out: held for its opt-in, not lost.

After STOP (an SMS number's: core/identity/opt_outs.py) Twilio refuses every send to the number
until it texts START, UNSTOP or YES (its error 21610), so the follow-up job tries none there. As
any follow-up refused for good, one due then moves once to another app of the person's, the one
they last wrote from (core/follow_ups/moves.py). With none, it is held (follow_ups.sql's `held`,
as WhatsApp holds one outside its 24-hour window: core/follow_ups/outside_thread.py), not given
up: a STOP sent by mistake and undone an hour later loses no reminder. The opt-in lets it go
(identities.sql's record_opt_out, follow_ups.sql's let_go_after_opt_in): the job's next run, within
a minute, says it through the Messages API, once, ending with when it was due ("(due at 09:00,
sent late)": core/follow_ups/lateness.py). Not in the answer to the opt-in: Twilio answers START
itself, and YES is a turn whose TwiML answer is the advisor's reply.

One whose own send Twilio refuses as opted out (21610: a STOP the webhook never heard; the
refusal records it) is moved or held alike, from the part it got to: its first parts out, it is
held (it moves only whole), and the rest is said after START.

Held at most HELD_FOR_OPT_IN after it was due (its `held_until`, recorded when it is held and the
one bound both the opt-in and the claim read, with the job's clock): an opt-in later than that gives
it up unsaid (logged with the count, never the number), as a reminder of a week gone is noise, and
the person who stopped texts for that long meant it; one the job first finds that late (the job was
down) is given up at once; and with no opt-in at all, the job's first run past that time gives it
up (follow_ups.sql's claim_due_follow_ups, logged with its id), else it would stay held for ever, in
the person's list and against their FOLLOW_UPS_PER_PERSON. Until then it stays in the person's
list, where the list tool says what it waits for (core/surfaces/sms.py's `held_until`) and they
can cancel it, from any of their apps. Given up with its first parts out (sent before the STOP),
it is stored in its thread whole, undelivered (follow_ups.sql's `kept_in_thread`).
"""

from __future__ import annotations

from datetime import datetime, timedelta

HELD_FOR_OPT_IN = timedelta(days=7)
# Why a follow-up was held, as its log line says.
HELD = "its number opted out (STOP): held until it opts in again (START)"


def held_until(due_at: datetime) -> datetime:
    """Until when a follow-up due at `due_at` is held for its number's opt-in: given up after it."""
    return due_at + HELD_FOR_OPT_IN


def held_for_opt_in(due_at: datetime, now: datetime) -> bool:
    """Whether a follow-up due at `due_at` to a number that opted out, with no other app to go to,
    is held for the number's opt-in at `now` (else given up)."""
    return now <= held_until(due_at)
