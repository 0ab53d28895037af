"""`web_chat`: the web frontend's fetch calls, routed by method and path in one function, by the
one route table at the end of this module (`ROUTES`):

POST /, /messages                      send a message; JSON, or SSE with Accept: text/event-stream
                                       (the UI message stream with x-vercel-ai-ui-message-stream: v1);
                                       the AI SDK's useChat body, answered with its UI message stream
GET  /<conversation>/stream            useChat's resume of that stream (functions/ui_chat.py)
GET  /conversations                    the person's conversations (web and the other surfaces')
POST /conversations                    start a web conversation
GET  /conversations/<id>/messages      one conversation's messages, paged with ?before=<id>&limit=
DELETE /conversations/<id>, /memory   forgetting (functions/forget_routes.py)
GET  /memory                           the person's memory notes (functions/notes.py)
POST, GET /links; DELETE /links/<surface>   linking the person's other apps (functions/links.py)
GET  /follow-ups, DELETE /follow-ups/<id>   their pending follow-ups (functions/follow_up_routes.py)
GET  /search?q=                        searching the person's own messages (functions/search_routes.py)
GET  /openapi.json                     this function's OpenAPI 3.1 document (functions/web_openapi.py), unauthenticated
OPTIONS *                              CORS preflight, without touching the database
"""

from __future__ import annotations

import itertools
import json
import re
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import flask

from core.errors import CrossmemError
from core.models import Surface
from core.turn.request import ContextItem, TurnRequest, TurnResult
from functions import follow_up_routes, forget_routes, links, notes, runtime, search_routes, ui_chat, web_openapi
from functions.http import (
    CONVERSATION_ID,
    error_response,
    json_response,
    parse_json,
    read_json,
    read_json_body,
    serving,
)
from functions.paging import page_query
from functions.ui_message_stream import UI_STREAM_HEADER
from functions.web_models import NewConversation, SendMessage


@serving
def web_chat(request: flask.Request) -> flask.Response:
    cors = cors_headers(request)
    if request.method == "OPTIONS":
        if not cors:  # said in JSON for whoever debugs it with curl; a browser only sees the 403
            return json_response({"error": "forbidden", "message": "this origin is not in CORS_ORIGINS"}, 403)
        return flask.Response(status=204, headers=cors)
    if request.method == "GET" and request.path.rstrip("/") == "/openapi.json":  # public, like docs/openapi.json
        return json_response(web_openapi.document(), headers=cors)
    try:
        person = runtime.identity().admit_web(runtime.token_verifier().person(request.headers.get("Authorization")))
        path = request.path.rstrip("/") or "/"
        matched = [(route, found) for route in ROUTES if (found := route.pattern.fullmatch(path))]
        for route, found in matched:
            if route.method == request.method:
                return route.handler(request, person, cors, found)
        if matched:
            allowed = ", ".join(sorted({route.method for route, _ in matched}))
            message = f"{request.method} {request.path}: this route takes {allowed}"
            return json_response({"error": "method_not_allowed", "message": message}, 405, {**cors, "Allow": allowed})
        return json_response({"error": "not_found", "message": f"no route {request.method} {request.path}"}, 404, cors)
    except CrossmemError as exc:
        return error_response(exc, cors)


def list_conversations(
    request: flask.Request, person: uuid.UUID, cors: dict[str, str], match: re.Match[str]
) -> flask.Response:
    listed = runtime.memory().list_conversations(person)
    return json_response({"conversations": [c.as_json() for c in listed]}, headers=cors)


def create_conversation(
    request: flask.Request, person: uuid.UUID, cors: dict[str, str], match: re.Match[str]
) -> flask.Response:
    title = read_json(request, NewConversation).title if request.content_length else ""
    return json_response(runtime.memory().create_conversation(person, title).as_json(), 201, cors)


def conversation_messages(
    request: flask.Request, person: uuid.UUID, cors: dict[str, str], match: re.Match[str]
) -> flask.Response:
    query = page_query(request.args)
    page = runtime.memory().conversation_messages(person, uuid.UUID(match[1]), query.before, query.limit)
    messages = [m.as_json() for m in page.messages]
    body = {"conversation": page.conversation.as_json(), "messages": messages, "has_more": page.has_more}
    return json_response(body, headers=cors)


