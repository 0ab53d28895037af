"""A minimal local stand-in for PostgREST's `POST /rest/v1/rpc/<fn>`.

It checks the service-role key the way Supabase's gateway does (the `apikey` header and
the bearer token), then runs the real SQL function on the real Postgres as
`service_role`, and answers with its JSON as PostgREST does. It counts requests, which
are the SupabaseStore's round trips.
"""

from __future__ import annotations

import hmac
import threading

from psycopg.conninfo import make_conninfo

from core.errors import StoreUnavailable
from core.stores.postgres_store import PostgresStore
from tests.fakes.local_server import LocalServer, QuietHandler


class PostgrestStandIn:
    def __init__(self, database_url: str, service_role_key: str) -> None:
        self.store = PostgresStore(make_conninfo(database_url, options="-c role=service_role"))
        self.key = service_role_key
        self.requests = 0
        self._lock = threading.Lock()
        self._http = LocalServer(self._handler())
        self.url = self._http.url

    def close(self) -> None:
        self._http.close()
        self.store.close()

    def _handler(self) -> type[QuietHandler]:
        stand_in = self

        class Handler(QuietHandler):
            def do_POST(self) -> None:
                with stand_in._lock:
                    stand_in.requests += 1
                arguments = self.read_json()
                bearer = self.headers.get("Authorization", "").removeprefix("Bearer ")
                apikey = self.headers.get("apikey", "")
                if not (hmac.compare_digest(apikey, stand_in.key) and hmac.compare_digest(bearer, stand_in.key)):
                    return self.answer_json(401, {"message": "Invalid API key"})
                if not self.path.startswith("/rest/v1/rpc/"):
                    return self.answer_json(404, {"message": "not found"})
                function = self.path.removeprefix("/rest/v1/rpc/").split("?")[0]
                try:
                    result = stand_in.store.call(function, arguments)
                except ValueError as exc:
                    error = {"code": "P0001", "message": str(exc), "details": None, "hint": None}
                    return self.answer_json(400, error)
                except StoreUnavailable as exc:
                    # As PostgREST answers: the database's error with its SQLSTATE as the code, or,
                    # when the database could not be reached, its own 503.
                    sqlstate = getattr(exc.__cause__, "sqlstate", None)
                    if sqlstate is None:
                        error = {"code": "PGRST001", "message": "Database client error", "details": None, "hint": None}
                        return self.answer_json(503, error)
                    return self.answer_json(400, {"code": sqlstate, "message": str(exc), "details": None, "hint": None})
                self.answer_json(200, result)

        return Handler
