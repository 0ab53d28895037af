"""A minimal local stand-in for PostgREST's `POST /rest/v1/rpc/<fn>`.

It checks the service-role key the way Supabase's gateway does (the `apikey` header and
the bearer token), then runs the real SQL function on the real Postgres as
`service_role`, its arguments read out of the request's JSON body by `json_to_record` with
the function's own parameter types, as PostgREST calls it (a JSON string given to a `json`
parameter stays a JSON string there), and answers with its JSON as PostgREST does. It counts
requests, which are the SupabaseStore's round trips.
"""

from __future__ import annotations

import hmac
import json
import threading
from collections.abc import Mapping
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo
from psycopg_pool import ConnectionPool

from core.stores.store import check_function
from tests.fakes.local_server import LocalServer, QuietHandler

# A function's input parameters and their types, in order (PostgREST reads them from the catalog).
PARAMETERS = """
select a.name, pg_catalog.format_type(a.type, null)
  from pg_catalog.pg_proc p
 cross join lateral unnest(p.proargnames, coalesce(p.proallargtypes, p.proargtypes::oid[]),
                           coalesce(p.proargmodes, array_fill('i'::"char", array[p.pronargs]))) as a(name, type, mode)
 where p.oid = %s::regproc and a.mode in ('i', 'b')
"""


def rpc(connection: psycopg.Connection[Any], function: str, arguments: Mapping[str, Any]) -> Any:
    """`public.<function>` called as PostgREST calls it: each argument read out of the JSON body
    by `json_to_record`, typed as the function's parameter."""
    types = dict(connection.execute(PARAMETERS, (f"public.{function}",)).fetchall())
    columns = sql.SQL(", ").join(
        sql.SQL("{} {}").format(sql.Identifier(name), sql.SQL(types[name])) for name in arguments
    )
    passed = sql.SQL(", ").join(
        sql.SQL("{} := pgrst_body.{}").format(sql.Identifier(name), sql.Identifier(name)) for name in arguments
    )
    query = sql.SQL(
        "select public.{}({}) from (select %s::json as json_data) pgrst_payload,"
        " lateral (select * from json_to_record(pgrst_payload.json_data) as _({}) limit 1) pgrst_body"
    ).format(sql.Identifier(function), passed, columns)
    row = connection.execute(query, (json.dumps(dict(arguments)),)).fetchone()
    return row[0] if row is not None else None


class PostgrestStandIn:
    def __init__(self, database_url: str, service_role_key: str) -> None:
        self.pool: ConnectionPool[psycopg.Connection[Any]] = ConnectionPool(
            make_conninfo(database_url, options="-c role=service_role"),
            kwargs={"autocommit": True},
            min_size=0,
            max_size=4,
            timeout=2,
        )
        self.key = service_role_key
        self.requests = 0
        self._lock = threading.Lock()
        self._http = LocalServer(self._handler())
        self.url = self._http.url

    def close(self) -> None:
        self._http.close()
        self.pool.close()

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
                    check_function(function)
                    with stand_in.pool.connection() as connection:
                        result = rpc(connection, function, arguments)
                except ValueError as exc:
                    error = {"code": "P0001", "message": str(exc), "details": None, "hint": None}
                    return self.answer_json(400, error)
                except psycopg.Error as exc:
                    # As PostgREST answers: the database's error with its SQLSTATE as the code, or,
                    # when the database could not be reached, its own 503.
                    sqlstate = getattr(exc, "sqlstate", None)
                    if sqlstate is None:
                        error = {"code": "PGRST001", "message": "Database client error", "details": None, "hint": None}
                        return self.answer_json(503, error)
                    return self.answer_json(400, {"code": sqlstate, "message": str(exc), "details": None, "hint": None})
                except Exception:  # the pool's timeout: no database
                    error = {"code": "PGRST001", "message": "Database client error", "details": None, "hint": None}
                    return self.answer_json(503, error)
                self.answer_json(200, result)

        return Handler
