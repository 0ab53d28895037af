"""The web's forgetting routes, inside `web_chat` (locally under `/chat`):

DELETE /conversations/<id>   one of the person's conversations and its messages: 204 (anyone else's: 404)
DELETE /memory               everything the person said and was answered, on every surface: 204
"""

from __future__ import annotations

import uuid

import flask

from functions import runtime


def forget_memory(request: flask.Request, person: uuid.UUID, cors: dict[str, str]) -> flask.Response:
    runtime.forgetting().forget_everything(person)
    return flask.Response(status=204, headers=cors)


def delete_conversation(
    request: flask.Request, person: uuid.UUID, cors: dict[str, str], conversation: uuid.UUID
) -> flask.Response:
    runtime.forgetting().delete_conversation(person, conversation)  # NotFound: 404
    return flask.Response(status=204, headers=cors)
