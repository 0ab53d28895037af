"""A local stand-in for Anthropic's Messages API, reached through ANTHROPIC_BASE_URL.

It accepts the SDK's real requests, records them, and answers as the API does: a
message, or server-sent events when `stream` is true, with usage computed by the prompt
cache simulator. `behaviour` makes it fail: "500", "529", "slow" or "malformed";
`latency_s` (low, high) makes every answer take a random time in that range, as the real
model's does (the soak). `GET /v1/models/{id}` answers the model object for an id in
`models`, else Anthropic's 404 `not_found_error`. `stream_ends` says how each stream ended:
"whole", or "cut" when the client closed it early (a write found the connection gone).
An `answer` may return content blocks instead of a text: text blocks
and `tool_use` blocks (`tool_use(name, input)`), streamed as the API does (`input_json_delta`)
and ending with `stop_reason: tool_use`. A request whose messages hold `REFUSAL_TRIGGER` is
declined as the API declines it (`stop_reason: refusal` with its `stop_details`). A tool whose
`input_schema` draft 2020-12's meta-schema refuses is answered 400, as the API answers it.

The 2026 models (`THINKING_MODELS`: Sonnet 5.5, Haiku 5.5) behave as their pages say
(docs/research/model-changes-2026.md): every answer begins with a `thinking` block (empty at the
default display, with a signature bound to the request's prefix), a continuation must carry such
a block back unchanged (a rebuilt turn, or a block whose prefix changed, answers 400), and Sonnet
5.5 answers 400 to a forced `tool_choice` and to `thinking.type` `disabled` or `enabled`. With
`thinking: {"type": "between_tools"}` (Sonnet 5.5 only: the models' capabilities say so, and the
fake answers 400 for another model, or at effort xhigh or max, or with any other thinking field),
an answer has no up-front thinking block, and its note before a tool call comes back as a thinking
block holding the note's text.
"""

from __future__ import annotations

import functools
import hashlib
import json
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import jsonschema_rs

from bench.prompt_cache import PromptCache, count_tokens
from tests.fakes.local_server import LocalServer, QuietHandler


def echo_last_message(body: dict[str, Any]) -> str:
    last = body["messages"][-1]["content"]
    text = last if isinstance(last, str) else last[-1]["text"]
    return f"Claude heard: {text}"


Answer = str | list[dict[str, Any]]


def tool_use(name: str, arguments: dict[str, Any], id: str | None = None) -> dict[str, Any]:
    """A `tool_use` content block, as the model writes one."""
    return {
        "type": "tool_use",
        "id": id or f"toolu_{name}_{len(json.dumps(arguments))}",
        "name": name,
        "input": arguments,
    }


