"""`web_chat`: the web frontend's fetch calls, routed by method and path in one function, by the
one route table at the end of this module (`URLS`, a werkzeug routing `Map`):

POST /, /messages                      send a message (functions/message_routes.py)
GET  /<conversation>/stream            useChat's resume of that stream (functions/ui_chat_routes.py)
GET, POST /conversations; GET /conversations/<id>/messages   (functions/conversation_routes.py)
DELETE /conversations/<id>, /memory   forgetting (functions/forget_routes.py)
GET  /memory                           the person's memory notes (functions/note_routes.py)
GET  /export                           everything held of the person, a JSON download (functions/export_routes.py)
POST, GET /links; DELETE /links/<surface>   linking the person's other apps (functions/link_routes.py)
GET  /follow-ups, DELETE /follow-ups/<id>   their pending follow-ups (functions/follow_up_routes.py)
GET  /search?q=                        searching the person's own messages (functions/search_routes.py)
GET  /openapi.json                     this function's OpenAPI 3.1 document (functions/web_openapi.py), unauthenticated
OPTIONS *                              CORS preflight, without touching the database

A path no route has is 404; a path a route has with another method is 405 with `Allow`; an id
its converter refuses (not a UUID, not a follow-up's number) is no such path: 404.
"""

from __future__ import annotations

import functools

import flask
from werkzeug.exceptions import MethodNotAllowed
from werkzeug.exceptions import NotFound as NoRoute
from werkzeug.routing import IntegerConverter, Map, Rule

from core.errors import CrossmemError
from functions import (
    conversation_routes,
    export_routes,
    follow_up_routes,
    forget_routes,
    link_routes,
    message_routes,
    note_routes,
    runtime,
    search_routes,
    ui_chat_routes,
    web_openapi,
)
from functions.http import error_response, json_response, serving
from functions.ui_message_stream import UI_STREAM_HEADER


def cors_headers(request: flask.Request) -> dict[str, str]:
    """The CORS headers of an answer to `request`: none for an origin CORS_ORIGINS does not allow;
    InvalidSetting while CORS_ORIGINS does not parse (no origin is known to be allowed)."""
    origin, allowed = request.headers.get("Origin"), runtime.settings().cors_origins
    if not origin or not ("*" in allowed or origin in allowed):
        return {}
    return {
        "Access-Control-Allow-Origin": origin,
        # User-Agent: the AI SDK's own (`ai`'s transport set it from 5.0.43 until March 2026; Safari and
        # Firefox send it).
        "Access-Control-Allow-Headers": f"Authorization, Content-Type, Accept, User-Agent, {UI_STREAM_HEADER}",
        "Access-Control-Allow-Methods": "GET, POST, DELETE, OPTIONS",
        # What a page on another origin may read besides the safelisted headers: when to ask again,
        # what a 405's route takes, the export's file name, and that the stream is the UI message stream.
        "Access-Control-Expose-Headers": f"Retry-After, Allow, Content-Disposition, {UI_STREAM_HEADER}",
        "Access-Control-Max-Age": "600",
        "Vary": "Origin",
    }


@functools.partial(serving, cors=cors_headers)  # its refusals, too, readable by an allowed page
def web_chat(request: flask.Request) -> flask.Response:
    cors = cors_headers(request)
    if request.method == "OPTIONS":
        if not cors:  # said in JSON for whoever debugs it with curl; a browser only sees the 403
            return json_response({"error": "forbidden", "message": "this origin is not in CORS_ORIGINS"}, 403)
        return flask.Response(status=204, headers=cors)
    if request.method == "GET" and request.path.rstrip("/") == "/openapi.json":  # public, like docs/openapi.json
        return json_response(web_openapi.document(), headers=cors)
    try:
        person = runtime.identity().admit_web(runtime.token_verifier().person(request.headers.get("Authorization")))
        routes, path = URLS.bind(""), request.path.rstrip("/") or "/"
        if request.method == "HEAD":  # werkzeug would run a GET's handler for it: a resumed turn, a search
            allowed = routes.allowed_methods(path)
            raise MethodNotAllowed(allowed) if allowed else NoRoute()
        handler, arguments = routes.match(path, request.method)
        return handler(request, person, cors, **arguments)  # type: ignore[no-any-return]
    except MethodNotAllowed as exc:
        allowed = ", ".join(sorted(set(exc.valid_methods or ()) - {"HEAD"}))
        message = f"{request.method} {request.path}: this route takes {allowed}"
        return json_response({"error": "method_not_allowed", "message": message}, 405, {**cors, "Allow": allowed})
    except NoRoute:
        return json_response({"error": "not_found", "message": f"no route {request.method} {request.path}"}, 404, cors)
    except CrossmemError as exc:
        return error_response(exc, cors)


class FollowUpId(IntegerConverter):
    """A follow-up's id: 1 to 18 ASCII digits (a bigint's range, no other script's digits)."""

    regex = "[0-9]{1,18}"


LINKABLE = ",".join(web_openapi.LINKABLE)

# Every route of `web_chat`, in one table: a new route is one line here (a handler takes the
# request, the person, the CORS headers and the path's converted values by name).
URLS = Map(
    [
        Rule("/", methods=["POST"], endpoint=message_routes.send_message),
        Rule("/messages", methods=["POST"], endpoint=message_routes.send_message),
        Rule("/conversations", methods=["GET"], endpoint=conversation_routes.list_conversations),
        Rule("/conversations", methods=["POST"], endpoint=conversation_routes.create_conversation),
        Rule(
            "/conversations/<uuid:conversation>/messages",
            methods=["GET"],
            endpoint=conversation_routes.conversation_messages,
        ),
        Rule("/conversations/<uuid:conversation>", methods=["DELETE"], endpoint=forget_routes.delete_conversation),
        Rule("/memory", methods=["GET"], endpoint=note_routes.show_memory),
        Rule("/memory", methods=["DELETE"], endpoint=forget_routes.forget_memory),
        Rule("/export", methods=["GET"], endpoint=export_routes.export_person),
        Rule("/links", methods=["POST"], endpoint=link_routes.new_code),
        Rule("/links", methods=["GET"], endpoint=link_routes.list_links),
        Rule(f"/links/<any({LINKABLE}):surface>", methods=["DELETE"], endpoint=link_routes.unlink),
        Rule("/follow-ups", methods=["GET"], endpoint=follow_up_routes.list_follow_ups),
        Rule("/follow-ups/<follow_up_id:follow_up>", methods=["DELETE"], endpoint=follow_up_routes.cancel),
        Rule("/search", methods=["GET"], endpoint=search_routes.search_messages),
        Rule("/<uuid:conversation>/stream", methods=["GET"], endpoint=ui_chat_routes.resume),
    ],
    converters={"follow_up_id": FollowUpId},
    strict_slashes=False,
    merge_slashes=False,
    redirect_defaults=False,
)
