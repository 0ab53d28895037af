"""`crossmem` commands, run in-process against the real database and a fake Bot API."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from core.models import Person, Surface
from core.stores.embedded import MIGRATIONS
from functions import runtime
from functions.tools.cli import main
from tests.database import fresh_database
from tests.fakes.telegram_api import FakeTelegram
from tests.helpers import TELEGRAM_SECRET, free_port

ROOT = Path(__file__).resolve().parents[2]


def test_migrate_applies_once_then_reports_up_to_date(
    postgres_server: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: object
) -> None:
    monkeypatch.chdir(str(tmp_path))
    with fresh_database(postgres_server) as url:
        monkeypatch.setenv("DATABASE_URL", url)
        assert main(["migrate", "--supabase-standins"]) == 0
        versions = [path.stem.split("_")[0] for path in sorted(MIGRATIONS.glob("*.sql"))]
        assert f"applied {len(versions)} migration(s): {', '.join(versions)}" in capsys.readouterr().out
        assert main(["migrate"]) == 0
        assert "up to date" in capsys.readouterr().out


def test_migrate_on_a_plain_postgres_says_to_use_the_standins(
    postgres_server: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: object
) -> None:
    monkeypatch.chdir(str(tmp_path))
    with fresh_database(postgres_server) as url:
        monkeypatch.setenv("DATABASE_URL", url)
        assert main(["migrate"]) == 1
    captured = capsys.readouterr()
    # The roles are the cluster's: a server that already has them stops at the auth schema instead.
    assert captured.err.startswith(('crossmem migrate: role "anon" does not exist', 'crossmem migrate: schema "auth"'))
    assert "this Postgres is not a Supabase project. Run `crossmem migrate --supabase-standins`" in captured.err
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err


def test_migrate_without_a_database_url_says_so(
    monkeypatch: pytest.MonkeyPatch, tmp_path: object, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(str(tmp_path))
    monkeypatch.delenv("DATABASE_URL", raising=False)
    assert main(["migrate"]) == 2
    assert "DATABASE_URL" in capsys.readouterr().err


def test_history_prints_a_persons_thread_over_every_surface(
    environment: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    person = uuid.uuid4()
    memory = runtime.memory()
    for surface, text in ((Surface.TELEGRAM, "from telegram"), (Surface.WHATSAPP, "from whatsapp")):
        start = memory.begin_turn(Person(user_id=person), surface, text, uuid.uuid4().hex)
        assert start.message_id is not None
        memory.finish_turn(person, start.message_id, f"reply to {text}")
    capsys.readouterr()
    assert main(["history", "--user", str(person)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("] ", 1)[1] for line in lines] == [
        "user: from telegram",
        "assistant: reply to from telegram",
        "user: from whatsapp",
        "assistant: reply to from whatsapp",
    ]
    assert main(["history", "--user", str(person), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(row["surface"], row["role"]) for row in rows][:2] == [("telegram", "user"), ("telegram", "assistant")]


def test_telegram_set_webhook_and_info_go_through_the_bot_api(
    environment: pytest.MonkeyPatch, fake_telegram: FakeTelegram, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        main(
            [
                "telegram",
                "set-webhook",
                "--url",
                "https://advisor.example.com/telegram_webhook",
                "--drop-pending-updates",
            ]
        )
        == 0
    )
    ((method, payload),) = fake_telegram.calls
    assert method == "setWebhook"
    assert payload["url"] == "https://advisor.example.com/telegram_webhook"
    assert payload["secret_token"] == TELEGRAM_SECRET and payload["drop_pending_updates"] is True
    assert "message" in payload["allowed_updates"] and "my_chat_member" in payload["allowed_updates"]
    assert main(["telegram", "info"]) == 0
    assert json.loads(capsys.readouterr().out.split("\n", 1)[1])["pending_update_count"] == 0
    fake_telegram.down = True
    assert main(["telegram", "info"]) == 1
    err = capsys.readouterr().err
    assert "getWebhookInfo" in err and "TEST-token" not in err  # the token never reaches the terminal


@pytest.mark.parametrize("port_from", ["environment", ".env"])
def test_say_reads_port_like_dev_and_names_the_url_it_could_not_reach(port_from: str, tmp_path: Path) -> None:
    port = free_port()
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(ROOT), "HOME": str(tmp_path)}
    if port_from == "environment":
        env["PORT"] = str(port)
    else:
        (tmp_path / ".env").write_text(f"PORT={port}\n")
    done = subprocess.run(
        [sys.executable, "-m", "functions.tools.cli", "say", "--surface", "telegram", "hello?"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1 and done.stdout == ""
    assert f"could not reach the dev server at http://127.0.0.1:{port} " in done.stderr
    assert "Traceback" not in done.stderr