def send_message(
    request: flask.Request, person: uuid.UUID, cors: dict[str, str], match: re.Match[str] | None = None
) -> flask.Response:
    raw = read_json_body(request)
    if ui_chat.is_ui_chat(json_object(raw)):
        return ui_chat.send_ui_chat(raw, person, cors)
    body = parse_json(raw, SendMessage)
    history = None
    if body.history is not None:
        history = [ContextItem(m.role, m.content, m.surface, m.created_at, m.id) for m in body.history]
    turn = TurnRequest(
        Surface.WEB,
        body.message,
        body.client_message_id or f"web-{uuid.uuid4()}",
        user_id=person,
        conversation_id=body.conversation_id,
        client_history=history,
        deadline_s=runtime.surfaces()[Surface.WEB].deadline_s,
        media=tuple(attachment.media() for attachment in body.attachments),
        timezone=body.timezone,
        language=body.language,
    )
    if "text/event-stream" not in request.headers.get("Accept", ""):
        return json_response(result_json(runtime.turns().run(turn)), headers=cors)
    if request.headers.get(UI_STREAM_HEADER) == "v1":  # today's body, answered as useChat's is (the demo page)
        return ui_chat.streamed(turn, cors)
    events = runtime.turns().stream(turn)
    first = next(events)  # errors of input, ownership and auth surface here, before any byte is sent
    return flask.Response(
        sse(first, events), headers={**cors, "Cache-Control": "no-cache"}, mimetype="text/event-stream"
    )


def json_object(raw: bytes) -> object:
    """The body parsed only to tell its shape (None when it is not JSON, or nested past Python's
    recursion limit: the model's parse then says why, as a 400)."""
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return None


def sse(first: TurnResult | str, rest: Iterator[TurnResult | str]) -> Iterator[str]:
    """Server-sent events: `delta` for each piece of text, `done` with the result."""
    for event in itertools.chain([first], rest):
        if isinstance(event, TurnResult):
            yield f"event: done\ndata: {json.dumps(result_json(event))}\n\n"
        else:
            yield f"event: delta\ndata: {json.dumps({'text': event})}\n\n"


def result_json(result: TurnResult) -> dict[str, object]:
    return {
        "reply": result.reply,
        "outcome": result.outcome.value,
        "conversation_id": str(result.conversation_id) if result.conversation_id else None,
        "message_id": result.message_id,
        "reply_id": result.reply_id,
    }


def cors_headers(request: flask.Request) -> dict[str, str]:
    origin = request.headers.get("Origin")
    allowed = runtime.settings().cors_origins
    if not origin or not ("*" in allowed or origin in allowed):
        return {}
    return {
        "Access-Control-Allow-Origin": origin,
        "Access-Control-Allow-Headers": f"Authorization, Content-Type, Accept, {UI_STREAM_HEADER}",
        "Access-Control-Allow-Methods": "GET, POST, DELETE, OPTIONS",
        "Access-Control-Max-Age": "600",
        "Vary": "Origin",
    }


Handler = Callable[[flask.Request, uuid.UUID, dict[str, str], re.Match[str]], flask.Response]


@dataclass(frozen=True)
class Route:
    method: str
    pattern: re.Pattern[str]
    handler: Handler


def route(method: str, path: str, handler: Handler) -> Route:
    return Route(method, re.compile(path), handler)


# Every route of `web_chat`, in one table: a new route is one line here (its path without the
# trailing slash; a path that matches with another method is a 405 naming the allowed ones).
ROUTES = (
    route("POST", "/", send_message),
    route("POST", "/messages", send_message),
    route("GET", "/conversations", list_conversations),
    route("POST", "/conversations", create_conversation),
    route("GET", rf"/conversations/{CONVERSATION_ID}/messages", conversation_messages),
    route("DELETE", rf"/conversations/{CONVERSATION_ID}", forget_routes.delete_conversation),
    route("GET", "/memory", notes.show_memory),
    route("DELETE", "/memory", forget_routes.forget_memory),
    route("POST", "/links", links.new_code),
    route("GET", "/links", links.list_links),
    route("DELETE", f"/links/({'|'.join(web_openapi.LINKABLE)})", links.unlink),
    route("GET", "/follow-ups", follow_up_routes.list_follow_ups),
    route("DELETE", "/follow-ups/([0-9]{1,18})", follow_up_routes.cancel_follow_up),
    route("GET", "/search", search_routes.search_messages),
    route("GET", rf"/{CONVERSATION_ID}/stream", ui_chat.resume),
)
