"""The model's tools in a turn: the toolsets of the capabilities that are on, and the loop that
runs them.

A toolset (one capability's tools for one turn, core/turn/capabilities.py) gives its definitions,
runs a call, says whether the model must see a result before it can answer, and what
`finish_turn` should record. The loop knows no tool by name: it streams the model's answer,
runs the calls, and asks again with their results only when some result must be seen (or the
model said nothing yet). A call in the answer to results runs too, for up to `rounds` rounds
(TOOL_ROUNDS); past the last one the model is asked once more with `tool_choice` none, to
answer with what it has. Each request's tokens count (`Usage`, all of them together).

The definitions are the toolsets' in a fixed order: the same bytes in every turn of a
deployment, before the system prompt in the prompt cache's prefix.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from traceback import extract_tb
from typing import Any, Protocol

from core.errors import ModelUnavailable
from core.model.llm import AssistantContent, Model, ToolCall, Usage, plus
from core.turn.context import ModelMessage

log = logging.getLogger("crossmem.tools")


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
    """One turn's toolsets, how many rounds of calls it may run, and what the loop did with them."""

    def __init__(self, toolsets: Sequence[Toolset], rounds: int) -> None:
        self.toolsets = tuple(toolsets)
        self.rounds = rounds
        self.definitions = tuple(definition for toolset in self.toolsets for definition in toolset.definitions)
        self._owners = {definition["name"]: toolset for toolset in self.toolsets for definition in toolset.definitions}
        self.requests = 0  # model requests made with these tools

    def run(self, call: ToolCall) -> tuple[ToolResult, bool]:
        """The call's result, and whether the model must see it."""
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
    answers: list[dict[str, Any]] = [
        {
            "type": "tool_result",
            "tool_use_id": r.call.id,
            "content": r.content,
            **({"is_error": True} if r.is_error else {}),
        }
        for r in results
    ]
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
    for round_ in range(tools.rounds + 1):
        # Past the last round: the tools stay defined (the results before refer to them), unusable.
        last = round_ == tools.rounds
        calls: list[ToolCall] = []
        parts: list[str] = []
        latest = Usage()
        answer: AssistantContent | None = None
        tools.requests += 1
        request = model.stream(
            system,
            messages,
            deadline_s,
            notes,
            tools=tools.definitions,
            continuation=said,
            tool_choice="none" if last else "auto",
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
        if last:
            log.warning("tool calls past the last round were not run", extra={"tools": [c.name for c in calls]})
            return
        text = "".join(parts)
        ran = [tools.run(call) for call in calls]
        if text.strip() and not any(must for _, must in ran):
            return
        said = [*said, *continuation(text, [result for result, _ in ran], answer)]
        if text.strip():
            gap = "\n\n"
        if stopped():
            # Not an answer: what it wrote before its calls only led into them.
            raise ModelUnavailable("no answer within the turn's time: it ran out during a tool's call")


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
