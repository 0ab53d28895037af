"""A turn's media, from references to what the model reads and what the memory keeps.

    stored at once:   [voice note, 0:42, not transcribed]       (begin_turn; see core/media.py)
    prepare:          fetch (its host only, within the limits) -> transcribe a voice note
                      -> images and PDFs as attachments of the current message
    answer:           the model, with them; beside it, a small model describes the attachments
    finish:           the message rewritten as what was learned (finish_turn's p_user_content)

It runs after begin_turn and only when begin_turn found a new (or owed) message, so a
redelivered voice note is neither fetched nor transcribed again. When nothing usable is left
(too large, an unreadable type, a failed download, no transcription service), the person gets
`notice` instead of a model call, and the message stays stored as what is known.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from core.context import ModelMessage
from core.errors import MediaUnreadable, ModelUnavailable
from core.media import (
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
from core.models import Role, Surface
from core.phrases.catalogue import Catalogue, Phrases

if TYPE_CHECKING:  # the modules themselves come with the first media (functions/runtime.py)
    from core.channels.media_fetch import MediaSource
    from core.listening import Listening
    from core.model.transcription import Transcriber

log = logging.getLogger("crossmem.media")

DESCRIBE_PROMPT = (
    "You write the memory of a chat assistant. Describe what the attached image or document shows, "
    "in one or two sentences, in the language of the person's caption when there is one, keeping what a "
    "person would want remembered later (names, amounts, dates, places, what is written). No preamble."
)


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
    ) -> PreparedMedia:
        """What the turn learns of its media; `listening` counts its voice notes in the person's
        day (None: not counted, as when the memory is away); `phrases`: the notice's language
        (None: the default's)."""
        phrases = phrases or Catalogue().phrases()
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
                    parts.append(self._transcribe(surface, ref, left, listening))
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
            return PreparedMedia(content, notice=notice, parts=parts, caption=caption)
        return PreparedMedia(content, tuple(attachments), None, described, parts, caption)

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

    def _transcribe(self, surface: Surface, ref: MediaRef, timeout_s: float, listening: Listening | None) -> str:
        limit_s = self.limits.voice_max_seconds  # a note said to be longer never gets here (prepare)
        transcriber = self._transcriber()
        if transcriber is None:
            raise MediaUnreadable("no transcription service")
        source = self._sources.get(surface)
        if source is None:
            raise MediaUnreadable("this app's files cannot be fetched here")
        audio = source().fetch(ref, self.limits.voice_max_bytes, min(timeout_s, self._fetch_timeout_s))
        seconds = ref.seconds if ref.seconds is not None else ogg_opus_seconds(audio)
        if seconds is not None and seconds > limit_s:
            raise voice_too_long(limit_s)
        reserved = math.ceil(seconds) if seconds is not None else limit_s
        # A note behind another of the person's waits for it, within half of what is left.
        asked = self._clock()
        if listening is not None and (refused := listening.reserve(reserved, wait_s=timeout_s / 2)) is not None:
            raise refused
        timeout_s = max(timeout_s - (self._clock() - asked), 0.5)
        try:
            transcript = transcriber.transcribe(audio, ref.mime_type, min(timeout_s, self._transcription_timeout_s))
        except MediaUnreadable:
            if listening is not None:
                listening.settle(reserved, reserved)  # a failure may have been paid for: it counts as it said
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
        return transcribed(seconds, transcript.text)

    def describe(self, prepared: PreparedMedia, timeout_s: float) -> None:
        """The short description the memory keeps of the attachments (a small model's), into
        `prepared`; a failure leaves it empty (the marker alone is stored)."""
        describer = self._describer()
        if describer is None or not prepared.attachments:
            return
        text = "The person's caption: " + prepared.caption.strip() if prepared.caption.strip() else "(no caption)"
        message = ModelMessage(Role.USER, text, (), prepared.attachments)
        try:
            reply = describer.reply(DESCRIBE_PROMPT, [message], timeout_s)
        except ModelUnavailable as exc:
            log.warning("the media description failed", extra={"error": str(exc)})
            return
        prepared.description = " ".join(reply.text.split())[:600]
        prepared.usage = reply.usage


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
