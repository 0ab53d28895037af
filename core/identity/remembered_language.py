"""A person's language as remembered, for a fixed answer given without a turn.

A turn learns the person's language from begin_turn's answer. A chat command's SQL function
answers it beside its outcome (forget_request, redeem_link_code, unlink_identities); what has no
SQL function of its own (the owner policy's "nothing to link", a Telegram notice from an app
that states no language) asks `person_language`: one round trip, asked only then
(docs/decisions.md, "The person's language").
"""

from __future__ import annotations

import logging

from core.errors import StoreUnavailable
from core.identity.policy import IdentityPolicy
from core.models import Surface
from core.stores.store import MemoryStore

log = logging.getLogger("crossmem.identity")


class RememberedLanguage:
    def __init__(self, store: MemoryStore, identity: IdentityPolicy) -> None:
        self._store = store
        self._identity = identity

    def of(self, surface: Surface, sender_id: str) -> str | None:
        """The remembered language of the sender's person; None for a stranger, a sender never
        seen, or a database that failed (the answer then goes by the words, else DEFAULT_LANGUAGE)."""
        person = self._identity.resolve(surface, sender_id)
        if person is None:
            return None
        arguments = {
            "p_user_id": str(person.user_id) if person.user_id else None,
            "p_surface": surface.value,
            "p_external_id": person.sender_id,
        }
        try:
            language = self._store.call("person_language", arguments)
        except StoreUnavailable as exc:
            log.warning("the remembered language could not be read", extra={"error": str(exc)})
            return None
        return str(language) if language else None
