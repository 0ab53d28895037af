"""Plain typed objects that travel between the store, the memory service and the turn."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, ClassVar, Final, TypeVar
from uuid import UUID

from core.media.kinds import Attachment, message_kind
from core.surfaces import Delivery as Delivery
from core.surfaces import Sent as Sent
from core.surfaces import Surface as Surface
from core.surfaces import rules


class Role(StrEnum):
    USER = "user"
    ASSISTANT = "assistant"


_Member = TypeVar("_Member", bound=StrEnum)


class _Members(dict[str, _Member]):
    """An enum's members by value: a lookup where the enum's call costs more; a value it lacks is
    looked up by the enum itself, which raises as its call does."""

    def __init__(self, enum: type[_Member]) -> None:
        super().__init__((member.value, member) for member in enum)
        self.enum = enum

    def __missing__(self, value: str) -> _Member:
        return self.enum(value)


# A turn reads dozens of stored messages (core/memory/service.py's turn_start), whose conversation ids,
# surfaces and roles repeat: each parsed once (a lookup instead of UUID() and the enum's call).
_SURFACES = _Members(Surface)
_ROLES = _Members(Role)


@functools.lru_cache(maxsize=4096)
def parse_uuid(text: str) -> UUID:
    """UUID(text), remembered: a UUID is immutable, so one object serves every row naming it."""
    return UUID(text)


def parse_surface(value: str) -> Surface:
    return _SURFACES[value]  # an unknown value raises, as Surface() does


def parse_role(value: str) -> Role:
    return _ROLES[value]


# A stored message's columns, in the order context.sql's context_window gives them.
COLUMNS = ("id", "conversation_id", "surface", "role", "content", "created_at")


# Immutable, but not `frozen=True`: a turn builds dozens of these, and a frozen dataclass's
# __init__ (an object.__setattr__ a field) costs three times a slotted one's. Its fields are
# `Final` instead, which mypy enforces, and it hashes as a frozen one does (unsafe_hash).
@dataclass(slots=True, unsafe_hash=True)
class StoredMessage:
    id: Final[int]
    conversation_id: Final[UUID]
    surface: Final[Surface]
    role: Final[Role]
    content: Final[str]
    created_at: Final[datetime]
    # What a turn attached (its images and PDFs) is never stored. Without any, a stored message is
    # rendered into the model's context as it is (core/turn/context.py), not through a copy each turn.
    attachments: ClassVar[tuple[Attachment, ...]] = ()

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> StoredMessage:
        # The row's JSON already holds the id as a number and the rest as strings.
        return cls.from_columns([row[name] for name in COLUMNS])

    @classmethod
    def from_columns(cls, columns: Sequence[Any]) -> StoredMessage:
        """A message from its COLUMNS' values, in order."""
        id_, conversation_id, surface, role, content, created_at = columns
        return cls(
            id_,
            parse_uuid(conversation_id),
            parse_surface(surface),
            parse_role(role),
            content,
            datetime.fromisoformat(created_at),
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "conversation_id": str(self.conversation_id),
            "surface": self.surface.value,
            "role": self.role.value,
            "content": self.content,
            "kind": message_kind(self.content),  # text, image, pdf, voice or file (docs/api.md)
            "created_at": self.created_at.isoformat(),
        }


def stored_messages(window: Sequence[Sequence[Any]]) -> list[StoredMessage]:
    """The messages of a context window as the SQL context_window gives it (context.sql): its
    COLUMNS, each the array of the messages' values, oldest first; `[]` when it is empty. Column by
    column, with `map`: every turn reads dozens, and a Python call per message and value (as
    `from_columns` makes) was most of the cost."""
    if not window:
        return []
    ids, conversation_ids, surfaces, roles, contents, created_ats = window[:6]
    if not len(ids) == len(conversation_ids) == len(surfaces) == len(roles) == len(contents) == len(created_ats):
        raise ValueError("the window's columns differ in length")
    return list(
        map(
            StoredMessage,
            ids,
            map(parse_uuid, conversation_ids),
            map(_SURFACES.__getitem__, surfaces),
            map(_ROLES.__getitem__, roles),
            contents,
            map(datetime.fromisoformat, created_ats),
        )
    )


def answered_elsewhere(window: Sequence[Sequence[Any]]) -> frozenset[int]:
    """The ids of a window's messages whose own attempt is still answering them (a chat's burst's
    first, another tab's question), or answered them after the window's end, as context_window marks
    them: its seventh array, when there is one."""
    return frozenset(window[6]) if len(window) > 6 and window[6] else frozenset()


