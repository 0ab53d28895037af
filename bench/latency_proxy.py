"""A loopback TCP proxy that counts round trips and can add latency to each one.

A round trip is a burst of bytes from the client that follows an answer from the server
(or opens the connection). With `delay_s`, every chunk waits half of it in each
direction, so each round trip costs `delay_s` more, as between a function and its
database in one region. Used by the tests (to count) and by the benchmarks (to delay).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlparse


@dataclass
class _Counter:
    round_trips: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


def postgres_target(conninfo: str) -> tuple[int, object]:
    """(address family, address) of the server a `postgresql://` URI points at."""
    parsed = urlparse(conninfo)
    host = parsed.hostname or parse_qs(parsed.query).get("host", ["127.0.0.1"])[0]
    port = parsed.port or 5432
    if host.startswith("/"):
        return socket.AF_UNIX, f"{host}/.s.PGSQL.{port}"
    return socket.AF_INET, (host, port)


def through_proxy(conninfo: str, proxy_port: int) -> str:
    """The same URI, aimed at the proxy on 127.0.0.1."""
    parsed = urlparse(conninfo)
    user = parsed.username or "postgres"
    database = parsed.path.lstrip("/") or "postgres"
    return f"postgresql://{user}@127.0.0.1:{proxy_port}/{database}"


class LatencyProxy:
    def __init__(self, target: tuple[int, object], delay_s: float = 0.0) -> None:
        self.target = target
        self.delay_s = delay_s
        self._counter = _Counter()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def round_trips(self) -> int:
        return self._counter.round_trips

    def reset(self) -> None:
        with self._counter.lock:
            self._counter.round_trips = 0

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.close()

    def __enter__(self) -> LatencyProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            family, address = self.target
            server = socket.socket(family, socket.SOCK_STREAM)
            try:
                server.connect(address)  # type: ignore[arg-type]
            except OSError:
                client.close()
                continue
            for sock in (client, server):
                if sock.family == socket.AF_INET:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._sockets += [client, server]
            state = {"last": "server"}
            threading.Thread(target=self._pump, args=(client, server, state, "client"), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, state, "server"), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, state: dict[str, str], side: str) -> None:
        try:
            while True:
                chunk = source.recv(65536)
                if not chunk:
                    break
                if side == "client":
                    with self._counter.lock:
                        if state["last"] != "client":
                            self._counter.round_trips += 1
                        state["last"] = "client"
                else:
                    state["last"] = "server"
                if self.delay_s:
                    time.sleep(self.delay_s / 2)
                sink.sendall(chunk)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
