"""The web's forgetting routes, inside `web_chat` (locally under `/chat`):

DELETE /conversations/<id>   one of the person's conversations and its messages: 204 (anyone else's: 404)
DELETE /memory               everything the person said and was answered, on every surface: 204
"""

from __future__ import annotations

import re
import uuid

import flask

from functions import runtime
from functions.http import CONVERSATION_ID

CONVERSATION = re.compile(rf"^/conversations/{CONVERSATION_ID}/?$")


def forget_route(request: flask.Request, person: uuid.UUID, cors: dict[str, str]) -> flask.Response | None:
    """The answer to a forgetting request, or None when the request is not one of these routes."""
    if request.method != "DELETE":
        return None
    if request.path.rstrip("/") == "/memory":
        runtime.forgetting().forget_everything(person)
        return flask.Response(status=204, headers=cors)
    if match := CONVERSATION.match(request.path):
        runtime.forgetting().delete_conversation(person, uuid.UUID(match[1]))  # NotFound: 404
        return flask.Response(status=204, headers=cors)
    return None
