"""A turn's media, from references to what the model reads and what the memory keeps.

    stored at once:   [voice note, 0:42, not transcribed]       (begin_turn; see core/media/kinds.py)
    prepare:          fetch (its host only, within the limits) -> transcribe a voice note
                      -> images and PDFs as attachments of the current message
    answer:           the model, with them; beside it, a small model describes the attachments
    finish:           the message rewritten as what was learned (finish_turn's p_user_content)

It runs after begin_turn and only when begin_turn found a new (or owed) message, so a
redelivered voice note is neither fetched nor transcribed again; an owed message whose earlier
attempt stored its transcripts (end_attempt, the model having failed after them) is answered from
them, its voice notes neither fetched, transcribed nor counted again. When nothing usable is left
(too large, an unreadable type, a failed download, no transcription service), the person gets
`notice` instead of a model call, and the message stays stored as what is known.
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from core.errors import MediaUnreadable, ModelUnavailable
from core.media.kinds import (
    IMAGE_TYPES,
    PDF_TYPE,
    Attachment,
    MediaKind,
    MediaLimits,
    MediaRef,
    minutes,
    not_seen,
    ogg_opus_seconds,
    pdf_pages,
    placeholder,
    seen,
    sniffed_type,
    transcribed,
)
from core.model.llm import Model, Usage
from core.models import Role, Surface, TurnStart
from core.phrases.catalogue import Catalogue, Phrases
from core.turn.context import ModelMessage

if TYPE_CHECKING:  # the modules themselves come with the first media (functions/runtime.py)
    from core.channels.media_fetch import MediaSource
    from core.media.listening import Listening
    from core.model.transcription import Transcriber

log = logging.getLogger("crossmem.media")

DESCRIBE_PROMPT = (
    "You write the memory of a chat assistant. Describe what the attached image or document shows, "
    "in one or two sentences, in the language of the person's caption when there is one, keeping what a "
    "person would want remembered later (names, amounts, dates, places, what is written). No preamble."
)

# The most a second of a voice note can weigh: its codec's highest plausible bitrate, by the type
# the platform names (docs/media.md has the figures' sources). Opus (Telegram's and WhatsApp's
# notes, Chromium's and Firefox's recorder): 510 kbit/s, RFC 6716's ceiling; MP3: 320 kbit/s,
# MPEG-1 Layer III's highest; anything else (Safari's AAC, AMR, WAV): uncompressed 16-bit stereo
# PCM at 48 kHz, 1,536 kbit/s, more than any compressed codec.
OPUS_BYTES_PER_S = 510_000 // 8
MP3_BYTES_PER_S = 320_000 // 8
PCM_BYTES_PER_S = 48_000 * 2 * 2
_BYTES_PER_S = {
    "audio/ogg": OPUS_BYTES_PER_S,
    "audio/opus": OPUS_BYTES_PER_S,
    "audio/webm": OPUS_BYTES_PER_S,
    "audio/mpeg": MP3_BYTES_PER_S,
    "audio/mp3": MP3_BYTES_PER_S,
}
# Beside the sound: the container's headers and tags (OpusTags or an ID3 tag with a small cover).
CONTAINER_BYTES = 64 * 1024
# A voice marker the turn wrote with a transcript, and one it wrote without (core/media/kinds.py's).
_TRANSCRIBED = re.compile(r"\[voice note, \d+:\d\d\] ")
_NOT_TRANSCRIBED = re.compile(r"\[voice note, \d+:\d\d, not transcribed")


@dataclass
class PreparedMedia:
    """What the turn learned of its media. `content` is the message as the model reads it now
    (transcripts in place; attachments marked, their bytes in `attachments`); `notice`, when set,
    is the answer instead of the model."""

    content: str
    attachments: tuple[Attachment, ...] = ()
    notice: str | None = None
    described: MediaRef | None = None  # the reference whose marker the description goes in
    parts: list[str] = field(default_factory=list)
    caption: str = ""
    description: str = ""
    usage: Usage = field(default_factory=Usage)
    # The language the transcription service heard in its voice notes (the first that said one).
    heard_language: str | None = None

    def stored(self) -> str:
        """The message as the memory keeps it: the description, when there is one, in its marker."""
        parts = list(self.parts)
        if self.described is not None and self.description:
            # The described file's own marker, wherever it stands (a voice note or a contact card
            # may come before it); it is the first of its kind that was read.
            marker = seen(self.described, "")
            at = parts.index(marker) if marker in parts else 0
            parts[at] = seen(self.described, self.description)
        caption = f" {self.caption.strip()}" if self.caption.strip() else ""
        return " ".join(parts) + caption


class MediaReader:
    def __init__(
        self,
        sources: Mapping[Surface, Callable[[], MediaSource]],
        transcriber: Callable[[], Transcriber | None],
        describer: Callable[[], Model | None],
        limits: MediaLimits,
        *,
        fetch_timeout_s: float = 5.0,
        transcription_timeout_s: float = 8.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._sources = sources
        self._transcriber = transcriber
        self._describer = describer
        self.limits = limits
        self._fetch_timeout_s = fetch_timeout_s
        self._transcription_timeout_s = transcription_timeout_s
        self._clock = clock

    @staticmethod
    def placeholder(media: Sequence[MediaRef], caption: str) -> str:
        return placeholder(media, caption)

    def prepare(
        self,
        surface: Surface,
        media: Sequence[MediaRef],
        caption: str,
        deadline_s: float,
        listening: Listening | None = None,
        phrases: Phrases | None = None,
        remembered: str | None = None,
    ) -> PreparedMedia:
        """What the turn learns of its media; `listening` counts its voice notes in the person's
        day (None: not counted, as when the memory is away); `phrases`: the notice's language
        (None: the default's). `remembered`: the message as an earlier attempt of an owed turn
        stored it, transcripts in place (`remembered_content`)."""
        phrases = phrases or Catalogue().phrases()
        if remembered is not None:
            return self._recalled(surface, media, remembered, deadline_s)
        began = self._clock()
        limits = self.limits
        if len(media) > limits.max_items:
            refused = [not_seen(ref, "too many files in one message") for ref in media]
            return PreparedMedia(
                self.placeholder(media, caption),
                notice=phrases.say("media.too_many", limit=limits.max_items),
                parts=refused,
                caption=caption,
            )
        limit_s = limits.voice_max_seconds
        said_too_long = [
            ref.kind is MediaKind.VOICE and ref.seconds is not None and ref.seconds > limit_s for ref in media
        ]
        if any(said_too_long):
            # The answer is that note's, whatever else the message holds: nothing of it is fetched
            # or transcribed for an answer that would not use it.
            too_long = longer_than(limit_s)
            return PreparedMedia(
                self.placeholder(media, caption),
                notice=phrases.say("media.unreadable", reason=said_reason(phrases, voice_too_long(limit_s))),
                parts=[
                    not_seen(ref, too_long if long else "sent with a voice note too long to hear")
                    for ref, long in zip(media, said_too_long, strict=True)
                ],
                caption=caption,
            )
        parts: list[str] = []
        attachments: list[Attachment] = []
        described: MediaRef | None = None
        notice: str | None = None
        heard_language: str | None = None
        # A file of a kind the model cannot read (a contact's vCard, a .docx) beside ones it can is
        # named in the message as not read, and the rest is answered; alone, it is the answer.
        unreadable_kind: MediaRef | None = None
        for ref in media:
            try:
                if ref.kind is MediaKind.OTHER:
                    unreadable_kind = unreadable_kind or ref
                    raise MediaUnreadable("a type I cannot read")
                left = max(deadline_s - (self._clock() - began), 0.5)
                if ref.kind is MediaKind.VOICE:
                    part, heard = self._transcribe(surface, ref, left, listening)
                    parts.append(part)
                    heard_language = heard_language or heard
                    continue
                data = self._fetch(surface, ref, left)
                attachments.append(Attachment(sniffed_type(data) or ref.mime_type, data))
                described = described or ref
                parts.append(seen(ref, ""))
            except MediaUnreadable as exc:
                reason = str(exc)
                parts.append(not_seen(ref, reason))
                if ref.kind is not MediaKind.OTHER and notice is None:
                    notice = (
                        phrases.say("media.no_transcriber")
                        if reason == "no transcription service"
                        else phrases.say("media.unreadable", reason=said_reason(phrases, exc, ref.kind))
                    )
        if unreadable_kind is not None and notice is None and all(ref.kind is MediaKind.OTHER for ref in media):
            notice = phrases.say("media.not_readable_kind", what=_what(phrases, unreadable_kind))
        caption_part = f" {caption.strip()}" if caption.strip() else ""
        content = " ".join(parts) + caption_part
        if notice is not None:
            return PreparedMedia(content, notice=notice, parts=parts, caption=caption, heard_language=heard_language)
        return PreparedMedia(
            content, tuple(attachments), None, described, parts, caption, heard_language=heard_language
        )

    def _recalled(
        self, surface: Surface, media: Sequence[MediaRef], remembered: str, deadline_s: float
    ) -> PreparedMedia:
        """An owed message taken over: its voice notes as the earlier attempt heard them (never
        fetched, transcribed or counted again), its images and PDFs fetched again for the model
        to read; their descriptions are in the text already, so none is written again."""
        began = self._clock()
        attachments: list[Attachment] = []
        for ref in media:
            if ref.kind not in (MediaKind.IMAGE, MediaKind.PDF):
                continue
            try:
                data = self._fetch(surface, ref, max(deadline_s - (self._clock() - began), 0.5))
            except MediaUnreadable as exc:  # the stored description stands in for it
                log.warning("an owed message's file could not be fetched again", extra={"error": str(exc)})
                continue
            attachments.append(Attachment(sniffed_type(data) or ref.mime_type, data))
        return PreparedMedia(remembered, tuple(attachments), parts=[remembered])

    def _fetch(self, surface: Surface, ref: MediaRef, timeout_s: float) -> bytes:
        limit = self.limits.pdf_max_bytes if ref.kind is MediaKind.PDF else self.limits.image_max_bytes
        if ref.size is not None and ref.size > limit:
            raise MediaUnreadable(f"larger than {limit / 1_000_000:.1f} MB", "too_large", size=limit)
        source = self._sources.get(surface)
        if source is None:
            raise MediaUnreadable("this app's files cannot be fetched here")
        data = source().fetch(ref, limit, min(timeout_s, self._fetch_timeout_s))
        kind = sniffed_type(data)
        if ref.kind is MediaKind.IMAGE and kind not in IMAGE_TYPES:
            raise MediaUnreadable("not a JPEG, PNG, GIF or WebP image", "not_an_image")
        if ref.kind is MediaKind.PDF:
            if kind != PDF_TYPE:
                raise MediaUnreadable("not a PDF", "not_a_pdf")
            pages = pdf_pages(data)
            if pages is None:
                raise MediaUnreadable("a PDF I cannot open", "pdf_unreadable")
            if pages > self.limits.pdf_max_pages:
                raise MediaUnreadable(
                    f"{pages} pages; I read up to {self.limits.pdf_max_pages}",
                    "too_many_pages",
                    pages=pages,
                    limit=self.limits.pdf_max_pages,
                )
        return data

    def _transcribe(
        self, surface: Surface, ref: MediaRef, timeout_s: float, listening: Listening | None
    ) -> tuple[str, str | None]:
        """The note's part of the message ("[voice note, 0:42] the words") and the language the
        service heard in it (None: it said none)."""
        limit_s = self.limits.voice_max_seconds  # a note said to be longer never gets here (prepare)
        transcriber = self._transcriber()
        if transcriber is None:
            raise MediaUnreadable("no transcription service")
        audio, seconds = self._audio(surface, ref, timeout_s)
        if seconds is not None and seconds > limit_s:
            raise voice_too_long(limit_s)
        # Counted at what it says, and never less than its bytes imply: a note that says nothing,
        # or too little, pays for the shortest its size can last, heard or not.
        reserved = max(math.ceil(seconds or 0), least_seconds(ref.mime_type, len(audio)))
        # A note behind another of the person's waits for it, within half of what is left.
        asked = self._clock()
        if listening is not None and (refused := listening.reserve(reserved, wait_s=timeout_s / 2)) is not None:
            raise refused
        timeout_s = max(timeout_s - (self._clock() - asked), 0.5)
        try:
            transcript = transcriber.transcribe(audio, ref.mime_type, min(timeout_s, self._transcription_timeout_s))
        except MediaUnreadable:
            if listening is not None:
                # A failure may have been paid for: it counts as it said, at least what its bytes imply.
                listening.settle(reserved, reserved)
            raise
        # The service's length decides when the claim (a web client's `seconds`, a last Ogg page,
        # forged or not) is off by more than a second, the slack of lengths in whole seconds: past
        # the limit the transcript is not used, and one that is used carries the length heard.
        heard = transcript.seconds
        if heard is not None and (seconds is None or abs(heard - seconds) > 1):
            seconds = heard
        if listening is not None:
            listening.settle(reserved, math.ceil(seconds) if seconds is not None else reserved)
        if seconds is not None and seconds > limit_s + 1:
            raise voice_too_long(limit_s)
        if not transcript.text:
            raise MediaUnreadable("no words could be heard in it", "no_words")
        log.info("voice note transcribed", extra={"seconds": seconds, "language": transcript.language})
        return transcribed(seconds, transcript.text), transcript.language

    def _audio(self, surface: Surface, ref: MediaRef, timeout_s: float) -> tuple[bytes, float | None]:
        """A voice note's bytes and the length it says (None: it says none). What it says (0 is
        saying nothing) bounds its bytes: no more reaches the transcriber than that length at its
        codec's highest bitrate, refused before the download when the platform says the size,
        else the download stops there."""
        source = self._sources.get(surface)
        if source is None:
            raise MediaUnreadable("this app's files cannot be fetched here")
        said: float | None = ref.seconds or None
        size = ref.size if ref.size is not None else (len(ref.data) if ref.data is not None else None)
        if size is not None:
            self._check_weight(ref.mime_type, said, size)
        most = min(self.limits.voice_max_bytes, most_bytes(ref.mime_type, said or self.limits.voice_max_seconds))
        audio = source().fetch(ref, most, min(timeout_s, self._fetch_timeout_s))
        said = said or ogg_opus_seconds(audio) or None  # an OGG file's own length: a claim like any
        self._check_weight(ref.mime_type, said, len(audio))
        return audio, said

    def _check_weight(self, mime_type: str, said: float | None, size: int) -> None:
        """Refuse a note of `size` bytes heavier than what it says it lasts can be (one that says
        nothing: than VOICE_MAX_SECONDS can be, so its bytes imply it is too long)."""
        if size <= most_bytes(mime_type, said or self.limits.voice_max_seconds):
            return
        if said is None:
            raise voice_too_long(self.limits.voice_max_seconds)
        raise MediaUnreadable(
            f"larger than a {minutes(said)} voice note can be", "voice_too_heavy", seconds=math.ceil(said)
        )

    def describe(self, prepared: PreparedMedia, timeout_s: float) -> None:
        """The short description the memory keeps of the attachments (a small model's), into
        `prepared`; a failure leaves it empty (the marker alone is stored)."""
        describer = self._describer()
        if describer is None or prepared.described is None:  # nothing read now, or described before
            return
        text = "The person's caption: " + prepared.caption.strip() if prepared.caption.strip() else "(no caption)"
        message = ModelMessage(Role.USER, text, (), prepared.attachments)
        try:
            reply = describer.reply(DESCRIBE_PROMPT, [message], timeout_s)
        except ModelUnavailable as exc:
            log.warning("the media description failed", extra={"error": str(exc)})
            if isinstance(exc.usage, Usage):  # a whole answer that was none (a refusal) still counts
                prepared.usage = exc.usage
            return
        prepared.description = " ".join(reply.text.split())[:600]
        prepared.usage = reply.usage


def most_bytes(mime_type: str, seconds: float) -> int:
    """The most a voice note of `seconds` can weigh (lengths are said in whole seconds: one more)."""
    return math.ceil((seconds + 1) * _bytes_per_s(mime_type)) + CONTAINER_BYTES


def least_seconds(mime_type: str, size: int) -> int:
    """The shortest a voice note of `size` bytes can last: what its bytes imply."""
    return math.ceil(max(size - CONTAINER_BYTES, 0) / _bytes_per_s(mime_type))


def _bytes_per_s(mime_type: str) -> int:
    return _BYTES_PER_S.get(mime_type.split(";", 1)[0].strip().lower(), PCM_BYTES_PER_S)


def remembered_content(start: TurnStart) -> str | None:
    """An owed message as its earlier attempt stored it, when that attempt transcribed its voice
    notes (end_attempt keeps the transcripts when the model fails after them); None otherwise."""
    if not start.owed or start.message_id is None:
        return None
    stored = next((m.content for m in start.history if m.id == start.message_id), None)
    if stored is None:
        return None
    stored = stored.removeprefix(start.quoting(""))  # begin_turn's quote before the content
    if _TRANSCRIBED.search(stored) is None or _NOT_TRANSCRIBED.search(stored) is not None:
        return None
    return stored


def longer_than(limit_s: int) -> str:
    return f"longer than {minutes(limit_s)}"


def voice_too_long(limit_s: int) -> MediaUnreadable:
    return MediaUnreadable(longer_than(limit_s), "voice_too_long", seconds=limit_s)


def said_reason(phrases: Phrases, refused: MediaUnreadable, kind: MediaKind | None = None) -> str:
    """Why media was refused, as the person reads it: `size` in bytes said in MB, `seconds` as m:ss;
    a voice note the transcription service failed on (core/model/transcription.py names no phrase)
    says so."""
    if refused.phrase == "unusable" and kind is MediaKind.VOICE:
        return phrases.say("media.reason.transcription_failed")
    values = dict(refused.values)
    if isinstance(size := values.pop("size", None), int):
        values["size"] = phrases.megabytes(size)
    if isinstance(seconds := values.pop("seconds", None), int):
        values["duration"] = minutes(seconds)
    return phrases.say(f"media.reason.{refused.phrase}", **values)


def _what(phrases: Phrases, ref: MediaRef) -> str:
    if ref.name and "." in ref.name:
        return phrases.say("media.what.extension", extension="." + ref.name.rsplit(".", 1)[1].lower())
    kind = ref.mime_type.split("/", 1)[0] if ref.mime_type else ""
    return phrases.say("media.what.videos" if kind == "video" else "media.what.other")
