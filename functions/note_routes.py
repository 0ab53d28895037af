"""The web's memory route, inside `web_chat` (locally under `/chat`):

GET /memory    the person's memory notes: 200 {notes, written_at, covered_until}
"""

from __future__ import annotations

import uuid

import flask

from core.memory.digest import read_notes
from functions import runtime
from functions.http import json_response


def show_memory(request: flask.Request, person: uuid.UUID, cors: dict[str, str]) -> flask.Response:
    return json_response(read_notes(runtime.store(), person).as_json(), headers=cors)
