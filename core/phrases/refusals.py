"""The answers a surface gives when a turn is refused before the model: the budget's pause and a
message that cannot be stored, in the person's language. The errors' own messages stay what the
web's JSON and the logs say."""

from __future__ import annotations

from core.errors import EmptyMessage, InputError, MessageTooLong, OverBudget
from core.phrases.catalogue import Phrases

# A pause shorter than this is said in seconds, a longer one as the time it ends.
SECONDS_UNTIL_S = 120


def over_budget(phrases: Phrases, refused: OverBudget) -> str:
    """ "You can write again in 40 seconds", "... tomorrow after 09:00" (on the person's clock, else
    "09:00 UTC"): in the person's remembered language when there is a catalogue for it (begin_turn
    keeps a stated one before it refuses, so the remembered one is the stated one when the request
    states one), else in `phrases`' (the request's words, else DEFAULT_LANGUAGE)."""
    if refused.language in phrases.catalogue.languages:
        phrases = phrases.catalogue.phrases(refused.language)
    wait_s = (refused.until - refused.now).total_seconds()
    if wait_s < SECONDS_UNTIL_S:
        when = phrases.count("budget.in_seconds", max(int(wait_s) + 1, 1))
    else:
        # On the person's clock, as their tags, reminders and search results are; else UTC, said so.
        until, another_day, zone = refused.on_their_clock()
        time = f"{until:%H:%M}" if zone is not None else f"{until:%H:%M} UTC"
        when = phrases.say("budget.tomorrow_after" if another_day else "budget.after", time=time)
    return phrases.say("budget.pause", when=when)


def input_refused(phrases: Phrases, refused: InputError) -> str:
    """ "Sorry, I couldn't take that message: the message has 4100 characters; the limit is 4000."."""
    if isinstance(refused, MessageTooLong):
        reason = phrases.say("turn.reason.too_long", length=refused.length, limit=refused.limit)
    elif isinstance(refused, EmptyMessage):
        reason = phrases.say("turn.reason.empty")
    else:
        reason = phrases.say("turn.reason.other")
    return phrases.say("turn.input_refused", reason=reason)
