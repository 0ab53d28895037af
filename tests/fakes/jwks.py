"""A project's JWKS endpoint, as Supabase serves it at /auth/v1/.well-known/jwks.json,
with one ES256 key whose private half signs the tests' tokens."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import ec

KID = "3a18cfe2-7226-43b0-bbb4-7c5242f2406e"


class FakeJwks:
    def __init__(self) -> None:
        self.private_key = ec.generate_private_key(ec.SECP256R1())
        public = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(self.private_key.public_key()))
        self.document = {"keys": [{**public, "kid": KID, "alg": "ES256", "use": "sig", "key_ops": ["verify"]}]}
        self.fetches = 0
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/auth/v1/.well-known/jwks.json"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def sign(self, claims: dict[str, Any]) -> str:
        return jwt.encode(claims, self.private_key, algorithm="ES256", headers={"kid": KID})

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                fake.fetches += 1
                data = json.dumps(fake.document).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler
