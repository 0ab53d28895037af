"""The memory service: a person's thread, stored as it happens, read back as context.

Every method is one call to a SQL function, so one round trip. Failures of the store
never reach the caller of `begin_turn` or `finish_turn`: the first degrades to an empty
context, the second to a logged loss of the reply.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from uuid import UUID, uuid4

from core.errors import (
    EmptyMessage,
    KeyOfAnotherConversation,
    MessageTooLong,
    NotFound,
    OverBudget,
    StoreUnavailable,
    TooManyEmptyConversations,
)
from core.models import (
    Conversation,
    ConversationList,
    ConversationPage,
    ConversationPlace,
    Delivery,
    FollowUp,
    MemoryHit,
    Person,
    PlatformMessage,
    PushApp,
    SaidFirst,
    Sent,
    StoredMessage,
    StoredReply,
    Surface,
    TurnStart,
    answered_elsewhere,
    parse_uuid,
    stored_messages,
)
from core.phrases.language import language_tag
from core.stores.store import JsonScalar, MemoryStore
from core.surfaces import rules

log = logging.getLogger("crossmem.memory")
# The longest question a search takes (the web's GET /search refuses a longer one; the model's is cut).
# A reply already sent whose storing failed (the database away for a moment) is tried again,
# after 0.25 s, then 0.5, 1 and 2, until its attempt's time allows no more: a reply not stored
# leaves its message owed, and the scheduled job would answer it a second time.
FINISH_RETRY_WAITS_S = (0.25, 0.5, 1.0, 2.0)
STORE_TRY_S = 2.0  # what a try may take (the pool's wait for a connection), before that time is up
SEARCH_QUERY_CHARS = 1000


@dataclass(frozen=True)
class ContextLimits:
    """The context rules (CONTEXT_WINDOW_HOURS, ...), passed in by functions/runtime.py: their
    defaults live with the settings."""

    window_hours: int
    max_messages: int
    window_step: int
    web_prepend: int
    max_message_chars: int
    max_history_chars: int


@dataclass(frozen=True)
class TurnBudget:
    """A person's turns and model tokens, across all their apps; 0 turns a limit off. The zeros
    are not TURNS_PER_MINUTE's and the others' defaults: a Memory built without a budget (the CLI,
    a test) has none; the functions always pass all three settings. `reply_tokens`: the most one
    model request writes (ANTHROPIC_MAX_TOKENS), what a turn reserves for each answer."""

    turns_per_minute: int = 0
    turns_per_day: int = 0
    tokens_per_day: int = 0
    reply_tokens: int = field(kw_only=True)


@dataclass(frozen=True)
class TurnEstimate:
    """What a turn knows it will read before it starts, for the tokens it reserves (begin_turn adds
    the window and the notes, which only the database knows): `input_tokens` each model request
    reads besides those, and the most `requests` it may make (tool rounds, a media description)."""

    input_tokens: int
    requests: int = 1


@dataclass(frozen=True)
class OwedMessage:
    """A stored message nobody answered, taken over by the scheduled job: where it came from
    (the chat or number to answer) and its start, as begin_turn would have returned it."""

    surface: Surface
    sender: str
    start: TurnStart
    tries: int  # the job's tries at it, this one included
    sender_user: UUID | None = None  # whose the chat or number is now: None, nobody's (unlinked, forgotten)
    opted_out: bool = False  # the chat or number asked for no more messages (SMS's STOP): not answered


@dataclass(frozen=True)
class EditResult:
    """What an edit found: the person's message it names (`found`), and whether its text changed
    (not for a redelivered or an older edit)."""

    found: bool
    edited: bool
    message_id: int | None = None


def turn_start(row: dict[str, Any]) -> TurnStart:
    reply = row.get("reply")
    return TurnStart(
        user_id=parse_uuid(row["user_id"]),
        conversation_id=parse_uuid(row["conversation_id"]),
        message_id=int(row["message_id"]),
        duplicate=bool(row["duplicate"]),
        reply=StoredReply(
            int(reply["id"]),
            str(reply["content"]),
            bool(reply["delivered"]),
            bool(reply.get("declined")),
            None if reply.get("unsent_from") is None else int(reply["unsent_from"]),
        )
        if reply
        else None,
        history=stored_messages(row["history"]),
        answered_elsewhere=answered_elsewhere(row["history"]) | answered_elsewhere(row["prepend"]),
        prepend=stored_messages(row["prepend"]),
        notes=str(row.get("notes") or ""),
        owed=bool(row.get("owed")),
        attempt=UUID(row["attempt"]) if row.get("attempt") else None,
        answer_by=datetime.fromisoformat(row["answer_by"]) if row.get("answer_by") else None,
        declined=bool(row.get("declined")),
        follow_ups=[FollowUp.from_row(item) for item in row.get("follow_ups") or []],
        timezone=row.get("timezone") or None,
        timezone_stated=bool(row.get("timezone_stated")),
        delivered_first=[
            SaidFirst(
                int(item["id"]),
                str(item["content"]),
                int(item.get("unsent_from") or 0),
                datetime.fromisoformat(item["due_at"]) if item.get("due_at") else None,
                item.get("timezone"),
            )
            for item in row.get("delivered_first") or []
        ],
        push_apps=[PushApp.from_row(item) for item in row.get("follow_up_apps") or []],
        quoted=row.get("quoted"),
        reserved_tokens=int(row.get("reserved") or 0),
        reply_id=int(reply["id"]) if reply else int(row["reply_id"]) if row.get("reply_id") is not None else None,
        language=row.get("language") or None,
        opted_out=bool(row.get("opted_out")),
    )


def platform_arguments(platform: PlatformMessage | None) -> dict[str, Any]:
    """begin_turn's and edit_message's arguments naming a message and what it replies to."""
    if platform is None:
        return {"p_platform_ref": None, "p_reply_ref": None, "p_quoted": None}
    return {
        "p_platform_ref": storable(platform.ref),
        "p_reply_ref": storable(platform.reply_to) if platform.reply_to is not None else None,
        "p_quoted": storable(platform.quoted) if platform.quoted is not None else None,
    }


def retried_call(store: MemoryStore, function: str, arguments: Mapping[str, JsonScalar], retry_for_s: float) -> Any:
    """A write after a send (a reply stored, its delivery or a follow-up's outcome recorded), tried
    again after each of FINISH_RETRY_WAITS_S while a try can still end within `retry_for_s`, so a
    database away for a moment costs nothing: only for a failure that may pass (not `final`), and
    only for a function whose call repeated after it committed changes nothing. The last
    StoreUnavailable when no try is left."""
    waits, retry_until = iter(FINISH_RETRY_WAITS_S), time.monotonic() + retry_for_s
    while True:
        try:
            return store.call(function, arguments)
        except StoreUnavailable as exc:
            wait = next(waits, None)
            if exc.final or wait is None or time.monotonic() + wait + STORE_TRY_S > retry_until:
                raise
            log.warning("%s failed; trying again", function, extra={"error": str(exc), "wait_s": wait})
            time.sleep(wait)


def storable(text: str) -> str:
    """The text without NUL characters, which Postgres text cannot hold."""
    return text.replace("\x00", "")


def clean_text(text: str, limit: int) -> str:
    """A person's message as it will be stored: storable, not empty, within the limit."""
    cleaned = storable(text)
    if not cleaned.strip():
        raise EmptyMessage()
    if len(cleaned) > limit:
        raise MessageTooLong(len(cleaned), limit)
    return cleaned


class Memory:
    def __init__(self, store: MemoryStore, limits: ContextLimits, budget: TurnBudget | None = None) -> None:
        self.store = store
        self.limits = limits
        self.budget = budget or TurnBudget(reply_tokens=0)  # no token limit: nothing reserved

    def begin_turn(
        self,
        person: Person,
        surface: Surface,
        text: str,
        external_id: str | None,
        conversation_id: UUID | None = None,
        *,
        sender: str | None = None,
        answer_within_s: float = 60.0,
        platform: PlatformMessage | None = None,
        estimate: TurnEstimate | None = None,
        language: str | None = None,
    ) -> TurnStart:
        """Store the person's message once and return the context to answer it with.

        `sender` is the chat or number to answer later if this turn cannot (kept with the
        message); `answer_within_s` how long its attempt may still answer (the surface's model
        deadline plus a margin): after it, the message is owed. `platform`: the platform's name
        for the message (what an edit finds it by) and the message it replies to, whose quote
        the stored message begins with (the stored one's words when the platform gives none).
        `estimate`: what the turn will read, for the tokens it reserves of the person's day
        (none without it); the start says how many (`reserved_tokens`), for its end to settle.
        `language`: what the request states (a BCP 47 tag, None: nothing), kept as the person's;
        the start's `language` is the person's as remembered, this one included.

        Raises InputError for a message we cannot store, NotFound for someone else's
        conversation and OverBudget for a person past their budget (nothing stored; a number that
        opted out is answered by nobody all the same: its start says so, with no message); a store
        failure gives a degraded, empty start instead.
        """
        content = clean_text(text, self.limits.max_message_chars)
        arguments: dict[str, Any] = {
            "p_surface": surface.value,
            "p_content": content,
            "p_external_id": storable(external_id) if external_id is not None else None,
            "p_user_id": str(person.user_id) if person.user_id else None,
            "p_sender_id": person.sender_id,
            "p_conversation_id": str(conversation_id) if conversation_id else None,
            "p_window_hours": self.limits.window_hours,
            "p_max_messages": self.limits.max_messages,
            "p_window_step": self.limits.window_step,
            "p_web_prepend": self.limits.web_prepend,
            # Sent again unchanged if the store retries the call: the database then knows
            # the message it finds is this turn's own, not a redelivery.
            "p_attempt": str(uuid4()),
            "p_turns_per_minute": self.budget.turns_per_minute,
            "p_turns_per_day": self.budget.turns_per_day,
            "p_tokens_per_day": self.budget.tokens_per_day,
            "p_answer_within_seconds": math.ceil(answer_within_s),
            "p_sender": sender,
            "p_sender_alias": person.sender_alias,
            "p_opts_out": rules(surface).opts_out,
            **platform_arguments(platform),
            "p_input_tokens": estimate.input_tokens if estimate is not None else 0,
            "p_output_tokens": self.budget.reply_tokens,
            "p_requests": estimate.requests if estimate is not None else 0,
            "p_language": language_tag(language),
        }
        try:
            row = self.store.call("begin_turn", arguments)
        except StoreUnavailable as exc:
            log.error("begin_turn failed; answering without history", extra={"error": str(exc)})
            return TurnStart(
                user_id=person.user_id,
                conversation_id=conversation_id,
                message_id=None,
                duplicate=False,
                reply=None,
                degraded=True,
            )
        if row.get("error") == "conversation_not_found":
            raise NotFound("no such conversation")
        if row.get("error") == "key_of_another_conversation":
            raise KeyOfAnotherConversation()
        if row.get("limited_until"):
            until = datetime.fromisoformat(row["limited_until"])
            log.info("over budget; no turn", extra={"user_id": row["user_id"], "until": until.isoformat()})
            if row.get("opted_out"):
                # Nothing stored, and no pause to say: any answer to it would be refused.
                return TurnStart(parse_uuid(row["user_id"]), None, None, duplicate=False, reply=None, opted_out=True)
            raise OverBudget(until, datetime.now(UTC), language=row.get("language"), timezone=row.get("timezone"))
        if row.get("forgotten"):
            # A redelivery of a message the person has since forgotten: nothing stored, nothing owed.
            return TurnStart(None, None, None, duplicate=True, reply=None)
        return turn_start(row)

    def finish_turn(
        self,
        user_id: UUID,
        user_message_id: int,
        reply: str,
        *,
        delivered: bool = True,
        unsent_from: int | None = None,
        attempt: UUID | None = None,
        tokens: int = 0,
        user_content: str | None = None,
        follow_ups: dict[str, Any] | None = None,
        max_follow_ups: int = 0,
        reserved: int = 0,
        reply_id: int | None = None,
        language: str | None = None,
        retry_for_s: float = 0.0,
        declined: Sequence[int] | None = None,
        merged: Sequence[int] = (),
        said_later: Sequence[SaidFirst] = (),
    ) -> int | None:
        """Store the reply to a stored user message, and the model tokens it took (the person's
        budget counts them, in place of the `reserved` its begin_turn reserved); the reply's id
        (`reply_id`, the one its begin_turn reserved, else the next), or None if it could not be
        stored: tried again (FINISH_RETRY_WAITS_S) while a try can end within `retry_for_s` (a
        retried call stores and counts nothing twice). `delivered`: whether it reached the person;
        if not, `unsent_from` (when it is owed a send) is the part a later send starts from, and
        the message is freed for it while `attempt` (the one that wrote it) still holds it. `user_content`:
        the user message rewritten as the turn learned it (a voice note's transcript, what a
        photo shows); `follow_ups`: what the model's tools decided (core/follow_ups/capability.py); `language`:
        the language the turn heard, kept as the person's; `declined`: the model declined the turn
        and the reply says so, with the ids of the other stored messages its last turn merged (they
        and the message and the reply are left out of every later context); `merged`: the ids of the
        other stored messages the answer's last turn merged, answered with it when nothing else
        answers them (no longer owed); `said_later`: the held
        follow-ups the message took to say first that its answer had no room for (a TwiML answer),
        left to the follow-up job once the reply is stored; all in the same round trip, so that a
        database failing after it leaves them with the message, never said by nothing."""
        arguments: dict[str, Any] = {
            "p_user_id": str(user_id),
            "p_user_message_id": user_message_id,
            "p_content": storable(reply) or " ",
            "p_delivered": delivered,
            "p_unsent_from": unsent_from,
            "p_attempt": None if attempt is None else str(attempt),
            "p_tokens": tokens,
            "p_user_content": self._learned(user_content) if user_content is not None else None,
            "p_reserved": reserved,
            "p_reply_id": reply_id,
            "p_language": language_tag(language),
            "p_declined": None if declined is None else json.dumps(list(declined)),
            "p_merged": json.dumps(list(merged)) if merged else None,
        }
        function = "finish_turn"
        written = {**(follow_ups or {}), **({"later": [said.id for said in said_later]} if said_later else {})}
        if written:
            function = "finish_turn_follow_ups"
            arguments.update(p_follow_ups=json.dumps(written), p_max_pending=max_follow_ups)
        try:
            row = retried_call(self.store, function, arguments, retry_for_s)
        except StoreUnavailable as exc:
            # What the agent may have promised and nothing will do: counted, never its words.
            changes = (follow_ups or {}).items()
            lost = {change: len(items) for change, items in changes if isinstance(items, list)}
            log.error(
                "finish_turn failed; the reply went out but is not stored",
                extra={"error": str(exc), "follow_ups_not_recorded": lost} if lost else {"error": str(exc)},
            )
            return None
        if row and row.get("refused"):
            log.warning("follow-ups refused by their limits", extra={"refused": row["refused"]})
        return int(row["reply_id"]) if row and row.get("reply_id") is not None else None

    def end_attempt(
        self,
        user_id: UUID,
        user_message_id: int,
        attempt: UUID | None,
        tokens: int,
        *,
        user_content: str | None = None,
        reserved: int = 0,
        language: str | None = None,
        said_first: bool = False,
        first_parts: Sequence[SaidFirst] = (),
        said_later: Sequence[SaidFirst] = (),
    ) -> None:
        """A turn that stored no reply (a fallback, an abandoned stream): count the model's
        tokens (in place of the `reserved` its begin_turn reserved), and make its message owed at
        once unless another attempt has taken it over. `user_content` and `language` as in
        finish_turn: a transcript, and the language heard in it, are kept even when the model
        failed. `said_first`: the held follow-ups the attempt took reached the person (with its
        fallback, or pushed before it), and the next answer does not say them again. `first_parts`:
        the held follow-ups pushed when one of them did not go, each from the part not out yet (its
        count of parts when all went), where the next answer starts them. `said_later`, with
        `said_first`: the ones its answer had no room for, left to the follow-up job in the same
        round trip (as finish_turn's)."""
        arguments: dict[str, Any] = {
            "p_user_id": str(user_id),
            "p_user_message_id": user_message_id,
            "p_attempt": str(attempt) if attempt else None,
            "p_tokens": tokens,
            "p_user_content": self._learned(user_content) if user_content is not None else None,
            "p_reserved": reserved,
            "p_language": language_tag(language),
            "p_said_first": said_first,
            "p_first_parts": json.dumps([{"id": said.id, "unsent_from": said.from_part} for said in first_parts])
            if first_parts
            else None,
            "p_said_later": json.dumps([said.id for said in said_later]) if said_later else None,
        }
        try:
            self.store.call("end_attempt", arguments)
        except StoreUnavailable as exc:
            log.error("end_attempt failed; its tokens are not counted", extra={"error": str(exc), "tokens": tokens})

    def _learned(self, content: str) -> str:
        """A message rewritten by its turn, within the message limit (a long transcript is cut)."""
        cleaned = storable(content).strip() or " "
        limit = self.limits.max_message_chars
        return cleaned if len(cleaned) <= limit else cleaned[: limit - 1] + "…"

    def claim_owed_replies(
        self,
        surfaces: Sequence[Surface],
        max_age_s: int,
        answer_within_s: float,
        limit: int,
        skip_users: Sequence[UUID] = (),
        estimate: TurnEstimate | None = None,
    ) -> list[OwedMessage]:
        """Owed messages of `surfaces` younger than `max_age_s`, each taken over for one attempt
        (until `answer_within_s` from now) with the context to answer it from: the least tried
        first, none of `skip_users`' and none of a person past the budget. `estimate`: what an
        answer reads besides the window and the notes, for the tokens each claim reserves of the
        person's day, as begin_turn's (none without it; its start's `reserved_tokens`). Raises
        StoreUnavailable."""
        rows = self.store.call(
            "claim_owed_replies",
            {
                "p_surfaces": ",".join(surface.value for surface in surfaces),
                "p_max_age_seconds": max_age_s,
                "p_answer_within_seconds": math.ceil(answer_within_s),
                "p_limit": limit,
                "p_skip_users": ",".join(str(user) for user in skip_users),
                "p_turns_per_minute": self.budget.turns_per_minute,
                "p_turns_per_day": self.budget.turns_per_day,
                "p_tokens_per_day": self.budget.tokens_per_day,
                "p_window_hours": self.limits.window_hours,
                "p_max_messages": self.limits.max_messages,
                "p_window_step": self.limits.window_step,
                "p_input_tokens": estimate.input_tokens if estimate is not None else 0,
                "p_output_tokens": self.budget.reply_tokens,
                "p_requests": estimate.requests if estimate is not None else 0,
            },
        )
        return [
            OwedMessage(
                Surface(row["surface"]),
                str(row["sender"]),
                turn_start(row),
                int(row["tries"]),
                UUID(row["sender_user"]) if row.get("sender_user") else None,
                bool(row.get("opted_out")),
            )
            for row in rows
        ]

    def give_up_owed(self, user_id: UUID, message_id: int, attempt: UUID | None) -> bool:
        """An owed message the job will not answer (its number opted out), claimed under `attempt`:
        no longer owed, its reply owed a send given up, nothing stored (owed_replies.sql's
        give_up_owed). Whether the claim still held it. Raises StoreUnavailable."""
        arguments: dict[str, JsonScalar] = {
            "p_user_id": str(user_id),
            "p_message_id": message_id,
            "p_attempt": None if attempt is None else str(attempt),
        }
        return bool(self.store.call("give_up_owed", arguments)["given_up"])

    def record_delivery(
        self, user_id: UUID, reply_id: int, attempt: UUID | None, sent: Sent, retry_for_s: float = 0.0
    ) -> None:
        """What a send of a reply stored undelivered came to: delivered, owed from a later part, or
        given up (turn.sql's record_delivery), by the one holding its message (`attempt`: the
        token its begin_turn or the job's claim answered). Tried again (FINISH_RETRY_WAITS_S) while
        a try can end within `retry_for_s`, as finish_turn is: the send went out, and one not
        recorded stays owed from where it was, and is sent from there again."""
        arguments: dict[str, JsonScalar] = {
            "p_user_id": str(user_id),
            "p_reply_id": reply_id,
            "p_attempt": None if attempt is None else str(attempt),
            "p_delivered": sent.delivery is Delivery.DELIVERED,
            "p_unsent_from": sent.unsent_from,
        }
        try:
            retried_call(self.store, "record_delivery", arguments, retry_for_s)
        except StoreUnavailable as exc:
            log.error("record_delivery failed", extra={"error": str(exc)})

    def edit_message(
        self, person: Person, surface: Surface, platform: PlatformMessage, text: str, edited_at: datetime
    ) -> EditResult:
        """Replace the text of the person's own stored message that `platform.ref` names, as the
        person corrected it at `edited_at` (the platform's time of the edit): once, and never with
        an older edit. One round trip; raises InputError for a text we cannot store and
        StoreUnavailable."""
        arguments: dict[str, Any] = {
            "p_user_id": str(person.user_id) if person.user_id else None,
            "p_sender_id": person.sender_id,
            "p_surface": surface.value,
            **platform_arguments(platform),
            "p_content": clean_text(text, self.limits.max_message_chars),
            "p_edited_at": edited_at.isoformat(),
        }
        row = self.store.call("edit_message", arguments)
        message_id = row.get("message_id")
        return EditResult(bool(row["found"]), bool(row["edited"]), int(message_id) if message_id else None)

    # What the web needs besides turns. These raise StoreUnavailable: a page can say so.

    def create_conversation(self, user_id: UUID, title: str = "", max_empty: int = 0) -> Conversation:
        """A new, empty web conversation; raises TooManyEmptyConversations when the person already
        holds `max_empty` never written in (EMPTY_CONVERSATIONS_PER_PERSON; 0: no limit)."""
        row = self.store.call(
            "create_conversation",
            {"p_user_id": str(user_id), "p_title": storable(title)[:200], "p_max_empty": max_empty},
        )
        if row.get("error") == "too_many_empty_conversations":
            raise TooManyEmptyConversations(max_empty)
        return Conversation.from_row(row)

    def list_conversations(
        self, user_id: UUID, before: ConversationPlace | None = None, limit: int = 50
    ) -> ConversationList:
        """The person's conversations after `before` (a listed one's place) in the list's order."""
        # One row more than asked tells whether others are left, in the same round trip.
        rows = self.store.call(
            "list_conversations",
            {
                "p_user_id": str(user_id),
                "p_limit": limit + 1,
                "p_before_at": before.updated_at.isoformat() if before else None,
                "p_before_id": str(before.id) if before else None,
            },
        )
        listed = [Conversation.from_row(row) for row in rows]
        return ConversationList(listed[:limit], has_more=len(listed) > limit)

    def conversation_messages(
        self, user_id: UUID, conversation_id: UUID, before_id: int | None = None, limit: int = 50
    ) -> ConversationPage:
        # One row more than asked tells whether older messages are left, in the same round trip.
        row = self.store.call(
            "conversation_messages",
            {
                "p_user_id": str(user_id),
                "p_conversation_id": str(conversation_id),
                "p_before_id": before_id,
                "p_limit": limit + 1,
            },
        )
        if row.get("error") == "conversation_not_found":
            raise NotFound("no such conversation")
        messages = [StoredMessage.from_row(item) for item in row["messages"]]
        return ConversationPage(
            conversation=Conversation.from_row(row["conversation"]),
            messages=messages[-limit:],
            has_more=len(messages) > limit,
            declined=frozenset(int(item["id"]) for item in row["messages"] if item.get("declined")),
            client_ids={int(item["id"]): str(item["client_id"]) for item in row["messages"] if item.get("client_id")},
        )

    def unanswered_message(self, user_id: UUID, conversation_id: UUID) -> tuple[Surface, str, str, int] | None:
        """The conversation's newest message when it is the person's web message (or the page's edit
        of another app's message, stored under that app's surface) and has no reply yet: its
        surface, its client's id, its text (the web's resume sends it again) and its stored id.
        NotFound for a conversation that is not theirs."""
        row = self.store.call(
            "unanswered_message", {"p_user_id": str(user_id), "p_conversation_id": str(conversation_id)}
        )
        if row.get("error") == "conversation_not_found":
            raise NotFound("no such conversation")
        message = row.get("message")
        if not message:
            return None
        return Surface(message["surface"]), str(message["external_id"]), str(message["content"]), int(message["id"])

    def web_messages(self, user_id: UUID, conversation_id: UUID, client_ids: Sequence[str]) -> dict[str, StoredMessage]:
        """The person's web messages in the conversation that were sent under `client_ids`, by
        them (the others are not stored, or not theirs). One round trip; none when the store
        fails, as begin_turn then answers from what the client sent."""
        try:
            rows = self.store.call(
                "web_messages_by_client_id",
                {
                    "p_user_id": str(user_id),
                    "p_conversation_id": str(conversation_id),
                    "p_client_ids": json.dumps(sorted(set(client_ids))),
                },
            )
        except StoreUnavailable as exc:
            log.error("web_messages_by_client_id failed; reading the client's words", extra={"error": str(exc)})
            return {}
        return {client_id: StoredMessage.from_row(row) for client_id, row in rows.items()}

    def message_delivery(
        self, user_id: UUID, conversation_id: UUID, message_id: int
    ) -> tuple[Surface, str, str, str | None] | None:
        """Where and under which key the person's own message `message_id` of the conversation was
        stored (a Telegram update_id, a web client id), its words, and when its key may be an
        edit's, the words of the message it may be an edit of (else None); or None: none of theirs
        there, or the store failed (begin_turn then answers as it can)."""
        arguments: dict[str, JsonScalar] = {
            "p_user_id": str(user_id),
            "p_conversation_id": str(conversation_id),
            "p_message_id": message_id,
        }
        try:
            row = self.store.call("message_delivery", arguments)
        except StoreUnavailable as exc:
            log.error("message_delivery failed; the id is taken for a client's", extra={"error": str(exc)})
            return None
        message = row.get("message")
        if not message:
            return None
        first = None if message["first"] is None else str(message["first"])
        return Surface(message["surface"]), str(message["external_id"]), str(message["content"]), first

    def replace_message(self, user_id: UUID, edit_id: int, key: str) -> None:
        """The person's message stored under `key`, and its edits, replaced by the version of it
        the page shows, `edit_id` (stored: an edit, or words put back): out of the page's listing,
        kept for memory; that version listed. A store that fails leaves them listed as they were
        (logged)."""
        arguments: dict[str, JsonScalar] = {"p_user_id": str(user_id), "p_message_id": edit_id, "p_key": key}
        try:
            self.store.call("replace_message", arguments)
        except StoreUnavailable as exc:
            log.error("replace_message failed; the edited message stays listed", extra={"error": str(exc)})

    def person_history(self, user_id: UUID, limit: int = 100) -> list[StoredMessage]:
        rows = self.store.call("person_history", {"p_user_id": str(user_id), "p_limit": limit})
        return [StoredMessage.from_row(row) for row in rows]

    def search(
        self,
        user_id: UUID,
        query: str,
        *,
        surface: Surface | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        exclude_ids: Sequence[int] = (),
        limit: int = 8,
        offset: int = 0,
        or_latest: bool = False,
    ) -> list[MemoryHit]:
        """The person's own messages that best match `query` (every surface, all time, or the
        surface and period given), best first, none of `exclude_ids`; `or_latest`: when none
        matches and a surface or period is given, what was said there, newest first (ranker
        "period"). One round trip; raises StoreUnavailable."""
        rows = self.store.call(
            "search_memory",
            {
                "p_user_id": str(user_id),
                "p_query": storable(query)[:SEARCH_QUERY_CHARS],
                "p_surface": surface.value if surface is not None else None,
                "p_since": since.isoformat() if since is not None else None,
                "p_until": until.isoformat() if until is not None else None,
                "p_exclude_ids": json.dumps(sorted(set(exclude_ids))),
                "p_limit": limit,
                "p_offset": offset,
                "p_or_latest": or_latest,
            },
        )
        return [MemoryHit.from_row(row) for row in rows["hits"]]
