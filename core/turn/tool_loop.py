"""The model's tools in a turn: the toolsets of the capabilities that are on, and the loop that
runs them.

A toolset (one capability's tools for one turn, core/turn/capabilities.py) gives its definitions,
runs a call, says whether the model must see a result before it can answer, and what
`finish_turn` should record. The loop knows no tool by name: it streams the model's answer,
runs the calls, and asks again with their results only when some result must be seen (or the
model said nothing yet). A call in the answer to results runs too, for up to `rounds` rounds
(TOOL_ROUNDS); past the last one the model is asked once more with `tool_choice` none, to
answer with what it has. Each request's tokens count (`Usage`, all of them together).

Within the turn's reservation (TOKENS_PER_DAY, `Toolbox.ceiling`): a request after tool results
reads the last one's input again, with the model's answer and the results, so before each the loop
counts what it will read at most. It asks with tools only while what is left of the reservation
holds that request twice (the request, and an answer after it that reads as much); else it asks
for the answer (`tool_choice` none), the round's results cut to what fits; when not even the cut
results fit (an answer that wrote nearly its whole `max_tokens` before its calls), the last request
is asked again without tools, which the rule kept room for.

The definitions are the toolsets' in a fixed order: the same bytes in every turn of a
deployment, before the system prompt in the prompt cache's prefix.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from traceback import extract_tb
from typing import Any, Protocol

from core.errors import ModelUnavailable
from core.model.llm import AssistantContent, Model, ToolCall, ToolChoice, Usage, approximate_tokens, plus
from core.turn.context import ModelMessage

log = logging.getLogger("crossmem.tools")
# What ends a tool result cut to fit the turn's reservation, so the model knows there was more.
CUT = " [cut: no room left in this turn]"


@dataclass(frozen=True)
class ToolResult:
    call: ToolCall
    content: str
    is_error: bool = False


class Toolset(Protocol):
    definitions: tuple[dict[str, Any], ...]
    round_trips: int  # database round trips its calls made in this turn

    def run(self, call: ToolCall) -> ToolResult: ...

    def must_answer(self, result: ToolResult) -> bool:
        """Whether the model must see this result to answer (a list, a search), not only record it."""
        ...

    def recorded(self) -> dict[str, Any]:
        """What finish_turn records for this toolset: its keyword arguments (empty when nothing)."""
        ...


class Toolbox:
    """One turn's toolsets, how many rounds of calls it may run, and what the loop did with them.
    `ceiling`: the tokens its requests may spend together, read and written (what the turn
    reserved of TOKENS_PER_DAY for them; 0: no ceiling); `reply_tokens`: the most a request writes
    (ANTHROPIC_MAX_TOKENS)."""

    def __init__(self, toolsets: Sequence[Toolset], rounds: int, ceiling: int = 0, reply_tokens: int = 0) -> None:
        self.toolsets = tuple(toolsets)
        self.rounds = rounds
        self.ceiling = ceiling
        self.reply_tokens = reply_tokens
        self.definitions = tuple(definition for toolset in self.toolsets for definition in toolset.definitions)
        # What a toolset found the model must know before it answers, whether or not it calls a tool
        # (the follow-ups' BROWSER_CLOCK): after the system prompt (capabilities.prompt_for).
        self.just_now = "".join(str(getattr(toolset, "just_now", "")) for toolset in self.toolsets)
        self._owners = {definition["name"]: toolset for toolset in self.toolsets for definition in toolset.definitions}
        self.requests = 0  # model requests made with these tools
        self.calls = 0  # calls run, and of them the ones said back as not done
        self.errors = 0

    def run(self, call: ToolCall) -> tuple[ToolResult, bool]:
        """The call's result, and whether the model must see it."""
        result, must = self._run(call)
        self.calls += 1
        self.errors += result.is_error
        return result, must

    def _run(self, call: ToolCall) -> tuple[ToolResult, bool]:
        owner = self._owners.get(call.name)
        if owner is None:
            return ToolResult(call, f"Not done: there is no tool {call.name!r}.", is_error=True), True
        try:
            result = owner.run(call)
        except Exception as exc:  # a failure of ours in a tool: the model is told, and the turn still answers
            log.error("tool failed", extra={"tool": call.name, **failure(exc)})
            failed = "Not done: the tool failed. Answer without it, and tell the person you could not do this now."
            return ToolResult(call, failed, is_error=True), True
        return result, result.is_error or owner.must_answer(result)

    @property
    def round_trips(self) -> int:
        return sum(toolset.round_trips for toolset in self.toolsets)

    def recorded(self) -> dict[str, Any]:
        merged: dict[str, Any] = {}
        for toolset in self.toolsets:
            merged.update(toolset.recorded())
        return merged


