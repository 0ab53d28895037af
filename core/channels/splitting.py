"""Splitting a long reply into messages a surface accepts (Telegram 4096, WhatsApp and SMS 1600),
and packing short texts into as few of them as they fit.

Cut at the last paragraph break that fits, else the last sentence end, else the last
space; a single word longer than the limit is the only thing ever cut inside. A text's length is
as its surface counts it (`length`): Python's characters by default, Twilio's UTF-16 code units
on its surfaces (core/channels/whatsapp.py's `twilio_length`, where an emoji is two).
"""

from __future__ import annotations

import re
from collections.abc import Callable

_SENTENCE_END = re.compile(r"[.!?…。！？][\"')\]»”’]*\s+")
# A message's later part that fails for a reason that may pass is tried again after these waits,
# sooner than what a failure leads to (a redelivery, the scheduled job), which sends from that part
# (a stored reply's `unsent_from`). (A part the service took but answered after our timeout is sent
# twice by a retry: the one part the person may read twice.)
LATER_PART_WAITS_S = (1.0, 2.0)


Length = Callable[[str], int]


def split_message(text: str, limit: int, *, at_paragraphs: bool = True, length: Length = len) -> list[str]:
    """`text` in parts of at most `limit` as `length` counts; `at_paragraphs=False` cuts at the last
    sentence end even when a paragraph ends earlier: fewer parts, for a text that must fit a few."""
    parts: list[str] = []
    rest = text.strip()
    while length(rest) > limit:
        fit = fitting(rest, limit, length)
        window = rest[: fit + 1]
        cut = window.rfind("\n\n") if at_paragraphs else -1
        if cut <= 0:
            ends = [match.end() for match in _SENTENCE_END.finditer(window) if match.end() <= fit]
            cut = ends[-1] if ends else -1
        if cut <= 0:
            cut = max(window.rfind(" "), window.rfind("\n"))
        if cut <= 0:
            cut = fit
        parts.append(rest[:cut].rstrip())
        rest = rest[cut:].lstrip()
    if rest:
        parts.append(rest)
    return parts


def fitting(text: str, limit: int, length: Length = len) -> int:
    """How many of `text`'s first characters fit in `limit` as `length` counts (a count that grows
    with the text, each character at least one)."""
    fits, over = 0, min(len(text), limit) + 1
    while over - fits > 1:  # the first `fits` characters fit, the first `over` do not
        middle = (fits + over) // 2
        fits, over = (middle, over) if length(text[:middle]) <= limit else (fits, middle)
    return fits


def packed(texts: list[str], limit: int, length: Length = len) -> list[str]:
    """`texts` in order, in as few messages of at most `limit` (as `length` counts) as they fit
    whole, a blank line between two in one message (each text already at most `limit`)."""
    messages: list[str] = []
    for text in texts:
        if messages and length(f"{messages[-1]}\n\n{text}") <= limit:
            messages[-1] += "\n\n" + text
        else:
            messages.append(text)
    return messages
