"""A local stand-in for Telegram's Bot API, reached through TELEGRAM_API_BASE.

Records every method call with its JSON payload and when it came. `fail_with(name, times,
method)` makes `sendMessage` (or `method`) answer with one of the real error answers of
tests/corpus/telegram_botapi_errors/errors.json (`times` answers, or until `recover()`);
`down` makes every method answer the front proxy's 502 without a JSON body.
`getWebhookInfo` answers `webhook_info` (a WebhookInfo: no webhook set, until a test sets one).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

from tests.fakes.local_server import LocalServer, QuietHandler

ERRORS: dict[str, dict[str, Any]] = json.loads(
    (Path(__file__).resolve().parents[1] / "corpus" / "telegram_botapi_errors" / "errors.json").read_text()
)
GATEWAY_PAGE = b"<html><head><title>502 Bad Gateway</title></head><body>nginx</body></html>"


class FakeTelegram:
    def __init__(self, token: str) -> None:
        self.token = token
        self.down = False
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.times: list[float] = []  # when each accepted call arrived (time.monotonic)
        self.refused: list[tuple[str, dict[str, Any]]] = []
        self.webhook_info: dict[str, Any] = {"url": "", "has_custom_certificate": False, "pending_update_count": 0}
        self._failure: str | None = None
        self._failing_method = "sendMessage"
        self._failures_left: int | None = None
        self._lock = threading.Lock()
        self._http = LocalServer(self._handler())
        self.url = self._http.url

    def sent(self, method: str = "sendMessage") -> list[dict[str, Any]]:
        """What was accepted (answered ok)."""
        return [payload for name, payload in self.calls if name == method]

    def fail_with(self, name: str, times: int | None = None, method: str = "sendMessage") -> None:
        """Answer `method` with the corpus's error `name`, `times` times (None: until recover())."""
        if name not in ERRORS:
            raise KeyError(f"the corpus has no Bot API error {name!r}")
        with self._lock:
            self._failure, self._failures_left, self._failing_method = name, times, method

    def recover(self) -> None:
        with self._lock:
            self._failure, self._failures_left = None, None

    def close(self) -> None:
        self._http.close()

    def _failure_for(self, method: str) -> dict[str, Any] | None:
        with self._lock:
            if self.down:
                return ERRORS["gateway"]
            if method != self._failing_method or self._failure is None:
                return None
            failure = ERRORS[self._failure]
            if self._failures_left is not None:
                self._failures_left -= 1
                if self._failures_left <= 0:
                    self._failure, self._failures_left = None, None
            return failure

    def _handler(self) -> type[QuietHandler]:
        fake = self

        class Handler(QuietHandler):
            def do_POST(self) -> None:
                payload = self.read_json()
                prefix = f"/bot{fake.token}/"
                if not self.path.startswith(prefix):
                    return self.answer_json(401, {"ok": False, "error_code": 401, "description": "Unauthorized"})
                method = self.path.removeprefix(prefix)
                failure = fake._failure_for(method)
                if failure is not None:
                    with fake._lock:
                        fake.refused.append((method, payload))
                    if failure["body"] is None:
                        return self.answer_bytes(failure["status"], GATEWAY_PAGE, "text/html")
                    return self.answer_json(failure["status"], failure["body"])
                with fake._lock:
                    fake.calls.append((method, payload))
                    fake.times.append(time.monotonic())
                    message_id = len(fake.calls)
                if method == "getWebhookInfo":
                    result: Any = fake.webhook_info
                elif method == "sendMessage":
                    result = {"message_id": message_id, "chat": {"id": payload.get("chat_id")}, "text": ""}
                else:
                    result = True
                self.answer_json(200, {"ok": True, "result": result})

        return Handler