def continuation(
    text: str, results: Sequence[ToolResult], answer: AssistantContent | None = None
) -> list[dict[str, Any]]:
    """The model's answer with its tool calls, and their results: what the next request adds.
    The answer goes back as the model gave it (`answer`), else rebuilt from its text and calls."""
    answers = result_blocks(results)
    if answer is not None:
        return [{"role": "assistant", "content": list(answer.blocks)}, {"role": "user", "content": answers}]
    said: list[dict[str, Any]] = [{"type": "text", "text": text}] if text.strip() else []
    calls = [{"type": "tool_use", "id": r.call.id, "name": r.call.name, "input": r.call.input} for r in results]
    return [{"role": "assistant", "content": said + calls}, {"role": "user", "content": answers}]


def answered(
    model: Model,
    system: str,
    messages: Sequence[ModelMessage],
    deadline_s: float,
    notes: str,
    tools: Toolbox | None,
    stopped: Callable[[], bool] = lambda: False,
) -> Iterator[str | Usage]:
    """The model's answer as text and `Usage` (all its requests' together, as each reports it).
    With `tools`, its calls run, and their results go back while the model needs them, for at
    most `tools.rounds` rounds; then it answers without tools. Once `stopped` (the turn's time ran
    out while a tool ran), no request more: ModelUnavailable."""
    if tools is None:
        only = model.stream(system, messages, deadline_s, notes)
        try:
            for chunk in only:
                if isinstance(chunk, str | Usage):  # no tool calls without tools
                    yield chunk
        finally:
            close(only)
        return
    spent = Usage()  # what the requests before this one spent
    said: list[dict[str, Any]] = []
    gap = ""
    rounds_left = tools.rounds
    # Past the last round: the tools stay defined (the results before refer to them), unusable.
    choice: ToolChoice = "auto" if rounds_left else "none"
    while True:
        calls: list[ToolCall] = []
        parts: list[str] = []
        latest = Usage()
        answer: AssistantContent | None = None
        tools.requests += 1
        request = model.stream(
            system, messages, deadline_s, notes, tools=tools.definitions, continuation=said, tool_choice=choice
        )
        try:
            for chunk in request:
                if isinstance(chunk, ToolCall):
                    calls.append(chunk)
                elif isinstance(chunk, AssistantContent):
                    answer = chunk
                elif isinstance(chunk, Usage):
                    latest = chunk
                    yield plus(spent, chunk)
                elif chunk:
                    yield gap + chunk
                    gap = ""
                    parts.append(chunk)
        finally:
            close(request)
        spent = plus(spent, latest)
        if not calls:
            return
        if choice == "none":
            log.warning("tool calls past the last round were not run", extra={"tools": [c.name for c in calls]})
            return
        text = "".join(parts)
        ran = [tools.run(call) for call in calls]
        if text.strip() and not any(must for _, must in ran):
            return
        rounds_left -= 1
        said, choice = next_request(
            tools, said, text, [result for result, _ in ran], answer, latest, spent, rounds_left
        )
        if text.strip():
            gap = "\n\n"
        if stopped():
            # Not an answer: what it wrote before its calls only led into them.
            raise ModelUnavailable("no answer within the turn's time: it ran out during a tool's call")


