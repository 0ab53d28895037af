"""The bodies of the web function's routes, as pydantic models: what each route validates with,
and what its OpenAPI document is generated from (functions/web_openapi.py), one source for both.

Today's send (`SendMessage`), and the AI SDK's `useChat` request (`UIChatRequest`: the chat's id
and its UI messages, as `DefaultChatTransport` posts them; the `ai` package's `UIMessage`)."""

from __future__ import annotations

import base64
import re
import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    ModelWrapValidatorHandler,
    PrivateAttr,
    Tag,
    field_validator,
    model_validator,
)

from core.media.kinds import MediaKind, MediaRef
from core.models import Role, Surface
from functions.paging import LARGEST_MESSAGE_ID

# What an edit adds to its message's key (functions/ui_chat_routes.py's `edited`): `~` and the digest
# of its words. A reloaded page's id for an edited message is the edit's key, and its next edit is
# keyed from the message's own, never a chain that outgrows an id; a client's id may end so too, with
# other words.
EDIT = re.compile(r"~[0-9a-f]{16}\Z")
# A message's id, as a page chooses it; an edit's key, as a reloaded page sends it, is 17 more.
ID_CHARS = 128


def within_an_id(value: str) -> str:
    if len(EDIT.sub("", value)) > ID_CHARS:
        raise ValueError(f"an id has at most {ID_CHARS} characters (an edited message's, `~` and 16 hex digits more)")
    return value


# The id of a UI message, the idempotency key of a new one: "" would name them all.
MessageId = Annotated[str, Field(min_length=1, max_length=ID_CHARS + 17), AfterValidator(within_an_id)]


class ClientMessage(BaseModel):
    # A stored message's (the history route's); the turn counts those it answered by them
    id: int | None = Field(default=None, ge=1, le=LARGEST_MESSAGE_ID)
    role: Role
    content: str = Field(max_length=200_000)
    surface: Surface = Surface.WEB
    created_at: datetime | None = None
    # Part of a turn the model declined (the history route's `declined`, the JSON answer's): left
    # out, a reply with the turn it answered (core/turn/context.py's undeclined).
    declined: bool = False


class WebAttachment(BaseModel):
    """An image or a voice note sent with a message (docs/api.md): its type and its bytes in
    base64; a voice note's length as the recorder measured it (WebM and MP4 say it nowhere near
    their start), a claim the transcriber's own length checks (core/media/turn_media.py)."""

    media_type: Literal["image/jpeg", "image/png", "image/gif", "image/webp", "audio/webm", "audio/ogg", "audio/mp4"]
    data: str = Field(min_length=4)  # the base64 of one byte at least
    seconds: int | None = Field(default=None, ge=0, le=86_400)

    def media(self) -> MediaRef:
        if self.media_type.startswith("audio/"):
            return MediaRef(MediaKind.VOICE, self.media_type, data=base64.b64decode(self.data), seconds=self.seconds)
        return MediaRef(MediaKind.IMAGE, self.media_type, data=base64.b64decode(self.data))

    @field_validator("data")
    @classmethod
    def base64_data(cls, value: str) -> str:
        try:
            base64.b64decode(value, validate=True)
        except ValueError:
            raise ValueError("data must be base64") from None
        return value


class SendMessage(BaseModel):
    message: str
    conversation_id: uuid.UUID | None = None
    client_message_id: str | None = Field(default=None, max_length=128)
    history: list[ClientMessage] | None = Field(default=None, max_length=200)
    attachments: list[WebAttachment] = Field(default=[], max_length=10)
    timezone: str | None = Field(default=None, max_length=64)  # the browser's Intl timezone
    language: str | None = Field(default=None, max_length=35)  # navigator.language: the fixed answers'


class NewConversation(BaseModel):
    title: str = Field(default="", max_length=200)


# The AI SDK's request (`ai` 6: HttpChatTransport.sendMessages posts `{...body, id, messages,
# trigger, messageId}`; a UIMessage is `{id, role, metadata?, parts}`).


class UITextPart(BaseModel):
    type: Literal["text"]
    text: str  # as long as the body holds: a message past MAX_MESSAGE_CHARS is 413 message_too_long


class UIFilePart(BaseModel):
    """A file the person attached: `useChat` sends it as a data URL (`data:image/png;base64,...`)."""

    type: Literal["file"]
    mediaType: str = Field(max_length=100)
    url: str
    filename: str | None = Field(default=None, max_length=1_000)


class UIOtherPart(BaseModel):
    """Any other part (`step-start`, `reasoning`, `data-*`, `tool-*`): not words the model reads."""

    model_config = ConfigDict(extra="allow")
    type: str = Field(max_length=200, json_schema_extra={"not": {"enum": ["text", "file"]}})


def part_kind(part: Any) -> str:
    """A part's model by its `type` alone: a text or file part that is not valid is refused with its
    reason, never taken for a part without words (a paste past a limit read as an empty message)."""
    kind = part.get("type") if isinstance(part, dict) else getattr(part, "type", None)
    return kind if kind in ("text", "file") else "other"


UIPart = Annotated[
    Annotated[UITextPart, Tag("text")] | Annotated[UIFilePart, Tag("file")] | Annotated[UIOtherPart, Tag("other")],
    Discriminator(part_kind),
]


class UIMessageMetadata(BaseModel):
    """What a page that built its messages from `GET /conversations/<id>/messages` may keep of each:
    where and when it was said (the context shows both), and whether it answered a declined turn.
    Anything else is the page's own."""

    model_config = ConfigDict(extra="allow")
    surface: Surface = Surface.WEB
    createdAt: datetime | None = None
    declined: bool = False  # as ClientMessage's: the stream's finish and the history route mark it


class UIMessage(BaseModel):
    id: MessageId
    role: Literal["system", "user", "assistant"]
    parts: list[UIPart] = Field(max_length=100)
    metadata: UIMessageMetadata | None = None


class UIChatRequest(BaseModel):
    """`useChat`'s body: the chat's id is the conversation's (make it with `POST /conversations`),
    its last message the person's new one, the earlier ones the client's history."""

    model_config = ConfigDict(extra="allow")  # a page's own `body` fields ride along
    id: uuid.UUID
    # As many as useChat keeps: the body's 1,000,000 bytes bound them, and the context reads the last few.
    messages: list[UIMessage] = Field(min_length=1)
    trigger: Literal["submit-message", "regenerate-message"] = "submit-message"
    messageId: MessageId | None = None
    timezone: str | None = Field(default=None, max_length=64)  # as SendMessage's, sent in `body`
    language: str | None = Field(default=None, max_length=35)  # as SendMessage's, sent in `body`

    # Sent as `{id, message}`: the page's thread is the stored one (an edit's, the thread before it).
    _alone: bool = PrivateAttr(default=False)

    @property
    def alone(self) -> bool:
        return self._alone

    @model_validator(mode="wrap")
    @classmethod
    def new_message_alone(cls, body: Any, handler: ModelWrapValidatorHandler[UIChatRequest]) -> UIChatRequest:
        """`{id, message}`, the AI SDK's "send only the last message" (prepareSendMessagesRequest,
        docs/frontend.md): the thread of that one message, which reads the stored thread."""
        alone = isinstance(body, dict) and "message" in body
        if alone:
            if "messages" in body:
                raise ValueError("send the new message as `message` or the thread as `messages`, not both")
            body = {**body, "messages": [body["message"]]}
            del body["message"]
        request = handler(body)
        request._alone = alone
        return request
