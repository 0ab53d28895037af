"""The data export through the real functions: GET /export on the web (the signed-in person's own,
as a download), under the owner policy only the owner's; the operator's crossmem export."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from flask.testing import FlaskClient

from functions import runtime
from functions.tools.cli import main
from tests.helpers import CORS_ORIGIN, JWT_SECRET, app_client, as_owner, bearer, rows


def said(web: FlaskClient, person: uuid.UUID, text: str) -> None:
    assert web.post("/", json={"message": text}, headers=bearer(person)).status_code == 200


def stored(database_url: str, person: uuid.UUID) -> list[tuple[Any, ...]]:
    return rows(
        database_url,
        "select id, surface, role, content from messages where user_id = %s order by created_at, id",
        person,
    )


def as_rows(export: dict[str, Any]) -> list[tuple[Any, ...]]:
    return [(m["id"], m["surface"], m["role"], m["content"]) for m in export["messages"]]


def test_get_export_is_a_download_of_the_persons_own_data(
    web: FlaskClient, environment: pytest.MonkeyPatch, database_url: str
) -> None:
    # The day in the file's name is the export's clock's (UTC): fixed, one second before midnight,
    # where the machine's own day (date.today(), in its zone) or a second later would be another.
    exported_at = datetime(2026, 12, 6, 23, 59, 59, tzinfo=UTC)
    environment.setattr(runtime, "now", lambda: exported_at)
    person, other = uuid.uuid4(), uuid.uuid4()
    said(web, person, "My bank is Northwind")
    said(web, other, "someone else's words")
    said(web, person, "My sister lands on the 14th")

    response = web.get("/export", headers=bearer(person))

    assert response.status_code == 200
    assert response.mimetype == "application/json"
    filename = f"crossmem-export-{person}-20261206.json"
    assert response.headers["Content-Disposition"] == f'attachment; filename="{filename}"'
    assert response.headers["Cache-Control"] == "no-store"
    export = json.loads(response.get_data(as_text=True))
    assert export["user_id"] == str(person) and export["messages_total"] == 4
    assert export["exported_at"] == "2026-12-06T23:59:59+00:00"
    assert [m["content"] for m in export["messages"] if m["role"] == "user"] == [
        "My bank is Northwind",
        "My sister lands on the 14th",
    ]
    assert as_rows(export) == stored(database_url, person)
    assert len(export["conversations"]) == 2


def test_a_page_on_another_origin_may_read_the_exports_file_name(web: FlaskClient) -> None:
    """The page on `CORS_ORIGINS` fetches GET /export with the bearer (a link cannot send it) and
    saves the answer under the name the function gives it: a cross-origin fetch reads a header
    only when the answer exposes it, and `Content-Disposition` is none of the safelisted ones, so
    `response.headers.get("Content-Disposition")` was null there."""
    person = uuid.uuid4()
    response = web.get("/export", headers={**bearer(person), "Origin": CORS_ORIGIN})
    assert response.status_code == 200
    assert response.headers["Access-Control-Allow-Origin"] == CORS_ORIGIN
    exposed = [name.strip() for name in response.headers["Access-Control-Expose-Headers"].split(",")]
    assert exposed == ["Retry-After", "Allow", "Content-Disposition", "x-vercel-ai-ui-message-stream"]
    assert response.headers["Content-Disposition"].startswith(f'attachment; filename="crossmem-export-{person}-')


def test_get_export_refuses_what_it_cannot_answer(web: FlaskClient) -> None:
    person = uuid.uuid4()
    assert web.get("/export").status_code == 401
    asked = web.get(f"/export?user={uuid.uuid4()}", headers=bearer(person))
    assert (asked.status_code, asked.get_json()) == (
        400,
        {"error": "bad_request", "message": "GET /export takes no parameters (got user): it exports all of yours"},
    )
    posted = web.post("/export", headers=bearer(person))
    assert (posted.status_code, posted.headers["Allow"]) == (405, "GET")


def test_under_the_owner_policy_only_the_owner_exports(environment: pytest.MonkeyPatch, owner: uuid.UUID) -> None:
    as_owner(environment, owner)
    environment.setenv("SUPABASE_JWT_SECRET", JWT_SECRET)
    web = app_client("web_chat")
    someone = web.get("/export", headers=bearer(uuid.uuid4()))
    assert someone.status_code == 403 and someone.get_json()["error"] == "forbidden"
    mine = web.get("/export", headers=bearer(owner))
    assert mine.status_code == 200 and json.loads(mine.get_data(as_text=True))["user_id"] == str(owner)


def test_crossmem_export_writes_the_persons_data_to_a_file_or_stdout(
    web: FlaskClient, database_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    person, other = uuid.uuid4(), uuid.uuid4()
    said(web, person, "My locker code is 4417")
    said(web, other, "someone else's words")
    output = tmp_path / "person.json"

    assert main(["export", "--user", str(person), "--output", str(output)]) == 0

    written = json.loads(output.read_text())
    assert written["user_id"] == str(person)
    assert as_rows(written) == stored(database_url, person)
    assert [m["content"] for m in written["messages"]][0] == "My locker code is 4417"
    assert not (tmp_path / "person.json.partial").exists()
    assert capsys.readouterr().err == f"exported {person} to {output}\n"

    assert main(["export", "--user", str(person)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert as_rows(printed) == as_rows(written)
    with pytest.raises(SystemExit) as refused:
        main(["export", "--user", "not-a-uuid"])
    assert refused.value.code == 2


def test_crossmem_export_to_a_file_it_cannot_write_says_which_and_why(
    web: FlaskClient, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A mistyped --output (its folder not there, or one that cannot be written): it ended in a
    traceback naming the `.partial` file beside it."""
    person = uuid.uuid4()
    said(web, person, "My locker code is 4417")
    capsys.readouterr()
    output = tmp_path / "no-such-folder" / "person.json"
    with pytest.raises(SystemExit) as refused:
        main(["export", "--user", str(person), "--output", str(output)])
    assert refused.value.code == 1
    assert capsys.readouterr() == ("", f"Error: Could not open file {str(output)!r}: No such file or directory\n")
    assert list(tmp_path.iterdir()) == []


def test_with_the_database_down_get_export_is_503_before_any_download(
    web: FlaskClient, environment: pytest.MonkeyPatch
) -> None:
    environment.setenv("DATABASE_URL", "postgresql://postgres@127.0.0.1:1/postgres")
    response = app_client("web_chat").get("/export", headers=bearer(uuid.uuid4()))
    assert response.status_code == 503 and response.get_json()["error"] == "store_unavailable"
    assert "Content-Disposition" not in response.headers
