"""A local stand-in for Deepgram's pre-recorded transcription, reached through DEEPGRAM_API_BASE.

`POST /v1/listen?model=...&detect_language=true` with the audio as the body and
`Authorization: Token <key>`, answered as Deepgram does: `metadata.duration`, and the channel's
`detected_language` and first alternative's `transcript`. Records each request (its query,
content type and bytes). `behaviour`: "500" answers an error, "slow" waits `slow_s` first,
"nonsense" answers 200 with JSON that holds no transcript (a proxy's, an API changed);
`latency_s` makes every answer take that long (the bench: a fixed transcriber time).
`GET /v1/auth/token`, Deepgram's own test of a key (what `crossmem doctor` asks): the key's
details when it is the fake's, 401 otherwise.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

from tests.fakes.local_server import LocalServer, QuietHandler


@dataclass(frozen=True)
class Heard:
    query: dict[str, list[str]]
    content_type: str
    audio: bytes


class FakeDeepgram:
    def __init__(self, api_key: str, transcript: str = "Hola, mañana tengo cita con el dentista a las diez.") -> None:
        self.api_key = api_key
        self.transcript = transcript
        self.language = "es"
        self.duration = 3.7
        self.behaviour = "ok"
        self.slow_s = 3.0
        self.latency_s = 0.0
        self.requests: list[Heard] = []
        self._lock = threading.Lock()
        self._http = LocalServer(self._handler())
        self.url = self._http.url

    def close(self) -> None:
        self._http.close()

    def _handler(self) -> type[QuietHandler]:
        fake = self

        class Handler(QuietHandler):
            def do_GET(self) -> None:
                if self.headers.get("Authorization") != f"Token {fake.api_key}":
                    return self.answer_json(401, {"err_code": "INVALID_AUTH", "err_msg": "Invalid credentials."})
                if urlsplit(self.path).path != "/v1/auth/token":
                    return self.answer_json(404, {"err_code": "NOT_FOUND"})
                self.answer_json(200, {"scopes": ["member"], "accessor": "fake-accessor"})

            def do_POST(self) -> None:
                audio = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                parts = urlsplit(self.path)
                if self.headers.get("Authorization") != f"Token {fake.api_key}":
                    return self.answer_json(401, {"err_code": "INVALID_AUTH", "err_msg": "Invalid credentials."})
                if parts.path != "/v1/listen":
                    return self.answer_json(404, {"err_code": "NOT_FOUND"})
                with fake._lock:
                    fake.requests.append(Heard(parse_qs(parts.query), self.headers.get("Content-Type", ""), audio))
                if fake.behaviour == "500":
                    return self.answer_json(500, {"err_code": "INTERNAL_SERVER_ERROR", "err_msg": "oops"})
                if fake.behaviour == "nonsense":
                    return self.answer_json(200, {"metadata": {"request_id": "fake"}, "results": {"channels": []}})
                if fake.behaviour == "slow":
                    time.sleep(fake.slow_s)
                elif fake.latency_s:
                    time.sleep(fake.latency_s)
                alternative = {"transcript": fake.transcript, "confidence": 0.97, "words": []}
                channel = {
                    "alternatives": [alternative],
                    "detected_language": fake.language,
                    "language_confidence": 0.98,
                }
                body = {
                    "metadata": {"request_id": "fake", "duration": fake.duration, "channels": 1},
                    "results": {"channels": [channel]},
                }
                self.answer_json(200, body)

        return Handler
