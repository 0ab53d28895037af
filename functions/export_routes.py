"""The web's data export, inside `web_chat` (locally under `/chat`):

GET /export   everything the memory holds of the signed-in person, as a JSON download (attachment),
              streamed a page of messages at a time (core/memory/export.py)

Under IDENTITY_POLICY=owner only the owner reaches it (web_chat admits no one else).
"""

from __future__ import annotations

import uuid

import flask

from core.errors import InputError
from functions import runtime


def export_person(request: flask.Request, person: uuid.UUID, cors: dict[str, str]) -> flask.Response:
    if request.args:  # a client that thinks it can choose (another person, a period) is told it cannot
        raise InputError(
            f"GET /export takes no parameters (got {', '.join(sorted(request.args))}): it exports all of yours"
        )
    export = runtime.export()
    pieces = export.pieces(person)  # the first page now: a store that is down is a 503, not a broken file
    headers = {
        **cors,
        "Content-Disposition": f'attachment; filename="{export.filename(person)}"',
        "Cache-Control": "no-store",
    }
    return flask.Response(pieces, 200, headers, mimetype="application/json")