@dataclass(frozen=True)
class Conversation:
    id: UUID
    surface: Surface
    title: str
    created_at: datetime
    updated_at: datetime

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Conversation:
        return cls(
            id=UUID(str(row["id"])),
            surface=Surface(row["surface"]),
            title=str(row["title"]),
            created_at=datetime.fromisoformat(str(row["created_at"])),
            updated_at=datetime.fromisoformat(str(row["updated_at"])),
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "id": str(self.id),
            "surface": self.surface.value,
            "title": self.title or rules(self.surface).title(),
            "created_at": self.created_at.isoformat(),
            "updated_at": self.updated_at.isoformat(),
        }


@dataclass(frozen=True)
class Person:
    """Who a turn belongs to: a known user id, or a sender the database resolves."""

    user_id: UUID | None = None
    sender_id: str | None = None
    # The same sender's other id: a WhatsApp number that came beside a BSUID. The database keeps
    # both as one person's (begin_turn).
    sender_alias: str | None = None


@dataclass(frozen=True)
class PlatformMessage:
    """How the platform names a person's message, and the message it replies to: what lets an edit
    find the stored message again and a reply show the model what it answers (docs/decisions.md,
    Corrections and replies)."""

    ref: str  # Telegram "chat_id:message_id", Twilio's MessageSid
    reply_to: str | None = None  # the platform's name for the message replied to
    quoted: str | None = None  # the text it quotes, when the platform gives it (Telegram does)


@dataclass(frozen=True)
class StoredReply:
    id: int
    content: str
    delivered: bool
    declined: bool = False  # the answer to a turn the model declined (turn.sql's finish_turn)
    # Owed a send from this part (messages.sql's unsent_from); None: delivered, or given up.
    unsent_from: int | None = None


@dataclass(frozen=True)
class SaidFirst:
    """A held WhatsApp follow-up, said before an answer: from its part `from_part` (the ones before
    it went out when it was first tried, inside the 24-hour window, or by an earlier answer that
    pushed it: follow_ups.sql's unsent_from). `id`: its follow-up's."""

    id: int
    content: str
    from_part: int = 0
    due_at: datetime | None = None  # said late, it says when (core/follow_ups/lateness.py)
    timezone: str | None = None  # the one it was asked in


@dataclass(frozen=True)
class FollowUp:
    """Something the agent will say on its own at `due_at` (UTC), as the person asked."""

    id: int
    content: str
    due_at: datetime
    timezone: str
    surface: Surface
    status: str = "pending"

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> FollowUp:
        return cls(
            id=int(row["id"]),
            content=str(row["content"]),
            due_at=datetime.fromisoformat(str(row["due_at"])),
            timezone=str(row.get("timezone") or "UTC"),
            surface=Surface(row["surface"]),
            status=str(row.get("status") or "pending"),
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "content": self.content,
            "due_at": self.due_at.isoformat(),
            "timezone": self.timezone,
            "surface": self.surface.value,
            "status": self.status,
        }


@dataclass(frozen=True)
class PushApp:
    """An app of the person's a follow-up asked on the web would be pushed on (follow_ups.sql's
    follow_up_apps): the chat or number they last wrote from there, and whose it is now (None:
    nobody's, as the owner policy's are)."""

    surface: Surface
    sender: str
    owner: UUID | None
    last_at: datetime  # their last message there (WhatsApp's 24-hour window runs from it)

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> PushApp:
        owner = row.get("sender_user")
        return cls(
            Surface(row["surface"]),
            str(row["sender"]),
            UUID(owner) if owner else None,
            datetime.fromisoformat(str(row["last_at"])),
        )


