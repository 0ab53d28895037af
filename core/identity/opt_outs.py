"""Opt-outs: a chat or number that asked its platform for no more messages, remembered as its
identity's (identities.sql's `opted_out_at`) so that nothing is sent to it, and nothing is asked of
the model for it, until it opts in again.

SMS is the one surface with such words today: Twilio answers STOP itself and refuses every later
send to the number (its error 21610) until it texts START, UNSTOP or YES (core/surfaces/sms.py).
What is heard of it is recorded here: the keyword's delivery to the webhook, or a send Twilio
refused as opted out (the STOP may have come while the webhook was down). The scheduled job then
gives up what it owed the number and the follow-ups due there, with no model call and no send
(core/turn/owed.py, core/follow_ups/delivery.py).

Whose identity: the owner policy's person for a number its list names (the identity is made for
them, as that policy keeps none otherwise), else whoever's the number's identity is; a stranger
the owner policy turns away, or a number never seen, records nothing (nothing is ever sent to
it). Logged without the number.
"""

from __future__ import annotations

import logging

from core.errors import StoreUnavailable
from core.identity.policy import IdentityPolicy, identity_key
from core.models import Surface
from core.stores.store import MemoryStore

log = logging.getLogger("crossmem.opt_outs")


class OptOuts:
    def __init__(self, store: MemoryStore, identity: IdentityPolicy) -> None:
        self._store = store
        self._identity = identity

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
        }
        try:
            recorded = bool(self._store.call("record_opt_out", arguments)["recorded"])
        except StoreUnavailable as exc:
            log.error("an opt-out or opt-in could not be recorded", extra={"surface": surface.value, "error": str(exc)})
            return False
        log.info(
            "opted out: nothing is sent there until it opts in" if opted_out else "opted in again",
            extra={"surface": surface.value, "recorded": recorded},
        )
        return recorded
