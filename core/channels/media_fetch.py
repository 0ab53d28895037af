"""Fetching what people sent: Telegram's files and Twilio's media, each from its own host only.

Telegram: `getFile` gives a `file_path`, downloaded from `{api}/file/bot<token>/<file_path>`
(the Bot API serves files up to 20 MB). The token is part of both URLs: no URL is logged.

Twilio: the form names `MediaUrl{N}`. Only a URL on Twilio's API host, of this account's
messages, is fetched (with the account SID and auth token, basic auth); anything else a form
names, however it is signed, is refused before a byte is requested. Twilio answers with a
redirect to its media CDN, which is followed without the credentials, and only over https to
the CDN's hosts (`TWILIO_CDN_ORIGINS`: mms.twiliocdn.com for media behind HTTP auth, the older
s3-external-1.amazonaws.com for public media, as Twilio's "Protect Media Access with HTTP Basic
Authentication" article names them); a redirect anywhere else is refused.

Every read stops at the limit it was given: a file larger than it is never read whole, and a
download that is still arriving when its time is up (a server trickling a byte at a time, each
read inside the per-read timeout) is cut there: the time given is for the whole download.
"""

from __future__ import annotations

import logging
import re
import time
from typing import Protocol
from urllib.parse import urlsplit

import httpx

from core.errors import MediaUnreadable
from core.media.kinds import MediaRef

log = logging.getLogger("crossmem.media")
TWILIO_MEDIA_ORIGIN = "https://api.twilio.com"
TWILIO_CDN_ORIGINS = frozenset({"https://mms.twiliocdn.com", "https://s3-external-1.amazonaws.com"})
# Twilio's media answer redirects once; a chain longer than this is not Twilio's.
MAX_REDIRECTS = 3
_TWILIO_MEDIA_PATH = re.compile(
    r"^/2010-04-01/Accounts/(AC[0-9a-fA-F]{32})/Messages/[A-Za-z0-9]{2,64}/Media/[A-Za-z0-9]{2,64}$"
)


class MediaSource(Protocol):
    def fetch(self, ref: MediaRef, max_bytes: int, timeout_s: float) -> bytes:
        """The bytes of `ref`, at most `max_bytes`; raises MediaUnreadable."""
        ...


def too_large(limit: int) -> MediaUnreadable:
    return MediaUnreadable(f"larger than {limit / 1_000_000:.1f} MB", "too_large", size=limit)


def read_capped(response: httpx.Response, max_bytes: int, ends: float) -> bytes:
    """The body, at most `max_bytes`, read before the monotonic time `ends` (else MediaUnreadable)."""
    declared = response.headers.get("Content-Length")
    if declared and declared.isdigit() and int(declared) > max_bytes:
        raise too_large(max_bytes)
    chunks: list[bytes] = []
    total = 0
    for chunk in response.iter_bytes():
        total += len(chunk)
        if total > max_bytes:
            raise too_large(max_bytes)
        if time.monotonic() > ends:
            raise MediaUnreadable("the download took too long")
        chunks.append(chunk)
    return b"".join(chunks)


def origin(url: httpx.URL) -> str:
    return f"{url.scheme}://{url.netloc.decode('ascii')}"


class TelegramFiles:
    def __init__(self, token: str, api_base: str = "https://api.telegram.org") -> None:
        self._token = token
        self._base = api_base.rstrip("/")
        self._http = httpx.Client()

    def fetch(self, ref: MediaRef, max_bytes: int, timeout_s: float) -> bytes:
        if ref.size is not None and ref.size > max_bytes:
            raise too_large(max_bytes)
        try:
            answer = self._http.post(
                f"{self._base}/bot{self._token}/getFile", json={"file_id": ref.source}, timeout=timeout_s
            ).json()
            path = answer["result"]["file_path"] if answer.get("ok") else None
            if not isinstance(path, str) or not path:
                log.warning("getFile refused", extra={"description": str(answer.get("description", ""))[:200]})
                raise MediaUnreadable("Telegram would not give the file")
            url = f"{self._base}/file/bot{self._token}/{path}"
            ends = time.monotonic() + timeout_s
            with self._http.stream("GET", url, timeout=timeout_s) as response:
                if response.status_code != 200:
                    log.warning("a Telegram file could not be fetched", extra={"status": response.status_code})
                    raise MediaUnreadable("the download failed", "download_failed")
                return read_capped(response, max_bytes, ends)
        except MediaUnreadable:
            raise
        # Whatever the Bot API answers, a file that cannot be fetched is an answer to the person,
        # never a 500 that Telegram would redeliver into the same failure: a file_path with a
        # control character or 70,000 characters makes httpx raise InvalidURL, no HTTPError.
        except Exception as exc:
            log.warning("a Telegram file could not be fetched", extra={"error": type(exc).__name__})
            raise MediaUnreadable("the download failed", "download_failed") from None

    def close(self) -> None:
        self._http.close()


