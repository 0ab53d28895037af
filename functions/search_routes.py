"""The web's memory search, inside `web_chat` (locally under `/chat`):

GET /search?q=<words>&surface=&since=&until=&limit=&offset=
    the person's own messages that best match `q`, on every surface and all time (or the surface
    and period given), best first: 200 {query, hits: [MemoryHit.as_json()], has_more, next_offset}

Under IDENTITY_POLICY=owner only the owner reaches it (web_chat admits no one else).
"""

from __future__ import annotations

import uuid

import flask

from functions import runtime
from functions.http import json_response
from functions.search_query import search_query


def search_messages(request: flask.Request, person: uuid.UUID, cors: dict[str, str]) -> flask.Response:
    query = search_query(request.args)
    # One hit more than asked tells whether more are left, in the same round trip.
    found = runtime.memory().search(
        person,
        query.text,
        surface=query.surface,
        since=query.since,
        until=query.until,
        limit=query.limit + 1,
        offset=query.offset,
    )
    hits = found[: query.limit]
    has_more = len(found) > query.limit
    body = {
        "query": query.text,
        "hits": [hit.as_json() for hit in hits],
        "has_more": has_more,
        "next_offset": query.offset + len(hits) if has_more else None,
    }
    return json_response(body, headers=cors)
