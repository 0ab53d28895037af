"""The web's follow-up routes, inside `web_chat` (locally under `/chat`):

GET    /follow-ups        the person's pending follow-ups, soonest first: 200 {follow_ups: [...]}, each
                          with the app it will be said on (`said_on`; core/follow_ups/listing.py)
DELETE /follow-ups/<id>   cancel one: 200 {cancelled: true}, or 404 if they have no such pending one

Under IDENTITY_POLICY=owner only the owner reaches these (web_chat admits no one else).
"""

from __future__ import annotations

import uuid

import flask

from core.follow_ups.capability import cancel_follow_up
from core.follow_ups.listing import pending_follow_ups
from functions import runtime
from functions.http import json_response


def list_follow_ups(request: flask.Request, person: uuid.UUID, cors: dict[str, str]) -> flask.Response:
    listed = [f.as_json() for f in pending_follow_ups(runtime.store(), person, runtime.identity().reaches)]
    return json_response({"follow_ups": listed}, headers=cors)


def cancel(request: flask.Request, person: uuid.UUID, cors: dict[str, str], follow_up: int) -> flask.Response:
    if not cancel_follow_up(runtime.store(), person, follow_up):
        return json_response({"error": "not_found", "message": "no such pending follow-up"}, 404, cors)
    return json_response({"cancelled": True}, headers=cors)