def twilio_media_allowed(url: str, account_sid: str | None) -> bool:
    """Only Twilio's own media URLs, of this account when it is configured (a form's `MediaUrl` is
    whatever the form says: one urlsplit cannot read, `https://[…`, is no Twilio URL, not a 500)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return False
    if f"{parts.scheme}://{parts.netloc}" != TWILIO_MEDIA_ORIGIN or parts.query or parts.fragment:
        return False
    match = _TWILIO_MEDIA_PATH.match(parts.path)
    return match is not None and (account_sid is None or match[1] == account_sid)


class TwilioMedia:
    """`api_base` replaces Twilio's origin (TWILIO_API_BASE: the tests' fake), after the check."""

    def __init__(self, account_sid: str | None, auth_token: str, api_base: str | None = None) -> None:
        self._account_sid = account_sid
        self._auth = (account_sid or "", auth_token)
        self._base = (api_base or TWILIO_MEDIA_ORIGIN).rstrip("/")
        # Where a redirect may lead: the CDN's hosts, and the API's own origin (the tests' fake
        # serves its "CDN" there).
        self._redirects_to = TWILIO_CDN_ORIGINS | {origin(httpx.URL(self._base))}
        self._http = httpx.Client(follow_redirects=False)

    def fetch(self, ref: MediaRef, max_bytes: int, timeout_s: float) -> bytes:
        if not twilio_media_allowed(ref.source, self._account_sid):
            log.warning("a media URL outside Twilio's media host was not fetched")
            raise MediaUnreadable("it was not on Twilio's media host", "not_on_media_host")
        url = httpx.URL(self._base + urlsplit(ref.source).path)
        ends = time.monotonic() + timeout_s
        try:
            for _ in range(MAX_REDIRECTS + 1):
                # The credentials go to Twilio's API only, never to where it redirects.
                auth = self._auth if origin(url) == origin(httpx.URL(self._base)) else None
                with self._http.stream("GET", url, auth=auth, timeout=timeout_s) as response:
                    if response.is_redirect:
                        url = response.url.join(response.headers.get("Location", ""))
                        if origin(url) not in self._redirects_to:
                            log.warning("a Twilio media redirect outside its CDN was not followed")
                            raise MediaUnreadable("the download failed", "download_failed")
                        continue
                    if response.status_code != 200:
                        log.warning("a Twilio media file could not be fetched", extra={"status": response.status_code})
                        raise MediaUnreadable("the download failed", "download_failed")
                    return read_capped(response, max_bytes, ends)
            log.warning("a Twilio media file could not be fetched", extra={"error": "too many redirects"})
            raise MediaUnreadable("the download failed", "download_failed")
        except MediaUnreadable:
            raise
        except Exception as exc:  # an odd Location (httpx.InvalidURL) as much as a network error
            log.warning("a Twilio media file could not be fetched", extra={"error": type(exc).__name__})
            raise MediaUnreadable("the download failed", "download_failed") from None

    def close(self) -> None:
        self._http.close()


class InlineMedia:
    """The web's media, sent in the request itself."""

    def fetch(self, ref: MediaRef, max_bytes: int, timeout_s: float) -> bytes:
        if ref.data is None:
            raise MediaUnreadable("nothing was attached")
        if len(ref.data) > max_bytes:
            raise too_large(max_bytes)
        return ref.data
