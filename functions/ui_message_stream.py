"""A turn as the AI SDK's UI message stream: what `useChat` (and assistant-ui and the other kits
that speak it) reads, with no adapter route in between (docs/frontend.md).

The protocol is the `ai` package's (version 6, pinned in tests/node/package-lock.json):
server-sent events whose `data` is one JSON part each, validated by its `uiMessageChunkSchema`,
the header `x-vercel-ai-ui-message-stream: v1` (its `UI_MESSAGE_STREAM_HEADERS`), and a last
`data: [DONE]` (its `JsonToSseTransformStream`). A turn is sent as

    start            messageId: the id the reply is stored under (reserved when the turn began;
                     none when the database was down)
    text-start       id "text-1"
    text-delta ...   the model's text as it writes
    text-end
    data-turn        {conversationId, messageId, replyId, outcome}: what was stored
    data-follow-ups  {scheduled: [...]}: follow-ups the turn scheduled, when it scheduled any
    error            errorText "<our error code>: <reason>", when the model failed (the fallback
                     text was sent and is not stored) or the turn failed after its first byte
    finish           finishReason "stop", or "error" after an error part
    [DONE]

A turn's errors before its first event (input, ownership, budget) are answered with their HTTP
status by the caller: a stream is only started once the turn has begun.

The useChat body always gets it; today's body gets it when it asks with `Accept: text/event-stream`
and the request header `x-vercel-ai-ui-message-stream: v1` (the demo page does, keeping the
voice recorder's `seconds`, which a UI file part has no place for); without that header today's
body keeps today's `delta` / `done` events (functions/message_routes.py's `sse`, which ends in an
`error` event where this stream has its `error` part), for the clients written against them.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Generator, Iterator
from typing import Any

from core.turn.request import Outcome, TurnResult
from functions.http import failed_mid_stream

UI_STREAM_HEADER = "x-vercel-ai-ui-message-stream"
HEADERS = {
    UI_STREAM_HEADER: "v1",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",  # a proxy that buffers would hold the text until the end
}
TEXT_ID = "text-1"
DONE = "data: [DONE]\n\n"


def event(chunk: dict[str, Any]) -> str:
    return f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"


def turn_events(reply_id: int | None, first: TurnResult | str, rest: Iterator[TurnResult | str]) -> Iterator[str]:
    """The UI message stream of a turn's events (`Turns.stream`: text, then the result), the
    first of them already taken (its errors are answered with their status, before any byte).

    `start` names `reply_id`, the id its reply is stored under (the stored reply's, for a
    redelivery or a resume): the SDK keeps the message under it, as the history route gives it.
    Closed early (the client went away), it closes `rest`, which counts the turn abandoned; an
    error after the first event is an `error` part."""
    try:
        yield event({"type": "start", "messageId": str(reply_id)} if reply_id is not None else {"type": "start"})
        yield event({"type": "text-start", "id": TEXT_ID})
        for item in itertools.chain([first], rest):
            if isinstance(item, TurnResult):
                yield from closing(item)
                return
            yield event({"type": "text-delta", "id": TEXT_ID, "delta": item})
    except Exception as exc:  # ours, or a bug (whose own words stay in the log)
        code, message = failed_mid_stream(exc)
        yield event({"type": "error", "errorText": f"{code}: {message}"})
        yield event({"type": "finish", "finishReason": "error"})
        yield DONE
    finally:
        if isinstance(rest, Generator):  # Turns.stream's: closing it ends the turn as abandoned
            rest.close()


def closing(result: TurnResult) -> Iterator[str]:
    yield event({"type": "text-end", "id": TEXT_ID})
    yield event({"type": "data-turn", "id": "turn", "data": turn_data(result)})
    if result.follow_ups_scheduled:
        yield event({"type": "data-follow-ups", "id": "follow-ups", "data": {"scheduled": result.follow_ups_scheduled}})
    failed = result.outcome is Outcome.FALLBACK
    if failed:
        reason = result.figures.error or "the model did not answer"
        yield event({"type": "error", "errorText": f"model_unavailable: {reason}; the message is kept, send it again"})
    if result.declined:  # declined now, or its stored answer sent again
        # The model declined the turn: the page keeps the mark on the reply and sends it back with
        # its history, which then leaves the reply and the message it answers out (ui_chat_routes.py).
        yield event({"type": "finish", "finishReason": "content-filter", "messageMetadata": {"declined": True}})
    else:
        yield event({"type": "finish", "finishReason": "error" if failed else "stop"})
    yield DONE


def turn_data(result: TurnResult) -> dict[str, Any]:
    return {
        "conversationId": str(result.conversation_id) if result.conversation_id else None,
        "messageId": result.message_id,
        "replyId": result.reply_id,
        "outcome": result.outcome.value,
    }
