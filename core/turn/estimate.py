"""What a turn will read, estimated before it starts: the part of its token reservation only the
caller knows (begin_turn adds the window and the notes it returns, infra/supabase/schemas/turn.sql).

A reservation is a ceiling on what concurrent turns may together spend of TOKENS_PER_DAY, not a
bill: the turn's end settles it to what the model reported. So it errs high: every request the
turn may make (the tool rounds, the media description) reads the whole input again.
"""

from __future__ import annotations

import functools
import json
from typing import TYPE_CHECKING

from core.media.kinds import MediaKind, MediaLimits
from core.memory.service import TurnEstimate
from core.model.llm import approximate_tokens
from core.turn.request import TurnRequest, TurnSettings

if TYPE_CHECKING:
    from core.turn.capabilities import Capability

# Claude's vision guide: an image is scaled to at most about 1.15 megapixels, about 1,600 tokens.
IMAGE_TOKENS = 1_600
# Claude's PDF guide: each page is read as its text (1,500 to 3,000 tokens) and as an image.
PDF_PAGE_TOKENS = 3_000 + IMAGE_TOKENS


def turn_estimate(settings: TurnSettings, request: TurnRequest, media: MediaLimits | None) -> TurnEstimate:
    """What each of the turn's model requests reads besides the window and the notes: the system
    prompt and the tools, the web client's history, and its images and PDFs at their largest
    (`media`: the limits a PDF's pages are counted by); and how many requests it may make."""
    tools = _tool_tokens(settings.capabilities)
    read = approximate_tokens(settings.system_prompt) + tools
    read += sum(approximate_tokens(item.content) for item in request.client_history or ())
    attached = [ref for ref in request.media if ref.kind in (MediaKind.IMAGE, MediaKind.PDF)]
    pages = media.pdf_max_pages if media is not None else 1
    read += sum(IMAGE_TOKENS if ref.kind is MediaKind.IMAGE else pages * PDF_PAGE_TOKENS for ref in attached)
    return TurnEstimate(read, _answer_requests(settings) + (1 if attached else 0))


def owed_estimate(settings: TurnSettings) -> TurnEstimate:
    """What the scheduled job's answer to an owed message reads besides the window and the notes
    (the system prompt and the tools: its media's bytes were never stored), and its requests."""
    return TurnEstimate(
        approximate_tokens(settings.system_prompt) + _tool_tokens(settings.capabilities), _answer_requests(settings)
    )


def answer_ceiling(settings: TurnSettings, request: TurnRequest | None, reserved: int) -> int:
    """What of the turn's reservation the answer's requests may spend (the tool loop's ceiling):
    all of it but the media description's share, one request's."""
    if request is None or not any(ref.kind in (MediaKind.IMAGE, MediaKind.PDF) for ref in request.media):
        return reserved
    return reserved - reserved // (_answer_requests(settings) + 1)


def _answer_requests(settings: TurnSettings) -> int:
    """The most requests the answer makes: the tool rounds, then the answer without tools."""
    return settings.tool_rounds + 1 if _tool_tokens(settings.capabilities) else 1


@functools.cache
def _tool_tokens(capabilities: tuple[Capability, ...]) -> int:
    """The tools' definitions as the model reads them (each character once, not escaped): the same
    every turn, so counted once (a capability hashes as itself)."""
    definitions = [definition for capability in capabilities for definition in capability.definitions]
    return approximate_tokens(json.dumps(definitions, ensure_ascii=False)) if definitions else 0
