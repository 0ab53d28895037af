"""Tools an operator adds by setting, without editing this package: the capability of the
model's tools that live elsewhere (EXTRA_TOOLS names them; functions/extra_tools.py imports
them; docs/extending.md has an example).

A tool is a Python callable that takes the model's arguments (a dict, as its schema describes
them) and returns the text the model reads. What the model is told about it sits on the callable
itself: `input_schema` (a JSON schema of an object, required), `description` (else its
docstring), `name` (else its `__name__`) and `instructions` (its part of the system prompt, when
to use it; optional). Its result always goes back to the model, cut to `RESULT_CHARS`; it records
nothing; what it raises is logged and said back to the model as not done, and the turn answers.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import math
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from core.errors import ConfigurationError
from core.model.llm import ToolCall
from core.turn.tool_loop import ToolResult, failure

if TYPE_CHECKING:
    from core.turn.capabilities import TurnState

log = logging.getLogger("crossmem.tools")

NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")  # the Messages API's rule for a tool's name
RESULT_CHARS = 8000  # what one call may add to the model's request (about 2,000 tokens)
# Of the turn's time left, what a call leaves the model to answer with its result: a call still
# running then is answered as not done, and the model answers without it.
ANSWER_AFTER_S = 3.0
# JSON Schema's types (draft 2020-12's meta-schema lists no other): said when Python's "int" or "str" is refused.
TYPES = ("array", "boolean", "integer", "null", "number", "object", "string")


@dataclass(frozen=True, eq=False)
class OperatorTool:
    name: str
    description: str
    input_schema: dict[str, Any]
    run: Callable[[dict[str, Any]], str]
    instructions: str = ""

    @property
    def definition(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "input_schema": self.input_schema}


def described(target: object, entry: str) -> OperatorTool:
    """The tool `target` describes, or a ConfigurationError naming `entry` and what it lacks."""
    if not callable(target):
        raise ConfigurationError(f"EXTRA_TOOLS: {entry} is not callable")
    if (never := never_text(target)) is not None:
        raise ConfigurationError(f"EXTRA_TOOLS: {entry} {never}")
    name = getattr(target, "name", None) or getattr(target, "__name__", "")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ConfigurationError(f"EXTRA_TOOLS: {entry}'s name must be 1 to 64 letters, digits, _ or -")
    # A partial's own docstring is functools' ("partial(func, *args, **keywords) - ..."): its function's
    # says what it does.
    documented = target.func if isinstance(target, functools.partial) else target
    description = getattr(target, "description", None) or inspect.getdoc(documented)
    if not isinstance(description, str) or not description.strip():
        raise ConfigurationError(f"EXTRA_TOOLS: {entry} needs a description (or a docstring)")
    schema = getattr(target, "input_schema", None)
    if not isinstance(schema, dict) or schema.get("type") != "object":
        raise ConfigurationError(f'EXTRA_TOOLS: {entry} needs an input_schema, a JSON schema of "type": "object"')
    if (problem := schema_problem(schema)) is not None:
        raise ConfigurationError(f"EXTRA_TOOLS: {entry}'s {problem}")
    instructions = getattr(target, "instructions", "")
    if not isinstance(instructions, str):
        raise ConfigurationError(f"EXTRA_TOOLS: {entry}'s instructions must be text")
    return OperatorTool(name, description.strip(), schema, target, instructions)


def never_text(target: Callable[..., object]) -> str | None:
    """Why calling `target` could never answer text, or None. Loaded, each would be a tool the model
    is offered and every call of which is said back as not done: a class named for its instance
    (called with the arguments, it answers a new instance or raises), an `async def` (its call
    answers a coroutine, which a tool's thread never awaits) or a generator."""
    if isinstance(target, type):
        return "is a class: name an instance of it"
    # A function, a method or a partial of one as it is; an instance by its class's __call__.
    call = target if inspect.isroutine(target) or isinstance(target, functools.partial) else type(target).__call__
    if inspect.iscoroutinefunction(call) or inspect.isasyncgenfunction(call):
        return "is async: a tool is called, never awaited, and answers its text"
    if inspect.isgeneratorfunction(call):
        return "is a generator: a tool answers its text"
    return None


def schema_problem(schema: dict[str, Any]) -> str | None:
    """What in an input_schema the turn could not send, or the Messages API would refuse in every
    request that carries it, or None. The API refuses (400 `invalid_request_error`: "JSON schema is
    invalid. It must match JSON Schema draft 2020-12") a schema its meta-schema refuses, whatever
    `$schema` it names: so this asks that meta-schema, and says its first error."""
    try:
        json.dumps(schema, allow_nan=False)
    except (TypeError, ValueError) as exc:
        return f"input_schema is not JSON ({exc})"
    for error in draft_2020_12().iter_errors(schema):
        where = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in error.instance_path)
        hint = f": JSON Schema's types are {', '.join(TYPES)}" if error.instance_path[-1:] == ["type"] else ""
        return f"input_schema{where} is refused by JSON Schema draft 2020-12: {error.message}{hint}"
    return None


