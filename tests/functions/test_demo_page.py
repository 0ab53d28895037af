"""The demo page in a real browser (Debian's Chromium, driven by Playwright): a newcomer
sees the agent on the web know what was said on Telegram."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import sync_playwright
from werkzeug.serving import make_server

from functions import runtime
from functions.local_dev import DEV_DEFAULTS, build_dev_app

SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "demo.png"
CHROMIUM_FLAGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture
def dev_server(monkeypatch: pytest.MonkeyPatch, database_url: str, tmp_path: Path) -> Iterator[str]:
    monkeypatch.chdir(tmp_path)
    for name, value in DEV_DEFAULTS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("OWNER_USER_ID", "00000000-0000-4000-8000-0000000b0b00")  # a person of this test alone
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    runtime.reset()
    server = make_server("127.0.0.1", 0, build_dev_app(), threaded=True)
    url = f"http://127.0.0.1:{server.server_port}"
    monkeypatch.setenv("PUBLIC_BASE_URL", url)
    runtime.reset()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield url
    server.shutdown()
    runtime.reset()


def test_the_web_page_shows_the_agent_knows_what_was_said_on_telegram(dev_server: str, tmp_path: Path) -> None:
    chromium = shutil.which("chromium")
    assert chromium, "Debian's chromium is missing: `make test` installs it"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport={"width": 1280, "height": 760})
        page.goto(dev_server)
        page.wait_for_selector("body[data-ready=true]")
        page.click("#new-conversation")

        page.fill("#message-input", "Hi! I'm planning my week.")
        page.click("#send")
        page.wait_for_selector(".message.assistant.done >> nth=0")

        page.select_option("#say-surface", "telegram")
        page.fill("#say-text", "My dentist appointment moved to Friday at 10:30")
        page.click("#say-send")
        page.wait_for_selector("#say-log li.delivered")

        page.fill("#message-input", "What did I just tell you on Telegram?")
        page.click("#send")
        answer = page.wait_for_selector(".message.assistant.done >> nth=1")
        assert answer is not None
        text = answer.inner_text()
        assert "on telegram" in text and "My dentist appointment moved to Friday at 10:30" in text
        conversations = page.inner_text("#conversations")
        assert "telegram" in conversations and "web" in conversations
        # The README's picture: taken again only when it is missing (delete it to refresh it).
        shot = SCREENSHOT if not SCREENSHOT.exists() else tmp_path / "demo.png"
        shot.parent.mkdir(exist_ok=True)
        page.screenshot(path=str(shot))
        browser.close()
    assert shot.read_bytes().startswith(b"\x89PNG")
