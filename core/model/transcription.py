"""Speech to text: voice notes become the words the model answers. Deepgram, over plain HTTP.

Why Deepgram (the README's "Voice notes and media" has the comparison): its pre-recorded
endpoint takes the OGG/Opus the apps send as it is (no transcoding here), detects the language
(`detect_language=true`: Spanish and English among ~35), answers in about a second for a
minute of audio (inside WhatsApp's 15 s), needs one secret (DEEPGRAM_API_KEY, from Secret
Manager), and costs less a minute than the alternatives.

`POST {DEEPGRAM_API_BASE}/v1/listen?model=...&detect_language=true&smart_format=true` with the
audio as the body and `Authorization: Token <key>`. Only this module knows Deepgram; it is
imported on the first voice note, never by a text turn.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Protocol

import httpx

from core.errors import MediaUnreadable

log = logging.getLogger("crossmem.transcription")

# What the person's history keeps of a note the service failed on ("[voice note, 0:42, not
# transcribed: the transcription service failed]"), in the words they were answered with
# (media.reason.transcription_failed): its status, or what was wrong with its answer, is the log's.
FAILED = "the transcription service failed"


@dataclass(frozen=True)
class Transcript:
    text: str
    language: str | None
    seconds: float | None


class Transcriber(Protocol):
    def transcribe(self, audio: bytes, mime_type: str, timeout_s: float) -> Transcript:
        """The words of `audio` (none, when none were heard), and its length as heard; raises
        MediaUnreadable when the service fails or is slow."""
        ...


class DeepgramTranscriber:
    def __init__(self, api_key: str, model: str = "nova-3", api_base: str = "https://api.deepgram.com") -> None:
        self._api_key = api_key
        self._model = model
        self._base = api_base.rstrip("/")
        self._http = httpx.Client()

    def transcribe(self, audio: bytes, mime_type: str, timeout_s: float) -> Transcript:
        """`timeout_s` bounds the whole answer, not only each read: httpx's timeout is per read,
        and an answer that trickles in would hold the turn past its attempt's time."""
        params = {"model": self._model, "detect_language": "true", "smart_format": "true"}
        headers = {"Authorization": f"Token {self._api_key}", "Content-Type": mime_type or "audio/ogg"}
        ends = time.monotonic() + timeout_s
        try:
            with self._http.stream(
                "POST", f"{self._base}/v1/listen", params=params, headers=headers, content=audio, timeout=timeout_s
            ) as response:
                status, answer = response.status_code, _read_before(response, ends)
        except httpx.TimeoutException:
            log.warning("the transcription service timed out", extra={"timeout_s": timeout_s})
            raise MediaUnreadable("the transcription service was too slow") from None
        except httpx.HTTPError as exc:
            log.warning("the transcription service could not be reached", extra={"error": type(exc).__name__})
            raise MediaUnreadable("the transcription service could not be reached") from None
        if status != 200:
            log.warning("the transcription service refused", extra={"status": status})
            raise MediaUnreadable(FAILED)
        try:
            body = json.loads(answer)
            channel = body["results"]["channels"][0]
            text = str(channel["alternatives"][0]["transcript"])
            language = channel.get("detected_language")
            seconds = body.get("metadata", {}).get("duration")
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            log.warning("the transcription service answered nonsense", extra={"error": type(exc).__name__})
            raise MediaUnreadable(FAILED) from None
        # No words is still an answer: its length counts in the person's day (core/media/listening.py).
        return Transcript(
            text.strip(),
            str(language) if language else None,
            float(seconds) if isinstance(seconds, int | float) else None,
        )

    def key_status(self, timeout_s: float) -> int:
        """What Deepgram's own test of a key (`GET /v1/auth/token`, free) answers: 200 when the key
        is valid, 401 when it is not (`crossmem doctor`). Raises MediaUnreadable (the error's type)
        when Deepgram does not answer."""
        headers = {"Authorization": f"Token {self._api_key}"}
        try:
            return self._http.get(f"{self._base}/v1/auth/token", headers=headers, timeout=timeout_s).status_code
        except httpx.HTTPError as exc:
            raise MediaUnreadable(type(exc).__name__) from None

    def close(self) -> None:
        self._http.close()


def _read_before(response: httpx.Response, ends: float) -> bytes:
    """The answer's body, read before the monotonic time `ends`, else MediaUnreadable."""
    chunks: list[bytes] = []
    for chunk in response.iter_bytes():
        if time.monotonic() > ends:
            log.warning("the transcription service answered too slowly")
            raise MediaUnreadable("the transcription service was too slow")
        chunks.append(chunk)
    return b"".join(chunks)
