"""Opt-outs: a chat or number that asked its platform for no more messages, remembered as its
identity's (identities.sql's `opted_out_at`) so that nothing is sent to it, and nothing is asked of
the model for it, until it opts in again.

SMS is the one surface with such words today: Twilio answers STOP itself and refuses every later
send to the number (its error 21610) until it texts START, UNSTOP or YES (core/surfaces/sms.py).
What is heard of it is recorded here: the keyword's delivery to the webhook, or a send Twilio
refused as opted out (the STOP may have come while the webhook was down). Meanwhile a message the
number sends is stored and answered by nobody, with no model call (turn.sql's begin_turn: any
answer would be refused); the scheduled job gives up what it owed the number, with no model call
and no send (core/turn/owed.py), and holds the follow-ups due there that no other app of the
person's takes (core/follow_ups/delivery.py). The opt-in lets those go, for the job to say late;
ones whose hold ended before it (`held_until`, HELD_FOR_OPT_IN after they were due) are given up
(core/follow_ups/opted_out.py).

Whose identity: the owner policy's person for a number its list names (the identity is made for
them, linked as to a web account, as that policy keeps none otherwise), else whoever's the number's
identity is; a stranger the owner policy turns away, or a number never seen, records nothing
(nothing is ever sent to it). Logged without the number.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime

from core.errors import StoreUnavailable
from core.identity.policy import IdentityPolicy, identity_key
from core.models import Surface
from core.stores.store import MemoryStore

log = logging.getLogger("crossmem.opt_outs")


class OptOuts:
    def __init__(
        self, store: MemoryStore, identity: IdentityPolicy, now: Callable[[], datetime] = lambda: datetime.now(UTC)
    ) -> None:
        self._store = store
        self._identity = identity
        self._now = now  # the follow-up job's clock: an opt-in lets go the ones whose hold has not ended

    def heard(self, surface: Surface, sender: str, opted_out: bool | None) -> bool:
        """What a message, or a refused send, said of `sender`'s subscription: opted out (True), in
        again (False), nothing (None). Whether an identity took it; False too when the database
        failed (logged: a later refusal records an opt-out again)."""
        if opted_out is None or (person := self._identity.resolve(surface, sender)) is None:
            return False
        arguments = {
            "p_surface": surface.value,
            "p_external_id": identity_key(surface, sender),
            "p_user_id": None if person.user_id is None else str(person.user_id),
            "p_opted_out": opted_out,
            # the job's clock, against each held one's `held_until` (the one place its week is counted)
            "p_now": self._now().isoformat(),
        }
        try:
            answer = self._store.call("record_opt_out", arguments)
        except StoreUnavailable as exc:
            log.error("an opt-out or opt-in could not be recorded", extra={"surface": surface.value, "error": str(exc)})
            return False
        recorded = bool(answer["recorded"])
        extra: dict[str, object] = {"surface": surface.value, "recorded": recorded}
        if not opted_out:
            # the follow-ups held for it: let go for the job to say late, or given up past the week
            extra.update(released=int(answer["released"]), given_up=int(answer["given_up"]))
        log.info("opted out: nothing is sent there until it opts in" if opted_out else "opted in again", extra=extra)
        return recorded
