"""The media limits at their boundaries, through the real MediaReader and the web's inline source:
exactly at a limit passes, one past is refused (issue 30, finding 9)."""

from __future__ import annotations

import io
import re
from collections.abc import Iterator

import pytest
from pypdf import PdfWriter

from core.channels.media_fetch import InlineMedia
from core.media.kinds import MediaKind, MediaRef
from core.media.turn_media import MediaReader, most_bytes
from core.model.transcription import DeepgramTranscriber
from core.models import Surface
from tests.fakes.deepgram_api import FakeDeepgram
from tests.helpers import CORPUS, ENGLISH, media_limits, ogg_lasting

MEDIA = CORPUS / "media"
RECEIPT = (MEDIA / "receipt.jpg").read_bytes()
VOICE = (MEDIA / "voice_note_es.ogg").read_bytes()  # 3.7 s of OGG/Opus
DEEPGRAM_KEY = "deepgram-test-key"


def reader(**limits: int) -> MediaReader:
    return MediaReader({Surface.WEB: InlineMedia}, lambda: None, lambda: None, media_limits(**limits))


def photo(data: bytes = RECEIPT) -> MediaRef:
    return MediaRef(MediaKind.IMAGE, "image/jpeg", data=data)


def test_media_max_items_exactly_passes_and_one_more_is_refused() -> None:
    at_limit = reader(max_items=3).prepare(Surface.WEB, [photo()] * 3, "", 5.0)
    assert at_limit.notice is None and len(at_limit.attachments) == 3
    past = reader(max_items=3).prepare(Surface.WEB, [photo()] * 4, "", 5.0)
    assert past.notice == ENGLISH.say("media.too_many", limit=3)
    assert past.attachments == ()


def test_an_image_of_exactly_image_max_bytes_passes_and_one_byte_more_is_refused() -> None:
    limit = len(RECEIPT)
    exactly = reader(image_max_bytes=limit).prepare(Surface.WEB, [photo()], "", 5.0)
    assert exactly.notice is None and [a.data for a in exactly.attachments] == [RECEIPT]
    over = reader(image_max_bytes=limit - 1).prepare(Surface.WEB, [photo()], "", 5.0)
    assert over.notice == ENGLISH.say("media.unreadable", reason=f"larger than {(limit - 1) / 1_000_000:.1f} MB")
    assert over.attachments == ()


def test_bytes_of_no_known_image_type_are_never_attached_as_an_image() -> None:
    prepared = reader().prepare(Surface.WEB, [photo(b"MZ\x90\x00 not an image at all")], "", 5.0)
    assert prepared.notice == ENGLISH.say("media.unreadable", reason="not a JPEG, PNG, GIF or WebP image")
    assert prepared.attachments == ()


def pdf(pages: int) -> bytes:
    writer = PdfWriter()
    for _ in range(pages):
        writer.add_blank_page(width=595, height=842)
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def a_pdf(data: bytes) -> MediaRef:
    return MediaRef(MediaKind.PDF, "application/pdf", data=data)


def test_pdf_max_pages_exactly_passes_and_one_more_page_is_refused() -> None:
    at_limit = reader(pdf_max_pages=3).prepare(Surface.WEB, [a_pdf(pdf(3))], "", 5.0)
    assert at_limit.notice is None and len(at_limit.attachments) == 1
    past = reader(pdf_max_pages=3).prepare(Surface.WEB, [a_pdf(pdf(4))], "", 5.0)
    assert past.notice == ENGLISH.say("media.unreadable", reason="4 pages; I read up to 3")


@pytest.mark.parametrize(
    "disguise",
    [rb"/Type /P#61ge", rb"/Type % a comment between the names" + b"\n" + rb"/Page"],
    ids=["escaped name", "comment"],
)
def test_pages_written_to_hide_from_a_pattern_are_counted(disguise: bytes) -> None:
    """Issue 30, finding 3: a regex counted 0 pages for `/Type /P#61ge`, or a comment between the names."""
    hidden = re.sub(rb"/Type\s*/Page(?![A-Za-z])", lambda _: disguise, pdf(5))
    assert re.findall(rb"/Type\s*/Page(?![A-Za-z])", hidden) == []
    refused = reader(pdf_max_pages=3).prepare(Surface.WEB, [a_pdf(hidden)], "", 5.0)
    assert refused.notice == ENGLISH.say("media.unreadable", reason="5 pages; I read up to 3")


