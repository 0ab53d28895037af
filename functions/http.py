"""What every function shares at the HTTP edge: the error table, JSON bodies, secrets."""

from __future__ import annotations

import functools
import hmac
import json
import logging
from collections.abc import Callable
from typing import Any, TypeVar

import flask
from pydantic import BaseModel, ValidationError

from core.errors import (
    AuthError,
    BodyTooLarge,
    ConfigurationError,
    Conflict,
    CrossmemError,
    EmptyMessage,
    Forbidden,
    InputError,
    LinkingNotNeeded,
    MessageTooLong,
    ModelUnavailable,
    NotFound,
    StoreUnavailable,
)
from functions import runtime

MAX_BODY_BYTES = 1_000_000

# The one table that turns core's errors into HTTP answers (most specific first).
HTTP_ERRORS: list[tuple[type[CrossmemError], int, str]] = [
    (EmptyMessage, 400, "empty_message"),
    (MessageTooLong, 413, "message_too_long"),
    (BodyTooLarge, 413, "body_too_large"),
    (InputError, 400, "bad_request"),
    (NotFound, 404, "not_found"),
    (AuthError, 401, "unauthorized"),
    (Forbidden, 403, "forbidden"),
    (LinkingNotNeeded, 409, "linking_not_needed"),
    (Conflict, 409, "conflict"),
    (StoreUnavailable, 503, "store_unavailable"),
    (ModelUnavailable, 503, "model_unavailable"),
    (ConfigurationError, 503, "not_configured"),
]

Model = TypeVar("Model", bound=BaseModel)
log = logging.getLogger("crossmem.functions")


def serving(handler: Callable[[flask.Request], flask.Response]) -> Callable[[flask.Request], flask.Response]:
    """A function that answers a configuration error with 503 and its reason, not a crash, and
    that refuses every route while it lacks what it must not serve without (a database, a model)."""

    @functools.wraps(handler)
    def serve(request: flask.Request) -> flask.Response:
        try:
            runtime.check_can_serve(runtime.settings())
            return handler(request)
        except ConfigurationError as exc:
            log.error("refusing to serve", extra={"error": str(exc)})
            return error_response(exc)

    return serve


def error_response(exc: CrossmemError, headers: dict[str, str] | None = None) -> flask.Response:
    for kind, status, code in HTTP_ERRORS:
        if isinstance(exc, kind):
            return json_response({"error": code, "message": str(exc)}, status, headers)
    return json_response({"error": "error", "message": str(exc)}, 400, headers)


def json_response(payload: Any, status: int = 200, headers: dict[str, str] | None = None) -> flask.Response:
    response = flask.Response(json.dumps(payload, ensure_ascii=False), status, mimetype="application/json")
    response.headers.update(headers or {})
    return response


def read_json(request: flask.Request, shape: type[Model]) -> Model:
    """The body as `shape`; InputError with the reason when it is not."""
    if (request.content_length or 0) > MAX_BODY_BYTES:
        raise BodyTooLarge(MAX_BODY_BYTES)
    if request.mimetype != "application/json":
        raise InputError("the body must be application/json")
    raw = request.get_data(cache=False)
    if len(raw) > MAX_BODY_BYTES:
        raise BodyTooLarge(MAX_BODY_BYTES)
    try:
        return shape.model_validate_json(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first.get("loc", ())) or "body"
        raise InputError(f"invalid body at {where}: {first.get('msg', 'invalid')}") from None


def same_secret(given: str | None, expected: str) -> bool:
    """Constant-time comparison of a presented secret with the configured one."""
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())
