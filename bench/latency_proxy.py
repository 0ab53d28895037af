"""A loopback TCP proxy that counts round trips and can add latency to each one.

A round trip is a burst of bytes from the client that follows an answer from the server
(or opens the connection); a statement is a round trip that asks the database something (not
one that opens, authenticates or closes a connection). With `delay_s`, the first chunk of each
round trip is held until `delay_s` after it arrived, so each round trip costs `delay_s` more,
as between a function and its database in one region. Used by the tests (to count, and to lose an
answer on its way back) and by the benchmarks (to delay, and to cut the database off).
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from psycopg.conninfo import conninfo_to_dict, make_conninfo


@dataclass
class _Counter:
    round_trips: int = 0
    statements: int = 0
    connections: int = 0
    open: int = 0  # connections whose two directions are not both finished yet
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass
class _Link:
    """One proxied connection: which side spoke last, and how many of its two directions still run."""

    last: str = "server"
    pumps: int = 2


def _asks_something(burst: bytes) -> bool:
    """Whether a client's burst asks the database something. The ones that do not: a connection's
    SSL or GSS request and its startup message (they begin with their length, so with a zero
    byte), a password message ('p') and Terminate ('X'); every other begins with its type byte."""
    return burst[:1] not in (b"\x00", b"p", b"X")


def postgres_target(conninfo: str) -> tuple[int, object]:
    """(address family, address) of the server a connection string (URI or key=value) points at,
    as libpq reads it: a host in a URI's query (the embedded server's socket) wins over its netloc."""
    parameters = conninfo_to_dict(conninfo)
    host = str(parameters.get("host") or "127.0.0.1")
    port = int(parameters.get("port") or 5432)
    if host.startswith("/"):
        return socket.AF_UNIX, f"{host}/.s.PGSQL.{port}"
    return socket.AF_INET, (host, port)


def through_proxy(conninfo: str, proxy_port: int) -> str:
    """The same connection string (user, password, database, options), aimed at the proxy on
    127.0.0.1."""
    return make_conninfo(conninfo, host="127.0.0.1", hostaddr=None, port=str(proxy_port))


class LatencyProxy:
    def __init__(self, target: tuple[int, object], delay_s: float = 0.0) -> None:
        self.target = target
        self.delay_s = delay_s
        self._counter = _Counter()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lose_next_answer = threading.Event()
        # While down, a new connection is closed at once, as by a database that is away.
        self.down = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def round_trips(self) -> int:
        return self._counter.round_trips

    @property
    def statements(self) -> int:
        """Round trips that asked the database something: a pool's connections opened or closed
        in the background are not among them."""
        return self._counter.statements

    @property
    def connections(self) -> int:
        return self._counter.connections

    @property
    def open_connections(self) -> int:
        """Connections still forwarded: one the server has closed leaves once both of its
        directions have seen the end (what a client sends on it after that reaches nothing)."""
        return self._counter.open

    def reset(self) -> None:
        with self._counter.lock:
            self._counter.round_trips = 0
            self._counter.statements = 0
            self._counter.connections = 0

    def lose_next_answer(self) -> None:
        """Drop the server's next answer and cut that connection: the statement ran
        (and committed) but the client never hears of it."""
        self._lose_next_answer.set()

    def cut(self) -> None:
        """Cut every open connection, both ways, as a network failure would."""
        sockets, self._sockets = self._sockets, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        self.cut()

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
            if self.down:
                client.close()
                continue
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
            with self._counter.lock:
                self._counter.connections += 1
                self._counter.open += 1
            link = _Link()
            threading.Thread(target=self._pump, args=(client, server, link, "client"), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, link, "server"), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, link: _Link, side: str) -> None:
        try:
            while True:
                chunk = source.recv(65536)
                if not chunk:
                    break
                arrived = time.perf_counter()
                opens_round_trip = False
                if side == "client":
                    with self._counter.lock:
                        opens_round_trip = link.last != "client"
                        self._counter.round_trips += opens_round_trip
                        self._counter.statements += opens_round_trip and _asks_something(chunk)
                        link.last = "client"
                else:
                    link.last = "server"
                    if self._lose_next_answer.is_set():
                        self._lose_next_answer.clear()
                        break
                if self.delay_s and opens_round_trip:
                    _sleep_until(arrived + self.delay_s)
                sink.sendall(chunk)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            with self._counter.lock:
                link.pumps -= 1
                self._counter.open -= link.pumps == 0


def _sleep_until(deadline: float) -> None:
    """Sleep to a deadline without the usual oversleep: the last 0.2 ms spin."""
    while (left := deadline - time.perf_counter()) > 0:
        if left > 0.0003:
            time.sleep(left - 0.0002)


@contextmanager
def proxy_process(conninfo: str, delay_s: float) -> Iterator[str]:
    """The proxy in a process of its own, so that forwarding bytes, like a network,
    costs the client no CPU time (and no share of its GIL); yields the URI through it."""
    process = ProxyProcess(conninfo, delay_s)
    try:
        yield process.url
    finally:
        process.close()


class ProxyProcess:
    """A proxy in a process of its own (see `proxy_process`) that can still be told to
    refuse connections (`down`), accept them again (`up`) and cut the open ones (`cut`)."""

    def __init__(self, conninfo: str, delay_s: float = 0.0) -> None:
        self._process = subprocess.Popen(
            [sys.executable, "-m", "bench.latency_proxy", conninfo, str(delay_s)],
            stdout=subprocess.PIPE,
            stdin=subprocess.PIPE,
            text=True,
            cwd=Path(__file__).resolve().parent.parent,
        )
        assert self._process.stdout is not None
        self.url = through_proxy(conninfo, int(self._process.stdout.readline()))

    def command(self, word: str) -> None:
        assert self._process.stdin is not None and self._process.stdout is not None
        self._process.stdin.write(word + "\n")
        self._process.stdin.flush()
        self._process.stdout.readline()  # done

    def close(self) -> None:
        self._process.terminate()
        self._process.wait(timeout=10)


def _obey(proxy: LatencyProxy) -> None:
    """Commands on standard input, one a line: down, up, cut."""
    for line in sys.stdin:
        word = line.strip()
        if word == "down":
            proxy.down = True
        elif word == "up":
            proxy.down = False
        elif word == "cut":
            proxy.cut()
        print("done", flush=True)


if __name__ == "__main__":
    proxy = LatencyProxy(postgres_target(sys.argv[1]), float(sys.argv[2]))
    print(proxy.port, flush=True)
    _obey(proxy)
    threading.Event().wait()
