"""What every function shares at the HTTP edge: the error table, JSON bodies, secrets."""

from __future__ import annotations

import functools
import hmac
import io
import json
import logging
from collections.abc import Callable
from datetime import UTC
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlsplit

import flask
from pydantic import BaseModel, ValidationError
from werkzeug.datastructures import MultiDict
from werkzeug.exceptions import RequestEntityTooLarge

from core.errors import (
    AuthError,
    AuthUnavailable,
    BodyTooLarge,
    ConfigurationError,
    Conflict,
    CrossmemError,
    DateOutOfRange,
    DeliveryFailed,
    EmptyMessage,
    Forbidden,
    HistoryTooLong,
    InputError,
    InvalidSetting,
    KeyOfAnotherConversation,
    LinkingNotNeeded,
    MediaUnreadable,
    MessageTooLong,
    ModelDeclined,
    ModelUnavailable,
    NotFound,
    OverBudget,
    StillAnswering,
    StoreUnavailable,
    TooManyEmptyConversations,
    UnsupportedBodyType,
)
from functions import runtime
from functions.function_settings import BY_FUNCTION, settings_of

MAX_BODY_BYTES = 1_000_000

# The one table that turns core's errors into HTTP answers (most specific first). Every class of
# core/errors.py has its row (a test enumerates them); a failure of ours is never a 4xx: 503 where
# asking again may pass (a store, a model, a surface's API), 500 where it cannot.
HTTP_ERRORS: list[tuple[type[CrossmemError], int, str]] = [
    (EmptyMessage, 400, "empty_message"),
    (MessageTooLong, 413, "message_too_long"),
    (HistoryTooLong, 413, "history_too_long"),
    (BodyTooLarge, 413, "body_too_large"),
    (DateOutOfRange, 400, "date_out_of_range"),
    (UnsupportedBodyType, 415, "unsupported_media_type"),
    (InputError, 400, "bad_request"),
    (NotFound, 404, "not_found"),
    (AuthError, 401, "unauthorized"),
    (Forbidden, 403, "forbidden"),
    (LinkingNotNeeded, 409, "linking_not_needed"),
    (StillAnswering, 409, "still_answering"),
    (KeyOfAnotherConversation, 409, "message_id_in_another_conversation"),
    (TooManyEmptyConversations, 409, "too_many_empty_conversations"),
    (Conflict, 409, "conflict"),
    (OverBudget, 429, "over_budget"),
    (StoreUnavailable, 503, "store_unavailable"),
    (AuthUnavailable, 503, "auth_unavailable"),
    (ModelDeclined, 503, "model_unavailable"),  # a turn answers it (core/turn/turns.py): never here but by a bug
    (ModelUnavailable, 503, "model_unavailable"),
    (DeliveryFailed, 503, "delivery_failed"),
    (InvalidSetting, 503, "not_configured"),
    (ConfigurationError, 503, "not_configured"),
    (MediaUnreadable, 500, "media_unreadable"),
]
# An error of ours the table does not name (a class added without its row): our failure, not the caller's.
UNNAMED_ERROR = (500, "internal_error")

Model = TypeVar("Model", bound=BaseModel)
log = logging.getLogger("crossmem.functions")


def serving(
    handler: Callable[[flask.Request], flask.Response],
    function: str = "",
    cors: Callable[[flask.Request], dict[str, str]] | None = None,
) -> Callable[[flask.Request], flask.Response]:
    """A function that reads at most MAX_BODY_BYTES of its request, answers an error of ours by
    the table (a configuration error with 503 and its reason, not a crash), and refuses every
    route while a setting it reads does not parse, or while it lacks what it must not serve
    without (a database, a model). What it reads is the list of `function` (main.py's name, the
    handler's by default) in functions/function_settings.py; a function no list names reads
    every setting: another surface's wrong setting refuses no function that does not read it.

    `cors`: a browser's function, the CORS headers of a request (none for an origin it does not
    allow; ConfigurationError while its own setting does not parse). Its refusals carry them, so a
    page on an allowed origin reads the 503's reason rather than a bare "CORS error"; and an
    allowed origin's preflight (OPTIONS), which needs no other setting, reaches the handler
    unchecked: a browser sends the request itself only after a 2xx preflight."""
    name = function or getattr(handler, "__name__", "")
    reads = settings_of(name) if name in BY_FUNCTION else None

    @functools.wraps(handler)
    def serve(request: flask.Request) -> flask.Response:
        # A hard limit on the bytes read from the stream, whatever the transfer encoding:
        # werkzeug refuses a larger Content-Length at once, and stops reading a chunked body
        # (which has none) at the limit instead of taking all of it into memory. It stops
        # there silently, so one byte more is allowed: `read_body` tells a body of exactly
        # the limit from a longer one by it.
        request.max_content_length = MAX_BODY_BYTES + 1
        allowed: dict[str, str] = {}  # none while the settings, or the CORS one, do not parse
        try:
            allowed = cors(request) if cors is not None else {}
            if not (allowed and request.method == "OPTIONS"):
                runtime.check_can_serve(runtime.settings(), reads)
            return handler(request)
        except ConfigurationError as exc:
            if str(exc) not in (logged := runtime.refusals_logged()):
                logged.add(str(exc))
                log.error("refusing to serve", extra={"error": str(exc)})
            return error_response(exc, allowed)
        except CrossmemError as exc:  # by the table: a bad signature 403, a bad body 400
            return error_response(exc, allowed)
        except RequestEntityTooLarge:
            return error_response(BodyTooLarge(MAX_BODY_BYTES), allowed)
        finally:
            # functions_framework reads what is left of the body after the function answers
            # (an after-request hook). Left here is only a body refused unread (no signature,
            # wrong secret) or the part past the limit: reading it is what the limit forbids,
            # and past the limit that read would fail with a 500.
            request.stream = io.BytesIO()

    return serve


