"""`make dev` end to end: `crossmem dev` in its own process, with no database configured
(so the embedded Postgres), the offline model, and `crossmem say` talking to it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
CROSSMEM = [sys.executable, "-m", "functions.cli"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def dev(tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    port = free_port()
    env = {
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": str(ROOT),
        "PORT": str(port),
        "EMBEDDED_DATA_DIR": str(tmp_path / "pgdata"),
        "HOME": str(tmp_path),
    }
    server = subprocess.Popen(
        [*CROSSMEM, "dev"], env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.3)
    else:
        server.kill()
        pytest.fail("crossmem dev did not answer /healthz: " + (server.stdout.read() if server.stdout else ""))
    yield url, env
    server.send_signal(signal.SIGTERM)  # as a process manager would: the embedded Postgres stops with it
    server.wait(timeout=30)


def test_make_dev_serves_everything_on_an_embedded_database(dev: tuple[str, dict[str, str]]) -> None:
    url, env = dev
    assert httpx.get(f"{url}/healthz").json() == {
        "ok": True,
        "store": "embedded",
        "model": "offline-stand-in",
        "max_message_chars": 16000,
    }
    assert "<title>crossmem" in httpx.get(f"{url}/").text
    crossmem(env, "say", "--surface", "telegram", "My flight is on Tuesday")
    asked = crossmem(env, "say", "--surface", "whatsapp", "When is my flight?")
    assert 'on telegram, was: "My flight is on Tuesday"' in asked
    unsigned = httpx.post(f"{url}/telegram", json={"update_id": 1})
    assert unsigned.status_code == 401
    history = crossmem(env, "history", "--user", "00000000-0000-4000-8000-00000000d3e0", "--json")
    assert [m["surface"] for m in json.loads(history)] == ["telegram", "telegram", "whatsapp", "whatsapp"]


def crossmem(env: dict[str, str], *args: str) -> str:
    done = subprocess.run([*CROSSMEM, *args], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout
