"""The web's linking routes, inside `web_chat` (locally under `/chat`):

POST   /links             a code for the signed-in person: 201 {code, expires_at, telegram_url, whatsapp_text}
GET    /links             their linked Telegram chats and WhatsApp numbers (masked)
DELETE /links/<surface>   unlink that surface: 200 {surface, unlinked}
"""

from __future__ import annotations

import re
import uuid

import flask

from core.models import Surface
from functions import runtime
from functions.http import json_response

LINKS = re.compile(r"^/links(?:/(telegram|whatsapp))?/?$")


def links_route(request: flask.Request, person: uuid.UUID, cors: dict[str, str]) -> flask.Response | None:
    """The answer to a /links request, or None when the path is not one of these routes."""
    match = LINKS.match(request.path)
    if match is None:
        return None
    linking = runtime.linking()
    linking.refuse_under_owner()
    surface = match[1]
    if surface is None and request.method == "POST":
        account = runtime.token_verifier().account(request.headers.get("Authorization"))
        return json_response(linking.new_code(person, account).as_json(), 201, cors)
    if surface is None and request.method == "GET":
        return json_response({"links": [item.as_json() for item in linking.identities(person)]}, headers=cors)
    if surface is not None and request.method == "DELETE":
        unlinked = linking.unlink_surface(person, Surface(surface))
        return json_response({"surface": surface, "unlinked": unlinked}, headers=cors)
    return json_response({"error": "method_not_allowed", "message": f"{request.method} {request.path}"}, 405, cors)
