"""`make dev` end to end: `crossmem dev` in its own process, with no database configured
(so the embedded Postgres), the offline model, and `crossmem say` talking to it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from werkzeug.test import Client

from functions import runtime
from functions.settings import Settings
from functions.tools.local_dev import (
    CHAT_SURFACES,
    DEV_DEFAULTS,
    NO_MESSAGE,
    apply_dev_defaults,
    build_dev_app,
    deliver_locally,
)
from tests.helpers import crossmem_dev, free_port

ROOT = Path(__file__).resolve().parents[2]
CROSSMEM = [sys.executable, "-m", "functions.tools.cli"]


@pytest.fixture
def dev(tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """The dev server on a port of its own; once stopped, its banner's `say` names that port (another
    shell may not have PORT)."""
    port = free_port()
    env = {
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": str(ROOT),
        "PORT": str(port),
        "EMBEDDED_DATA_DIR": str(tmp_path / "pgdata"),
        "HOME": str(tmp_path),
    }
    server = crossmem_dev(env, tmp_path, port)
    url = f"http://127.0.0.1:{port}"
    yield url, env
    server.send_signal(signal.SIGTERM)  # as a process manager would: the embedded Postgres stops with it
    server.wait(timeout=30)
    printed = server.stdout.read() if server.stdout else ""
    assert f"try: .venv/bin/crossmem say --port {port} --surface telegram" in printed


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
    assert 'You told me on telegram: "My flight is on Tuesday".' in asked
    texted = crossmem(env, "say", "--surface", "sms", "And the hotel?")
    assert 'You told me on telegram: "My flight is on Tuesday".' in texted
    assert crossmem(env, "say", "--surface", "sms", "HELP") == NO_MESSAGE + "\n"  # Twilio's own answer, not ours
    assert (
        crossmem(env, "say", "--surface", "telegram", " ")
        == "(answered with no message: private message without text)\n"
    )
    unsigned = httpx.post(f"{url}/telegram", json={"update_id": 1})
    assert unsigned.status_code == 401
    history = crossmem(env, "history", "--user", "00000000-0000-4000-8000-00000000d3e0", "--json")
    assert [m["surface"] for m in json.loads(history)] == ["telegram", "telegram", "whatsapp", "whatsapp", "sms", "sms"]
    nobody = "00000000-0000-4000-8000-0000000000aa"  # an empty answer says so, as follow-ups' does
    assert crossmem(env, "history", "--user", nobody) == "no messages\n"
    assert crossmem(env, "identities", "--user", nobody) == "no linked chats or numbers\n"


def test_say_with_url_alone_signs_for_the_server_it_names(dev: tuple[str, dict[str, str]]) -> None:
    # Another shell, without PORT: `--url` names the server, and a Twilio form is signed for that
    # server's PUBLIC_BASE_URL (http://127.0.0.1:<its port>), not for 8080's.
    url, env = dev
    elsewhere = {name: value for name, value in env.items() if name != "PORT"}
    for surface in ("whatsapp", "sms", "telegram"):
        answer = crossmem(elsewhere, "say", "--url", url, "--surface", surface, f"hello by --url on {surface}")
        assert f'You said on {surface}: "hello by --url on {surface}"' in answer


def crossmem(env: dict[str, str], *args: str) -> str:
    done = subprocess.run([*CROSSMEM, *args], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
def dev_app(environment: pytest.MonkeyPatch) -> Any:
    environment.setenv("SUPABASE_JWT_SECRET", "local-development-jwt-secret-at-least-32-bytes")
    runtime.reset()
    return build_dev_app()


@pytest.mark.parametrize("host", ["127.0.0.1:8080", "localhost:8080", "LOCALHOST", "[::1]:8080", "127.0.0.1"])
def test_the_dev_server_answers_loopback_names(dev_app: Any, host: str) -> None:
    response = Client(dev_app).post("/dev/token", headers={"Host": host})
    assert response.status_code == 200 and response.get_json()["access_token"].count(".") == 2


def test_the_dev_server_names_the_surfaces_for_the_demo_page(dev_app: Any) -> None:
    answer = Client(dev_app).get("/dev/surfaces", headers={"Host": "127.0.0.1:8080"})
    assert answer.get_json() == {
        "surfaces": [
            {"surface": "web", "label": "Web"},
            {"surface": "telegram", "label": "Telegram"},
            {"surface": "whatsapp", "label": "WhatsApp"},
            {"surface": "sms", "label": "SMS"},
        ],
        "other_apps": ["telegram", "whatsapp", "sms"],
    }


@pytest.mark.parametrize("host", ["rebound.example:8080", "127.0.0.1.nip.io:8080", "localhost.evil.example"])
@pytest.mark.parametrize("path", ["/dev/token", "/dev/say", "/telegram", "/chat/conversations"])
def test_the_dev_server_refuses_any_other_host_on_every_route(dev_app: Any, host: str, path: str) -> None:
    response = Client(dev_app).post(path, headers={"Host": host})
    assert (response.status_code, response.get_json()) == (
        403,
        {"error": "forbidden_host", "message": "this server answers only localhost, 127.0.0.1 and [::1]"},
    )


def test_dot_env_wins_over_the_development_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [*DEV_DEFAULTS, "PUBLIC_BASE_URL"]:
        monkeypatch.setenv(name, "")  # recorded, so the test gives the environment back as it was
        monkeypatch.delenv(name)
    (tmp_path / ".env").write_text("APP_ENV=production\nTELEGRAM_WEBHOOK_SECRET=from-dot-env\n")
    monkeypatch.chdir(tmp_path)
    apply_dev_defaults(8080)
    runtime.reset()
    config = runtime.settings()
    assert config.app_env == "production"
    assert config.telegram_webhook_secret is not None
    assert config.telegram_webhook_secret.get_secret_value() == "from-dot-env"
    assert config.identity_policy == "owner"  # not in .env: the development value
    assert config.public_base_url == "http://127.0.0.1:8080"
    runtime.reset()


def test_a_copy_of_the_example_configuration_keeps_the_development_values(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """.env.example says "Copy to .env for local use": its copy must leave `make dev` local (a copied
    APP_ENV=production made every turn 503 `no database` while the banner said store=embedded)."""
    for name in [*DEV_DEFAULTS, "PUBLIC_BASE_URL"]:
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    (tmp_path / ".env").write_text((ROOT / ".env.example").read_text())
    monkeypatch.chdir(tmp_path)
    apply_dev_defaults(8080)
    runtime.reset()
    config = runtime.settings()
    assert {name: os.environ.get(name) for name in DEV_DEFAULTS} == DEV_DEFAULTS
    assert config.app_env == "local" and config.identity_policy == "owner"
    runtime.reset()


def test_say_from_a_telegram_sender_that_is_not_a_user_id_says_what_it_wants() -> None:
    # It was `invalid literal for int() with base 10: 'abc'`; nothing is posted either way.
    with pytest.raises(
        ValueError, match=r"^--from on telegram is a Telegram user id \(digits, e.g. 100200300\), not 'abc'$"
    ):
        deliver_locally("http://127.0.0.1:9", "telegram", "hello", Settings.defaults(), "abc")


@pytest.mark.parametrize("surface", CHAT_SURFACES)
def test_say_signs_a_delivery_on_every_chat_surface(surface: str) -> None:
    """`crossmem say` and the demo page's "Other app" list every surface but the web (`Surface`);
    how a delivery is signed is the dev server's one knowledge of each platform (Telegram's update,
    Twilio's form). A surface on another platform fails here until deliver_locally signs its
    deliveries: seen with a pretend fifth surface (a JSON webhook with a shared secret), which
    every other test let by while `say` posted it a Twilio form (415)."""
    with pytest.raises(OSError):  # signed and posted: nothing listens on port 9
        deliver_locally("http://127.0.0.1:9", surface, "hello", Settings.defaults(), None)


def test_say_to_a_surface_it_cannot_sign_says_so_and_posts_nothing() -> None:
    """It posted any surface but Telegram a form signed as Twilio's: the surface's function
    answered 415 or 403, shown as the reply, with nothing said of why."""
    with pytest.raises(ValueError, match=r"^crossmem say cannot sign a delivery on web: "):
        deliver_locally("http://127.0.0.1:9", "web", "hello", Settings.defaults(), None)


def test_crossmem_dev_under_app_env_production_without_a_database_stops_before_it_serves(tmp_path: Path) -> None:
    # It served, its banner saying store=embedded and /healthz ok, and every turn was 503 "no database".
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(ROOT), "HOME": str(tmp_path), "PORT": str(free_port())}
    (tmp_path / ".env").write_text("APP_ENV=production\n")
    done = subprocess.run([*CROSSMEM, "dev"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == (
        "crossmem dev: APP_ENV=production (the environment or .env): no database: set DATABASE_URL (on Supabase,"
        " the transaction pooler's URL) or SUPABASE_URL with SUPABASE_SERVICE_ROLE_KEY\n"
    )
    assert not (tmp_path / ".local").exists()  # no embedded database was started for nothing


def test_crossmem_dev_on_a_port_in_use_says_so_before_any_banner_or_database(tmp_path: Path) -> None:
    # It started the embedded database, printed "crossmem on http://127.0.0.1:PORT" and `try: ...`,
    # and only then said the port was taken.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(ROOT), "HOME": str(tmp_path), "PORT": str(port)}
        done = subprocess.run([*CROSSMEM, "dev"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == (
        f"Address already in use\nPort {port} is in use by another program. Either identify and stop that program,"
        " or start the server with a different port.\n"
    )
    assert not (tmp_path / ".local").exists()


def test_closing_the_terminal_of_crossmem_dev_stops_its_embedded_postgres(tmp_path: Path) -> None:
    """Seen failing: a closed terminal (SIGHUP) ended the server without its cleanup, and the embedded
    Postgres ran on for good: the next `make dev` reused it, and its exit, finding the dead server's
    handle still listed, left it running too."""
    port = free_port()
    data = tmp_path / "pgdata"
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(ROOT), "PORT": str(port)}
    env |= {"EMBEDDED_DATA_DIR": str(data), "HOME": str(tmp_path)}
    server = crossmem_dev(env, tmp_path, port)
    running = int((data / "postmaster.pid").read_text().split()[0])
    try:
        server.send_signal(signal.SIGHUP)
        assert server.wait(timeout=30) == 0
        assert not (data / "postmaster.pid").exists()
        assert json.loads((data / ".handle_pids.json").read_text()) == []
    finally:
        if (data / "postmaster.pid").exists():  # left running: stop it (fast shutdown), as no one else will
            os.kill(running, signal.SIGINT)


def test_crossmem_dev_after_one_killed_outright_cleans_its_handle_up_and_stops_its_embedded_postgres(
    tmp_path: Path,
) -> None:
    """Seen failing: `kill -9` of `crossmem dev` (no handler runs) left its pid listed among the embedded
    Postgres's handles (.handle_pids.json) and the Postgres running. The next `crossmem dev` started on
    it, and its clean exit, finding the dead pid still listed, left the Postgres running too: as every
    later one did, the dead pid never leaving the list."""
    port = free_port()
    data = tmp_path / "pgdata"
    handles = data / ".handle_pids.json"
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(ROOT), "PORT": str(port)}
    env |= {"EMBEDDED_DATA_DIR": str(data), "HOME": str(tmp_path)}
    killed = crossmem_dev(env, tmp_path, port)
    running = int((data / "postmaster.pid").read_text().split()[0])
    server = None
    try:
        killed.kill()
        killed.wait(timeout=30)
        assert json.loads(handles.read_text()) == [killed.pid]  # what `kill -9` leaves
        server = crossmem_dev(env, tmp_path, port)
        assert json.loads(handles.read_text()) == [server.pid]
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=30) == 0
        assert not (data / "postmaster.pid").exists()
        assert json.loads(handles.read_text()) == []
    finally:
        if server is not None and server.poll() is None:
            server.kill()
            server.wait(timeout=30)
        if (data / "postmaster.pid").exists():  # left running: stop it (fast shutdown), as no one else will
            os.kill(running, signal.SIGINT)
