"""A person's corrections: an edited message replaces what memory keeps of it.

The rule (docs/decisions.md, Corrections and replies): the person's own stored message takes the
new text, marked ` (edited)` for the model, once (a redelivered or an older edit changes nothing),
and nothing is answered: the model reads the corrected text from the next turn on, as a person
who fixed a typo expects. An edit that finds nothing to correct (a message never stored, a
stranger under the owner policy) or that the database cannot take is logged and dropped: the
webhook still answers 200, so Telegram does not hold the person's next messages back for it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING

from core.errors import InputError, StoreUnavailable
from core.identity.policy import IdentityPolicy
from core.models import PlatformMessage, Surface

if TYPE_CHECKING:  # a channel adapter builds a MessageEdit without the memory service
    from core.memory.service import Memory

log = logging.getLogger("crossmem.edits")


@dataclass(frozen=True)
class MessageEdit:
    """The person's new text for a message of theirs, as the platform names it and dates the edit."""

    surface: Surface
    sender_id: str
    text: str
    platform: PlatformMessage
    edited_at: datetime


class EditOutcome(StrEnum):
    EDITED = "edited"
    UNCHANGED = "unchanged"  # the message has this edit, or a later one: a redelivery
    NOT_FOUND = "not_found"  # no stored message of this person by that name
    REFUSED = "refused"  # a sender the owner policy turns away
    UNUSABLE = "unusable"  # the new text cannot be stored (empty, too long): the old one stays
    FAILED = "failed"  # the database failed


class Corrections:
    def __init__(self, memory: Memory, identity: IdentityPolicy) -> None:
        self._memory = memory
        self._identity = identity

    def apply(self, edit: MessageEdit) -> EditOutcome:
        """The edit, applied once to the person's own message; one round trip."""
        person = self._identity.resolve(edit.surface, edit.sender_id)
        if person is None:
            return EditOutcome.REFUSED
        try:
            result = self._memory.edit_message(person, edit.surface, edit.platform, edit.text, edit.edited_at)
        except InputError as exc:  # the person's input, not our failure: no error line for it
            log.info("an edit that cannot be stored was dropped", extra={"error": str(exc)})
            return EditOutcome.UNUSABLE
        except StoreUnavailable as exc:
            log.error("an edit was not stored", extra={"surface": edit.surface.value, "error": str(exc)})
            return EditOutcome.FAILED
        outcome = (
            EditOutcome.EDITED if result.edited else EditOutcome.UNCHANGED if result.found else EditOutcome.NOT_FOUND
        )
        log.info("edit", extra={"surface": edit.surface.value, "outcome": outcome.value})
        return outcome
