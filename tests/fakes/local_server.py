"""What every local fake shares: an HTTP server on a free loopback port, in a thread."""

from __future__ import annotations

import json
import selectors
import socket
import socketserver
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class QuietHandler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass

    def answer_json(self, status: int, payload: Any, content_type: str = "application/json") -> None:
        self.answer_bytes(status, json.dumps(payload).encode(), content_type)

    def answer_bytes(self, status: int, data: bytes, content_type: str, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def read_json(self) -> Any:
        return json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that gave up waiting (a deadline passed) is not the fake's error."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class ServingThread:
    """A socketserver's accept loop in a thread, stopped at once.

    `serve_forever()` looks for `shutdown()` only between polls, so every close waited up to
    half a second; this loop also waits on a socket that `stop()` writes to, and ends as soon
    as it does.
    """

    def __init__(self, server: socketserver.BaseServer) -> None:
        self._server = server
        self._stopping, self._stop = socket.socketpair()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        with selectors.DefaultSelector() as selector:
            selector.register(self._server, selectors.EVENT_READ)
            selector.register(self._stopping, selectors.EVENT_READ)
            while all(key.fileobj is not self._stopping for key, _ in selector.select()):
                self._server._handle_request_noblock()  # type: ignore[attr-defined]  # what serve_forever calls

    def stop(self) -> None:
        """Stop accepting and close the listening socket; requests in flight finish in their threads."""
        self._stop.send(b"\0")
        self._thread.join()
        self._server.server_close()
        self._stop.close()
        self._stopping.close()


class LocalServer:
    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self._server = _Server(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._serving = ServingThread(self._server)

    def close(self) -> None:
        self._serving.stop()
