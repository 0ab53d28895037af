"""The hard limit on the bytes a function reads from its request, whatever the transfer
encoding. Chunked bodies go through a real HTTP server on loopback (werkzeug's, which
sets `wsgi.input_terminated` for them as gunicorn does), since a test client does not
send them the way a socket does."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from functions_framework import create_app
from twilio.request_validator import RequestValidator
from werkzeug.serving import make_server

from functions import runtime
from functions.http import MAX_BODY_BYTES
from tests.fakes.local_server import ServingThread
from tests.helpers import (
    JWT_SECRET,
    MAIN,
    PUBLIC_BASE_URL,
    SKELETON_PERSON,
    TELEGRAM_SECRET,
    TWILIO_TOKEN,
    app_client,
    bearer,
    sms_can_send_later,
    telegram_skeleton,
)

TOO_LARGE = {"error": "body_too_large", "message": f"the request body is larger than {MAX_BODY_BYTES} bytes"}
# The web's send route says what to send instead (functions/message_routes.py).
SEND_ALONE = (
    ": send only the new message, the thread is stored here "
    "(useChat: prepareSendMessagesRequest returning {id, message, trigger, messageId}, docs/frontend.md)"
)


def too_large(target: str) -> dict[str, str]:
    return {**TOO_LARGE, "message": TOO_LARGE["message"] + SEND_ALONE} if target == "web_chat" else TOO_LARGE


# A signed Twilio form (its body is read, within the limits, before the signature is checked).
TWILIO_FORM = (
    {"X-Twilio-Signature": RequestValidator(TWILIO_TOKEN).compute_signature(PUBLIC_BASE_URL, {})},
    "application/x-www-form-urlencoded",
)
# SMS's function is functions/twilio.py's twilio_function, served as every function is.
TWILIO_FUNCTIONS = ["whatsapp_webhook", "sms_webhook"]
# Each function with headers that get it past its credentials check, and its content type.
FUNCTIONS: dict[str, tuple[dict[str, str], str]] = {
    "telegram_webhook": ({"X-Telegram-Bot-Api-Secret-Token": TELEGRAM_SECRET}, "application/json"),
    **dict.fromkeys(TWILIO_FUNCTIONS, TWILIO_FORM),
    "web_chat": ({}, "application/json"),  # the token is made per test: it needs the secret set
}


@pytest.fixture
def configured(environment: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    environment.setenv("TWILIO_AUTH_TOKEN", TWILIO_TOKEN)
    environment.setenv("PUBLIC_BASE_URL", PUBLIC_BASE_URL)
    environment.setenv("SUPABASE_JWT_SECRET", JWT_SECRET)
    sms_can_send_later(environment)
    return environment


def headers_for(target: str) -> dict[str, str]:
    headers, content_type = FUNCTIONS[target]
    if target == "web_chat":
        headers = bearer(uuid.uuid4())
    return {**headers, "Content-Type": content_type}


class CountingInput:
    """The server's request stream, counting the bytes the application takes from it."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self.taken = 0

    def read(self, size: int = -1) -> bytes:
        data: bytes = self._stream.read(size)
        self.taken += len(data)
        return data

    def readline(self, size: int = -1) -> bytes:
        data: bytes = self._stream.readline(size)
        self.taken += len(data)
        return data

    def readinto(self, buffer: bytearray) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


class LoopbackServer:
    """One function, as functions_framework builds it, behind werkzeug's HTTP server."""

    def __init__(self, target: str) -> None:
        runtime.reset()
        app = create_app(target, MAIN)  # type: ignore[no-untyped-call]
        self.inputs: list[CountingInput] = []

        def counted(environ: dict[str, Any], start_response: Any) -> Any:
            counter = CountingInput(environ["wsgi.input"])
            self.inputs.append(counter)
            environ["wsgi.input"] = counter
            return app(environ, start_response)

        self._server = make_server("127.0.0.1", 0, counted, threaded=True)
        self.port = self._server.server_port
        self._serving = ServingThread(self._server)

    def close(self) -> None:
        self._serving.stop()


@pytest.fixture
def loopback(configured: pytest.MonkeyPatch) -> Iterator[type[LoopbackServer]]:
    servers: list[LoopbackServer] = []

    def start(target: str) -> LoopbackServer:
        server = LoopbackServer(target)
        servers.append(server)
        return server

    yield start  # type: ignore[misc]
    for server in servers:
        server.close()


