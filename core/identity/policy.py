"""Who is writing: maps a sender on a secondary surface to the person whose memory it is.

`owner`: the seed's single-user case made safe. One person, `OWNER_USER_ID`, reachable
only from allow-listed Telegram ids and WhatsApp numbers; anyone else is a stranger. A WhatsApp
sender known by a business-scoped user id (BSUID) is the owner only when that BSUID is listed:
a number that comes beside it (`WaId`) never makes it the owner's, since a number passes to
someone else, who writes with a BSUID of their own (SECURITY.md, Linking and owner mode).
`auto`: every new sender becomes a new person, resolved inside `begin_turn`; a chat or
number linked with a code (core/identity/linking.py) resolves to the web person who asked for it.
On the web the person is the token's subject; under `owner` only the owner is served.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal
from uuid import UUID

from core.errors import ConfigurationError, Forbidden
from core.models import Person, Surface
from core.surfaces import rules

log = logging.getLogger("crossmem.identity")


def identity_key(surface: Surface, sender_id: str) -> str:
    """A sender as `identities` keys it, by its surface's rules (a WhatsApp number as `+digits`)."""
    return rules(surface).key(sender_id)


@dataclass(frozen=True)
class IdentityPolicy:
    mode: Literal["owner", "auto"]
    owner_user_id: UUID | None = None
    # Per surface, its senders that are the owner, as `identity_key` keys them; a surface without
    # an entry has none (its senders are strangers, never checked against another surface's list).
    owners: Mapping[Surface, frozenset[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.mode == "owner" and self.owner_user_id is None:
            raise ConfigurationError("invalid configuration: IDENTITY_POLICY=owner needs OWNER_USER_ID")

    @classmethod
    def build(
        cls,
        mode: Literal["owner", "auto"],
        owner_user_id: UUID | None,
        owners: Mapping[Surface, Iterable[str]],
    ) -> IdentityPolicy:
        keyed = {surface: frozenset(identity_key(surface, value) for value in ids) for surface, ids in owners.items()}
        return cls(mode=mode, owner_user_id=owner_user_id, owners=keyed)

    def resolve(self, surface: Surface, sender_id: str, also_known_as: str | None = None) -> Person | None:
        """The person behind a sender, or None for a stranger the owner policy turns away.
        `also_known_as`: the same sender's other id (a WhatsApp number beside its BSUID): under
        `auto` kept as the same person; under `owner` it admits no one (only `sender_id` does)."""
        sender_id = identity_key(surface, sender_id)
        alias = identity_key(surface, also_known_as) if also_known_as else None
        if self.mode == "auto":
            return Person(sender_id=sender_id, sender_alias=alias)
        allowed = self.owners.get(surface, frozenset())
        if sender_id in allowed:
            return Person(user_id=self.owner_user_id)
        if alias is not None and alias in allowed:
            # The owner's number beside a BSUID that is not listed: perhaps the owner's new one,
            # perhaps whoever has their old number now. Only the operator can tell; no ids logged.
            log.warning(
                "a WhatsApp sender with a business-scoped id not in OWNER_WHATSAPP_NUMBERS came with a listed "
                "number: refused as a stranger (if it is the owner, list the BSUID: Twilio's message log shows it)"
            )
        return None

    def reaches(self, surface: Surface, sender: str, owned_by: UUID | None, user_id: UUID) -> bool:
        """Whether a chat or number still reaches `user_id`, as what the agent says on its own
        (a follow-up, an owed answer) needs: under `owner`, the owner's allow-list names it and
        `user_id` is the owner; under `auto`, its identity is theirs (`owned_by`: whose it is now,
        None when it is nobody's: unlinked, forgotten)."""
        if self.mode == "owner":
            person = self.resolve(surface, sender)
            return person is not None and person.user_id == user_id
        return owned_by == user_id

    def admit_web(self, user_id: UUID) -> UUID:
        """The web person of a verified token, if this deployment serves them."""
        if self.mode == "owner" and user_id != self.owner_user_id:
            raise Forbidden("this assistant serves one person (IDENTITY_POLICY=owner), and this account is not theirs")
        return user_id
