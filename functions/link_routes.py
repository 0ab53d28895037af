"""The web's linking routes, inside `web_chat` (locally under `/chat`):

POST   /links             a code for the signed-in person: 201 {code, expires_at, telegram_url, whatsapp_text}
GET    /links             their linked Telegram chats and WhatsApp numbers (masked)
DELETE /links/<surface>   unlink that surface: 200 {surface, unlinked}
"""

from __future__ import annotations

import uuid

import flask

from core.models import Surface
from functions import runtime
from functions.http import json_response


def new_code(request: flask.Request, person: uuid.UUID, cors: dict[str, str]) -> flask.Response:
    linking = runtime.linking()
    linking.refuse_under_owner()
    account = runtime.token_verifier().account(request.headers.get("Authorization"))
    return json_response(linking.new_code(person, account).as_json(), 201, cors)


def list_links(request: flask.Request, person: uuid.UUID, cors: dict[str, str]) -> flask.Response:
    linking = runtime.linking()
    linking.refuse_under_owner()
    return json_response({"links": [item.as_json() for item in linking.identities(person)]}, headers=cors)


def unlink(request: flask.Request, person: uuid.UUID, cors: dict[str, str], surface: str) -> flask.Response:
    linking = runtime.linking()
    linking.refuse_under_owner()
    unlinked = linking.unlink_surface(person, Surface(surface))
    return json_response({"surface": surface, "unlinked": unlinked}, headers=cors)
