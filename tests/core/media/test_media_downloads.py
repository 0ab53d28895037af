"""Downloads of what people sent, against local servers: a redirect is followed only to Twilio's
CDN, and the time a fetch is given is for the whole download (issue 30, findings 1 and 8)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from core.channels.media_fetch import TwilioMedia
from core.errors import MediaUnreadable
from core.media.kinds import MediaKind, MediaRef
from tests.fakes.local_server import LocalServer, QuietHandler

ACCOUNT = "AC" + "1" * 32
MEDIA_PATH = f"/2010-04-01/Accounts/{ACCOUNT}/Messages/MM{'2' * 32}/Media/ME{'3' * 32}"
PHOTO = MediaRef(MediaKind.IMAGE, "image/jpeg", "https://api.twilio.com" + MEDIA_PATH)


class Elsewhere(QuietHandler):
    """A host that is not Twilio's: every request it gets is recorded."""

    requests: list[str] = []

    def do_GET(self) -> None:
        Elsewhere.requests.append(self.path)
        self.answer_bytes(200, b"not twilio's", "image/jpeg")


class Trickle(QuietHandler):
    """Twilio's API answering one byte at a time, each inside any per-read timeout."""

    sent = 0

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "image/jpeg")
        self.send_header("Content-Length", "60")
        self.end_headers()
        try:
            for _ in range(60):
                self.wfile.write(b"x")
                self.wfile.flush()
                Trickle.sent += 1
                time.sleep(0.05)
        except (BrokenPipeError, ConnectionResetError):
            pass


@pytest.fixture
def elsewhere() -> Iterator[LocalServer]:
    Elsewhere.requests = []
    server = LocalServer(Elsewhere)
    yield server
    server.close()


def redirecting_to(location: str) -> type[QuietHandler]:
    class Redirect(QuietHandler):
        def do_GET(self) -> None:
            self.answer_bytes(302, b"", "text/plain", {"Location": location})

    return Redirect


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_a_twilio_media_redirect_to_a_host_outside_its_cdn_is_not_followed(
    elsewhere: LocalServer, scheme: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Not a byte asked of the other host; the thread keeps what the person was told (the download
    failed), and where the answer pointed is the log line's."""
    target = elsewhere.url.replace("http://", f"{scheme}://") + "/stolen.jpg"
    api = LocalServer(redirecting_to(target))
    try:
        media = TwilioMedia(ACCOUNT, "auth-token", api_base=api.url)
        with pytest.raises(MediaUnreadable) as refused:
            media.fetch(PHOTO, 1_000_000, 5.0)
    finally:
        api.close()
    assert (str(refused.value), refused.value.phrase) == ("the download failed", "download_failed")
    assert [r.getMessage() for r in caplog.records if r.name == "crossmem.media"] == [
        "a Twilio media redirect outside its CDN was not followed"
    ]
    assert Elsewhere.requests == []  # not a byte was asked of it


def test_a_twilio_media_redirect_on_its_own_origin_is_followed(elsewhere: LocalServer) -> None:
    """The tests' fake serves its CDN on the API's origin; the redirect is followed there."""
    media = TwilioMedia(ACCOUNT, "auth-token", api_base=elsewhere.url)
    assert media.fetch(PHOTO, 1_000_000, 5.0) == b"not twilio's"
    assert Elsewhere.requests == [MEDIA_PATH]


def test_a_download_still_arriving_when_its_time_is_up_is_cut_there() -> None:
    """A 60-byte trickle once held a turn 88.6 s: each read came inside the per-read timeout."""
    Trickle.sent = 0
    api = LocalServer(Trickle)
    try:
        media = TwilioMedia(ACCOUNT, "auth-token", api_base=api.url)
        with pytest.raises(MediaUnreadable) as cut:
            media.fetch(PHOTO, 1_000_000, 0.5)
    finally:
        api.close()
    assert str(cut.value) == "the download took too long"
    assert Trickle.sent < 60