@functools.cache
def draft_2020_12() -> Any:
    """A validator of schemas: draft 2020-12's meta-schema, which jsonschema_rs carries (no network)."""
    import jsonschema_rs  # only when EXTRA_TOOLS names a tool

    return jsonschema_rs.Draft202012Validator({"$ref": "https://json-schema.org/draft/2020-12/schema"})


def sendable(text: str) -> str:
    """`text` as UTF-8 can carry it: a lone surrogate (a file name decoded with surrogateescape,
    half of an emoji cut from UTF-16) becomes U+FFFD, where the model's request could not be
    encoded and the turn answered the fallback."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return text


@dataclass(frozen=True, eq=False)
class OperatorTools:
    """The capability (core/turn/capabilities.py): on when EXTRA_TOOLS names at least one tool."""

    tools: tuple[OperatorTool, ...] = ()

    @property
    def instructions(self) -> str:
        return "\n".join(tool.instructions.strip("\n") + "\n" for tool in self.tools if tool.instructions.strip())

    @functools.cached_property
    def definitions(self) -> tuple[dict[str, Any], ...]:
        return tuple(tool.definition for tool in self.tools)  # built once: the same bytes every turn

    def toolset(self, turn: TurnState) -> OperatorToolset | None:
        return OperatorToolset(self.tools, self.definitions, turn.time_left) if self.tools else None


class OperatorToolset:
    """One turn's operator tools: each call runs the callable, its text goes back to the model."""

    round_trips = 0  # none of ours: what the tool does is its own

    def __init__(
        self,
        tools: tuple[OperatorTool, ...],
        definitions: tuple[dict[str, Any], ...],
        time_left: Callable[[], float] = lambda: math.inf,
    ) -> None:
        self.definitions = definitions
        self._tools = {tool.name: tool for tool in tools}
        self._time_left = time_left

    def run(self, call: ToolCall) -> ToolResult:
        tool = self._tools[call.name]  # the toolbox only hands this toolset its own tools' calls
        wait_s = self._time_left() - ANSWER_AFTER_S
        if wait_s <= 0:  # too late to wait for it: not started, so never done behind the model's back
            log.error("an operator's tool was not run: the turn's time is up", extra={"tool": call.name})
            return ToolResult(call, f"Not done: no time was left to run {call.name}. Answer without it.", is_error=True)
        outcome: list[object] = []
        failed: list[BaseException] = []

        def run() -> None:
            try:
                outcome.append(tool.run(dict(call.input)))
            # An operator's code: whatever it raises, the turn still answers. BaseException too
            # (asyncio's CancelledError, a library's sys.exit): uncaught, it ended the thread and
            # Python printed it whole on stderr, its message with it.
            except BaseException as exc:
                failed.append(exc)

        # On a thread of its own, waited for while the model still has time to answer after it: a
        # call that hangs is left there, and the turn answers without it (its thread ends with the
        # call, or with the instance).
        worker = threading.Thread(target=run, name=f"tool {call.name}", daemon=True)
        worker.start()
        worker.join(timeout=wait_s)
        if worker.is_alive():
            log.error("an operator's tool did not answer in time", extra={"tool": call.name})
            unknown = f"{call.name} did not answer in time: it may or may not have been done. Answer without it."
            return ToolResult(call, unknown, is_error=True)
        if failed:
            log.error("an operator's tool failed", extra={"tool": call.name, **failure(failed[0])})
            return ToolResult(call, f"Not done: {call.name} failed. Answer without it.", is_error=True)
        [text] = outcome
        if not isinstance(text, str):
            log.error("an operator's tool answered no text", extra={"tool": call.name, "type": type(text).__name__})
            return ToolResult(call, f"Not done: {call.name} answered no text. Answer without it.", is_error=True)
        return ToolResult(call, sendable(text if len(text) <= RESULT_CHARS else text[: RESULT_CHARS - 1] + "…"))

    def must_answer(self, result: ToolResult) -> bool:
        return True  # what the tool found is for the model to read

    def recorded(self) -> dict[str, Any]:
        return {}
