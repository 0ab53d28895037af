"""A local stand-in for Twilio's REST API, reached through TWILIO_API_BASE.

`POST /2010-04-01/Accounts/{AccountSid}/Messages.json` with the form the twilio SDK sends
(From, To, Body), answered 201 with the message resource (the fields the SDK reads), and
`POST /v2/Indicators/Typing.json` (Messaging v2's typing indicators), answered
`{"success": true}`; both with HTTP basic auth (the account SID and auth token).
`fail_with(status, code)` answers messages with Twilio's error body instead, e.g. 400 / 63016
(outside WhatsApp's 24-hour window); `fail_once_after` and `fail_after` once some were taken.
`refused` lists the forms of the messages answered so (`messages`, the ones taken).

`GET /2010-04-01/Accounts/{AccountSid}/IncomingPhoneNumbers.json?PhoneNumber=+1...` lists the
account's numbers in `numbers` (phone number -> its SmsUrl, "When a message comes in") as
Twilio's list resource does: the page's fields and `incoming_phone_numbers`, empty when the
number is not the account's.

Media: `media[path] = (bytes, content type)` for `GET /2010-04-01/Accounts/{sid}/Messages/{sid}/Media/{sid}`
(basic auth), answered as Twilio does, with a 302 to its CDN (here `/cdn/...` of the same fake,
which wants no credentials and records whether any came: `cdn_authorizations`).
`media_requests` lists the media paths asked for.
"""

from __future__ import annotations

import base64
import threading
import uuid
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from tests.fakes.local_server import LocalServer, QuietHandler


