"""The web function's OpenAPI 3.1 document, served at `GET /openapi.json` (locally
`/chat/openapi.json`) and kept in docs/openapi.json (a test fails when they differ).

The request bodies' schemas are the pydantic models the routes validate with
(functions/web_models.py): one source. The answers' schemas are the models below, each the shape
a route's JSON has (`as_json` of core's objects); Schemathesis checks every answer of the running
function against them (tests/functions/test_web_openapi.py). `python -m functions.web_openapi`
prints the document (what docs/openapi.json holds)."""

from __future__ import annotations

import functools
import json
import uuid
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from core.models import Role, Surface
from core.turn.request import Outcome
from functions.web_models import NewConversation, SendMessage, UIChatRequest

# The surfaces a person links to their web account (and unlinks): every one but the web.
LINKABLE = [surface.value for surface in Surface if surface.is_secondary]


class ErrorAnswer(BaseModel):
    error: str  # the code of functions/http.py's HTTP_ERRORS, or not_found / method_not_allowed
    message: str
    until: datetime | None = Field(None, description="`over_budget`: when the person may write again")


class SendAnswer(BaseModel):
    reply: str | None
    outcome: Outcome
    conversation_id: uuid.UUID | None
    message_id: int | None
    reply_id: int | None
    declined: bool  # the reply answers a turn the model declined (docs/api.md)


class ConversationAnswer(BaseModel):
    id: uuid.UUID
    surface: Surface
    title: str
    created_at: datetime
    updated_at: datetime


class ConversationList(BaseModel):
    conversations: list[ConversationAnswer]
    has_more: bool
    next: str | None


class MessageAnswer(BaseModel):
    id: int
    conversation_id: uuid.UUID
    surface: Surface
    role: Role
    content: str
    kind: Literal["text", "image", "pdf", "voice", "file"]
    created_at: datetime


class PageMessageAnswer(MessageAnswer):
    declined: bool  # a turn the model declined: shown, and out of the model's context (docs/api.md)
    client_id: str | None  # the key the person's web message was sent with: useChat's id for it


class ConversationPageAnswer(BaseModel):
    conversation: ConversationAnswer
    messages: list[PageMessageAnswer]
    has_more: bool


class NeighbourAnswer(BaseModel):
    id: int
    role: Role
    content: str
    created_at: datetime


class SearchHitAnswer(MessageAnswer):
    ranker: str
    rank: int
    score: float
    before: NeighbourAnswer | None
    after: NeighbourAnswer | None


class SearchAnswer(BaseModel):
    query: str
    hits: list[SearchHitAnswer]
    has_more: bool
    next_offset: int | None


class MemoryAnswer(BaseModel):
    notes: str
    written_at: datetime | None
    covered_until: datetime | None


class LinkCodeAnswer(BaseModel):
    code: str
    expires_at: datetime
    telegram_url: str | None
    whatsapp_text: str


class LinkAnswer(BaseModel):
    surface: Surface
    external_id: str  # masked
    linked_at: datetime


class LinkList(BaseModel):
    links: list[LinkAnswer]


class UnlinkAnswer(BaseModel):
    surface: str = Field(json_schema_extra={"enum": [value for value in LINKABLE]})
    unlinked: int


class FollowUpAnswer(BaseModel):
    id: int
    content: str
    due_at: datetime
    timezone: str
    surface: Surface = Field(description="the app it was asked on (or moved to): its conversation's")
    said_on: Surface = Field(
        description=(
            "the app it will be said on: `surface`'s, or for one asked on the web the linked app the person last"
            " wrote from that still reaches them, `web` with none (shown in its web conversation, nothing pushed)"
        )
    )
    status: Literal["pending", "sending", "held"]


class FollowUpList(BaseModel):
    follow_ups: list[FollowUpAnswer]


class CancelAnswer(BaseModel):
    cancelled: Literal[True]


