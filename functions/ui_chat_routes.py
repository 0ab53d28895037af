"""`useChat` on the web function (docs/frontend.md): the AI SDK's request turned into the same turn
today's body makes, answered with its UI message stream (functions/ui_message_stream.py), and
the chat's stream resumed after a dropped connection.

    POST /                      `{"id", "messages", "trigger"}` as DefaultChatTransport posts it
    GET  /<conversation>/stream its `reconnectToStream` (`${api}/${chatId}/stream`): 204, or the reply
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import time
import uuid
from collections.abc import Callable, Generator

import flask
from pydantic import ValidationError

from core.errors import InputError, StillAnswering
from core.memory.service import storable
from core.models import Role, StoredMessage, Surface, TurnStart
from core.turn.context import undeclined
from core.turn.request import ContextItem, TurnRequest
from core.turn.turns import ANSWER_MARGIN_S
from functions import runtime
from functions.http import parse_json
from functions.ui_message_stream import HEADERS, turn_events
from functions.web_models import EDIT, ID_CHARS, UIChatRequest, UIFilePart, UIMessage, UITextPart, WebAttachment

DATA_URL = re.compile(r"data:([^;,]+)(?:;[^;,=]+=[^;,]*)*;base64,(.*)", re.DOTALL)
# The edit a message sent again under its id is, asked once the turn found it stored (`unnamed_edit`).
Edit = Callable[[], "tuple[TurnRequest, str | None] | None"]
# How often a turn asks again while another attempt is answering its message.
RESUME_POLL_S = 1.0


class Edited(Exception):
    """The message a turn took over owed was sent under its id with other words: its edit (`unnamed_edit`)."""

    def __init__(self, edit: tuple[TurnRequest, str | None]) -> None:
        super().__init__("an edit of an owed message")
        self.edit = edit


def is_ui_chat(body: object) -> bool:
    """Whether a parsed JSON body is the AI SDK's (its `messages`, or the new UI message alone as
    `message`, an object) rather than today's (`message`, a string)."""
    if not isinstance(body, dict):
        return False
    return ("messages" in body and "message" not in body) or isinstance(body.get("message"), dict)


def send_ui_chat(raw: bytes, person: uuid.UUID, cors: dict[str, str]) -> flask.Response:
    body = parse_json(raw, UIChatRequest)
    turn, replaces = ui_turn(body, person)
    return answered(turn, cors, replaces, lambda: unnamed_edit(body, person, turn))


def unnamed_edit(body: UIChatRequest, person: uuid.UUID, turn: TurnRequest) -> tuple[TurnRequest, str | None] | None:
    """The edit a message is when it was sent under a stored message's id with other words and no
    `messageId` (a client that builds its own body drops it, as the AI SDK's example of sending the
    new message alone does): that message's edit, as useChat's edit (`messageId` its id) is. None
    when its words are the stored ones (a redelivery), or it names no message of the person's. Asked
    only once the turn found the id stored, so a new message costs no round trip more."""
    if body.messageId is not None or body.trigger != "submit-message":
        return None
    edit, replaces = ui_turn(body.model_copy(update={"messageId": body.messages[-1].id}), person)
    return (edit, replaces) if edit.external_id != turn.external_id else None


