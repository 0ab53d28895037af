"""A local stand-in for Telegram's Bot API, reached through TELEGRAM_API_BASE.

Records every method call with its JSON payload and when it came. `fail_with(name, times,
method)` makes `sendMessage` (or `method`) answer with one of the real error answers of
tests/corpus/telegram_botapi_errors/errors.json (`times` answers, or until `recover()`);
`down` makes every method answer the front proxy's 502 without a JSON body. `before_answer(method,
payload)`, when set, runs before an accepted call is answered: what the person does while a call
is in flight (tapping a draft's stop button) happens before the bot hears back.

The command menus: `setMyCommands` keeps its list in `menus[(scope type, language_code)]` (the
default scope is "default", no language_code is ""), which `getMyCommands` answers, an empty list
for a scope and language with none, as Telegram does, and `deleteMyCommands` drops.

Files: `files[file_id] = bytes` are what `getFile` knows (an unknown id is the Bot API's 400),
served at `GET /file/bot<token>/<file_path>`; `downloads` lists the paths downloaded.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
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
        self.menus: dict[tuple[str, str], list[dict[str, Any]]] = {}
        self.files: dict[str, bytes] = {}
        self.file_paths: dict[str, str] = {}  # a file_path getFile answers for that file_id, odd or not
        self.downloads: list[str] = []
        self.before_answer: Callable[[str, dict[str, Any]], None] | None = None
        self._failure: str | None = None
        self._failing_method = "sendMessage"
        self._failures_left: int | None = None
        self._paths: dict[str, str] = {}
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
                if fake.before_answer is not None:
                    fake.before_answer(method, payload)
                if method == "getFile":
                    file_id = str(payload.get("file_id", ""))
                    if file_id not in fake.files:
                        error = {"ok": False, "error_code": 400, "description": "Bad Request: invalid file_id"}
                        return self.answer_json(400, error)
                    size = len(fake.files[file_id])
                    path = fake.file_paths.get(file_id) or f"documents/file_{abs(hash(file_id)) % 10**6}.bin"
                    with fake._lock:
                        fake._paths[path] = file_id
                    result: Any = {
                        "file_id": file_id,
                        "file_unique_id": "u" + file_id[:8],
                        "file_size": size,
                        "file_path": path,
                    }
                elif method == "getWebhookInfo":
                    result = fake.webhook_info
                elif method in ("setMyCommands", "getMyCommands", "deleteMyCommands"):
                    scope = payload.get("scope") or {"type": "default"}
                    menu = (str(scope["type"]), str(payload.get("language_code", "")))
                    with fake._lock:
                        if method == "setMyCommands":
                            fake.menus[menu] = list(payload["commands"])
                        elif method == "deleteMyCommands":
                            fake.menus.pop(menu, None)
                        result = list(fake.menus.get(menu, [])) if method == "getMyCommands" else True
                elif method == "sendMessage":
                    result = {"message_id": message_id, "chat": {"id": payload.get("chat_id")}, "text": ""}
                else:
                    result = True
                self.answer_json(200, {"ok": True, "result": result})

            def do_GET(self) -> None:
                prefix = f"/file/bot{fake.token}/"
                file_id = fake._paths.get(self.path.removeprefix(prefix)) if self.path.startswith(prefix) else None
                if file_id is None:
                    return self.answer_json(404, {"ok": False, "error_code": 404, "description": "Not Found"})
                with fake._lock:
                    fake.downloads.append(self.path.removeprefix(prefix))
                self.answer_bytes(200, fake.files[file_id], "application/octet-stream")

        return Handler
