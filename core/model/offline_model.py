"""`OfflineModel`: the stand-in used when no ANTHROPIC_API_KEY is set (and by `make dev`).

No network and no randomness. Its answer shows the memory at work: how many earlier
messages it sees, from which surfaces, and one line the person said on each app; asked "what did
I tell you about X?", it searches the memory for X (the search_memory tool) and answers from
what it found.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from typing import Any

from core.model.llm import AssistantContent, ModelReply, ToolCall, ToolChoice, Usage
from core.models import Role
from core.turn.context import ModelMessage

# "remind me in 5 minutes to stretch": what the stand-in schedules through the follow-up tool.
REMIND = re.compile(r"remind me in (\d{1,6}) (?:minute|minutes|min|mins) (?:to |that |about )?(.+)", re.IGNORECASE)
# "what did I tell you about the dentist?", "¿qué te dije sobre el presupuesto?": a search for X.
RECALL = re.compile(
    r"(?:what did i (?:tell|say to) you|what did i say|qu[eé] te dije|qu[eé] dije)"
    r" (?:about|of|sobre|de) (.+?)[?.!]*$",  # not "on": "what did I tell you on my other apps?" asks where
    re.IGNORECASE,
)


def _quote(text: str, limit: int = 160) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


class OfflineModel:
    name = "offline-stand-in"

    def reply(self, system: str, messages: Sequence[ModelMessage], timeout_s: float, notes: str = "") -> ModelReply:
        text = self.compose(messages, notes)
        return ModelReply(
            text, Usage(input_tokens=sum(len(m.content) for m in messages) // 4, output_tokens=len(text) // 4)
        )

    def stream(
        self,
        system: str,
        messages: Sequence[ModelMessage],
        timeout_s: float,
        notes: str = "",
        *,
        tools: Sequence[dict[str, Any]] = (),
        continuation: Sequence[dict[str, Any]] = (),
        tool_choice: ToolChoice = "auto",  # "none" comes only after results, which it never answers with a call
    ) -> Iterator[str | Usage | ToolCall | AssistantContent]:
        last = messages[-1].sources[-1].text if messages and messages[-1].sources else ""
        asked = REMIND.search(last)
        if continuation:  # the results of its own tool call: say what they were
            results = [b for b in continuation[-1]["content"] if b.get("type") == "tool_result"]
            said = " ".join(str(r["content"]) for r in results)
            recall = RECALL.search(last.strip())
            if recall is not None and said.startswith("Nothing found"):
                # The search leaves out what the turn already shows: the answer may be right here.
                said = self.seen(messages, recall[1]) or said
            yield "(Offline stand-in model.) " + said
            yield Usage(input_tokens=sum(len(m.content) for m in messages) // 4, output_tokens=10)
            return
        recall = RECALL.search(last.strip())
        if recall is not None and any(tool["name"] == "search_memory" for tool in tools):
            topic = recall[1].strip()
            yield ToolCall("offline-search-1", "search_memory", {"query": topic})
            yield Usage(input_tokens=sum(len(m.content) for m in messages) // 4, output_tokens=10)
            return
        if asked is not None and any(tool["name"] == "schedule_follow_up" for tool in tools):
            minutes, what = int(asked[1]), asked[2].strip().rstrip(".!")
            yield f"(Offline stand-in model.) I will remind you in {minutes} minute{'s' if minutes != 1 else ''}."
            yield ToolCall("offline-1", "schedule_follow_up", {"in_minutes": minutes, "content": f"Reminder: {what}."})
            yield Usage(input_tokens=sum(len(m.content) for m in messages) // 4, output_tokens=20)
            return
        reply = self.reply(system, messages, timeout_s, notes)
        words = reply.text.split(" ")
        for index, word in enumerate(words):
            yield word if index == len(words) - 1 else word + " "
        yield reply.usage

    @staticmethod
    def seen(messages: Sequence[ModelMessage], topic: str) -> str | None:
        """The latest earlier thing the person said that shares a word with `topic`, as an answer."""
        words = {word for word in re.findall(r"\w{4,}", topic.lower())}
        earlier = [(m.role, source) for m in messages for source in m.sources][:-1]
        for role, source in reversed(earlier):
            if role is Role.USER and words & set(re.findall(r"\w{4,}", source.text.lower())):
                return f'You told me on {source.surface.value}: "{_quote(source.text)}".'
        return None

    @staticmethod
    def compose(messages: Sequence[ModelMessage], notes: str = "") -> str:
        sources = [(message.role, source) for message in messages for source in message.sources]
        if not sources:
            return "(Offline stand-in model, no ANTHROPIC_API_KEY set.) I received nothing to answer."
        _, current = sources[-1]
        earlier = sources[:-1]
        surfaces = sorted({source.surface.value for _, source in earlier})
        lines = [
            "(Offline stand-in model: no ANTHROPIC_API_KEY is set, so this answer is generated locally.)",
            f'You said on {current.surface.value}: "{_quote(current.text)}".',
        ]
        if earlier:
            lines.append(
                f"I can see {len(earlier)} earlier message{'s' if len(earlier) != 1 else ''} in our thread,"
                f" from {', '.join(surfaces)}."
            )
        else:
            lines.append("I see no earlier messages in our thread yet.")
        # One line from each app it saw the person write on (the latest there), so "what did I
        # tell you today?" shows the thread is one across them.
        latest_on: dict[str, str] = {}
        for role, source in earlier:
            if role is Role.USER and source.surface is not current.surface:
                latest_on[source.surface.value] = source.text
        for surface in sorted(latest_on):
            lines.append(f'You told me on {surface}: "{_quote(latest_on[surface])}".')
        remembered = [line for line in notes.splitlines() if line.strip()]
        if remembered:
            lines.append(
                f"From before that, my notes hold {len(remembered)} line{'s' if len(remembered) != 1 else ''},"
                f' the latest: "{_quote(remembered[-1].lstrip("- "))}".'
            )
        return " ".join(lines)
