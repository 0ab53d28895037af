"""A project's JWKS endpoint, as Supabase serves it at /auth/v1/.well-known/jwks.json,
with one ES256 key whose private half signs the tests' tokens."""

from __future__ import annotations

import json
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import ec

from tests.fakes.local_server import LocalServer, QuietHandler

KID = "3a18cfe2-7226-43b0-bbb4-7c5242f2406e"


class FakeJwks:
    def __init__(self) -> None:
        self.private_key = ec.generate_private_key(ec.SECP256R1())
        public = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(self.private_key.public_key()))
        self.document = {"keys": [{**public, "kid": KID, "alg": "ES256", "use": "sig", "key_ops": ["verify"]}]}
        self.fetches = 0
        self._http = LocalServer(self._handler())
        self.url = f"{self._http.url}/auth/v1/.well-known/jwks.json"

    def sign(self, claims: dict[str, Any]) -> str:
        return jwt.encode(claims, self.private_key, algorithm="ES256", headers={"kid": KID})

    def close(self) -> None:
        self._http.close()

    def _handler(self) -> type[QuietHandler]:
        fake = self

        class Handler(QuietHandler):
            def do_GET(self) -> None:
                fake.fetches += 1
                self.answer_json(200, fake.document)

        return Handler