def ui_turn(body: UIChatRequest, person: uuid.UUID) -> tuple[TurnRequest, str | None]:
    """The turn of a `useChat` request: its last message the person's new one (its id the
    idempotency key, as `client_message_id`), the earlier ones the client's history. Without
    earlier ones (a page that loaded none, or sends the new message alone) the stored thread is
    read, as for today's body without `history`; an edit sent alone reads the stored thread before the
    message it edits (`thread_before`). With it, the key of the message whose versions
    it replaces on the page when it is an edit, an edit back to words stored before, or the message
    a Try again of an earlier reply posts (None when it is none of them)."""
    *earlier, last = body.messages
    if last.role != "user":
        raise InputError("the last message must be the person's (role user), as useChat sends it")
    # An edit (sendMessage with messageId) or a Try again (regenerate) sends a message that may
    # be stored under its id with other words: its own stored words are read in the same round trip.
    sent_again = last if body.messageId == last.id or body.trigger == "regenerate-message" else None
    stored = stored_messages(earlier, person, body.id, sent_again)
    own = stored[last.id].content if last.id in stored else None
    key = edit_key(last, last.id, own) if sent_again is not None else None
    origin = first_key(last.id, own)
    if key is not None and origin in stored and stored[origin].content == storable(words(last)):
        key = origin  # a reloaded edit edited back to its message's first words: that message sent again
    by_stored_id = sent_by_stored_id(last, person, body.id)
    surface, external_id, edits, other_words = by_stored_id or (Surface.WEB, key or last.id, origin, False)
    # An edit (sendMessage with messageId), of other words or back to words it was stored with (the
    # first ones or an earlier edit's): the page shows this message there. A Try again of an earlier
    # reply (regenerate with its id) drops what followed it from the page, as an edit does; a Try
    # again of the last one (no id) drops nothing.
    # Another app's message the page shows, sent with other words, is its edit, named or not.
    named = other_words or (
        body.messageId is not None and (body.messageId == last.id or body.trigger == "regenerate-message")
    )
    replaces = edits if named else None
    history = undeclined(
        [
            (item, message.metadata is not None and message.metadata.declined)
            for message in earlier
            # A message the page edited keeps its id there: its edit is stored under the edit's key.
            if (item := history_item(message, shown_version(message, stored))) is not None
        ]
    )
    if body.alone and (named or key is not None):
        # An edit sent alone: its page holds the stored thread before the message it edits.
        anchor = stored[last.id].id if last.id in stored else stored_id(last.id) if by_stored_id else None
        client_history = thread_before(person, body.id, anchor)
    else:
        # An edit's page holds the thread before it: the replaced words and their reply are no history.
        client_history = history if earlier or key or named else None
    turn = TurnRequest(
        surface,
        words(last),
        external_id,
        user_id=person,
        conversation_id=body.id,
        client_history=client_history,
        history_is_page=not named and key is None,
        # The page cannot shorten the thread it posts: past MAX_HISTORY_CHARS its oldest messages are
        # left out, as the stored window's start moves, where today's body is refused (docs/decisions.md).
        history_fits=True,
        deadline_s=runtime.settings().web_model_deadline,
        media=tuple(attachment(part).media() for part in last.parts if isinstance(part, UIFilePart)),
        timezone=body.timezone,
        language=body.language,
    )
    return turn, replaces


def thread_before(person: uuid.UUID, conversation: uuid.UUID, message_id: int | None) -> list[ContextItem] | None:
    """The thread a page shows before the person's stored message `message_id`, as the history
    route lists it (without what edits replaced), its newest CONTEXT_MAX_MESSAGES: what an edit of
    that message sent alone reads. None (the stored thread) when no stored message is named."""
    if message_id is None:
        return None
    limit = runtime.settings().context_max_messages
    page = runtime.memory().conversation_messages(person, conversation, message_id, limit)
    return undeclined([(ContextItem.from_stored(message), message.id in page.declined) for message in page.messages])


def words(message: UIMessage) -> str:
    return "\n\n".join(part.text for part in message.parts if isinstance(part, UITextPart))


def stored_messages(
    earlier: list[UIMessage], person: uuid.UUID, conversation: uuid.UUID, sent_again: UIMessage | None = None
) -> dict[str, StoredMessage]:
    """The person's earlier web messages as stored, by the ids their page sent them under (a live
    tab's, and loadMessages' after a reload) and by the keys their edits would be stored under, and
    the one `sent_again`: one round trip, only when there are such ids."""
    asked = [*earlier, sent_again] if sent_again is not None else earlier
    client_ids = [
        key
        for message in asked
        # an id of digits may be a client's too (generateId: Date.now()): the one sent again is asked
        if message.role == "user" and (stored_id(message.id) is None or message is sent_again)
        # its id may be an edit's key (a reloaded edit's: its message's first words and its edit's
        # key, which a live tab keeps for the words it edits them to) or a client's
        for key in dict.fromkeys(
            (message.id, edited_key(message), EDIT.sub("", message.id), EDIT.sub("", message.id) + edited(message))
        )
    ]
    return runtime.memory().web_messages(person, conversation, client_ids) if client_ids else {}


def shown_version(message: UIMessage, stored: dict[str, StoredMessage]) -> StoredMessage | None:
    """The stored version of an earlier message of the person's as the page shows it: the version
    its words were stored as when the page edited it (a live tab keeps the id it edited, which may
    be a reloaded page's edit's key: keyed as `edit_key` keyed it, or its message's first words put
    back), else the one its id names (a voice note's transcript, a photo's description)."""
    own = stored.get(message.id)
    if own is None:
        return stored.get(edited_key(message))
    origin = first_key(message.id, own.content)
    if origin in stored and stored[origin].content == storable(words(message)):
        return stored[origin]
    return stored.get(origin + edited(message)) or own