REFUSALS = {
    "400": "bad input (`bad_request`, `empty_message`, `date_out_of_range`)",
    "401": "no valid Supabase access token (`unauthorized`)",
    "403": "under IDENTITY_POLICY=owner, anyone but the owner (`forbidden`)",
    "404": "no such route, or no such thing of the person's (`not_found`)",
    "405": "a route that takes another method (`method_not_allowed`, with `Allow`)",
    "409": "`still_answering` (with `Retry-After`), `message_id_in_another_conversation`, `linking_not_needed`,"
    " `too_many_empty_conversations`, `conflict`",
    "413": "`message_too_long`, `history_too_long`, `body_too_large` (over 1,000,000 bytes)",
    "415": "a body that is not `application/json` (`unsupported_media_type`)",
    "429": "past the person's budget (`over_budget`, with `until` and `Retry-After`)",
    "500": "a failure of ours that asking again cannot mend (`media_unreadable`, `internal_error`)",
    "503": "no database, model, surface's API, sign-in keys or setting: ask again later (`store_unavailable`, "
    "`model_unavailable`, `delivery_failed`, `auth_unavailable`, `not_configured`)",
}
UI_STREAM = {
    "text/event-stream": {
        "schema": {"type": "string"},
        "x-ui-message-stream": "the AI SDK's UI message stream v1 (docs/frontend.md)",
    }
}
EMPTY = {"description": "done; no body"}
# GET /export's document (core/memory/export.py), written by the SQL function, not by a model.
EXPORT = {
    "type": "object",
    "required": ["format", "exported_at", "user_id", "messages_total", "conversations", "identities", "messages"],
    "properties": {
        "format": {"const": "crossmem-export/1"},
        "user_id": {"type": "string", "format": "uuid"},
        "messages_total": {"type": "integer", "minimum": 0},
        "messages": {"type": "array", "items": {"type": "object"}},
    },
}
CONVERSATION_ID = {
    "name": "conversation_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "format": "uuid"},
}


def json_content(model: type[BaseModel]) -> dict[str, Any]:
    return {"application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}


def answered(status: str, model: type[BaseModel] | None, description: str) -> dict[str, Any]:
    """A route's answers: its own, and the refusals every route may give, each an ErrorAnswer."""
    own: dict[str, Any] = {"description": description}
    if model is not None:
        own["content"] = json_content(model)
    return {status: own, **{code: {"$ref": f"#/components/responses/{code}"} for code in REFUSALS}}


def query(name: str, schema: dict[str, Any], description: str, *, required: bool = False) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": required, "schema": schema, "description": description}


def send_operation() -> dict[str, Any]:
    answers = answered(
        "200",
        SendAnswer,
        "the turn: JSON, or a stream (today's `delta`/`done` events, `error` for a failure after the first,"
        " or the UI message stream)",
    )
    answers["200"]["content"].update(UI_STREAM)
    return {
        "summary": "Send a message: today's body, or the AI SDK's useChat body (answered with its UI message stream)",
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {
                    "schema": {
                        "oneOf": [
                            {"$ref": "#/components/schemas/SendMessage"},
                            {"$ref": "#/components/schemas/UIChatRequest"},
                            {"$ref": "#/components/schemas/UIChatNewMessage"},
                        ]
                    }
                }
            },
        },
        "responses": answers,
    }