# What a stream's error says of a failure that is no error of ours (a bug): its own words are the
# log's. The turn has kept the message, owed: the same send again is answered.
BROKEN = "the turn failed; your message is kept: send it again"


def failed_mid_stream(exc: Exception) -> tuple[str, str]:
    """A turn's failure after its stream's first event (the status and headers sent): its error code
    and the words a client is shown, for the stream's last event; logged, a bug with its
    traceback (its own words never leave the log)."""
    ours = isinstance(exc, CrossmemError)
    code = error_status(exc)[1] if isinstance(exc, CrossmemError) else UNNAMED_ERROR[1]
    log.error("a streamed turn failed after its first event", exc_info=not ours, extra={"error": code})
    return code, str(exc) if ours else BROKEN


def error_status(exc: CrossmemError) -> tuple[int, str]:
    """The HTTP status and the error code of `exc`, by the table."""
    for kind, status, code in HTTP_ERRORS:
        if isinstance(exc, kind):
            return status, code
    return UNNAMED_ERROR


def error_response(exc: CrossmemError, headers: dict[str, str] | None = None) -> flask.Response:
    status, code = error_status(exc)
    payload: dict[str, Any] = {"error": code, "message": str(exc)}
    if isinstance(exc, StillAnswering):
        headers = {**(headers or {}), "Retry-After": str(exc.retry_after_s)}
    if isinstance(exc, OverBudget):  # when, for a page to say on its own clock, and a client to wait
        payload["until"] = exc.until.astimezone(UTC).isoformat()
        headers = {**(headers or {}), "Retry-After": str(exc.wait_s)}
    return json_response(payload, status, headers)


def json_response(payload: Any, status: int = 200, headers: dict[str, str] | None = None) -> flask.Response:
    response = flask.Response(json.dumps(payload, ensure_ascii=False), status, mimetype="application/json")
    response.headers.update(headers or {})
    return response


def read_body(request: flask.Request, advice: str = "") -> bytes:
    """The body, read within the limit `serving` set; BodyTooLarge past it, with the route's
    `advice` (what to send instead)."""
    try:
        raw = request.get_data(cache=False)
    except RequestEntityTooLarge:
        raise BodyTooLarge(MAX_BODY_BYTES, advice) from None
    if len(raw) > MAX_BODY_BYTES:
        raise BodyTooLarge(MAX_BODY_BYTES, advice)
    return raw


def read_json(request: flask.Request, shape: type[Model]) -> Model:
    """The body as `shape`; InputError with the reason when it is not."""
    return parse_json(read_json_body(request), shape)


def read_json_body(request: flask.Request, advice: str = "") -> bytes:
    """The bytes of a body that says it is JSON; InputError when it does not (`advice`: read_body's)."""
    if request.mimetype != "application/json":
        raise UnsupportedBodyType("application/json")
    return read_body(request, advice)


def parse_json(raw: bytes, shape: type[Model]) -> Model:
    """`raw` as `shape`; InputError with the reason when it is not."""
    try:
        return shape.model_validate_json(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first.get("loc", ()))
        said = first.get("msg", "invalid")
        raise InputError(f"invalid body at {where}: {said}" if where else f"invalid body: {said}") from None


def read_form(request: flask.Request, max_fields: int) -> MultiDict[str, str]:
    """A form-encoded body, parsed once: BodyTooLarge past the byte limit, InputError past
    `max_fields` (a body of many tiny fields costs far more memory than its size)."""
    text = read_body(request).decode("utf-8", errors="replace")
    try:
        return MultiDict(parse_qsl(text, keep_blank_values=True, max_num_fields=max_fields))
    except ValueError:
        raise InputError(f"the form has more than {max_fields} fields") from None


def same_secret(given: str | None, expected: str) -> bool:
    """Constant-time comparison of a presented secret with the configured one."""
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())


def public_url(base: str, request: flask.Request) -> str:
    """The URL the platform called, which a webhook's signature signs: the configured public base,
    then this function's path and query (never request.url, which is internal behind a proxy). The
    base exactly as configured when the path adds nothing: a custom domain's root,
    `https://sms.example.com/`, is signed with its slash, and a base that holds the query Twilio
    calls with (`…/sms?src=twilio`) is that whole URL. Nor when the base already ends with the
    path: it is the full URL Twilio calls, and a custom domain's rewrite (Firebase Hosting's, a load
    balancer's) hands its path on to the function (`…/twilio/sms` is not `…/twilio/sms/twilio/sms`)."""
    path = request.script_root + (request.path if request.path != "/" else "")
    query = request.query_string.decode()
    if path and urlsplit(base).path.rstrip("/").endswith(path.rstrip("/")):
        path = ""
    if not path and urlsplit(base).query:
        return base
    return (base.rstrip("/") + path if path else base) + (f"?{query}" if query else "")
