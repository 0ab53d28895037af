"""Forgetting: a person erases what the memory holds of them, from whichever app they are in.

    Telegram:  /forget, then /forget confirm within 5 minutes
    WhatsApp:  forget, then forget confirm (any case)
    SMS:       forget, then forget confirm CODE, the six digits the answer to `forget` sent: a
               caller ID can be forged, and only the number's holder reads that answer
    web:       DELETE /conversations/<id> (one conversation), DELETE /memory (everything)
    operator:  crossmem forget --user ID (everything, and the person's identities)

Everything is every conversation and message of the person, on every surface, and their link
codes; their linked identities stay linked, so their apps are still one person, who starts
from nothing. Each operation is one SQL function call (the forgetting migration). Neither the
request nor its confirmation is ever part of the thread.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from core.errors import NotFound, StoreUnavailable
from core.identity.linking import retry_said
from core.identity.policy import IdentityPolicy, identity_key
from core.models import Surface
from core.phrases.catalogue import Catalogue
from core.stores.store import MemoryStore
from core.surfaces import rules

CONFIRM_MINUTES = 5
CODE_DIGITS = 6  # a forger has one guess a request, and each request reaches the number's holder


@dataclass(frozen=True)
class ForgetRequest:
    """`/forget` or `forget` asks (confirm False); `/forget confirm` or `forget confirm` deletes,
    with the code the request was answered with where the surface does not vouch for its sender
    (`forget confirm 123456` on SMS)."""

    surface: Surface
    sender_id: str
    confirm: bool
    code: str | None = None
    also_known_as: str | None = None  # the same sender's other id (a WhatsApp number beside its BSUID)


@dataclass(frozen=True)
class Forgotten:
    """What an operation deleted (or, for a request, will delete)."""

    messages: int
    conversations: int
    link_codes: int = 0
    identities: int = 0
    follow_ups: int = 0  # a request's: the pending ones it cancels with their conversations

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Forgotten:
        return cls(
            messages=int(row["messages"]),
            conversations=int(row["conversations"]),
            link_codes=int(row.get("link_codes") or 0),
            identities=int(row.get("identities") or 0),
            follow_ups=int(row.get("follow_ups") or 0),
        )


class Forgetting:
    def __init__(
        self,
        store: MemoryStore,
        identity: IdentityPolicy,
        *,
        stranger_reply: str = "",
        catalogue: Catalogue | None = None,
        attempts_per_hour: int = 5,
    ) -> None:
        self._store = store
        self._identity = identity
        self._attempts_per_hour = attempts_per_hour  # wrong forget codes an SMS number may send an hour
        self._stranger_reply = stranger_reply
        self._catalogue = catalogue or Catalogue()

    # The other apps' side: a chat or number that sent /forget or /forget confirm.

    def answer(self, request: ForgetRequest, stated: str | None = None, text: str = "") -> str:
        """What to tell the person who sent the command (it is never part of the thread), in their
        language: `stated` by the request, else as remembered (forget_request answers it, read
        before forgetting deletes it), else the words of `text`, else DEFAULT_LANGUAGE."""
        phrases = self._catalogue.phrases(self._catalogue.choose(stated, text))
        person = self._identity.resolve(request.surface, request.sender_id)
        if person is None:
            return self._stranger_reply or phrases.say("turn.stranger")
        surface = rules(request.surface)
        command = surface.command("forget")
        code = request.code
        if not request.confirm:  # where the sender may be forged, a code only the number's holder reads
            code = None if surface.sender_vouched_for else f"{secrets.randbelow(10**CODE_DIGITS):0{CODE_DIGITS}d}"
        try:
            row = self._store.call(
                "forget_request",
                {
                    "p_surface": request.surface.value,
                    "p_confirm": request.confirm,
                    "p_user_id": str(person.user_id) if person.user_id else None,
                    # the sender's own key, the owner's too: a code is its, and its wrong codes are counted
                    "p_sender_id": identity_key(request.surface, request.sender_id),
                    "p_window_minutes": CONFIRM_MINUTES,
                    "p_code": code,
                    "p_max_attempts": self._attempts_per_hour,
                    "p_sender_alias": identity_key(request.surface, request.also_known_as)
                    if request.also_known_as
                    else None,
                },
            )
        except StoreUnavailable:
            return phrases.say("link.unavailable")
        phrases = self._catalogue.phrases(self._catalogue.choose(stated, text, remembered=row.get("language")))
        counts = Forgotten.from_row(row)
        status = row["status"]
        if status == "requested" and counts.messages + counts.conversations > 0:
            pending = phrases.count("count.follow_ups", counts.follow_ups)
            cancelled = phrases.say("forget.follow_ups_cancelled", follow_ups=pending) if counts.follow_ups else ""
            return phrases.say(
                "forget.will_delete",
                messages=phrases.count("count.messages", counts.messages),
                conversations=phrases.count("count.conversations", counts.conversations),
                confirm=f"{command} confirm {code}" if code else f"{command} confirm",
                minutes=CONFIRM_MINUTES,
                follow_ups_cancelled=" " + cancelled if cancelled else "",
            )
        if status == "forgotten":
            return phrases.say("forget.forgotten", messages=phrases.count("count.messages", counts.messages))
        if status == "expired":
            return phrases.say("forget.expired", request=command, minutes=CONFIRM_MINUTES)
        if status == "wrong_code":
            return phrases.say("forget.wrong_code", request=command)
        if status == "too_many_attempts":
            retry = retry_said(phrases, datetime.fromisoformat(row["retry_at"]))
            return phrases.say("link.too_many_attempts", retry=retry)
        if status == "no_request":
            return phrases.say("forget.no_request", request=command)
        return phrases.say("forget.nothing_stored")

    # The web's side: a signed-in person.

    def forget_everything(self, user_id: UUID) -> Forgotten:
        row = self._store.call("forget_person", {"p_user_id": str(user_id), "p_erase_identities": False})
        return Forgotten.from_row(row)

    def delete_conversation(self, user_id: UUID, conversation_id: UUID) -> Forgotten:
        """One of the person's conversations and its messages; NotFound for anyone else's."""
        row = self._store.call(
            "forget_conversations", {"p_user_id": str(user_id), "p_conversation_id": str(conversation_id)}
        )
        forgotten = Forgotten.from_row(row)
        if forgotten.conversations == 0:
            raise NotFound("no such conversation")
        return forgotten

    # The operator's side.

    def erase_person(self, user_id: UUID) -> Forgotten:
        """Everything, and the person's identities: an erasure request."""
        row = self._store.call("forget_person", {"p_user_id": str(user_id), "p_erase_identities": True})
        return Forgotten.from_row(row)