@dataclass(frozen=True)
class TurnStart:
    """What `begin_turn` returns. `degraded` means the store failed: nothing was stored."""

    user_id: UUID | None
    conversation_id: UUID | None
    message_id: int | None
    duplicate: bool
    reply: StoredReply | None
    history: list[StoredMessage] = field(default_factory=list)
    # Of `history` and `prepend`, the messages another attempt is answering now, or answered after
    # this turn's message (answered_elsewhere): read, not answered.
    answered_elsewhere: frozenset[int] = frozenset()
    prepend: list[StoredMessage] = field(default_factory=list)
    degraded: bool = False
    notes: str = ""  # the person's memory notes (core/memory/digest.py), empty before the first digest
    # A delivery stored before and never answered, whose attempt can no longer answer: this
    # turn answers it (the same delivery again, or the scheduled job).
    owed: bool = False
    attempt: UUID | None = None  # this attempt's id: what ends it must name it
    # A duplicate not answered yet whose attempt may still answer until then.
    answer_by: datetime | None = None
    # A duplicate declined with a later turn of the person's (turn.sql's mark_declined), which answered it.
    declined: bool = False
    follow_ups: list[FollowUp] = field(default_factory=list)  # the person's pending ones
    timezone: str | None = None  # the person's own, when known (else CONTEXT_TIMEZONE)
    timezone_stated: bool = False  # they said it (set_timezone): a web browser's zone does not replace it
    # Follow-ups held outside WhatsApp's 24-hour window, to say before this turn's reply.
    delivered_first: list[SaidFirst] = field(default_factory=list)
    # On the web, or while a web-asked follow-up is pending: the person's apps one asked there would be
    # pushed on, the last written from first.
    push_apps: list[PushApp] = field(default_factory=list)
    # What this message quotes, when it is a reply (its stored content begins with it).
    quoted: str | None = None
    # The tokens this attempt reserved of the person's day (TOKENS_PER_DAY), which its end settles.
    reserved_tokens: int = 0
    # The reply's id before its text exists: the stored reply's, or the one begin_turn reserved for
    # the reply this attempt stores (finish_turn), unused when it stores none. None when degraded.
    reply_id: int | None = None
    # The person's language: as begin_turn returns it, the one remembered (person_languages); once
    # the turn has chosen (core/turn/turns.py), the one its fixed phrases are said in.
    language: str | None = None
    # The language the turn heard in a voice note when the request stated none: kept as the
    # person's by the round trip that ends the turn (docs/decisions.md, "The person's language").
    heard_language: str | None = None
    # Its chat or number has opted out (an SMS number's STOP): the message is stored, and nobody
    # answers it (turn.sql's opted_out_message).
    opted_out: bool = False

    def quoting(self, content: str) -> str:
        """`content` as begin_turn stores this message (turn.sql's quoting): after the text it
        quotes, when it is a reply, so the model reads what the person answered."""
        return content if self.quoted is None else f'[replying to: "{self.quoted}"] {content}'

    def thread(self) -> list[StoredMessage]:
        """Of `history`, the turn's own conversation's: a chat's window spans the person's
        conversations, and a web page of that chat's thread shows that thread alone."""
        return [message for message in self.history if message.conversation_id == self.conversation_id]


@dataclass(frozen=True)
class ConversationPage:
    """A page of a conversation, oldest first; `has_more`: older messages are left."""

    conversation: Conversation
    messages: list[StoredMessage]
    has_more: bool
    declined: frozenset[int] = frozenset()  # the ids of the messages of turns the model declined
    # The person's web messages' client keys, by id: what sends one again (a `useChat` retry).
    client_ids: dict[int, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ConversationList:
    """A page of a person's conversations, the latest active first; `has_more`: others are left."""

    conversations: list[Conversation]
    has_more: bool


@dataclass(frozen=True)
class ConversationPlace:
    """Where a conversation stood in its person's list when it was listed: the next page's start."""

    updated_at: datetime
    id: UUID


@dataclass(frozen=True)
class Neighbour:
    """The message just before or after a search hit in its conversation: what it answered, or
    what answered it."""

    id: int
    role: Role
    content: str
    created_at: datetime

    @classmethod
    def from_row(cls, row: dict[str, Any] | None) -> Neighbour | None:
        if row is None:
            return None
        return cls(int(row["id"]), parse_role(row["role"]), row["content"], datetime.fromisoformat(row["created_at"]))

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "role": self.role.value,
            "content": self.content,
            "created_at": self.created_at.isoformat(),
        }


@dataclass(frozen=True)
class MemoryHit:
    """One message memory search found, with its place among the ranker's results (`ranker`,
    `rank`, `score`: a second ranker's hits are fused by rank, docs/decisions.md)."""

    message: StoredMessage
    ranker: str
    rank: int
    score: float
    before: Neighbour | None
    after: Neighbour | None
    words: tuple[str, ...] = ()  # its own words the query matched, as search reads them, rarest first

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> MemoryHit:
        return cls(
            StoredMessage.from_row(row),
            str(row["ranker"]),
            int(row["rank"]),
            float(row["score"]),
            Neighbour.from_row(row.get("before")),
            Neighbour.from_row(row.get("after")),
            tuple(row.get("words") or ()),
        )

    def as_json(self) -> dict[str, Any]:
        return {
            **self.message.as_json(),
            "ranker": self.ranker,
            "rank": self.rank,
            "score": self.score,
            "before": self.before.as_json() if self.before else None,
            "after": self.after.as_json() if self.after else None,
        }