def text_block(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def tool_results(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The `tool_result` blocks a request ends with (none for a first request)."""
    last = body["messages"][-1]["content"]
    return [] if isinstance(last, str) else [b for b in last if b.get("type") == "tool_result"]


# Anthropic's string for testing refusal handling (its page on streaming refusals): a request whose
# messages hold it is declined, as every request is while the refused turn stays in the context.
REFUSAL_TRIGGER = (
    "ANTHROPIC_MAGIC_STRING_TRIGGER_REFUSAL_1FAEFB6177B4672DEE07F9D3AFC62588CCD2631EDCF22E8CCC1FB35B501C9C86"
)
THINKING_MODELS = frozenset({"claude-sonnet-5-5", "claude-haiku-5-5"})
FORCED_TOOL = 'tool_choice: type "tool" and "any" are not supported for this model.'
THINKING_DISABLED = (
    '"thinking.type.disabled" is not supported for this model. Use "thinking.type.between_tools" for the lowest'
    ' thinking setting, or "thinking.type.adaptive" and "output_config.effort" to control thinking behavior.'
)
BETWEEN_TOOLS_MODELS = frozenset({"claude-sonnet-5-5"})
BETWEEN_TOOLS_ONLY = "thinking.type.between_tools takes no other field"
BETWEEN_TOOLS_EFFORT = "thinking.type.between_tools is not supported at this effort; use low, medium or high"
THINKING_ENABLED = (
    '"thinking.type.enabled" is not supported for this model. Use "thinking.type.adaptive" and'
    ' "output_config.effort" to control thinking behavior.'
)


def signature(body: dict[str, Any], before: int) -> str:
    """A thinking block's signature: bound to the model, the system prompt, the tools and the
    messages before the answer it opens (index `before`)."""
    prefix = [body.get("model"), body.get("system"), body.get("tools"), body["messages"][:before]]
    return hashlib.sha256(json.dumps(prefix, sort_keys=True).encode()).hexdigest()


# The Messages API's answer (400 invalid_request_error) to a tool whose input_schema JSON Schema
# draft 2020-12's meta-schema refuses, whichever model is asked.
INVALID_SCHEMA = (
    "tools.{index}.custom.input_schema: JSON schema is invalid. It must match JSON Schema draft 2020-12 "
    "(https://json-schema.org/draft/2020-12). Learn more about tool use at "
    "https://platform.claude.com/docs/en/agents-and-tools/tool-use/overview."
)


@functools.cache
def draft_2020_12() -> jsonschema_rs.Validator:
    return jsonschema_rs.Draft202012Validator({"$ref": "https://json-schema.org/draft/2020-12/schema"})


def refusal(body: dict[str, Any]) -> str | None:
    """What the API, or a 2026 model, answers 400 to in this request, or None."""
    for index, tool in enumerate(body.get("tools") or ()):
        if "input_schema" in tool and not draft_2020_12().is_valid(tool["input_schema"]):
            return INVALID_SCHEMA.format(index=index)
    model = body.get("model")
    thinking = (body.get("thinking") or {}).get("type")
    if thinking == "between_tools":
        if model not in BETWEEN_TOOLS_MODELS:
            return f'"thinking.type.between_tools" is not supported for this model ({model})'
        if set(body["thinking"]) != {"type"}:
            return BETWEEN_TOOLS_ONLY
        if (body.get("output_config") or {}).get("effort") in ("xhigh", "max"):
            return BETWEEN_TOOLS_EFFORT
    if model not in THINKING_MODELS:
        return None
    choice = (body.get("tool_choice") or {}).get("type")
    if model == "claude-sonnet-5-5" and choice in ("any", "tool"):
        return FORCED_TOOL
    if model == "claude-sonnet-5-5" and thinking == "disabled":
        return THINKING_DISABLED
    if thinking == "enabled":
        return THINKING_ENABLED
    if thinking == "between_tools":
        return misplaced_thinking(body)
    for index, message in enumerate(body["messages"]):
        # An earlier turn is text (rebuilt from the store each time): only an answer that called a
        # tool, sent back within its turn, must be the model's own, thinking block first.
        if message["role"] != "assistant" or isinstance(message["content"], str):
            continue
        if not any(block.get("type") == "tool_use" for block in message["content"]):
            continue
        first = message["content"][0] if message["content"] else {}
        if first.get("type") != "thinking" or first.get("signature") != signature(body, index):
            return f"messages.{index}.content.0: this turn's thinking block is missing or not of this conversation"
    return None


def capabilities(model: str) -> dict[str, Any]:
    """The model object's `capabilities.thinking` (the Models API's, which the SDK reads): which
    `thinking.type` values the model takes."""
    types = {
        "adaptive": model in THINKING_MODELS,
        "between_tools": model in BETWEEN_TOOLS_MODELS,
        "disabled": model != "claude-sonnet-5-5",
        "enabled": model not in THINKING_MODELS,
    }
    support = {name: {"supported": supported} for name, supported in types.items()}
    return {"thinking": {"supported": True, "types": support}}


def misplaced_thinking(body: dict[str, Any]) -> str | None:
    """With between_tools there is no up-front block to require: each thinking block sent back must
    still be the model's own, for this conversation (its signature)."""
    for index, message in enumerate(body["messages"]):
        if message["role"] != "assistant" or isinstance(message["content"], str):
            continue
        for position, block in enumerate(message["content"]):
            if block.get("type") == "thinking" and block.get("signature") != signature(body, index):
                return f"messages.{index}.content.{position}: this thinking block is not of this conversation"
    return None


def between_tools(blocks: list[dict[str, Any]], signed: str, *, said: bool = False) -> list[dict[str, Any]]:
    """A 2026 model's answer: a note of more than a sentence or two before a tool call comes back
    as a `thinking` block, empty at the default display, holding the note with `said` (thinking
    between_tools); a short remark stays text."""
    shaped = []
    for index, block in enumerate(blocks):
        calls_next = index + 1 < len(blocks) and blocks[index + 1]["type"] == "tool_use"
        long_note = block["type"] == "text" and block["text"].count(". ") >= 2
        if calls_next and long_note:
            block = {"type": "thinking", "thinking": block["text"] if said else "", "signature": signed}
        shaped.append(block)
    return shaped


class FakeAnthropic:
    def __init__(self, answer: Callable[[dict[str, Any]], Answer] = echo_last_message) -> None:
        self.answer = answer
        self.behaviour = "ok"
        self.slow_s = 3.0
        self.latency_s = (0.0, 0.0)
        self.delta_pause_s = 0.0  # between a stream's text deltas, as a model writes
        self.first_token_s = 0.0  # from a stream's start to its first text
        # How an answer stops, when not as its blocks say (end_turn, tool_use): "refusal" (a
        # streaming classifier stopped it), "max_tokens" (a tool call's input cut halfway), or
        # None with `ends_early`: the stream ends cleanly before message_delta and message_stop.
        self.stop_reason: str | None = None
        self.ends_early = False
        self.requests: list[dict[str, Any]] = []
        self.usages: list[dict[str, int]] = []  # the usage each answer reported (a stream's at its start)
        # How each stream ended: "whole", or "cut" when the client closed it before its last event
        # (a write that found the connection gone).
        self.stream_ends: list[str] = []
        self.inputs: list[int] = []  # each request's input tokens (cached or not), in the order of `requests`
        self.headers: list[dict[str, str]] = []
        self.cache = PromptCache(min_tokens=1024)
        self.models = {"claude-sonnet-5-5": "Claude Sonnet 5.5", "claude-haiku-5-5": "Claude Haiku 5.5"}
        self._lock = threading.Lock()
        self._http = LocalServer(self._handler())
        self.url = self._http.url

    def close(self) -> None:
        self._http.close()

    def _handler(self) -> type[QuietHandler]:
        fake = self

        class Handler(QuietHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                model = self.path.removeprefix("/v1/models/")
                if self.path.startswith("/v1/models/") and model in fake.models:
                    found = {
                        "type": "model",
                        "id": model,
                        "display_name": fake.models[model],
                        "created_at": "2026-06-01T00:00:00Z",
                        "capabilities": capabilities(model),
                    }
                    return self.answer_json(200, found)
                error = {"type": "error", "error": {"type": "not_found_error", "message": f"model: {model}"}}
                self.answer_json(404, error)

            def do_POST(self) -> None:
                body = self.read_json()
                with fake._lock:
                    fake.requests.append(body)
                    fake.headers.append({k.lower(): v for k, v in self.headers.items()})
                    usage = fake.cache.request(body, time.time())
                    fake.inputs.append(usage.total)
                if self.path != "/v1/messages":
                    error = {"type": "error", "error": {"type": "not_found_error", "message": "no"}}
                    return self.answer_json(404, error)
                if fake.behaviour in ("500", "529"):
                    kind = "api_error" if fake.behaviour == "500" else "overloaded_error"
                    error = {"type": "error", "error": {"type": kind, "message": kind}}
                    # No retry from the SDK: each behaviour is one request, and the test counts them.
                    data = json.dumps(error).encode()
                    return self.answer_bytes(int(fake.behaviour), data, "application/json", {"x-should-retry": "false"})
                refused = refusal(body)
                if refused is not None:
                    error = {"type": "error", "error": {"type": "invalid_request_error", "message": refused}}
                    data = json.dumps(error).encode()
                    return self.answer_bytes(400, data, "application/json", {"x-should-retry": "false"})
                if fake.behaviour == "slow" and not body.get("stream"):
                    time.sleep(fake.slow_s)
                elif fake.latency_s[1] > 0:
                    time.sleep(random.uniform(*fake.latency_s))
                answer = fake.answer(body)
                blocks = [text_block(answer)] if isinstance(answer, str) else answer
                if REFUSAL_TRIGGER in json.dumps(body.get("messages")):
                    # As Anthropic's test string does: declined, and again while it is in the context.
                    blocks, stop = [text_block("Hello..")], "refusal"
                else:
                    stop = fake.stop_reason
                if (body.get("thinking") or {}).get("type") == "between_tools":  # no up-front thinking
                    blocks = between_tools(blocks, signature(body, len(body["messages"])), said=True)
                elif body.get("model") in THINKING_MODELS:
                    signed = signature(body, len(body["messages"]))
                    blocks = [{"type": "thinking", "thinking": "", "signature": signed}, *between_tools(blocks, signed)]
                text = "".join(b["text"] for b in blocks if b["type"] == "text")
                usage_json = {
                    "input_tokens": usage.input_tokens,
                    "cache_creation_input_tokens": usage.cache_creation_input_tokens,
                    "cache_read_input_tokens": usage.cache_read_input_tokens,
                    "output_tokens": count_tokens(text),
                }
                if fake.behaviour == "malformed":
                    return self.answer_bytes(
                        200, b'{"id": "msg_1", "type": "message", "content": [{"ty', "application/json"
                    )
                with fake._lock:
                    fake.usages.append({**usage_json, "output_tokens": 1} if body.get("stream") else usage_json)
                if body.get("stream"):
                    return self._stream(body, blocks, usage_json, stop)
                self.answer_json(200, message(body, blocks, usage_json, stop))

            def _stream(
                self, body: dict[str, Any], blocks: list[dict[str, Any]], usage: dict[str, int], stop_reason: str | None
            ) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Connection", "close")
                self.end_headers()
                start = {**message(body, [], {**usage, "output_tokens": 1}), "stop_reason": None}  # as the API's
                events: list[tuple[str, dict[str, Any]]] = [
                    ("message_start", {"type": "message_start", "message": start}),
                ]
                for index, block in enumerate(blocks):
                    if block["type"] == "thinking":  # its text (none at the default display), one signature
                        opened = {"type": "thinking", "thinking": "", "signature": ""}
                        start_event = {"type": "content_block_start", "index": index, "content_block": opened}
                        events.append(("content_block_start", start_event))
                        delta_event = {"type": "content_block_delta", "index": index}
                        if block["thinking"]:
                            thought = {"type": "thinking_delta", "thinking": block["thinking"]}
                            events.append(("content_block_delta", {**delta_event, "delta": thought}))
                        signed = {"type": "signature_delta", "signature": block["signature"]}
                        events.append(("content_block_delta", {**delta_event, "delta": signed}))
                    elif block["type"] == "tool_use":
                        opened = {**block, "input": {}}
                        events.append(
                            (
                                "content_block_start",
                                {"type": "content_block_start", "index": index, "content_block": opened},
                            )
                        )
                        written = json.dumps(block["input"])
                        if stop_reason == "max_tokens":
                            written = written[: len(written) // 2]
                        partial = {"type": "input_json_delta", "partial_json": written}
                        events.append(
                            ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": partial})
                        )
                    else:
                        opened = {"type": "text", "text": ""}
                        events.append(
                            (
                                "content_block_start",
                                {"type": "content_block_start", "index": index, "content_block": opened},
                            )
                        )
                        words = block["text"].split(" ")
                        for position, word in enumerate(words):
                            piece = word if position == len(words) - 1 else word + " "
                            delta = {"type": "text_delta", "text": piece}
                            events.append(
                                ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
                            )
                    events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
                stop = stop_reason or ("tool_use" if any(b["type"] == "tool_use" for b in blocks) else "end_turn")
                events += (
                    []
                    if fake.ends_early
                    else [
                        (
                            "message_delta",
                            {
                                "type": "message_delta",
                                "delta": {"stop_reason": stop, "stop_sequence": None, "stop_details": details(stop)},
                                "usage": {"output_tokens": usage["output_tokens"]},
                            },
                        ),
                        ("message_stop", {"type": "message_stop"}),
                    ]
                )
                ended = "whole"
                try:
                    for name, data in events:
                        self.wfile.write(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())
                        self.wfile.flush()
                        if name == "message_start" and fake.behaviour == "slow":
                            # A slow model has read the request (and says what it cost) but writes late.
                            time.sleep(fake.slow_s)
                        elif name == "message_start" and fake.first_token_s:
                            time.sleep(fake.first_token_s)
                        if name == "content_block_delta" and fake.delta_pause_s:
                            time.sleep(fake.delta_pause_s)
                except (BrokenPipeError, ConnectionResetError):
                    ended = "cut"
                with fake._lock:
                    fake.stream_ends.append(ended)
                self.close_connection = True

        return Handler


def message(
    body: dict[str, Any], blocks: list[dict[str, Any]], usage: dict[str, int], stop: str | None = None
) -> dict[str, Any]:
    return {
        "id": "msg_fake",
        "type": "message",
        "role": "assistant",
        "model": body.get("model", "claude"),
        "content": blocks,
        "stop_reason": stop or ("tool_use" if any(b["type"] == "tool_use" for b in blocks) else "end_turn"),
        "stop_sequence": None,
        "stop_details": details(stop),
        "usage": usage,
    }


def details(stop: str | None) -> dict[str, Any] | None:
    """A refusal's `stop_details`, as Anthropic's page on refusals shows it; none for another stop."""
    if stop != "refusal":
        return None
    explanation = "This request was declined because it could enable cyber harm."
    return {"type": "refusal", "category": "cyber", "explanation": explanation}