def sent_by_stored_id(
    message: UIMessage, person: uuid.UUID, conversation: uuid.UUID
) -> tuple[Surface, str, str, bool] | None:
    """The surface and key of the person's stored message that `message` names by its stored id
    (the history route gives another app's message no client id, so `loadMessages` keeps that id,
    and Try again sends it so): it is that message sent again, its stored reply sent again, or its
    answer if it has none (docs/decisions.md); with other words, its edit, under its key and a
    digest of them (`edit_key`), or back to that message's first words, it sent again; and the
    key of the message it is a version of (its own), and whether its words are other than that
    version's (an edit: named or not, it replaces it on the page). None for an id that names none
    of theirs there."""
    named = stored_id(message.id)
    found = runtime.memory().message_delivery(person, conversation, named) if named is not None else None
    if found is None:
        return None
    surface, external_id, content, first = found
    origin = first_key(external_id, content)
    edit = edit_key(message, external_id, content)
    if edit is not None and origin != external_id and first == storable(words(message)):
        edit = origin  # a reloaded edit edited back to its message's first words: that message sent again
    return surface, edit or external_id, origin, edit is not None


def edit_key(message: UIMessage, key: str, stored: str | None) -> str | None:
    """The key of an edited message (docs/decisions.md, An edit on the web is a new message): the
    key of the message it edits (`key` names a version of it, stored with the words `stored`) and
    its new words, so that the edit is stored and answered once, after the words it replaces; None
    when its words are the `stored` ones as they are stored (a Try again), or it has files (stored
    as what the turn learned of them, which its parts do not hold)."""
    if stored is None or stored == storable(words(message)) or any(isinstance(p, UIFilePart) for p in message.parts):
        return None
    origin = first_key(key, stored)
    if len(origin) > ID_CHARS:  # a client's id that only ends like an edit's key: its edit's would outgrow an id
        raise InputError(f"a message whose id has more than {ID_CHARS} characters cannot be edited")
    return origin + edited(message)


def edited_key(message: UIMessage) -> str:
    """The key `message`, as the page shows it, is stored under if it is an edit: its message's key
    and a digest of its words."""
    return first_key(message.id, words(message)) + edited(message)


def first_key(key: str, text: str | None) -> str:
    """The key of the message `key` names a version of, stored with the words `text`: an edit's
    key without the digest of those words its edit added, any other key itself (a client's id
    that ends in `~` and 16 hex digits of other words is its own message's)."""
    found = EDIT.search(key)
    return (
        key[: found.start()] if found and found.start() > 0 and text is not None and found[0] == digest(text) else key
    )


def edited(message: UIMessage) -> str:
    """What an edit's key adds to the key of the message it edits: a digest of its words, as they
    are stored."""
    return digest(words(message))


def digest(text: str) -> str:
    return "~" + hashlib.sha256(storable(text).encode()).hexdigest()[:16]


def history_item(message: UIMessage, stored: StoredMessage | None) -> ContextItem | None:
    """An earlier message as the context reads it; a message with no words (only data parts, a
    system message) is left out, and so is a fallback (`unstored`). The person's web message as
    `stored` (a voice note's transcript, a photo's description, which its parts do not hold), and
    an id that is a stored message's (as the history route and the stream's `start` give them):
    each keeps what the context shows from being found again, or shown twice."""
    if message.role == "system" or unstored(message):
        return None
    if stored is not None:
        return ContextItem.from_stored(stored)
    text = words(message)
    if not text:
        return None
    metadata = message.metadata
    surface = metadata.surface if metadata is not None else Surface.WEB
    created_at = metadata.createdAt if metadata is not None else None
    return ContextItem(Role(message.role), text, surface, created_at, stored_id(message.id))


def stored_id(message_id: str) -> int | None:
    """The stored message an id names, when it is one's (all digits)."""
    # ASCII digits only: str.isdigit() also takes "²", which int() refuses
    return int(message_id) if message_id.isascii() and message_id.isdigit() and len(message_id) < 19 else None


def unstored(message: UIMessage) -> bool:
    """A fallback the page was shown (its `data-turn` part says so): never stored, so the stored
    thread holds the two questions around it as one turn (docs/decisions.md), and so does this."""
    for part in message.parts:
        data = getattr(part, "data", None) if part.type == "data-turn" else None
        if isinstance(data, dict) and data.get("outcome") == "fallback":
            return True
    return False


