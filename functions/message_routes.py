"""The web's send route, inside `web_chat` (locally under `/chat`):

POST /, /messages    send a message; JSON, or SSE with Accept: text/event-stream (the UI message
                     stream with x-vercel-ai-ui-message-stream: v1); the AI SDK's useChat body,
                     answered with its UI message stream (functions/ui_chat_routes.py)
"""

from __future__ import annotations

import itertools
import json
import uuid
from collections.abc import Iterator

import flask

from core.models import Surface
from core.turn.context import ContextItem, undeclined
from core.turn.request import TurnRequest, TurnResult
from functions import runtime, ui_chat_routes
from functions.http import failed_mid_stream, json_response, parse_json, read_json_body
from functions.ui_message_stream import UI_STREAM_HEADER
from functions.web_models import SendMessage

# What a send past the body's limit is told: useChat posts its whole thread each turn, which a long
# chat takes past it, and every later turn was a 413 that named no way out. With `trigger` and
# `messageId`: without them, a Try again of an earlier reply could not say what the page dropped.
SEND_ALONE = (
    "send only the new message, the thread is stored here "
    "(useChat: prepareSendMessagesRequest returning {id, message, trigger, messageId}, docs/frontend.md)"
)


def send_message(request: flask.Request, person: uuid.UUID, cors: dict[str, str]) -> flask.Response:
    raw = read_json_body(request, SEND_ALONE)
    if ui_chat_routes.is_ui_chat(json_object(raw)):
        return ui_chat_routes.send_ui_chat(raw, person, cors)
    body = parse_json(raw, SendMessage)
    history = None
    if body.history is not None:
        history = undeclined(
            [(ContextItem(m.role, m.content, m.surface, m.created_at, m.id), m.declined) for m in body.history]
        )
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
        return ui_chat_routes.streamed(turn, cors)
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
    """Server-sent events: `delta` for each piece of text, `done` with the result. A failure after
    the first event, when the status and headers are sent, ends it with one `error` event instead
    of a cut (docs/api.md): `{"error", "message"}` as our JSON errors, by the error table."""
    try:
        for event in itertools.chain([first], rest):
            if isinstance(event, TurnResult):
                yield f"event: done\ndata: {json.dumps(result_json(event))}\n\n"
            else:
                yield f"event: delta\ndata: {json.dumps({'text': event})}\n\n"
    except Exception as exc:
        code, message = failed_mid_stream(exc)
        yield f"event: error\ndata: {json.dumps({'error': code, 'message': message})}\n\n"


def result_json(result: TurnResult) -> dict[str, object]:
    return {
        "reply": result.reply,
        "outcome": result.outcome.value,
        "conversation_id": str(result.conversation_id) if result.conversation_id else None,
        "message_id": result.message_id,
        "reply_id": result.reply_id,
        "declined": result.declined,
    }