def paths() -> dict[str, Any]:
    send = send_operation()
    resume = answered("200", None, "the chat's unanswered turn, as the UI message stream")
    resume["200"]["content"] = UI_STREAM
    resume["204"] = {"description": "nothing running or unanswered in this chat"}
    messages = answered("200", ConversationPageAnswer, "a page of the conversation, oldest first")
    export = answered("200", None, "the export, as an attachment (docs/design.md#exporting-a-persons-data)")
    export["200"]["content"] = {"application/json": {"schema": EXPORT}}
    return {
        "/": {"post": send},
        "/messages": {"post": send},
        "/{conversation_id}/stream": {
            "get": {
                "summary": "Resume a chat's stream (useChat's reconnectToStream)",
                "parameters": [CONVERSATION_ID],
                "responses": resume,
            }
        },
        "/conversations": {
            "get": {
                "summary": "The person's conversations, the latest active first, paged",
                "parameters": [
                    query(
                        "before",
                        {"type": "string", "pattern": "^[0-9]{1,17}-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}$"},
                        "the previous page's `next`: the conversations after its last one",
                    ),
                    query("limit", {"type": "integer", "minimum": 1, "maximum": 200}, "how many (default 50)"),
                ],
                "responses": answered("200", ConversationList, "a page of the conversations"),
            },
            "post": {
                "summary": "Start a web conversation (its id is a useChat chat id)",
                "requestBody": {"required": False, "content": json_content(NewConversation)},
                "responses": answered("201", ConversationAnswer, "the new conversation"),
            },
        },
        "/conversations/{conversation_id}/messages": {
            "get": {
                "summary": "One conversation's messages, paged",
                "parameters": [
                    CONVERSATION_ID,
                    query("before", {"type": "integer", "minimum": 1}, "messages older than this id"),
                    query("limit", {"type": "integer", "minimum": 1, "maximum": 200}, "how many (default 50)"),
                ],
                "responses": messages,
            }
        },
        "/conversations/{conversation_id}": {
            "delete": {
                "summary": "Forget one conversation",
                "parameters": [CONVERSATION_ID],
                "responses": answered("204", None, EMPTY["description"]),
            }
        },
        "/memory": {
            "get": {"summary": "The person's memory notes", "responses": answered("200", MemoryAnswer, "the notes")},
            "delete": {
                "summary": "Forget everything of the person",
                "responses": answered("204", None, EMPTY["description"]),
            },
        },
        "/export": {"get": {"summary": "Everything held of the person, as a JSON download", "responses": export}},
        "/links": {
            "post": {
                "summary": "A link code for the person's other apps",
                "responses": answered("201", LinkCodeAnswer, "the code"),
            },
            "get": {
                "summary": "The person's linked chats and numbers",
                "responses": answered("200", LinkList, "links"),
            },
        },
        "/links/{surface}": {
            "delete": {
                "summary": "Unlink a surface",
                "parameters": [{"name": "surface", "in": "path", "required": True, "schema": {"enum": LINKABLE}}],
                "responses": answered("200", UnlinkAnswer, "how many were unlinked"),
            }
        },
        "/follow-ups": {
            "get": {
                "summary": "The person's pending follow-ups, soonest first",
                "responses": answered("200", FollowUpList, "the follow-ups"),
            }
        },
        "/follow-ups/{follow_up_id}": {
            "delete": {
                "summary": "Cancel a pending follow-up",
                "parameters": [
                    {
                        "name": "follow_up_id",
                        "in": "path",
                        "required": True,
                        "schema": {"type": "integer", "minimum": 0, "maximum": 999_999_999_999_999_999},
                    }
                ],
                "responses": answered("200", CancelAnswer, "cancelled"),
            }
        },
        "/search": {
            "get": {
                "summary": "Search the person's own messages",
                "parameters": [
                    query("q", {"type": "string", "minLength": 1, "maxLength": 1000}, "the words", required=True),
                    query("surface", {"enum": [surface.value for surface in Surface]}, "only this surface"),
                    query("since", {"type": "string"}, "an ISO 8601 date, or date and time"),
                    query("until", {"type": "string"}, "an ISO 8601 date, or date and time"),
                    query("limit", {"type": "integer", "minimum": 1, "maximum": 50}, "how many (default 20)"),
                    query("offset", {"type": "integer", "minimum": 0, "maximum": 10_000}, "from (default 0)"),
                ],
                "responses": answered("200", SearchAnswer, "the hits, best first"),
            }
        },
    }


REQUESTS: tuple[type[BaseModel], ...] = (SendMessage, UIChatRequest, NewConversation)
ANSWERS: tuple[type[BaseModel], ...] = (
    ErrorAnswer,
    SendAnswer,
    ConversationList,
    ConversationPageAnswer,
    SearchAnswer,
    MemoryAnswer,
    LinkCodeAnswer,
    LinkList,
    UnlinkAnswer,
    FollowUpList,
    CancelAnswer,
)


def schemas() -> dict[str, Any]:
    """Every model's JSON Schema under components, the models they use beside them."""
    found: dict[str, Any] = {}
    for models, mode in ((REQUESTS, "validation"), (ANSWERS, "serialization")):
        for model in models:
            schema = model.model_json_schema(ref_template="#/components/schemas/{model}", mode=mode)  # type: ignore[arg-type]
            found.update(schema.pop("$defs", {}))
            found[model.__name__] = schema
    found["UIChatNewMessage"] = new_message_alone(found["UIChatRequest"])
    return dict(sorted(found.items()))


def new_message_alone(thread: dict[str, Any]) -> dict[str, Any]:
    """useChat's body with the new message alone, `message` for `messages` (UIChatRequest takes it)."""
    properties = {name: value for name, value in thread["properties"].items() if name != "messages"}
    return {
        **thread,
        "title": "UIChatNewMessage",
        "description": "useChat's body with its new message alone (prepareSendMessagesRequest: docs/frontend.md)",
        "properties": {"message": {"$ref": "#/components/schemas/UIMessage"}, **properties},
        "required": ["id", "message"],
    }


@functools.cache
def document() -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "crossmem web_chat",
            "version": "1",
            "description": "The web function's routes (docs/api.md); the useChat stream is docs/frontend.md.",
        },
        "servers": [{"url": "http://127.0.0.1:8080/chat", "description": "make dev"}],
        "security": [{"bearer": []}],
        "paths": paths(),
        "components": {
            "responses": {
                code: {"description": reason, "content": json_content(ErrorAnswer)} for code, reason in REFUSALS.items()
            },
            "schemas": schemas(),
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "bearerFormat": "JWT",
                    "description": "the Supabase session's access token",
                }
            },
        },
    }


def text() -> str:
    """The document as docs/openapi.json holds it."""
    return json.dumps(document(), indent=2, ensure_ascii=False) + "\n"


if __name__ == "__main__":
    print(text(), end="")
