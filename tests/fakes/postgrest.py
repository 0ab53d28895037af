"""A minimal local stand-in for PostgREST's `POST /rest/v1/rpc/<fn>`.

It checks the service-role key the way Supabase's gateway does (the `apikey` header and
the bearer token), then runs the real SQL function on the real Postgres as
`service_role`, and answers with its JSON as PostgREST does. It counts requests, which
are the SupabaseStore's round trips.
"""

from __future__ import annotations

import hmac
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import quote

from core.errors import StoreUnavailable
from core.postgres_store import PostgresStore


class PostgrestStandIn:
    def __init__(self, database_url: str, service_role_key: str) -> None:
        options = quote("-c role=service_role")
        separator = "&" if "?" in database_url else "?"
        self.store = PostgresStore(f"{database_url}{separator}options={options}")
        self.key = service_role_key
        self.requests = 0
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self.store.close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                with stand_in._lock:
                    stand_in.requests += 1
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                bearer = self.headers.get("Authorization", "").removeprefix("Bearer ")
                apikey = self.headers.get("apikey", "")
                if not (hmac.compare_digest(apikey, stand_in.key) and hmac.compare_digest(bearer, stand_in.key)):
                    return self._answer(401, {"message": "Invalid API key"})
                if not self.path.startswith("/rest/v1/rpc/"):
                    return self._answer(404, {"message": "not found"})
                function = self.path.removeprefix("/rest/v1/rpc/").split("?")[0]
                try:
                    result = stand_in.store.call(function, json.loads(body or b"{}"))
                except (ValueError, StoreUnavailable) as exc:
                    return self._answer(400, {"code": "P0001", "message": str(exc), "details": None, "hint": None})
                self._answer(200, result)

            def _answer(self, status: int, payload: Any) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler
