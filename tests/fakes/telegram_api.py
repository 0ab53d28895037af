"""A local stand-in for Telegram's Bot API, reached through TELEGRAM_API_BASE.

Records every method call with its JSON payload; `down` makes it answer 502.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class FakeTelegram:
    def __init__(self, token: str) -> None:
        self.token = token
        self.down = False
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def sent(self, method: str = "sendMessage") -> list[dict[str, Any]]:
        return [payload for name, payload in self.calls if name == method]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                payload = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
                prefix = f"/bot{fake.token}/"
                if not self.path.startswith(prefix):
                    return self._answer(401, {"ok": False, "error_code": 401, "description": "Unauthorized"})
                method = self.path.removeprefix(prefix)
                if fake.down:
                    return self._answer(502, {"ok": False, "error_code": 502, "description": "Bad Gateway"})
                with fake._lock:
                    fake.calls.append((method, payload))
                if method == "getWebhookInfo":
                    result: Any = {"url": "", "has_custom_certificate": False, "pending_update_count": 0}
                elif method == "sendMessage":
                    result = {"message_id": len(fake.calls), "chat": {"id": payload.get("chat_id")}, "text": ""}
                else:
                    result = True
                self._answer(200, {"ok": True, "result": result})

            def _answer(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler
