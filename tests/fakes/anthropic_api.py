"""A local stand-in for Anthropic's Messages API, reached through ANTHROPIC_BASE_URL.

It accepts the SDK's real requests, records them, and answers as the API does: a
message, or server-sent events when `stream` is true, with usage computed by the prompt
cache simulator. `behaviour` makes it fail: "500", "529", "slow" or "malformed".
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from bench.prompt_cache import PromptCache


def echo_last_message(body: dict[str, Any]) -> str:
    last = body["messages"][-1]["content"]
    text = last if isinstance(last, str) else last[-1]["text"]
    return f"Claude heard: {text}"


class FakeAnthropic:
    def __init__(self, answer: Callable[[dict[str, Any]], str] = echo_last_message) -> None:
        self.answer = answer
        self.behaviour = "ok"
        self.slow_s = 3.0
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.cache = PromptCache(min_tokens=1024)
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
                with fake._lock:
                    fake.requests.append(body)
                    fake.headers.append({k.lower(): v for k, v in self.headers.items()})
                    usage = fake.cache.request(body, time.time())
                if self.path != "/v1/messages":
                    return self._json(404, {"type": "error", "error": {"type": "not_found_error", "message": "no"}})
                if fake.behaviour in ("500", "529"):
                    kind = "api_error" if fake.behaviour == "500" else "overloaded_error"
                    error = {"type": "error", "error": {"type": kind, "message": kind}}
                    return self._json(int(fake.behaviour), error)
                if fake.behaviour == "slow":
                    time.sleep(fake.slow_s)
                text = fake.answer(body)
                usage_json = {
                    "input_tokens": usage.input_tokens,
                    "cache_creation_input_tokens": usage.cache_creation_input_tokens,
                    "cache_read_input_tokens": usage.cache_read_input_tokens,
                    "output_tokens": max(1, len(text) // 4),
                }
                if fake.behaviour == "malformed":
                    return self._raw(200, b'{"id": "msg_1", "type": "message", "content": [{"ty', "application/json")
                if body.get("stream"):
                    return self._stream(body, text, usage_json)
                self._json(200, message(body, text, usage_json))

            def _stream(self, body: dict[str, Any], text: str, usage: dict[str, int]) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Connection", "close")
                self.end_headers()
                start = message(body, "", {**usage, "output_tokens": 1})
                start["content"] = []
                events: list[tuple[str, dict[str, Any]]] = [
                    ("message_start", {"type": "message_start", "message": start}),
                    (
                        "content_block_start",
                        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
                    ),
                ]
                words = text.split(" ")
                for index, word in enumerate(words):
                    piece = word if index == len(words) - 1 else word + " "
                    delta = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": piece}}
                    events.append(("content_block_delta", delta))
                events += [
                    ("content_block_stop", {"type": "content_block_stop", "index": 0}),
                    (
                        "message_delta",
                        {
                            "type": "message_delta",
                            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                            "usage": {"output_tokens": usage["output_tokens"]},
                        },
                    ),
                    ("message_stop", {"type": "message_stop"}),
                ]
                for name, data in events:
                    self.wfile.write(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())
                    self.wfile.flush()
                self.close_connection = True

            def _json(self, status: int, payload: dict[str, Any]) -> None:
                self._raw(status, json.dumps(payload).encode(), "application/json")

            def _raw(self, status: int, data: bytes, content_type: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                if status >= 500:
                    self.send_header("x-should-retry", "false")
                self.end_headers()
                self.wfile.write(data)

        return Handler


def message(body: dict[str, Any], text: str, usage: dict[str, int]) -> dict[str, Any]:
    return {
        "id": "msg_fake",
        "type": "message",
        "role": "assistant",
        "model": body.get("model", "claude"),
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": usage,
    }