def next_request(
    tools: Toolbox,
    said: list[dict[str, Any]],
    text: str,
    results: Sequence[ToolResult],
    answer: AssistantContent | None,
    latest: Usage,
    spent: Usage,
    rounds_left: int,
) -> tuple[list[dict[str, Any]], ToolChoice]:
    """What the request after a round of calls carries, and whether it may call tools: the round's
    answer and results, with tools while rounds are left. Within `tools.ceiling` (the module's
    docstring): `latest` is what the round's request read and wrote, `spent` what every request
    has."""
    whole = [*said, *continuation(text, results, answer)]
    if not tools.ceiling:
        return whole, "auto" if rounds_left else "none"
    left = tools.ceiling - total_tokens(spent)
    answered = whole[-2]["content"]  # the model's answer, read again after its input
    reads = total_tokens(latest) - latest.output_tokens + max(latest.output_tokens, tokens_of(answered))
    if rounds_left and 2 * (reads + result_tokens(results) + tools.reply_tokens) <= left:
        return whole, "auto"
    fitting = cut_to(results, left - reads - tools.reply_tokens)
    if fitting is None:
        log.warning("a round's calls left no room in the turn's reservation; its last request is asked again")
        return said, "none"
    return [*said, *continuation(text, fitting, answer)], "none"


def cut_to(results: Sequence[ToolResult], tokens: int) -> list[ToolResult] | None:
    """The results within `tokens` as a request reads them: in order, whole while they fit, then cut
    (ending with CUT); None when not even each one's CUT fits."""
    least = [replace(result, content=CUT) for result in results]
    left = tokens - result_tokens(least)
    if left < 0:
        return None
    fitting: list[ToolResult] = []
    for result, short in zip(results, least, strict=True):
        floor = result_tokens([short])

        def beyond(content: str, result: ToolResult = result, floor: int = floor) -> int:
            return result_tokens([replace(result, content=content)]) - floor

        if beyond(result.content) <= left:
            fitting.append(result)
            left -= max(beyond(result.content), 0)
            continue
        low, high = 0, len(result.content)  # the longest beginning that fits, with CUT after it
        while low < high:
            middle = (low + high + 1) // 2
            low, high = (middle, high) if beyond(result.content[:middle] + CUT) <= left else (low, middle - 1)
        fitting.append(replace(result, content=result.content[:low] + CUT))
        left -= beyond(result.content[:low] + CUT)
    return fitting


def result_blocks(results: Sequence[ToolResult]) -> list[dict[str, Any]]:
    """The `tool_result` blocks that answer a round's calls."""
    return [
        {
            "type": "tool_result",
            "tool_use_id": r.call.id,
            "content": r.content,
            **({"is_error": True} if r.is_error else {}),
        }
        for r in results
    ]


def tokens_of(blocks: Sequence[dict[str, Any]]) -> int:
    """Content blocks' tokens as a request reads them, at most: each block's JSON, about four
    characters a token (the fake Anthropic server counts a tool call and a result so). Its
    characters as the model reads them: an "é" is one, not the six of its escape (`\\u00e9`)."""
    return sum(approximate_tokens(json.dumps(block, default=str, ensure_ascii=False)) for block in blocks)


def result_tokens(results: Sequence[ToolResult]) -> int:
    return tokens_of(result_blocks(results))


def total_tokens(usage: Usage) -> int:
    """A request's tokens, read and written."""
    return usage.input_tokens + usage.output_tokens + usage.cache_creation_input_tokens + usage.cache_read_input_tokens


def failure(exc: BaseException) -> dict[str, Any]:
    """A tool's failure as a log line tells it: its type and where it was raised (the file, line and
    function of its last frames), never its message, which may hold the person's words."""
    where = [
        f"{frame.filename.rsplit('/', 1)[-1]}:{frame.lineno} {frame.name}"
        for frame in extract_tb(exc.__traceback__)[-4:]
    ]
    return {"error": type(exc).__name__, "where": where}


def close(chunks: object) -> None:
    """Stop reading (and paying for) a model's stream."""
    stop = getattr(chunks, "close", None)
    if stop is not None:
        stop()
