"""functions/http.py's error table: every error class of core/errors.py has its own row, and a
failure of ours is never blamed on the caller (issue 33: DeliveryFailed and MediaUnreadable were
answered 400)."""

from __future__ import annotations

import inspect
from datetime import UTC, datetime

import flask
import pytest
from pydantic import BaseModel

import core.errors
from core.errors import CrossmemError
from functions.http import HTTP_ERRORS, error_response, error_status, parse_json, serving

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)

# One instance of every class in core/errors.py, and the answer it must get. A new class without
# its line here fails `test_every_error_class_is_in_this_test`; one without its row in the table,
# `test_every_error_class_has_its_own_row`.
EXPECTED: dict[type[CrossmemError], tuple[CrossmemError, int, str]] = {
    core.errors.CrossmemError: (core.errors.CrossmemError("ours"), 500, "internal_error"),
    core.errors.InputError: (core.errors.InputError("bad"), 400, "bad_request"),
    core.errors.EmptyMessage: (core.errors.EmptyMessage(), 400, "empty_message"),
    core.errors.MessageTooLong: (core.errors.MessageTooLong(9, 8), 413, "message_too_long"),
    core.errors.HistoryTooLong: (core.errors.HistoryTooLong(9, 8), 413, "history_too_long"),
    core.errors.DateOutOfRange: (core.errors.DateOutOfRange(NOW), 400, "date_out_of_range"),
    core.errors.BodyTooLarge: (core.errors.BodyTooLarge(10), 413, "body_too_large"),
    core.errors.UnsupportedBodyType: (core.errors.UnsupportedBodyType("JSON"), 415, "unsupported_media_type"),
    core.errors.NotFound: (core.errors.NotFound("none"), 404, "not_found"),
    core.errors.AuthError: (core.errors.AuthError("who"), 401, "unauthorized"),
    core.errors.AuthUnavailable: (core.errors.AuthUnavailable("JWKS down"), 503, "auth_unavailable"),
    core.errors.Forbidden: (core.errors.Forbidden("not you"), 403, "forbidden"),
    core.errors.Conflict: (core.errors.Conflict("no"), 409, "conflict"),
    core.errors.LinkingNotNeeded: (core.errors.LinkingNotNeeded("owner"), 409, "linking_not_needed"),
    core.errors.StillAnswering: (core.errors.StillAnswering(30), 409, "still_answering"),
    core.errors.KeyOfAnotherConversation: (
        core.errors.KeyOfAnotherConversation(),
        409,
        "message_id_in_another_conversation",
    ),
    core.errors.TooManyEmptyConversations: (
        core.errors.TooManyEmptyConversations(20),
        409,
        "too_many_empty_conversations",
    ),
    core.errors.OverBudget: (core.errors.OverBudget(NOW, NOW), 429, "over_budget"),
    core.errors.StoreUnavailable: (core.errors.StoreUnavailable("down"), 503, "store_unavailable"),
    core.errors.ModelUnavailable: (core.errors.ModelUnavailable("slow"), 503, "model_unavailable"),
    core.errors.ModelDeclined: (core.errors.ModelDeclined("cyber"), 503, "model_unavailable"),
    core.errors.DeliveryFailed: (core.errors.DeliveryFailed("sendMessage: HTTP 502"), 503, "delivery_failed"),
    core.errors.MediaUnreadable: (core.errors.MediaUnreadable("too large"), 500, "media_unreadable"),
    core.errors.ConfigurationError: (core.errors.ConfigurationError("set X"), 503, "not_configured"),
    core.errors.InvalidSetting: (core.errors.InvalidSetting("invalid configuration: X: bad"), 503, "not_configured"),
}


def error_classes() -> list[type[CrossmemError]]:
    return [
        kind
        for _, kind in inspect.getmembers(core.errors, inspect.isclass)
        if issubclass(kind, CrossmemError) and kind.__module__ == core.errors.__name__
    ]


def test_every_error_class_is_in_this_test() -> None:
    assert sorted(kind.__name__ for kind in error_classes()) == sorted(kind.__name__ for kind in EXPECTED)


def test_every_error_class_has_its_own_row() -> None:
    named = {kind for kind, _, _ in HTTP_ERRORS}
    assert [kind.__name__ for kind in error_classes() if kind not in named and kind is not CrossmemError] == []


@pytest.mark.parametrize("kind", error_classes(), ids=lambda kind: kind.__name__)
def test_each_error_class_answers_its_status(kind: type[CrossmemError]) -> None:
    error, status, code = EXPECTED[kind]
    assert type(error) is kind
    assert error_status(error) == (status, code)
    response = error_response(error)
    until = {"until": NOW.astimezone(UTC).isoformat()} if kind is core.errors.OverBudget else {}
    assert (response.status_code, response.get_json()) == (status, {"error": code, "message": str(error), **until})


@pytest.mark.parametrize("kind", error_classes(), ids=lambda kind: kind.__name__)
def test_our_failures_are_never_a_4xx(kind: type[CrossmemError]) -> None:
    """What the caller did wrong is a 4xx; what failed on our side (a store, a model, a surface's
    API, media we could not read, the settings) is a 5xx."""
    callers = (core.errors.InputError, core.errors.NotFound, core.errors.AuthError, core.errors.Forbidden)
    blamed_on_caller = issubclass(kind, (*callers, core.errors.Conflict, core.errors.OverBudget))
    status = error_status(EXPECTED[kind][0])[0]
    assert (400 <= status < 500) == blamed_on_caller and (status >= 500) != blamed_on_caller


def test_an_error_the_table_does_not_name_is_a_500() -> None:
    class NewFailure(CrossmemError):
        """A class added to core without its row in the table."""

    assert error_status(NewFailure("lost")) == (500, "internal_error")


def test_serving_answers_an_error_its_function_lets_through_by_the_table(environment: pytest.MonkeyPatch) -> None:
    """`serving` answers any error of ours by the table, not with a crash (a 500 without a body):
    a surface's API down while a function answers is a 503 with its code."""

    def handler(request: flask.Request) -> flask.Response:
        raise core.errors.DeliveryFailed("sendMessage: HTTP 502")

    with flask.Flask(__name__).test_request_context("/", method="POST"):
        response = serving(handler)(flask.request)
    assert (response.status_code, response.get_json()) == (
        503,
        {"error": "delivery_failed", "message": "sendMessage: HTTP 502"},
    )


def test_a_body_that_is_not_json_says_so_without_a_place_and_a_wrong_field_names_its_place() -> None:
    class Shape(BaseModel):
        message: str

    with pytest.raises(core.errors.InputError) as not_json:
        parse_json(b"{", Shape)
    assert str(not_json.value).startswith("invalid body: Invalid JSON: ")
    with pytest.raises(core.errors.InputError) as wrong:
        parse_json(b'{"message": 5}', Shape)
    assert str(wrong.value) == "invalid body at message: Input should be a valid string"
