"""Media, the capability: photos, PDFs and voice notes reach the model with the person's message
(core/media/turn_media.py), so it brings no tools, only its part of the system prompt (always on:
MEDIA_* bound what is read, never whether)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from core.turn.capabilities import TurnState

IMAGES = """\
Photos and documents
- You see the photos and PDFs the person sends: they come with their message. Read them and \
answer about what they show; in later turns you see a short note of what was sent instead. \
The web chat takes photos, not PDFs: there, ask for a photo of the page or for the PDF on \
another app.
"""

# The same whether DEEPGRAM_API_KEY is set or not: a note that cannot be transcribed never reaches
# the model (the person is told at once), and the digest (its owed answers), which holds no Deepgram
# key, sends the same prompt as the chat functions (docs/decisions.md, The prompt).
VOICE = """\
Voice notes
- A voice note reaches you as its transcript, marked as a voice note. Answer what was said; if \
the transcript looks garbled, say what you understood and ask.
"""


class Media:
    instructions = IMAGES + "\n" + VOICE
    definitions: tuple[dict[str, Any], ...] = ()

    def toolset(self, turn: TurnState) -> None:
        return None