def attachment(part: UIFilePart) -> WebAttachment:
    """A file part's data URL as today's attachment, with today's rules (types, base64)."""
    found = DATA_URL.fullmatch(part.url)
    if found is None:
        raise InputError("a file part must be a base64 data: URL (useChat sends a FileList so)")
    if found[1] != part.mediaType.split(";")[0].strip():  # a recording's says `audio/webm;codecs=opus`
        raise InputError(f"the file part says {part.mediaType} and its data URL {found[1]}")
    try:
        base64.b64decode(found[2], validate=True)
        return WebAttachment(media_type=found[1], data=found[2])  # type: ignore[arg-type]
    except (binascii.Error, ValidationError) as exc:
        reason = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else "data must be base64"
        raise InputError(f"invalid file part: {reason}") from None


def resume(request: flask.Request, person: uuid.UUID, cors: dict[str, str], conversation: uuid.UUID) -> flask.Response:
    """The chat's stream again: 204 when its newest message is answered (nothing running, nothing
    owed); else that message sent again by its client's id, which gives the stored reply, waits
    for the attempt still answering it, or answers it anew when its client went away. Once
    answered, the next resume is a 204: the reply is shown once. The page's edit of another app's
    message (stored under that app's surface) reads the page's thread before it, as its edit did."""
    unanswered = runtime.memory().unanswered_message(person, conversation)
    if unanswered is None:
        return flask.Response(status=204, headers=cors)
    surface, client_id, text, message_id = unanswered
    history = thread_before(person, conversation, message_id) if surface is not Surface.WEB else None
    deadline_s = runtime.settings().web_model_deadline
    turn = TurnRequest(
        surface,
        text,
        client_id,
        user_id=person,
        conversation_id=conversation,
        client_history=history,
        history_fits=True,
        deadline_s=deadline_s,
    )
    return answered(turn, cors)


def answered(
    turn: TurnRequest, cors: dict[str, str], replaces: str | None = None, edit: Edit | None = None
) -> flask.Response:
    """The turn's stream once no other attempt is answering its message: one still answering (a
    stream the person stopped a moment ago, which its instance notices at its next write; another
    tab's) is waited for, asked again every RESUME_POLL_S; past its deadline and margin, the 409.
    `replaces`: the key of the message whose other versions the turn's message replaces on the page;
    `edit`: the edit the message is when it was stored with other words (`unnamed_edit`)."""
    give_up_at = time.monotonic() + turn.deadline_s + ANSWER_MARGIN_S
    while True:
        try:
            return streamed(turn, cors, replaces, edit)
        except StillAnswering:
            if time.monotonic() + RESUME_POLL_S > give_up_at:
                raise
            time.sleep(RESUME_POLL_S)


def streamed(
    turn: TurnRequest, cors: dict[str, str], replaces: str | None = None, edit: Edit | None = None
) -> flask.Response:
    """The UI message stream of a turn, started only once its first event came: its errors of
    input, ownership, budget and auth are answered with their status, before any byte. By then
    the turn has begun, and its start knows the id its reply is stored under; an edit is stored
    (or the version put back found), and the other versions of what it `replaces` leave the page's
    listing."""
    begun: list[TurnStart] = []

    def took(start: TurnStart) -> None:
        begun.append(start)
        # Its id stored and owed (its attempt gave no reply, the fallback was shown), with other
        # words: its edit, before the model is asked about the words it replaces.
        if edit is not None and start.owed and (found := edit()):
            raise Edited(found)

    events = runtime.turns().stream(turn, took)
    try:
        first = next(events)
    except Edited as edited:  # the message taken over is owed again, as it was: the page replaced it
        return answered(edited.edit[0], cors, edited.edit[1])
    # Its id stored and answered: the same message sent again, or an edit that named no `messageId`.
    if edit is not None and begun and begun[0].duplicate and begun[0].reply is not None and (found := edit()):
        if isinstance(events, Generator):  # Turns.stream's: the stored reply to the words it replaces, never sent
            events.close()
        return answered(found[0], cors, found[1])
    reply_id = begun[0].reply_id if begun else None
    if replaces is not None and begun and begun[0].user_id is not None and begun[0].message_id is not None:
        runtime.memory().replace_message(begun[0].user_id, begun[0].message_id, replaces)
    return flask.Response(
        turn_events(reply_id, first, events), headers={**cors, **HEADERS}, mimetype="text/event-stream"
    )
