"""Splitting a long reply into messages a surface accepts (Telegram 4096, WhatsApp 1600), and
packing short texts into as few of them as they fit.

Cut at the last paragraph break that fits, else the last sentence end, else the last
space; a single word longer than the limit is the only thing ever cut inside.
"""

from __future__ import annotations

import re

_SENTENCE_END = re.compile(r"[.!?…。！？][\"')\]»”’]*\s+")
# A message's later part that fails for a reason that may pass is tried again after these waits,
# sooner than what a failure leads to (a redelivery, the scheduled job), which sends from that part
# (a stored reply's `unsent_from`). (A part the service took but answered after our timeout is sent
# twice by a retry: the one part the person may read twice.)
LATER_PART_WAITS_S = (1.0, 2.0)


def split_message(text: str, limit: int, *, at_paragraphs: bool = True) -> list[str]:
    """`text` in parts of at most `limit` characters; `at_paragraphs=False` cuts at the last
    sentence end even when a paragraph ends earlier: fewer parts, for a text that must fit a few."""
    parts: list[str] = []
    rest = text.strip()
    while len(rest) > limit:
        window = rest[: limit + 1]
        cut = window.rfind("\n\n") if at_paragraphs else -1
        if cut <= 0:
            ends = [match.end() for match in _SENTENCE_END.finditer(window) if match.end() <= limit]
            cut = ends[-1] if ends else -1
        if cut <= 0:
            cut = max(window.rfind(" "), window.rfind("\n"))
        if cut <= 0:
            cut = limit
        parts.append(rest[:cut].rstrip())
        rest = rest[cut:].lstrip()
    if rest:
        parts.append(rest)
    return parts


def packed(texts: list[str], limit: int) -> list[str]:
    """`texts` in order, in as few messages of at most `limit` characters as they fit whole, a
    blank line between two in one message (each text already at most `limit`)."""
    messages: list[str] = []
    for text in texts:
        if messages and len(messages[-1]) + 2 + len(text) <= limit:
            messages[-1] += "\n\n" + text
        else:
            messages.append(text)
    return messages
