"""The web function's OpenAPI document (functions/web_openapi.py): served as docs/openapi.json holds
it, and Schemathesis (from PyPI) sending every route the requests it derives from it, with a
valid token, against the real function on a real server: no 5xx, every answer's status, type
and body as the document says."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from flask.testing import FlaskClient
from werkzeug.serving import make_server

from functions import web_openapi
from tests.fakes.anthropic_api import FakeAnthropic
from tests.fakes.local_server import ServingThread
from tests.helpers import bearer

DOCUMENT = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"
SCHEMATHESIS = Path(sys.executable).parent / "st"
# Bounded: a few hundred cases over the 15 operations (the coverage phase's own, and this many
# fuzzed for each), well under a minute.
MAX_EXAMPLES = 5


def test_the_served_document_is_docs_openapi_json(web: FlaskClient) -> None:
    served = web.get("/openapi.json")  # no token: the document is public, as docs/openapi.json is
    assert served.status_code == 200
    assert served.get_json() == json.loads(DOCUMENT.read_text()), "regenerate: python -m functions.web_openapi"
    assert DOCUMENT.read_text() == web_openapi.text()
    assert served.get_json()["openapi"] == "3.1.0"


def test_the_request_bodies_are_the_models_the_routes_validate_with() -> None:
    schemas = web_openapi.document()["components"]["schemas"]
    assert schemas["SendMessage"]["required"] == ["message"]
    assert schemas["UIChatRequest"]["properties"]["id"] == {"format": "uuid", "title": "Id", "type": "string"}
    assert schemas["WebAttachment"]["properties"]["media_type"]["enum"][0] == "image/jpeg"


@pytest.fixture
def served(web: FlaskClient) -> Iterator[str]:
    server = make_server("127.0.0.1", 0, web.application, threaded=True)
    serving = ServingThread(server)
    yield f"http://127.0.0.1:{server.server_port}"
    serving.stop()


def test_schemathesis_finds_no_5xx_and_every_answer_as_documented(
    served: str, fake_anthropic: FakeAnthropic, tmp_path: Path, record_property: Callable[[str, object], None]
) -> None:
    person = uuid.uuid4()
    # The process's first turn builds its clients (a dozen seconds on a busy machine): not a case's.
    assert httpx.post(served, json={"message": "hello"}, headers=bearer(person), timeout=60).status_code == 200
    run = subprocess.run(
        [
            str(SCHEMATHESIS),
            "run",
            str(DOCUMENT),
            "--url",
            served,
            "--header",
            f"Authorization: {bearer(person)['Authorization']}",
            "--checks",
            "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance",
            "--phases",
            "examples,coverage,fuzzing",
            "--max-examples",
            str(MAX_EXAMPLES),
            "--seed",
            "31",
            # One worker: with two threads, Hypothesis (describing its lambdas) parses source with `ast`
            # in both at once, and CPython 3.11's AST constructor can then raise "AST constructor
            # recursion depth mismatch" (python/cpython#106905): a runtime error of the tool, once
            # in a loaded CI run, never a finding about the web.
            "--workers",
            "1",
            "--report",
            "ndjson",
            "--report-dir",
            str(tmp_path),
            "--request-timeout",
            "30",
            "--no-color",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
    )
    print(run.stdout)
    assert run.returncode == 0, run.stdout + run.stderr
    cases = re.search(r"Test cases:\s+(\d+) generated", run.stdout)
    assert cases is not None and int(cases[1]) > 100, run.stdout
    record_property("summary", f"Schemathesis: {cases[1]} cases on every web route, no 5xx, all as documented")
