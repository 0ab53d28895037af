"""The media limits at their boundaries, through the real MediaReader and the web's inline source:
exactly at a limit passes, one past is refused (issue 30, finding 9)."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from pypdf import PdfWriter

from core.channels.media_fetch import InlineMedia
from core.media import MediaKind, MediaLimits, MediaRef
from core.media_turn import MediaReader
from core.models import Surface
from tests.helpers import ENGLISH

RECEIPT = (Path(__file__).parent.parent / "corpus" / "media" / "receipt.jpg").read_bytes()


def reader(**limits: int) -> MediaReader:
    return MediaReader({Surface.WEB: InlineMedia}, lambda: None, lambda: None, MediaLimits(**limits))


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
