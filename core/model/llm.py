"""The model: a small protocol, and Claude through the anthropic SDK (imported only here).

The SDK is imported on the first model call, not before: importing it costs about a
second of cold start, and a Telegram update that never reaches the model should not pay.

Prompt caching: three breakpoints (Anthropic allows four). One after the system prompt,
which holds for everyone and across the window's steps; one after the person's memory
notes, their own block after it, which change only when a digest rewrites them; one on
the last message, so the next turn, which repeats this request and adds two messages,
reads everything up to here from the cache. A turn thus pays for the notes at the cache
read price, and a write only after they change.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from core.errors import ConfigurationError, ModelDeclined, ModelUnavailable
from core.model.prompt import NOTES_PREAMBLE
from core.turn.context import ModelMessage

log = logging.getLogger("crossmem.model")
CACHE = {"type": "ephemeral"}
# Stop reasons of an answer the model did not finish: its last block may be cut (a tool call's
# input among them, which the SDK parses as far as it goes: {"id": 12} for booking 123).
CUT_SHORT = frozenset({"max_tokens", "model_context_window_exceeded"})
ToolChoice = Literal["auto", "none"]  # never a forced tool: the current models refuse it
# `thinking` of a turn's requests (ANTHROPIC_THINKING): "between_tools", no up-front thinking and
# a note written before a tool call comes back with its text (Sonnet 5.5); "adaptive", the
# models' default (the field left out), whose notes before a tool call come back empty.
Thinking = Literal["between_tools", "adaptive"]


@dataclass(frozen=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0


def approximate_tokens(text: str) -> int:
    """About four characters a token in the Latin alphabet, one a CJK character (Claude's tokenizer
    is not public; its ratios are). Counted as characters alone, a Japanese or Chinese text was a
    quarter of what it costs, in the budget's reservations, the tool loop's count and the search
    results' cut (turn.sql's turn_input_tokens counts the same)."""
    return token_eighths(text) // 8


def token_eighths(text: str) -> int:
    """`approximate_tokens` in eighths of a token: 3 a UTF-8 byte less 1 a character, which is 2 a
    character of one byte (a quarter token) and 8 a character of three (a token)."""
    if text.isascii():  # nearly every text: no encoding to count
        return 2 * len(text)
    return 3 * len(text.encode()) - len(text)


@dataclass(frozen=True)
class ToolCall:
    """A `tool_use` block of the model's answer: which tool, with what input, under which id
    (the `tool_result` that answers it names it)."""

    id: str
    name: str
    input: dict[str, Any]


@dataclass(frozen=True)
class AssistantContent:
    """An answer's content blocks exactly as the API returned them (thinking blocks with their
    signatures, text, tool calls): what a tool loop sends back, unchanged, with the results.
    Current models refuse a rebuilt turn, or lose its thinking (docs/research/model-changes-2026.md)."""

    blocks: tuple[dict[str, Any], ...]


@dataclass(frozen=True)
class Listed:
    """A model as the Models API lists it: its name for people, and the `thinking.type` values it
    takes (None when the listing does not say)."""

    display_name: str
    thinking: frozenset[str] | None


def plus(spent: Usage, more: Usage) -> Usage:
    """What two requests of one turn spent together."""
    return Usage(
        spent.input_tokens + more.input_tokens,
        spent.output_tokens + more.output_tokens,
        spent.cache_creation_input_tokens + more.cache_creation_input_tokens,
        spent.cache_read_input_tokens + more.cache_read_input_tokens,
    )


@dataclass(frozen=True)
class ModelReply:
    text: str
    usage: Usage
    cut: bool = False  # stopped by max_tokens (or the context window): the text is only its start


class Model(Protocol):
    name: str

    def reply(self, system: str, messages: Sequence[ModelMessage], timeout_s: float, notes: str = "") -> ModelReply: ...

    def stream(
        self,
        system: str,
        messages: Sequence[ModelMessage],
        timeout_s: float,
        notes: str = "",
        *,
        tools: Sequence[dict[str, Any]] = (),
        continuation: Sequence[dict[str, Any]] = (),
        tool_choice: ToolChoice = "auto",
    ) -> Iterator[str | Usage | ToolCall | AssistantContent]:
        """Text as it is written, and `Usage` as the model reports it: what it has spent so
        far each time (the input when it starts, everything at the end), so a stream that is
        stopped part-way still knows what it cost. With `tools`, the model may also call them:
        each `tool_use` block comes as a `ToolCall` at the end, then the whole answer as an
        `AssistantContent` (a model that has none leaves it out: the loop then rebuilds the
        turn from the text and the calls). `continuation`: raw messages after the context (the
        model's answers and the tools' results), for the request that answers them;
        `tool_choice` "none": the tools stay defined but the model must answer in text."""
        ...


def messages_request(
    model: str,
    max_tokens: int,
    system: str,
    messages: Sequence[ModelMessage],
    notes: str = "",
    *,
    cached: bool = True,
    effort: str | None = None,
    thinking: Thinking = "adaptive",
    tools: Sequence[dict[str, Any]] = (),
    continuation: Sequence[dict[str, Any]] = (),
    tool_choice: ToolChoice = "auto",
) -> dict[str, Any]:
    """The Messages API request body for a context, with its cache breakpoints: after the
    system prompt, after the person's notes (when there are any), on the last message.

    Nothing the current models refuse with a 400: no sampling parameters, no thinking budget
    and no `thinking: disabled` (adaptive thinking is their default), no assistant prefill (the
    context ends with the person's message), no forced tool choice (`tools` go with the default
    `auto`, or `none` once a turn's tool rounds are spent; `continuation` follows the context: the
    model's tool calls and their results). `effort` goes out as `output_config.effort` only when
    given; `thinking` only when not the default (adaptive)."""
    marker = {"cache_control": CACHE} if cached else {}
    system_blocks: list[dict[str, Any]] = [{"type": "text", "text": system, **marker}]
    if notes.strip():
        system_blocks.append({"type": "text", "text": NOTES_PREAMBLE + notes.strip(), **marker})
    body: list[dict[str, Any]] = []
    # A message with images or a PDF is never repeated (later turns read its description), so
    # the breakpoint goes on the message before it: the write premium is not paid on the image.
    last = len(messages) - 1
    if messages and messages[-1].attachments:
        last -= 1
    for index, message in enumerate(messages):
        block: dict[str, Any] = {"type": "text", "text": message.content}
        if index == last:
            block.update(marker)
        attached = [attachment.block() for attachment in message.attachments]
        body.append({"role": message.role.value, "content": [*attached, block]})
    body.extend(continuation)
    request: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "system": system_blocks, "messages": body}
    if tools:
        # Before the system prompt in the cache's order (tools, system, messages): the system
        # prompt's breakpoint caches them with it, one prefix, the same in every turn.
        request["tools"] = list(tools)
        if tool_choice != "auto":
            request["tool_choice"] = {"type": tool_choice}
    if effort is not None:
        request["output_config"] = {"effort": effort}
    if thinking != "adaptive":
        request["thinking"] = {"type": thinking}
    return request


def _usage(raw: Any) -> Usage:
    return Usage(
        input_tokens=int(getattr(raw, "input_tokens", 0) or 0),
        output_tokens=int(getattr(raw, "output_tokens", 0) or 0),
        cache_creation_input_tokens=int(getattr(raw, "cache_creation_input_tokens", 0) or 0),
        cache_read_input_tokens=int(getattr(raw, "cache_read_input_tokens", 0) or 0),
    )


def _check_stop(stop_reason: str | None, tools: list[str], stop_details: Any) -> None:
    """ModelUnavailable for an answer that is not one (docs/design.md, failure policy): a stream
    that ended before the model said why it stopped, a refusal (ModelDeclined: a safety classifier
    stopped it, and its text so far is not an answer), or a tool call the model was cut off
    writing (never run)."""
    if stop_reason is None:
        raise ModelUnavailable("the model's answer ended before its end")
    if stop_reason == "refusal":
        category = getattr(stop_details, "category", None)
        raise ModelDeclined(str(category) if category else None)
    if stop_reason in CUT_SHORT and tools:
        log.warning("an answer cut inside a tool call; no call of it runs", extra={"tools": tools})
        raise ModelUnavailable(f"the model's answer was cut inside a tool call ({stop_reason})")


def _unavailable(exc: Exception) -> ModelUnavailable:
    """The SDK's failures, mapped at its boundary: a status, a timeout, or an unusable answer."""
    import anthropic

    if isinstance(exc, anthropic.APIStatusError):
        return ModelUnavailable(f"the model answered {exc.status_code}")
    if isinstance(exc, anthropic.APITimeoutError) or "Timeout" in type(exc).__name__:
        return ModelUnavailable("the model timed out")
    return ModelUnavailable(f"the model's answer was unusable: {type(exc).__name__}")


class AnthropicModel:
    def __init__(
        self,
        *,
        api_key: str,
        model: str,
        max_tokens: int,
        base_url: str | None = None,
        timeout_s: float = 30.0,
        max_retries: int = 2,
        cached: bool = True,
        effort: str | None = None,
        thinking: Thinking = "adaptive",
    ) -> None:
        """`cached=False` for a request that is never repeated (the digest's): a cache
        write would cost 1.25x for nothing."""
        self.name = model
        self._cached = cached
        self._effort = effort
        self._thinking = thinking
        self._api_key = api_key
        self._max_tokens = max_tokens
        self._base_url = base_url
        self._timeout_s = timeout_s
        self._max_retries = max_retries
        self._client: Any = None
        self._lock = threading.Lock()

    def reply(self, system: str, messages: Sequence[ModelMessage], timeout_s: float, notes: str = "") -> ModelReply:
        import anthropic

        request = self._request(system, messages, notes)
        try:
            response = self._sdk(timeout_s).messages.create(**request)
            text = "".join(block.text for block in response.content if getattr(block, "type", "") == "text")
            usage = _usage(response.usage)
        except (anthropic.APIError, ValueError, AttributeError, TypeError) as exc:
            raise _unavailable(exc) from exc
        try:
            _check_stop(response.stop_reason, [], response.stop_details)
            if not text.strip():
                raise ModelUnavailable("the model answered with no text")
        except ModelUnavailable as exc:
            exc.usage = usage  # it read and wrote all the same: the caller counts it
            raise
        return ModelReply(text, usage, cut=response.stop_reason in CUT_SHORT)

    def stream(
        self,
        system: str,
        messages: Sequence[ModelMessage],
        timeout_s: float,
        notes: str = "",
        *,
        tools: Sequence[dict[str, Any]] = (),
        continuation: Sequence[dict[str, Any]] = (),
        tool_choice: ToolChoice = "auto",
    ) -> Iterator[str | Usage | ToolCall | AssistantContent]:
        request = self._request(
            system, messages, notes, tools=tools, continuation=continuation, tool_choice=tool_choice
        )
        try:
            with self._sdk(timeout_s).messages.stream(**request) as stream:
                said = False
                # With between_tools, a thinking block is a note the model wrote before a tool call
                # (a progress update), said when the call comes next; with adaptive thinking it is
                # reasoning, never said (and empty at the default display).
                notes_said = self._thinking == "between_tools"
                note = ""
                for event in stream:
                    if event.type == "message_start":
                        yield _usage(event.message.usage)
                    elif event.type == "text":
                        said = True
                        yield event.text
                    elif event.type == "content_block_stop" and event.content_block.type == "thinking":
                        note = event.content_block.thinking.strip() if notes_said else ""
                    elif event.type == "content_block_start":
                        if note and event.content_block.type == "tool_use":
                            yield ("\n\n" if said else "") + note
                            said = True
                        note = ""
                final = stream.get_final_message()
                yield _usage(final.usage)  # what it wrote counts, whatever it was
                calls = [block for block in final.content if getattr(block, "type", "") == "tool_use"]
                _check_stop(final.stop_reason, [str(block.name) for block in calls], final.stop_details)
                for block in calls:
                    yield ToolCall(str(block.id), str(block.name), dict(block.input or {}))
                if calls:
                    yield AssistantContent(tuple(block.model_dump(exclude_none=True) for block in final.content))
        except ModelUnavailable:
            raise
        # A stream that never started (a JSON body instead of events) fails the SDK's own assertion;
        # one that stalls mid-way raises its HTTP client's timeout, which the SDK does not wrap.
        except Exception as exc:
            raise _unavailable(exc) from exc

    def _request(self, system: str, messages: Sequence[ModelMessage], notes: str, **tools: Any) -> dict[str, Any]:
        """This model's request body, with its settings (`tools`: messages_request's tool arguments)."""
        return messages_request(
            self.name,
            self._max_tokens,
            system,
            messages,
            notes,
            cached=self._cached,
            effort=self._effort,
            thinking=self._thinking,
            **tools,
        )

    def listed(self) -> Listed | None:
        """This model as the key sees it (`GET /v1/models/{id}`: `crossmem doctor`), None when it
        is not available to the key. Raises ConfigurationError (the status: our key, no caller's
        fault) when the key is refused, ModelUnavailable (the error's type) when Anthropic does not
        answer."""
        import anthropic

        try:
            found = self._sdk(self._timeout_s).models.retrieve(self.name)
        except anthropic.NotFoundError:
            return None
        except (anthropic.AuthenticationError, anthropic.PermissionDeniedError) as exc:
            raise ConfigurationError(str(exc.status_code)) from None
        except anthropic.APIError as exc:
            raise ModelUnavailable(type(exc).__name__) from None
        types = getattr(getattr(found.capabilities, "thinking", None), "types", None)
        if types is None:
            return Listed(str(found.display_name), None)
        taken = frozenset(name for name, support in types if getattr(support, "supported", False))
        return Listed(str(found.display_name), taken)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()

    def _sdk(self, timeout_s: float) -> Any:
        with self._lock:
            if self._client is None:
                import anthropic

                self._client = anthropic.Anthropic(
                    api_key=self._api_key,
                    base_url=self._base_url,
                    timeout=self._timeout_s,
                    max_retries=self._max_retries,
                )
        return self._client.with_options(timeout=min(timeout_s, self._timeout_s))
