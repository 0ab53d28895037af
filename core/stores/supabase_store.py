"""`SupabaseStore`: the memory's SQL functions through PostgREST's `/rest/v1/rpc/<fn>`.

supabase-py is imported here only, and only when the store is built: it is slow to import.
One `call` is one HTTP request, authenticated with the project's service-role key.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from core.errors import StoreUnavailable
from core.stores.store import JsonScalar, check_function, final_error


class SupabaseStore:
    def __init__(self, url: str, service_role_key: str, *, timeout_s: float = 5.0) -> None:
        from supabase import ClientOptions, create_client

        self._client = create_client(
            url,
            service_role_key,
            options=ClientOptions(postgrest_client_timeout=timeout_s, auto_refresh_token=False, persist_session=False),
        )

    def call(self, function: str, arguments: Mapping[str, JsonScalar]) -> Any:
        check_function(function)
        try:
            return self._client.rpc(function, dict(arguments)).execute().data
        except Exception as exc:  # postgrest.APIError, httpx errors, JSON errors: all one failure
            # PostgREST passes the database's SQLSTATE on as the error's code (its own are PGRST...)
            code = getattr(exc, "code", None)
            final = isinstance(code, str) and len(code) == 5 and final_error(code)
            raise StoreUnavailable(f"{function} failed: {type(exc).__name__}", final=final) from exc

    def close(self) -> None:
        self._client.postgrest.session.close()