class FakeTwilio:
    def __init__(self, account_sid: str, auth_token: str) -> None:
        self.account_sid = account_sid
        self.auth_token = auth_token
        self.messages: list[dict[str, str]] = []
        self.refused: list[dict[str, str]] = []
        self.typing: list[dict[str, str]] = []  # typing indicators (POST /v2/Indicators/Typing.json)
        self.failure: tuple[int, int] | None = None
        self.numbers: dict[str, str] = {}
        self.media: dict[str, tuple[bytes, str]] = {}
        self.failing_after: tuple[int, int, int] | None = None
        self.down_after: tuple[int, int, int] | None = None
        self.media_requests: list[str] = []
        self.cdn_authorizations: list[str | None] = []
        self._lock = threading.Lock()
        self._http = LocalServer(self._handler())
        self.url = self._http.url

    def fail_with(self, status: int, code: int) -> None:
        self.failure = (status, code)

    def fail_once_after(self, accepted: int, status: int, code: int) -> None:
        """Once `accepted` messages are taken, answer the next one with Twilio's error, once."""
        self.failing_after = (accepted, status, code)

    def fail_after(self, accepted: int, status: int, code: int) -> None:
        """Once `accepted` messages are taken, answer every next one with Twilio's error, until
        `recover()`."""
        self.down_after = (accepted, status, code)

    def recover(self) -> None:
        self.failure = self.down_after = None

    def close(self) -> None:
        self._http.close()

    def _handler(self) -> type[QuietHandler]:
        fake = self

        class Handler(QuietHandler):
            def do_GET(self) -> None:
                if self.path.startswith("/cdn/"):
                    with fake._lock:
                        fake.cdn_authorizations.append(self.headers.get("Authorization"))
                    found = fake.media.get(self.path.removeprefix("/cdn"))
                    if found is None:
                        return self.answer_json(404, {"code": 20404, "message": "not found", "status": 404})
                    return self.answer_bytes(200, found[0], found[1])
                media = "/Media/" in self.path
                if media:
                    with fake._lock:
                        fake.media_requests.append(self.path)
                credentials = base64.b64encode(f"{fake.account_sid}:{fake.auth_token}".encode()).decode()
                if self.headers.get("Authorization") != f"Basic {credentials}":
                    return self.answer_json(401, {"code": 20003, "message": "Authenticate", "status": 401})
                if media:
                    if self.path not in fake.media:
                        return self.answer_json(404, {"code": 20404, "message": "not found", "status": 404})
                    return self.answer_bytes(302, b"", "text/plain", {"Location": "/cdn" + self.path})
                listing = f"/2010-04-01/Accounts/{fake.account_sid}/IncomingPhoneNumbers.json"
                path, query = urlsplit(self.path).path, dict(parse_qsl(urlsplit(self.path).query))
                if path != listing:
                    return self.answer_json(404, {"code": 20404, "message": "not found", "status": 404})
                wanted = query.get("PhoneNumber")
                numbers = [
                    phone_number(fake.account_sid, number, sms_url)
                    for number, sms_url in fake.numbers.items()
                    if wanted is None or number == wanted
                ]
                page = {
                    "incoming_phone_numbers": numbers,
                    "start": 0,
                    "end": max(0, len(numbers) - 1),
                    "page": 0,
                    "page_size": 50,
                    "first_page_uri": f"{listing}?PageSize=50&Page=0",
                    "next_page_uri": None,
                    "previous_page_uri": None,
                    "uri": f"{listing}?PageSize=50&Page=0",
                }
                self.answer_json(200, page)

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0"))).decode()
                credentials = base64.b64encode(f"{fake.account_sid}:{fake.auth_token}".encode()).decode()
                if self.headers.get("Authorization") != f"Basic {credentials}":
                    return self.answer_json(401, {"code": 20003, "message": "Authenticate", "status": 401})
                if self.path == "/v2/Indicators/Typing.json":
                    with fake._lock:
                        fake.typing.append(dict(parse_qsl(body, keep_blank_values=True)))
                    return self.answer_json(200, {"success": True})
                if self.path != f"/2010-04-01/Accounts/{fake.account_sid}/Messages.json":
                    return self.answer_json(404, {"code": 20404, "message": "not found", "status": 404})
                form = dict(parse_qsl(body, keep_blank_values=True))
                if fake.failure is not None:
                    status, code = fake.failure
                    with fake._lock:
                        fake.refused.append(form)
                    return self.answer_json(status, {"code": code, "message": f"error {code}", "status": status})
                with fake._lock:
                    after, fake.failing_after = fake.failing_after, None
                    if after is not None and len(fake.messages) != after[0]:
                        fake.failing_after, after = after, None
                    if fake.down_after is not None and len(fake.messages) >= fake.down_after[0]:
                        after = fake.down_after
                if after is not None:
                    _, status, code = after
                    with fake._lock:
                        fake.refused.append(form)
                    return self.answer_json(status, {"code": code, "message": f"error {code}", "status": status})
                with fake._lock:
                    fake.messages.append(form)
                sid = "SM" + uuid.uuid4().hex
                self.answer_json(201, resource(fake.account_sid, sid, form))

        return Handler


def resource(account_sid: str, sid: str, form: dict[str, str]) -> dict[str, Any]:
    return {
        "account_sid": account_sid,
        "sid": sid,
        "from": form.get("From"),
        "to": form.get("To"),
        "body": form.get("Body"),
        "status": "queued",
        "direction": "outbound-api",
        "num_segments": "1",
        "api_version": "2010-04-01",
        "uri": f"/2010-04-01/Accounts/{account_sid}/Messages/{sid}.json",
        "date_created": "Tue, 01 Dec 2026 12:00:00 +0000",
        "subresource_uris": {},
    }


def phone_number(account_sid: str, number: str, sms_url: str) -> dict[str, Any]:
    """An IncomingPhoneNumber, with the fields the SDK and `crossmem doctor` read."""
    sid = "PN" + uuid.uuid5(uuid.NAMESPACE_URL, number).hex
    return {
        "account_sid": account_sid,
        "sid": sid,
        "phone_number": number,
        "friendly_name": number,
        "sms_url": sms_url,
        "sms_method": "POST",
        "sms_application_sid": "",
        "capabilities": {"sms": True, "mms": True, "voice": True, "fax": False},
        "status": "in-use",
        "api_version": "2010-04-01",
        "uri": f"/2010-04-01/Accounts/{account_sid}/IncomingPhoneNumbers/{sid}.json",
    }
