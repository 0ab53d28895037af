"""A local stand-in for Telegram's Bot API, reached through TELEGRAM_API_BASE.

Records every method call with its JSON payload; `down` makes it answer 502.
"""

from __future__ import annotations

import threading
from typing import Any

from tests.fakes.local_server import LocalServer, QuietHandler


class FakeTelegram:
    def __init__(self, token: str) -> None:
        self.token = token
        self.down = False
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self._lock = threading.Lock()
        self._http = LocalServer(self._handler())
        self.url = self._http.url

    def sent(self, method: str = "sendMessage") -> list[dict[str, Any]]:
        return [payload for name, payload in self.calls if name == method]

    def close(self) -> None:
        self._http.close()

    def _handler(self) -> type[QuietHandler]:
        fake = self

        class Handler(QuietHandler):
            def do_POST(self) -> None:
                payload = self.read_json()
                prefix = f"/bot{fake.token}/"
                if not self.path.startswith(prefix):
                    return self.answer_json(401, {"ok": False, "error_code": 401, "description": "Unauthorized"})
                method = self.path.removeprefix(prefix)
                if fake.down:
                    return self.answer_json(502, {"ok": False, "error_code": 502, "description": "Bad Gateway"})
                with fake._lock:
                    fake.calls.append((method, payload))
                if method == "getWebhookInfo":
                    result: Any = {"url": "", "has_custom_certificate": False, "pending_update_count": 0}
                elif method == "sendMessage":
                    result = {"message_id": len(fake.calls), "chat": {"id": payload.get("chat_id")}, "text": ""}
                else:
                    result = True
                self.answer_json(200, {"ok": True, "result": result})

        return Handler
