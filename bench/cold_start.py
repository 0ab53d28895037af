"""Cold start: a fresh process serving the Telegram function to its first answered
webhook (offline model), beside a process that only imports anthropic."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

MAIN = str(Path(__file__).resolve().parent.parent / "main.py")
TELEGRAM = """
from functions_framework import create_app
client = create_app("telegram_webhook", {main!r}).test_client()
update = {{"update_id": 1, "message": {{"message_id": 1, "chat": {{"id": 7, "type": "private"}},
          "from": {{"id": 7, "is_bot": False, "first_name": "A"}}, "text": "hello"}}}}
assert client.post("/", json=update).status_code == 200
print("answered", flush=True)
"""


def _wall_ms(code: str, env: dict[str, str], until: str | None = None) -> float:
    began = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        text=True,
        cwd=env["PYTHONPATH"],  # `python -c` puts the working directory first on sys.path
    )
    assert process.stdout is not None
    if until is not None:
        for line in process.stdout:
            if until in line:
                break
        elapsed = time.perf_counter() - began
        process.wait(timeout=60)
    else:
        process.wait(timeout=60)
        elapsed = time.perf_counter() - began
    return elapsed * 1000


def run(database_url: str, runs: int = 5, main: str = MAIN, warm: bool = True) -> dict[str, float]:
    """`main`: another tree's main.py (the bench's side-by-side figure of an earlier commit).
    `warm`: a first, unmeasured run fills the bytecode cache (off in the quick run: no figure)."""
    env = {
        "PATH": os.environ.get("PATH", ""),
        "APP_ENV": "local",
        "DATABASE_URL": database_url,
        "PYTHONPATH": str(Path(main).parent),
        "IDENTITY_POLICY": "auto",
    }
    code = TELEGRAM.format(main=main)
    if warm:
        _wall_ms(code, env, "answered")  # the first run fills the bytecode cache, as a deploy's build step does
    telegram = [_wall_ms(code, env, "answered") for _ in range(runs)]
    anthropic = [_wall_ms("import anthropic", env) for _ in range(runs)]
    python = [_wall_ms("pass", env) for _ in range(runs)]
    return {
        "telegram": round(statistics.median(telegram), 1),
        "anthropic_import": round(statistics.median(anthropic), 1),
        "python_startup": round(statistics.median(python), 1),
    }
