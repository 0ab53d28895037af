"""What people send besides text: its kinds, its limits, and what the memory keeps of it.

A photo, a PDF or a voice note reaches the model in the turn it was sent (an image block, a
document block, or its transcript) and is stored as text, so every later turn on any app,
the notes and the digest know it:

    [voice note, 0:42] the transcript                    [voice note, 0:42, not transcribed]
    [photo: a receipt from Bar Pepe, 23,40 EUR] caption  [photo, not seen: larger than 3.8 MB]
    [PDF "lease.pdf": a rental contract ...] caption

The bytes are never stored: they live for the turn and are gone after it. This module is a
leaf: limits and formats, no network (core/channels/media_fetch.py, core/model/transcription.py) and no
turn (core/media/turn_media.py).
"""

from __future__ import annotations

import io
import logging
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

# What Claude reads (its vision and PDF guides): these image types, and PDFs.
IMAGE_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})
PDF_TYPE = "application/pdf"
# The long edge and area Claude's vision guide recommends: larger images are scaled down by the
# API (slower, no better), so Telegram's photo size is chosen within them.
RECOMMENDED_EDGE = 1568
RECOMMENDED_PIXELS = 1_150_000


class MediaKind(StrEnum):
    IMAGE = "image"
    PDF = "pdf"
    VOICE = "voice"  # a voice note or an audio file: transcribed
    OTHER = "other"  # a file the model cannot read (a video, a .docx)


@dataclass(frozen=True)
class MediaRef:
    """One thing sent with a message, before it is fetched: where it is (a Telegram file id,
    a Twilio media URL) or, from the web, its bytes."""

    kind: MediaKind
    mime_type: str
    source: str = ""
    data: bytes | None = None
    size: int | None = None  # bytes, when the surface says
    seconds: int | None = None  # a voice note's length, when the surface says
    name: str | None = None  # a document's file name


@dataclass(frozen=True)
class Attachment:
    """Bytes the model reads in this turn: an image or a PDF."""

    media_type: str
    data: bytes

    def block(self) -> dict[str, object]:
        import base64

        kind = "document" if self.media_type == PDF_TYPE else "image"
        source = {"type": "base64", "media_type": self.media_type, "data": base64.b64encode(self.data).decode()}
        return {"type": kind, "source": source}


@dataclass(frozen=True)
class MediaLimits:
    """MEDIA_* and VOICE_* settings. Claude refuses an image over 5 MB of base64 (3.75 MB of
    bytes) and a request over 32 MB or 100 PDF pages; ours are below, and named in the README."""

    max_items: int
    image_max_bytes: int
    pdf_max_bytes: int
    pdf_max_pages: int
    voice_max_seconds: int
    voice_seconds_per_day: int
    voice_max_bytes: int = 5_000_000


def twilio_refs(urls: Sequence[str], content_types: Sequence[str]) -> tuple[MediaRef, ...]:
    """A Twilio form's media, each by its kind; where each URL may be fetched from is
    core/channels/media_fetch.py's to say."""
    return tuple(MediaRef(media_kind(kind), kind, url) for url, kind in zip(urls, content_types, strict=True))


def twilio_media(urls: Sequence[str], content_types: Sequence[str]) -> tuple[MediaRef, ...]:
    """A Twilio form's media, when any of it is an image, a PDF or audio (a shared contact's vCard
    alone is not)."""
    refs = twilio_refs(urls, content_types)
    return refs if any(ref.kind is not MediaKind.OTHER for ref in refs) else ()


def media_kind(mime_type: str) -> MediaKind:
    mime = mime_type.split(";", 1)[0].strip().lower()
    if mime in IMAGE_TYPES:
        return MediaKind.IMAGE
    if mime == PDF_TYPE:
        return MediaKind.PDF
    if mime.startswith("audio/"):
        return MediaKind.VOICE
    return MediaKind.OTHER


def minutes(seconds: int | float | None) -> str:
    whole = int(round(seconds or 0))
    return f"{whole // 60}:{whole % 60:02d}"


def voice_label(seconds: int | float | None) -> str:
    return f"voice note, {minutes(seconds)}"


def _caption(text: str) -> str:
    return f" {text.strip()}" if text.strip() else ""


def placeholder(media: Sequence[MediaRef], caption: str) -> str:
    """What is stored when the message arrives, before anything is fetched: what was sent, as
    far as the update says. The turn rewrites it with what it learned (finish_turn)."""
    parts = [_unseen(ref) for ref in media]
    return " ".join(parts) + _caption(caption)


def _unseen(ref: MediaRef) -> str:
    if ref.kind is MediaKind.VOICE:
        return f"[{voice_label(ref.seconds)}, not transcribed]"
    if ref.kind is MediaKind.IMAGE:
        return "[photo]"
    if ref.kind is MediaKind.PDF:
        return f'[PDF "{ref.name}"]' if ref.name else "[PDF]"
    return f"[file {ref.mime_type or 'of unknown type'}, not read]"


