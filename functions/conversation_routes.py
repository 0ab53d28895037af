"""The web's conversation routes, inside `web_chat` (locally under `/chat`):

GET  /conversations                  the person's conversations (web and the other surfaces'), paged
                                     with ?before=<a page's next>&limit=
POST /conversations                  start a web conversation: 201 with it; 409 while the person
                                     has EMPTY_CONVERSATIONS_PER_PERSON never written in
GET  /conversations/<id>/messages    one conversation's messages, paged with ?before=<id>&limit=
"""

from __future__ import annotations

import uuid

import flask

from functions import runtime
from functions.http import json_response, read_json
from functions.paging import conversations_query, next_place, page_query
from functions.web_models import NewConversation


def list_conversations(request: flask.Request, person: uuid.UUID, cors: dict[str, str]) -> flask.Response:
    query = conversations_query(request.args)
    listed = runtime.memory().list_conversations(person, query.before, query.limit)
    body = {
        "conversations": [c.as_json() for c in listed.conversations],
        "has_more": listed.has_more,
        "next": next_place(listed.conversations[-1]) if listed.has_more else None,
    }
    return json_response(body, headers=cors)


def create_conversation(request: flask.Request, person: uuid.UUID, cors: dict[str, str]) -> flask.Response:
    title = read_json(request, NewConversation).title if request.content_length else ""
    most = runtime.settings().empty_conversations_per_person
    return json_response(runtime.memory().create_conversation(person, title, most).as_json(), 201, cors)


def conversation_messages(
    request: flask.Request, person: uuid.UUID, cors: dict[str, str], conversation: uuid.UUID
) -> flask.Response:
    query = page_query(request.args)
    page = runtime.memory().conversation_messages(person, conversation, query.before, query.limit)
    messages = [
        {**m.as_json(), "declined": m.id in page.declined, "client_id": page.client_ids.get(m.id)}
        for m in page.messages
    ]
    body = {"conversation": page.conversation.as_json(), "messages": messages, "has_more": page.has_more}
    return json_response(body, headers=cors)