def post_chunked(port: int, headers: dict[str, str], total: int, filler: bytes) -> tuple[int, bytes]:
    """POST `total` bytes with Transfer-Encoding: chunked (no Content-Length), sending
    while the answer is read: a server that stops reading answers before the end."""
    connection = socket.create_connection(("127.0.0.1", port), timeout=30)
    lines = ["POST / HTTP/1.1", f"Host: 127.0.0.1:{port}", "Transfer-Encoding: chunked", "Connection: close"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    connection.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
    piece = (filler * (65536 // len(filler) + 1))[:65536]

    def send_body() -> None:
        try:
            for start in range(0, total, len(piece)):
                part = piece[: min(len(piece), total - start)]
                connection.sendall(f"{len(part):x}\r\n".encode() + part + b"\r\n")
            connection.sendall(b"0\r\n\r\n")
        except OSError:
            pass  # the server answered and closed the connection: what these tests expect

    sender = threading.Thread(target=send_body, daemon=True)
    sender.start()
    response = http.client.HTTPResponse(connection)
    response.begin()
    body = response.read()
    sender.join(timeout=30)
    connection.close()
    return response.status, body


@pytest.mark.parametrize("target", list(FUNCTIONS))
def test_a_chunked_body_past_the_limit_is_refused_having_read_no_more_than_the_limit(
    loopback: Any, target: str
) -> None:
    server = loopback(target)
    filler = b"a=b&" if target in TWILIO_FUNCTIONS else b" "
    status, body = post_chunked(server.port, headers_for(target), 4 * MAX_BODY_BYTES, filler)
    assert (status, json.loads(body)) == (413, too_large(target))
    assert server.inputs[0].taken <= MAX_BODY_BYTES + 1


def test_a_chunked_body_within_the_limit_still_reaches_the_turn(loopback: Any) -> None:
    server = loopback("telegram_webhook")
    update = telegram_skeleton(77, SKELETON_PERSON, "hello")
    status, body = post_chunked(
        server.port, headers_for("telegram_webhook"), len(json.dumps(update)), json.dumps(update).encode()
    )
    assert (status, json.loads(body)) == (200, {"ok": True, "outcome": "answered"})


@pytest.mark.parametrize("target", TWILIO_FUNCTIONS)
def test_an_unsigned_twilio_post_is_refused_without_reading_its_body(loopback: Any, target: str) -> None:
    server = loopback(target)
    headers = {"Content-Type": "application/x-www-form-urlencoded"}
    status, body = post_chunked(server.port, headers, 4 * MAX_BODY_BYTES, b"a=b&")
    assert (status, json.loads(body)) == (403, {"error": "forbidden", "message": "invalid Twilio signature"})
    assert server.inputs[0].taken == 0


@pytest.mark.parametrize("target", list(FUNCTIONS))
def test_a_declared_length_past_the_limit_is_refused(configured: pytest.MonkeyPatch, target: str) -> None:
    client = app_client(target)
    response = client.post("/", data=b"a" * (MAX_BODY_BYTES + 1), headers=headers_for(target))
    assert (response.status_code, response.get_json()) == (413, too_large(target))


@pytest.mark.parametrize("target", TWILIO_FUNCTIONS)
def test_a_twilio_form_of_many_tiny_fields_is_refused_before_its_signature_is_computed(
    configured: pytest.MonkeyPatch, target: str
) -> None:
    client = app_client(target)
    response = client.post("/", data=b"a=b&" * 1000, headers=headers_for(target))
    assert (response.status_code, response.get_json()) == (
        400,
        {"error": "bad_request", "message": "the form has more than 100 fields"},
    )


@pytest.mark.parametrize("target", list(FUNCTIONS))
def test_a_body_of_another_type_is_a_415_that_says_which_type(configured: pytest.MonkeyPatch, target: str) -> None:
    json_body = FUNCTIONS[target][1] == "application/json"
    expected = "application/json" if json_body else "Twilio's form post (application/x-www-form-urlencoded)"
    headers = {**headers_for(target), "Content-Type": "text/plain"}
    response = app_client(target).post("/", data=b"hello", headers=headers)
    assert (response.status_code, response.get_json()) == (
        415,
        {"error": "unsupported_media_type", "message": f"the body must be {expected}"},
    )
