"""Speech to text within the attempt's time (issue 30, finding 1): the transcription's timeout
bounds its whole answer, not each read of it."""

from __future__ import annotations

import json
import time

import pytest

from core.errors import MediaUnreadable
from core.model.transcription import DeepgramTranscriber
from tests.fakes.local_server import LocalServer, QuietHandler

ANSWER = json.dumps(
    {
        "metadata": {"duration": 2.0},
        "results": {"channels": [{"detected_language": "en", "alternatives": [{"transcript": "see you at ten"}]}]},
    }
).encode()


class TricklingDeepgram(QuietHandler):
    """Deepgram's answer one byte at a time, each well inside any per-read timeout."""

    sent = 0

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(ANSWER)))
        self.end_headers()
        try:
            for byte in ANSWER:
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                TricklingDeepgram.sent += 1
                time.sleep(0.05)
        except (BrokenPipeError, ConnectionResetError):
            pass


def test_an_answer_still_trickling_in_when_its_time_is_up_is_cut_there() -> None:
    TricklingDeepgram.sent = 0
    api = LocalServer(TricklingDeepgram)
    transcriber = DeepgramTranscriber("dg-key", api_base=api.url)
    try:
        with pytest.raises(MediaUnreadable) as cut:
            transcriber.transcribe(b"OggS" + bytes(100), "audio/ogg", 0.5)
    finally:
        transcriber.close()
        api.close()
    assert str(cut.value) == "the transcription service was too slow"
    assert TricklingDeepgram.sent < len(ANSWER)
