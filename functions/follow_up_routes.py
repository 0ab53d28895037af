"""The web's follow-up routes, inside `web_chat` (locally under `/chat`):

GET    /follow-ups        the person's pending follow-ups, soonest first: 200 {follow_ups: [...]}
DELETE /follow-ups/<id>   cancel one: 200 {cancelled: true}, or 404 if they have no such pending one

Under IDENTITY_POLICY=owner only the owner reaches these (web_chat admits no one else).
"""

from __future__ import annotations

import re
import uuid

import flask

from core.models import FollowUp
from functions import runtime
from functions.http import json_response


def pending_follow_ups(person: uuid.UUID) -> list[FollowUp]:
    """A person's pending follow-ups (raises StoreUnavailable)."""
    rows = runtime.store().call("follow_ups_of", {"p_user_id": str(person)})
    return [FollowUp.from_row(row) for row in rows]


def list_follow_ups(
    request: flask.Request, person: uuid.UUID, cors: dict[str, str], match: re.Match[str]
) -> flask.Response:
    listed = [f.as_json() for f in pending_follow_ups(person)]
    return json_response({"follow_ups": listed}, headers=cors)


def cancel_follow_up(
    request: flask.Request, person: uuid.UUID, cors: dict[str, str], match: re.Match[str]
) -> flask.Response:
    done = runtime.store().call("cancel_follow_up", {"p_user_id": str(person), "p_id": int(match[1])})
    if not done["cancelled"]:
        return json_response({"error": "not_found", "message": "no such pending follow-up"}, 404, cors)
    return json_response({"cancelled": True}, headers=cors)
