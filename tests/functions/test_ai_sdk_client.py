"""The AI SDK's own client against `crossmem dev`'s server: tests/node/chat.test.mjs, run with
`node --test`, reads the web function's UI message stream with the `ai` package that
tests/node/package-lock.json pins (`make test` installs it with `npm ci`). The server is
`make dev`'s app (functions/tools/local_dev.py's build_dev_app: every function at its path) on
the test's Postgres, with the fake Anthropic as its model."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jwt
import pytest
from werkzeug.serving import make_server

from functions import runtime
from functions.tools.local_dev import DEV_DEFAULTS, build_dev_app
from tests.fakes.anthropic_api import FakeAnthropic
from tests.fakes.local_server import ServingThread
from tests.helpers import claims, execute

NODE_TESTS = Path(__file__).resolve().parents[1] / "node"
STORY = "Once upon a time a traveller wrote down every word she heard, and the notes kept her company."


def model(body: dict[str, Any]) -> str:
    """The story, told slowly enough for a client to hang up after its first words; nothing at
    all (the model failing: no text) when asked to say nothing."""
    return "" if "please say nothing" in json.dumps(body["messages"][-1]) else STORY


@pytest.fixture
def dev_server(
    environment: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic, database_url: str
) -> Iterator[tuple[str, str]]:
    secret = DEV_DEFAULTS["SUPABASE_JWT_SECRET"]
    environment.setenv("SUPABASE_JWT_SECRET", secret)
    environment.setenv("TOKENS_PER_DAY", "1000000")
    fake_anthropic.answer = model
    fake_anthropic.delta_pause_s = 0.02
    runtime.reset()
    server = make_server("127.0.0.1", 0, build_dev_app(), threaded=True)
    serving = ServingThread(server)
    yield f"http://127.0.0.1:{server.server_port}", secret
    serving.stop()
    runtime.reset()


def test_the_ai_sdk_reads_the_stream_of_crossmem_dev(dev_server: tuple[str, str], database_url: str) -> None:
    node = shutil.which("node")
    assert node is not None, "the AI SDK test needs Node 20 (`make test` runs it)"
    assert (NODE_TESTS / "node_modules" / "ai").is_dir(), "run `npm ci --prefix tests/node` (`make test` does)"
    url, secret = dev_server
    person, spender = uuid.uuid4(), uuid.uuid4()
    # The spender has used the day's tokens: the next turn is refused before anything is stored.
    execute(
        database_url,
        "insert into turn_usage (message_id, user_id, tokens) values (%s, %s, 1000000)",
        -(uuid.uuid4().int % 2**62),
        spender,
    )
    env = {
        "PATH": os.environ.get("PATH", ""),
        "CROSSMEM_API": f"{url}/chat/",
        "CROSSMEM_TOKEN": jwt.encode(claims(person), secret, algorithm="HS256"),
        "CROSSMEM_OVER_BUDGET_TOKEN": jwt.encode(claims(spender), secret, algorithm="HS256"),
    }
    done = subprocess.run(
        [node, "--test", "--test-reporter=spec", "chat.test.mjs"],
        cwd=NODE_TESTS,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    print(done.stdout)
    assert "ℹ pass 9\n" in done.stdout and "ℹ fail 0\n" in done.stdout, done.stdout


def test_docs_frontend_shows_the_client_the_node_test_runs() -> None:
    doc = (NODE_TESTS.parents[1] / "docs" / "frontend.md").read_text()
    blocks = re.findall(r"```js\n(.*?)```", doc, flags=re.DOTALL)
    assert blocks == [(NODE_TESTS / "crossmem-chat.mjs").read_text()]