# What a placeholder (or a marker with nothing learned in it) says no model has read: an attempt
# that died mid-turn, or whose model failed before a description, left it so.
_UNREAD = (
    ("a photo", re.compile(r"\[photo\]")),
    ("a PDF", re.compile(r'\[PDF(?: "[^"\]]*")?\]')),
    ("a voice note", re.compile(r"\[voice note, \d+:\d\d, not transcribed\]")),
)
UNREAD_NOTICE = (
    "[Sent with this message: {what}, not read for this answer: you do not know what is in it. "
    "Say so plainly and ask for it again if it matters; never guess.]"
)


def unread_notice(content: str) -> str | None:
    """What the model is told beside a stored message whose media it never read (the scheduled
    job answers from what was stored, and the media's bytes never are): that it was sent and
    could not be read, so the answer does not pretend. None when nothing of it is unread."""
    unread = [what for what, marker in _UNREAD if marker.search(content)]
    return UNREAD_NOTICE.format(what=" and ".join(unread)) if unread else None


def seen(ref: MediaRef, description: str) -> str:
    """An image or PDF with what it shows (the description), for the stored message."""
    what = "photo" if ref.kind is MediaKind.IMAGE else (f'PDF "{ref.name}"' if ref.name else "PDF")
    return f"[{what}: {description.strip()}]" if description.strip() else f"[{what}]"


def not_seen(ref: MediaRef, reason: str) -> str:
    if ref.kind is MediaKind.VOICE:
        return f"[{voice_label(ref.seconds)}, not transcribed: {reason}]"
    what = {MediaKind.IMAGE: "photo", MediaKind.PDF: "PDF"}.get(ref.kind, f"file {ref.mime_type}")
    return f"[{what}, not read: {reason}]"


def transcribed(seconds: float | None, transcript: str) -> str:
    return f"[{voice_label(seconds)}] {transcript.strip()}"


_KINDS = (
    ("voice", re.compile(r"^\[voice note, \d+:\d\d")),
    ("image", re.compile(r"^\[photo[:,\]]")),
    ("pdf", re.compile(r"^\[PDF[ :,\]]")),
    ("file", re.compile(r"^\[file ")),
)


def message_kind(content: str) -> str:
    """`text`, `voice`, `image`, `pdf` or `file`: how a frontend shows a stored message (its
    `kind` in the web API), read from the marker the turn stored it with."""
    for kind, marker in _KINDS:
        if marker.match(content):
            return kind
    return "text"


def photo_size(sizes: Sequence[dict[str, object]]) -> dict[str, object]:
    """Of Telegram's sizes of one photo (at least one), the largest within the recommended
    dimensions (else the smallest): Claude would only scale a larger one down, later and for nothing."""

    def dimensions(size: dict[str, object]) -> tuple[int, int]:
        width, height = size.get("width"), size.get("height")
        return (width if isinstance(width, int) else 0, height if isinstance(height, int) else 0)

    fitting = [
        size
        for size in sizes
        if max(dimensions(size)) <= RECOMMENDED_EDGE and dimensions(size)[0] * dimensions(size)[1] <= RECOMMENDED_PIXELS
    ]
    ranked = sorted(fitting or sizes, key=lambda size: dimensions(size)[0] * dimensions(size)[1])
    return ranked[-1] if fitting else ranked[0]


def sniffed_type(data: bytes) -> str | None:
    """The type the bytes themselves say (the magic numbers), whatever the sender claimed."""
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "image/gif"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    if data.startswith(b"%PDF-"):
        return PDF_TYPE
    if data.startswith(b"OggS"):
        return "audio/ogg"
    return None


def pdf_pages(data: bytes) -> int | None:
    """The pages of a PDF as a real parser reads its page tree (pypdf, imported only here: a turn
    without a PDF never loads it), names written with `#xx` escapes and comments included; None
    for a PDF it cannot read."""
    from pypdf import PdfReader

    logging.getLogger("pypdf").setLevel(logging.ERROR)  # a damaged PDF's repairs are not our log's
    try:
        return len(PdfReader(io.BytesIO(data)).pages)
    except Exception:  # pypdf raises its own errors and, on some damage, plain ones
        return None


def ogg_opus_seconds(data: bytes) -> float | None:
    """An OGG/Opus file's length: its last page's granule position (always at 48 kHz) less the
    pre-skip of its head. None for anything else, or a file cut short."""
    head = data.find(b"OpusHead")
    last = data.rfind(b"OggS")
    if head < 0 or last < 0 or len(data) < last + 14 or len(data) < head + 12:
        return None
    granule: int = struct.unpack_from("<q", data, last + 6)[0]
    pre_skip: int = struct.unpack_from("<H", data, head + 10)[0]
    if granule < 0:
        return None
    return max(granule - pre_skip, 0) / 48000
