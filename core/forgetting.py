"""Forgetting: a person erases what the memory holds of them, from whichever app they are in.

    Telegram:  /forget, then /forget confirm within 5 minutes
    WhatsApp:  forget, then forget confirm (any case)
    web:       DELETE /conversations/<id> (one conversation), DELETE /memory (everything)
    operator:  crossmem forget --user ID (everything, and the person's identities)

Everything is every conversation and message of the person, on every surface, and their link
codes; their linked identities stay linked, so their apps are still one person, who starts
from nothing. Each operation is one SQL function call (the forgetting migration). Neither the
request nor its confirmation is ever part of the thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from uuid import UUID

from core.errors import NotFound, StoreUnavailable
from core.identity.linking import UNAVAILABLE
from core.identity.policy import IdentityPolicy
from core.models import Surface
from core.stores.store import MemoryStore
from core.surfaces import rules

CONFIRM_MINUTES = 5


@dataclass(frozen=True)
class ForgetRequest:
    """`/forget` or `forget` asks (confirm False); `/forget confirm` or `forget confirm` deletes."""

    surface: Surface
    sender_id: str
    confirm: bool


@dataclass(frozen=True)
class Forgotten:
    """What an operation deleted (or, for a request, will delete)."""

    messages: int
    conversations: int
    link_codes: int = 0
    identities: int = 0

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Forgotten:
        return cls(
            messages=int(row["messages"]),
            conversations=int(row["conversations"]),
            link_codes=int(row.get("link_codes") or 0),
            identities=int(row.get("identities") or 0),
        )


WILL_DELETE = (
    "This deletes everything I remember of you: every message you sent me and every answer I gave, "
    "on Telegram, WhatsApp and the web ({messages} messages in {conversations} conversations). "
    "Your linked apps stay linked, and I start again from nothing. "
    f"To delete it all, send {{confirm}} within {CONFIRM_MINUTES} minutes; to keep it, do nothing."
)
FORGOTTEN = "Done: I have forgotten everything ({messages} messages). Your next message starts a new conversation."
NOTHING_STORED = "I have nothing stored from you, so there is nothing to forget."
NO_REQUEST = "There is nothing to confirm. Send {request} first: I will tell you what it deletes."
EXPIRED = (
    f"That confirmation came more than {CONFIRM_MINUTES} minutes after {{request}}, so nothing was deleted. "
    "Send {request} again if you still want to."
)


class Forgetting:
    def __init__(self, store: MemoryStore, identity: IdentityPolicy, *, stranger_reply: str = "") -> None:
        self._store = store
        self._identity = identity
        self._stranger_reply = stranger_reply

    # The other apps' side: a chat or number that sent /forget or /forget confirm.

    def answer(self, request: ForgetRequest) -> str:
        """What to tell the person who sent the command (it is never part of the thread)."""
        person = self._identity.resolve(request.surface, request.sender_id)
        if person is None:
            return self._stranger_reply
        command = rules(request.surface).command("forget")
        try:
            row = self._store.call(
                "forget_request",
                {
                    "p_surface": request.surface.value,
                    "p_confirm": request.confirm,
                    "p_user_id": str(person.user_id) if person.user_id else None,
                    "p_sender_id": person.sender_id,
                    "p_window_minutes": CONFIRM_MINUTES,
                },
            )
        except StoreUnavailable:
            return UNAVAILABLE
        counts = Forgotten.from_row(row)
        status = row["status"]
        if status == "requested" and counts.messages + counts.conversations > 0:
            return WILL_DELETE.format(
                messages=counts.messages, conversations=counts.conversations, confirm=f"{command} confirm"
            )
        if status == "forgotten":
            return FORGOTTEN.format(messages=counts.messages)
        if status == "expired":
            return EXPIRED.format(request=command)
        if status == "no_request":
            return NO_REQUEST.format(request=command)
        return NOTHING_STORED

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