def test_a_pdf_no_parser_can_open_is_refused_with_a_clear_answer() -> None:
    refused = reader().prepare(Surface.WEB, [a_pdf(b"%PDF-1.7\n garbage, no objects, no trailer")], "", 5.0)
    assert refused.notice == ENGLISH.say("media.unreadable", reason="a PDF I cannot open")
    assert refused.attachments == ()


# Voice notes: VOICE_MAX_SECONDS and the bytes a length may hold, through the real Deepgram client.


@pytest.fixture
def deepgram() -> Iterator[FakeDeepgram]:
    server = FakeDeepgram(DEEPGRAM_KEY)
    yield server
    server.close()


def listener(deepgram: FakeDeepgram, **limits: int) -> MediaReader:
    transcriber = DeepgramTranscriber(DEEPGRAM_KEY, api_base=deepgram.url)
    return MediaReader({Surface.WEB: InlineMedia}, lambda: transcriber, lambda: None, media_limits(**limits))


def note(data: bytes = VOICE, seconds: int | None = None, mime_type: str = "audio/webm") -> MediaRef:
    return MediaRef(MediaKind.VOICE, mime_type, data=data, seconds=seconds)


def test_a_voice_note_said_to_last_exactly_voice_max_seconds_is_heard_and_one_second_more_is_not(
    deepgram: FakeDeepgram,
) -> None:
    deepgram.duration = 3.0
    exactly = listener(deepgram, voice_max_seconds=3).prepare(Surface.WEB, [note(seconds=3)], "", 5.0)
    assert (exactly.notice, exactly.content) == (None, f"[voice note, 0:03] {deepgram.transcript}")
    past = listener(deepgram, voice_max_seconds=3).prepare(Surface.WEB, [note(seconds=4)], "", 5.0)
    assert past.notice == ENGLISH.say("media.unreadable", reason="longer than 0:03")
    assert len(deepgram.requests) == 1  # the note said too long was never sent


def test_an_ogg_file_lasting_exactly_voice_max_seconds_is_heard_and_one_second_more_is_not(
    deepgram: FakeDeepgram,
) -> None:
    """WhatsApp's notes say no length: the OGG file's last page does."""
    deepgram.duration = 3.0
    ogg = note(ogg_lasting(VOICE, 3.0), mime_type="audio/ogg")
    exactly = listener(deepgram, voice_max_seconds=3).prepare(Surface.WEB, [ogg], "", 5.0)
    assert (exactly.notice, exactly.content) == (None, f"[voice note, 0:03] {deepgram.transcript}")
    longer = note(ogg_lasting(VOICE, 4.0), mime_type="audio/ogg")
    past = listener(deepgram, voice_max_seconds=3).prepare(Surface.WEB, [longer], "", 5.0)
    assert past.notice == ENGLISH.say("media.unreadable", reason="longer than 0:03")
    assert len(deepgram.requests) == 1


def test_a_note_of_exactly_the_bytes_its_length_may_hold_is_heard_and_one_byte_more_is_not(
    deepgram: FakeDeepgram,
) -> None:
    """A note saying 1 s holds at most 2 s of Opus at 510 kbit/s and 64 KiB of headers: 193,036
    bytes (issue 30, finding 6: `duration: 1` and 4.9 MB went whole to Deepgram)."""
    deepgram.duration = 1.0
    most = most_bytes("audio/webm", 1)
    assert most == 2 * 63_750 + 65_536
    exactly = listener(deepgram).prepare(Surface.WEB, [note(VOICE + bytes(most - len(VOICE)), 1)], "", 5.0)
    assert exactly.notice is None and [len(heard.audio) for heard in deepgram.requests] == [most]
    past = listener(deepgram).prepare(Surface.WEB, [note(VOICE + bytes(most + 1 - len(VOICE)), 1)], "", 5.0)
    assert past.notice == ENGLISH.say("media.unreadable", reason="larger than a 0:01 voice note can be")
    assert len(deepgram.requests) == 1
