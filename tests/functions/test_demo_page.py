"""The demo page in a real browser (Debian's Chromium, driven by Playwright), used as people
use it, on a phone and on a desktop: a web message, a delivery from another app, the web
answer that knows it, a long thread, a failed send, a tab left open for an hour, a stored photo
and voice note shown by their kind, and the search box finding what was said on another app."""

from __future__ import annotations

import base64
import json
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlparse
from zoneinfo import ZoneInfo

import httpx
import jwt
import psycopg
import pytest
from playwright.sync_api import Page, Route, sync_playwright
from werkzeug.serving import make_server

from core.models import Person, Surface
from core.surfaces import rules
from functions import runtime
from functions.tools.local_dev import DEV_DEFAULTS, build_dev_app, run_scheduled_job
from tests.fakes.anthropic_api import FakeAnthropic
from tests.fakes.deepgram_api import FakeDeepgram
from tests.fakes.local_server import ServingThread

DOCS = Path(__file__).resolve().parents[2] / "docs"
SIZES = {"desktop": {"width": 1280, "height": 800}, "phone": {"width": 390, "height": 844}}
SCREENSHOTS = {"desktop": DOCS / "demo.png", "phone": DOCS / "demo-phone.png"}
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
TELEGRAM_NOTES = 26  # with their replies, more than the page's first page of 50
LONG_THREAD_TURNS = 12
HEBREW = "נפגשים ביום שישי בעשר"
POLL_MS = 10_000  # functions/tools/demo/index.html's
RECEIPT = Path(__file__).resolve().parents[1] / "corpus" / "media" / "receipt.jpg"
VOICE_NOTE = Path(__file__).resolve().parents[1] / "corpus" / "media" / "voice_note_es.ogg"

LAYOUT = """() => {
  const box = (id) => document.getElementById(id).getBoundingClientRect();
  const send = box("send");
  const onTop = document.elementFromPoint(send.x + send.width / 2, send.y + send.height / 2);
  return { pageWidth: document.documentElement.scrollWidth, viewport: innerWidth, thread: box("messages").width,
           input: box("message-input").width, sendOnTop: onTop !== null && onTop.id === "send", sendRight: send.right };
}"""
AT_END = """() => { const thread = document.getElementById('messages');
  return thread.scrollHeight - thread.clientHeight - thread.scrollTop <= 2; }"""
SCROLL_TOP = "() => document.getElementById('messages').scrollTop"
WATCH_TYPING = """() => { window.typingSeen = false;
  new MutationObserver(() => { if (document.querySelector('.message.typing')) window.typingSeen = true; })
    .observe(document.getElementById('messages'), { childList: true, subtree: true, attributes: true }); }"""
# A tab in the background (Chromium's own, headless, is always in front): the page stops polling.
HIDE_TAB = """() => { Object.defineProperty(document, 'visibilityState', { configurable: true, get: () => 'hidden' });
  document.dispatchEvent(new Event('visibilitychange')); }"""
# What the page's own fetch calls were answered, as the page saw them. Playwright's "response" event
# can be missing for a response whose body the page never reads (the 401 before a renewal).
RECORD_FETCHES = """(() => { const seen = []; window.fetched = seen; const original = window.fetch;
  window.fetch = async (input, init = {}) => { const response = await original(input, init);
    seen.push([init.method || 'GET', new URL(String(input), location.href).pathname, response.status]);
    return response; }; })();"""
SHOW_TAB = """() => { delete document.visibilityState; document.dispatchEvent(new Event('visibilitychange')); }"""
TEXTS_WITHOUT_DIR_AUTO = """() => [...document.querySelectorAll(
  '.message .text, #conversations .title, #say-log .said, #say-log .answer, #message-input, #say-text')]
  .filter((element) => element.dir !== 'auto').length"""


def fetched(page: Page) -> list[tuple[str, str, int]]:
    return [tuple(answer) for answer in page.evaluate("window.fetched")]  # type: ignore[misc]


class DevApi:
    """The dev server's API as a frontend (or a person with curl) calls it, to seed and to check."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.auth = {"Authorization": f"Bearer {httpx.post(f'{url}/dev/token').json()['access_token']}"}

    def say(self, text: str, surface: str = "telegram") -> None:
        assert httpx.post(f"{self.url}/dev/say", json={"surface": surface, "text": text}).json()["status"] == 200

    def chat(
        self, text: str, conversation_id: str | None = None, attachments: list[dict[str, Any]] | None = None
    ) -> str:
        body = {"message": text, "conversation_id": conversation_id, "attachments": attachments or []}
        answer = httpx.post(f"{self.url}/chat/", json=body, headers=self.auth, timeout=30)
        assert answer.status_code == 200, answer.text
        return str(answer.json()["conversation_id"])

    def messages(self, conversation_id: str) -> list[dict[str, Any]]:
        page = httpx.get(f"{self.url}/chat/conversations/{conversation_id}/messages", headers=self.auth)
        return list(page.json()["messages"])

    def conversations(self) -> list[dict[str, Any]]:
        return list(httpx.get(f"{self.url}/chat/conversations", headers=self.auth).json()["conversations"])

    def message_count(self, surface: str) -> int:
        conversation = next(c for c in self.conversations() if c["surface"] == surface)
        page = httpx.get(f"{self.url}/chat/conversations/{conversation['id']}/messages?limit=200", headers=self.auth)
        return len(page.json()["messages"])


@pytest.fixture
def dev_server(monkeypatch: pytest.MonkeyPatch, database_url: str, tmp_path: Path) -> Iterator[str]:
    monkeypatch.chdir(tmp_path)
    for name, value in DEV_DEFAULTS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("OWNER_USER_ID", str(uuid.uuid4()))  # a person of this test alone
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("MAX_MESSAGE_CHARS", raising=False)
    monkeypatch.setenv("TURNS_PER_MINUTE", "0")  # the test writes faster than a person
    runtime.reset()
    server = make_server("127.0.0.1", 0, build_dev_app(), threaded=True)
    url = f"http://127.0.0.1:{server.server_port}"
    monkeypatch.setenv("PUBLIC_BASE_URL", url)
    runtime.reset()
    serving = ServingThread(server)
    yield url
    serving.stop()
    runtime.reset()


def send_on_the_web(page: Page, text: str) -> str:
    """Send from the page's composer; the answer's text once it is complete."""
    answered = page.locator(".message.assistant.done").count()
    page.fill("#message-input", text)
    page.click("#send")
    page.wait_for_function(f"document.querySelectorAll('.message.assistant.done').length > {answered}")
    page.wait_for_selector("body:not([data-busy])", state="attached")  # and the list refreshed after it
    return page.locator(".message.assistant.done").last.inner_text()


def answering_with(monkeypatch: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic) -> None:
    """The dev server's turns answered by the fake Anthropic, not the offline model."""
    for name, value in {
        "ANTHROPIC_API_KEY": "sk-ant-test",
        "ANTHROPIC_BASE_URL": fake_anthropic.url,
        "ANTHROPIC_MAX_RETRIES": "0",
    }.items():
        monkeypatch.setenv(name, value)
    runtime.reset()


@contextmanager
def demo_page(url: str, size: str = "desktop") -> Iterator[Page]:
    """The demo page in Chromium at a desktop's size (or `size`'s), its clock the test's, ready to send."""
    chromium = shutil.which("chromium")
    assert chromium, "Debian's chromium is missing: `make test` installs it"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport=SIZES[size])  # type: ignore[arg-type]
        page.clock.install()
        page.goto(url)
        page.wait_for_selector("body[data-ready=true]")
        yield page
        browser.close()


def deliver_from_telegram(page: Page, text: str, phone: bool, *, double_click: bool = False) -> None:
    """The right-hand panel: a signed Telegram delivery (behind the "Other app" button on a phone)."""
    if phone:
        page.click("#show-elsewhere")
    delivered = page.locator("#say-log li.delivered").count()
    page.select_option("#say-surface", "telegram")
    page.fill("#say-text", text)
    if double_click:
        page.dblclick("#say-send")
    else:
        page.click("#say-send")
    page.wait_for_function(f"document.querySelectorAll('#say-log li.delivered').length > {delivered}")
    page.wait_for_selector("body:not([data-busy])", state="attached")
    if phone:
        page.click("#elsewhere [data-close]")


def open_conversation(page: Page, selector: str, phone: bool) -> None:
    if phone:
        page.click("#show-conversations")
    page.click(selector)


def check_layout(page: Page, phone: bool) -> None:
    layout = page.evaluate(LAYOUT)
    assert layout["pageWidth"] == layout["viewport"], "the page scrolls sideways"
    assert layout["sendOnTop"] and layout["sendRight"] <= layout["viewport"], "Send is covered or off screen"
    assert layout["thread"] >= (layout["viewport"] if phone else 600)
    assert layout["input"] >= 200
    assert page.is_visible("#sidebar") is not phone and page.is_visible("#elsewhere") is not phone


@pytest.mark.parametrize("size", ["desktop", "phone"])
def test_the_demo_page_as_people_use_it(dev_server: str, size: str) -> None:
    chromium = shutil.which("chromium")
    assert chromium, "Debian's chromium is missing: `make test` installs it"
    phone = size == "phone"
    api = DevApi(dev_server)
    for index in range(TELEGRAM_NOTES):
        api.say(f"Note {index} from Telegram: pack item number {index}")
    long_thread = api.chat("Let's go through my packing list, item by item.")
    for index in range(LONG_THREAD_TURNS - 1):
        api.chat(f"Item {index}: do I need it for a week in Lisbon?", long_thread)

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport=SIZES[size])  # type: ignore[arg-type]
        page.clock.install()
        page.add_init_script(RECORD_FETCHES)
        answers: list[tuple[str, str, int]] = []
        page.on(
            "response",
            lambda response: answers.append((response.request.method, urlparse(response.url).path, response.status)),
        )
        page.goto(dev_server)
        page.wait_for_selector("body[data-ready=true]")
        page.evaluate("window.sameDocument = true")
        page.evaluate(WATCH_TYPING)

        # The other apps offered are the server's list (GET /dev/surfaces, built from `Surface`).
        offered = page.eval_on_selector_all("#say-surface option", "options => options.map((o) => [o.value, o.text])")
        assert offered == [[surface.value, rules(surface).label] for surface in Surface if surface.is_secondary]

        # The screen fits: on a phone the chat takes it, from 360 px up; the list and the panel fold away.
        if phone:
            page.set_viewport_size({"width": 360, "height": 740})
            check_layout(page, phone=True)
            page.set_viewport_size(SIZES["phone"])
        else:
            page.set_viewport_size({"width": 768, "height": 800})
            check_layout(page, phone=True)
            page.set_viewport_size(SIZES["desktop"])
        check_layout(page, phone)

        # A long thread opens at its end and follows the reply as it comes in.
        assert page.locator(".message").count() == 2 * LONG_THREAD_TURNS
        assert page.evaluate(AT_END)
        send_on_the_web(page, "One more thing: the hotel is booked.")
        assert page.evaluate(
            "() => { const t = document.getElementById('messages'); return t.scrollHeight > 2 * t.clientHeight; }"
        )
        assert page.evaluate(AT_END)

        # "New conversation" stores nothing until its first message.
        conversations = len(api.conversations())
        open_conversation(page, "#new-conversation", phone)
        assert page.inner_text("#messages") == "A new conversation. It is saved when you send its first message."
        assert len(api.conversations()) == conversations

        send_on_the_web(page, "Hi! I'm planning my week.")
        assert [c["title"] for c in api.conversations() if c["surface"] == "web"][0] == "Hi! I'm planning my week."
        assert len(api.conversations()) == conversations + 1
        assert page.text_content("#conversations li.active .title") == "Hi! I'm planning my week."

        # One delivery per click on the panel, even a double click.
        deliver_from_telegram(page, "My dentist appointment moved to Friday at 10:30", phone, double_click=True)
        assert page.locator("#say-log li").count() == 1
        assert api.message_count("telegram") == 2 * TELEGRAM_NOTES + 2

        answer = send_on_the_web(page, "What did I just tell you on Telegram?")
        assert "on telegram" in answer and "My dentist appointment moved to Friday at 10:30" in answer

        # A photo attached (a gallery's or the phone camera's file input), scaled, sent beside the text.
        page.set_input_files("#photo-input", str(RECEIPT))
        page.wait_for_selector("#attachment:not([hidden])")
        send_on_the_web(page, "Here is this morning's receipt")
        assert page.locator(".message.user img.photo").count() == 1
        assert page.locator("#attachment").is_hidden()
        conversation = next(c for c in api.conversations() if c["surface"] == "web" and "planning" in c["title"])
        listed = httpx.get(f"{api.url}/chat/conversations/{conversation['id']}/messages", headers=api.auth).json()
        mine = [m for m in listed["messages"] if m["role"] == "user"][-1]
        assert (mine["kind"], mine["content"]) == ("image", "[photo] Here is this morning's receipt")
        page.screenshot(path=str(SCREENSHOTS[size]))  # the README's pictures, from this run

        # Over the limit: not sent, said so in the page's words, the text kept, and a retry.
        assistant_bubbles = page.locator(".message.assistant").count()
        too_long = ("Every detail of my trip, day by day. " * 500)[:16001]
        page.fill("#message-input", too_long)
        assert page.inner_text("#counter") == "16,001 / 16,000 characters: 1 over the limit"
        page.click("#send")
        page.wait_for_selector(".message.user.failed")
        assert page.inner_text(".message.user.failed .reason") == (
            "Not sent: it is 16,001 characters long, over the limit of 16,000. Shorten it, then retry."
        )
        assert page.input_value("#message-input") == too_long
        assert page.locator(".message.assistant").count() == assistant_bubbles
        page.fill("#message-input", "The short version: Lisbon, 3 to 9 May.")
        page.click(".message.user.failed .retry")
        page.wait_for_function(
            f"document.querySelectorAll('.message.assistant.done').length === {assistant_bubbles + 1}"
        )
        page.wait_for_selector("body:not([data-busy])", state="attached")
        assert page.locator(".message.user.failed").count() == 0 and page.input_value("#message-input") == ""
        assert page.locator(".message.user").last.inner_text() == "The short version: Lisbon, 3 to 9 May."

        # An hour later, in the same tab: the session is renewed, and a token the server refuses
        # (here, one that already expired) is renewed once more and the message retried. The tab
        # was in the background for that hour: no poll renewed the session meanwhile.
        page.evaluate(HIDE_TAB)
        page.clock.fast_forward("01:00:00")
        now = int(time.time())
        expired = jwt.encode(
            {
                "sub": str(runtime.settings().owner_user_id),
                "aud": "authenticated",
                "role": "authenticated",
                "iat": now - 3700,
                "exp": now - 100,
            },
            DEV_DEFAULTS["SUPABASE_JWT_SECRET"],
            algorithm="HS256",
        )
        page.route(
            "**/dev/token", lambda route: route.fulfill(json={"access_token": expired, "expires_in": 3600}), times=1
        )
        before = len(fetched(page))
        answer = send_on_the_web(page, "Still there after an hour?")
        assert 'You said on web: "Still there after an hour?"' in answer
        # Renewed before use (the hour is up), refused once (that token had expired), renewed
        # again, retried. Whichever of the page's calls met the 401 first, the message went.
        after_an_hour = fetched(page)[before:]
        assert [a for a in after_an_hour if a[1] == "/dev/token"] == [("POST", "/dev/token", 200)] * 2, after_an_hour
        assert [a[2] for a in after_an_hour if a[1].startswith("/chat/")].count(401) == 1, after_an_hour
        assert [a for a in after_an_hour if a[:2] == ("POST", "/chat/")][-1] == ("POST", "/chat/", 200)
        assert page.evaluate("window.sameDocument") is True
        page.evaluate(SHOW_TAB)

        # The Telegram thread: a note that what is written here stays on the web, the older
        # messages behind "Show earlier", and the panel's deliveries appear in it.
        open_conversation(page, "#conversations li[data-surface=telegram]", phone)
        page.wait_for_selector("#surface-note:visible")
        assert page.inner_text("#surface-note") == (
            "Your Telegram conversation, as the agent remembers it."
            " Messages you write here stay on the web: they do not reach Telegram."
        )
        assert page.locator(".message").count() == 50 and page.evaluate(AT_END)
        page.evaluate("document.getElementById('messages').scrollTop = 0")
        page.click("#earlier")
        page.wait_for_function(f"document.querySelectorAll('.message').length === {2 * TELEGRAM_NOTES + 2}")
        assert page.locator("#earlier").count() == 0
        assert not page.evaluate(AT_END), "loading older messages jumped to the end"
        page.evaluate("document.getElementById('messages').scrollTop = 0")

        deliver_from_telegram(page, HEBREW, phone)  # while the person reads the top: no jump
        page.wait_for_function(
            f"[...document.querySelectorAll('.message .text')].some((t) => t.textContent === '{HEBREW}')"
        )
        assert page.evaluate(SCROLL_TOP) == 0 and page.is_visible("#new-below")
        assert page.locator("#messages").get_by_text(HEBREW, exact=True).evaluate("(text) => text.matches(':dir(rtl)')")
        page.click("#new-below")
        assert page.evaluate(AT_END)
        deliver_from_telegram(page, "And the taxi is at 9.", phone)  # at the end: it follows
        page.wait_for_function(
            "[...document.querySelectorAll('.message .text')].some((t) => t.textContent === 'And the taxi is at 9.')"
        )
        assert page.evaluate(AT_END)

        assert page.evaluate("window.typingSeen") is True
        assert page.evaluate(TEXTS_WITHOUT_DIR_AUTO) == 0
        # The only refusals of the whole run: the message over the limit and the expired token, and
        # nothing the page loads by itself is missing (no favicon 404).
        assert sorted(a for a in fetched(page) if a[2] >= 400) == [("POST", "/chat/", 401), ("POST", "/chat/", 413)]
        assert [a for a in answers if a[2] >= 400 and not a[1].startswith("/chat/")] == []
        browser.close()
    assert SCREENSHOTS[size].read_bytes().startswith(b"\x89PNG")


def test_a_follow_up_the_agent_sends_appears_in_the_open_conversation_without_a_reload(
    dev_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with demo_page(dev_server) as page:
        page.evaluate("window.sameDocument = true")
        answer = send_on_the_web(page, "remind me in 1 minute to stretch")
        # asked again with the tool's result: this web account has no app it could be pushed on
        assert answer.startswith(
            "(Offline stand-in model.) I will remind you in 1 minute.\n\n(Offline stand-in model.) Scheduled for "
        )
        assert answer.endswith(
            " They have no app linked to this account that it can be pushed to: it will only appear in this web"
            " conversation, with no notification. Tell them so, and for anything that matters suggest asking on one"
            " of their other apps, or a reminder on their phone."
        )
        assert run_scheduled_job() == 0  # not due yet

        # Two minutes later (the server's clock), the scheduled job of `crossmem dev` says it.
        later = datetime.now(UTC) + timedelta(minutes=2)
        monkeypatch.setattr(runtime, "now", lambda: later)
        assert run_scheduled_job() == 1
        page.clock.fast_forward(POLL_MS)  # the page's next poll
        reminder = "[...document.querySelectorAll('.message.assistant .text')].map((t) => t.textContent)"
        page.wait_for_function(f"{reminder}.includes('Reminder: stretch.')")
        with page.expect_response(lambda response: response.url.endswith("/messages?limit=50")) as polled:
            page.clock.fast_forward(POLL_MS)  # and the one after it adds nothing more
        polled.value.finished()
        # (its two paragraphs, one element each: their textContent joined without the blank line)
        assert page.evaluate(f"{reminder}.slice(-2)") == [answer.replace("\n\n", ""), "Reminder: stretch."]
        assert page.evaluate("window.sameDocument") is True


def record_a_voice_note(page: Page) -> None:
    """Tap the microphone, let it record two seconds (Chromium's fake device: a tone), tap again."""
    page.click("#record")
    page.wait_for_selector("#record.recording")
    assert page.get_attribute("#record", "aria-pressed") == "true"
    page.wait_for_function("document.getElementById('record-time').textContent === '0:02'")
    page.click("#record")
    page.wait_for_selector("#attachment:not([hidden])")
    assert page.inner_text("#attachment-text") == "A voice note (0:02), sent with your message"


def test_a_voice_note_recorded_on_the_page_is_transcribed_and_remembered(
    dev_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The microphone records a voice note; Send posts it with no text; the server transcribes it
    (a local Deepgram) and stores the transcript. A first send whose answer is lost on the way
    back (stored, answered, never seen) and a new note recorded after it are two messages."""
    chromium = shutil.which("chromium")
    assert chromium, "Debian's chromium is missing: `make test` installs it"
    deepgram = FakeDeepgram("dev-deepgram-key", transcript="Remind me that the plumber comes on Thursday.")
    deepgram.duration = 2.2  # what it hears of the two seconds recorded
    monkeypatch.setenv("DEEPGRAM_API_KEY", "dev-deepgram-key")
    monkeypatch.setenv("DEEPGRAM_API_BASE", deepgram.url)
    runtime.reset()
    flags = [*CHROMIUM_FLAGS, "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream"]
    sent: list[Any] = []
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=chromium, args=flags)
            page = browser.new_page(viewport=SIZES["desktop"])  # type: ignore[arg-type]
            page.on(
                "request",
                lambda r: sent.append(r.post_data_json) if r.method == "POST" and r.url.endswith("/chat/") else None,
            )
            page.goto(dev_server)
            page.wait_for_selector("body[data-ready=true]")
            record_a_voice_note(page)

            def answer_lost(route: Route) -> None:
                route.fetch()  # the server stores and answers it
                route.abort()  # and the page never hears

            page.route("**/chat/", answer_lost, times=1)
            page.click("#send")
            page.wait_for_selector(".message.failed")
            assert page.inner_text("#attachment-text") == "A voice note (0:02), sent with your message"
            page.click("#remove-photo")
            record_a_voice_note(page)
            page.click("#send")
            page.wait_for_function("document.querySelectorAll('.message.assistant.done').length > 0")
            browser.close()
        assert [(body["message"], len(body["attachments"])) for body in sent] == [("", 1), ("", 1)]
        assert sent[0]["client_message_id"] != sent[1]["client_message_id"]
        voices = [body["attachments"][0] for body in sent]
        assert [(voice["media_type"], voice["seconds"]) for voice in voices] == [("audio/webm", 2)] * 2
        assert [heard.content_type for heard in deepgram.requests] == ["audio/webm"] * 2
        assert [heard.audio for heard in deepgram.requests] == [base64.b64decode(voice["data"]) for voice in voices]
        assert deepgram.requests[0].audio[:4] == b"\x1a\x45\xdf\xa3"  # EBML: WebM
        # Each began a conversation (the page never learned the first one's id): one note in each.
        api = DevApi(dev_server)
        stored = [
            (m["role"], m["kind"], m["content"])
            for c in api.conversations()
            for m in httpx.get(f"{dev_server}/chat/conversations/{c['id']}/messages", headers=api.auth).json()[
                "messages"
            ]
            if m["role"] == "user"
        ]
        assert stored == [("user", "voice", "[voice note, 0:02] Remind me that the plumber comes on Thursday.")] * 2
    finally:
        deepgram.close()


def attached(path: Path, media_type: str, **extra: Any) -> dict[str, Any]:
    return {"media_type": media_type, "data": base64.b64encode(path.read_bytes()).decode(), **extra}


def described(body: dict[str, Any]) -> str:
    """The fake model: a description when the memory asks for one, else a short answer."""
    if "Describe what the attached image" in json.dumps(body.get("system")):
        return "A till receipt from Café Central: two coffees, 4.80 EUR, 3 May 2026."
    return "Got it."


def test_a_stored_photo_and_voice_note_show_by_their_kind_not_their_marker(
    dev_server: str, monkeypatch: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic
) -> None:
    """Sent earlier (here through the API), then read on a freshly loaded page: each shows its icon
    and what the memory kept of it (the description, the voice note's length), then its words."""
    chromium = shutil.which("chromium")
    assert chromium, "Debian's chromium is missing: `make test` installs it"
    deepgram = FakeDeepgram("dev-deepgram-key", transcript="The plumber comes on Thursday.")
    fake_anthropic.answer = described
    for name, value in {
        "ANTHROPIC_API_KEY": "sk-ant-test",
        "ANTHROPIC_BASE_URL": fake_anthropic.url,
        "ANTHROPIC_MAX_RETRIES": "0",
        "DEEPGRAM_API_KEY": "dev-deepgram-key",
        "DEEPGRAM_API_BASE": deepgram.url,
    }.items():
        monkeypatch.setenv(name, value)
    runtime.reset()
    try:
        api = DevApi(dev_server)
        conversation = api.chat("Here is this morning's receipt", attachments=[attached(RECEIPT, "image/jpeg")])
        api.chat("", conversation, attachments=[attached(VOICE_NOTE, "audio/ogg")])
        photo, voice = [m for m in api.messages(conversation) if m["role"] == "user"]
        assert (photo["kind"], photo["content"]) == (
            "image",
            "[photo: A till receipt from Café Central: two coffees, 4.80 EUR, 3 May 2026.]"
            " Here is this morning's receipt",
        )
        assert voice["kind"] == "voice" and voice["content"].endswith("] The plumber comes on Thursday.")
        length = voice["content"].removeprefix("[voice note, ").split("]")[0]

        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS)
            page = browser.new_page(viewport=SIZES["desktop"])  # type: ignore[arg-type]
            page.goto(dev_server)
            page.wait_for_selector("body[data-ready=true]")
            mine = page.locator(".message.user")
            assert mine.count() == 2
            assert mine.nth(0).locator(".media.image svg").count() == 1
            assert mine.nth(0).locator(".media.image").inner_text() == (
                "Photo: A till receipt from Café Central: two coffees, 4.80 EUR, 3 May 2026."
            )
            assert mine.nth(0).locator(".text").inner_text() == "Here is this morning's receipt"
            assert mine.nth(1).locator(".media.voice svg").count() == 1
            assert mine.nth(1).locator(".media.voice").inner_text() == f"Voice note, {length}"
            assert mine.nth(1).locator(".text").inner_text() == "The plumber comes on Thursday."
            shown = page.inner_text("#messages")
            assert "[photo" not in shown and "[voice note" not in shown
            browser.close()
    finally:
        deepgram.close()


def test_the_page_states_the_browsers_language_and_clock(dev_server: str, database_url: str) -> None:
    """A Spanish speaker in Madrid on the demo page: their language (the fixed answers', kept for
    their other apps) and their clock (their follow-ups') are the browser's, as a frontend's are."""
    chromium = shutil.which("chromium")
    assert chromium, "Debian's chromium is missing: `make test` installs it"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport=SIZES["desktop"], timezone_id="Europe/Madrid", locale="es-ES")  # type: ignore[arg-type]
        page.goto(dev_server)
        page.wait_for_selector("body[data-ready=true]")
        send_on_the_web(page, "hola")
        browser.close()
    person = os.environ["OWNER_USER_ID"]
    with psycopg.connect(database_url) as connection:
        language = connection.execute("select language from person_languages where user_id = %s", (person,)).fetchone()
        zone = connection.execute("select timezone from person_timezones where user_id = %s", (person,)).fetchone()
    assert (language, zone) == (("es",), ("Europe/Madrid",))


def test_the_search_box_finds_what_was_said_on_another_app(dev_server: str) -> None:
    """Said on WhatsApp, searched on the web page: the hit shows its app, its time in the
    browser's zone, who said it and the text, and opens its conversation."""
    chromium = shutil.which("chromium")
    assert chromium, "Debian's chromium is missing: `make test` installs it"
    api = DevApi(dev_server)
    api.say("The plumber, Ezequiel, comes on Thursday at 8", surface="whatsapp")
    api.chat("Let's plan the week.")
    whatsapp = next(c for c in api.conversations() if c["surface"] == "whatsapp")
    said = next(m for m in api.messages(whatsapp["id"]) if m["role"] == "user")
    in_madrid = datetime.fromisoformat(said["created_at"]).astimezone(ZoneInfo("Europe/Madrid"))

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport=SIZES["desktop"], timezone_id="Europe/Madrid", locale="en-GB")  # type: ignore[arg-type]
        page.add_init_script(RECORD_FETCHES)
        page.goto(dev_server)
        page.wait_for_selector("body[data-ready=true]")
        assert page.is_hidden("#search-results")

        page.fill("#search-input", "when does the plumber come?")
        page.press("#search-input", "Enter")
        page.wait_for_selector("#hits li.hit")
        page.wait_for_selector("body:not([data-busy])", state="attached")
        # The offline stand-in's answers quote the person: they are hits too, "Your advisor"'s.
        hit = page.locator("#hits li.hit:has(.who:text-is('You'))")
        assert hit.count() == 1
        assert hit.get_attribute("data-surface") == "whatsapp"
        assert hit.locator(".surface").inner_text() == "WhatsApp"
        assert hit.locator(".text").inner_text() == "The plumber, Ezequiel, comes on Thursday at 8"
        assert hit.locator("time").get_attribute("datetime") == said["created_at"]
        assert f"{in_madrid:%H:%M}" in hit.locator("time").inner_text()
        assert str(in_madrid.day) in hit.locator("time").inner_text()
        assert page.inner_text("#search-summary").endswith("for “when does the plumber come?”")

        hit.click()  # opens the WhatsApp conversation it was said in
        page.wait_for_selector("#conversations li.active[data-surface=whatsapp]")
        assert page.is_visible("#surface-note")
        page.locator("#messages").get_by_text("The plumber, Ezequiel, comes on Thursday at 8", exact=True).wait_for()

        page.fill("#search-input", "flamingo")
        page.press("#search-input", "Enter")
        page.wait_for_function("document.getElementById('search-summary').textContent.startsWith('Nothing found')")
        assert page.locator("#hits li").count() == 0
        page.click("#clear-search")
        assert page.is_hidden("#search-results") and page.input_value("#search-input") == ""
        assert page.evaluate(TEXTS_WITHOUT_DIR_AUTO) == 0
        assert [a for a in fetched(page) if a[2] >= 400] == []
        assert ("GET", "/chat/search", 200) in fetched(page)
        browser.close()


# The demo page's thread when ids are not the order: a reply's id is drawn when its turn begins
# (begin_turn), so a reply stored after the page's own turn may have a lower id than what the page
# shows. Real browser, `crossmem dev` in process (this module's server).
TEXTS = "[...document.querySelectorAll('#messages .message .text')].map((t) => t.textContent)"


def test_a_reply_stored_after_the_pages_turn_with_a_lower_id_appears_once(dev_server: str) -> None:
    with demo_page(dev_server) as page:
        first = send_on_the_web(page, "first words")
        chat = uuid.UUID(page.evaluate("state.conversationId"))
        owner = runtime.settings().owner_user_id
        assert owner is not None
        memory = runtime.memory()
        # Another tab's turn begins (its reply's id drawn), the page's own turn comes and goes, and
        # only then is the other tab's reply stored: under an id lower than the page's.
        other = memory.begin_turn(Person(user_id=owner), Surface.WEB, "from the other tab", "other-tab-1", chat)
        second = send_on_the_web(page, "second words")
        assert other.message_id is not None
        stored = memory.finish_turn(owner, other.message_id, "the other tab's answer", reply_id=other.reply_id)
        newest = memory.conversation_messages(owner, chat).messages
        assert stored is not None and stored < newest[-2].id  # lower than the page's second answer's

        page.clock.fast_forward(POLL_MS)  # the page's next poll
        page.wait_for_function(f'{TEXTS}.includes("the other tab\'s answer")')
        with page.expect_response(lambda response: response.url.endswith("/messages?limit=50")) as polled:
            page.clock.fast_forward(POLL_MS)  # and the one after it adds nothing more
        polled.value.finished()
        assert page.evaluate(TEXTS) == [
            "first words",
            first,
            "second words",
            second,
            "from the other tab",
            "the other tab's answer",
        ]


def test_notes_folded_by_a_link_say_so_and_not_a_time_from_1970(dev_server: str) -> None:
    """After a link the notes have no coverage until the next digest (`covered_until` null): the
    page said "from messages up to 01:00", the epoch in the browser's zone (a newcomer's finding)."""
    chromium = shutil.which("chromium")
    assert chromium, "Debian's chromium is missing: `make test` installs it"
    folded = {"notes": "- Has a dog called Rufus", "written_at": "2026-12-06T09:30:00+00:00", "covered_until": None}

    def memory(route: Route) -> None:
        route.fulfill(status=200, content_type="application/json", body=json.dumps(folded))

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport=SIZES["desktop"], timezone_id="Europe/Madrid", locale="en-GB")  # type: ignore[arg-type]
        page.route("**/chat/memory", memory)
        page.goto(dev_server)
        page.wait_for_selector("body[data-ready=true]")
        page.wait_for_function("() => document.getElementById('notes-when').textContent.startsWith('Written')")
        said = page.locator("#notes-when").inner_text()
        browser.close()
    assert said == "Written 10:30. Your apps were linked since: the next notes read all of them."


@pytest.mark.parametrize("surface", ["telegram", "whatsapp", "sms"])
def test_a_reminder_asked_for_on_another_app_arrives_under_make_dev(
    dev_server: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], surface: str
) -> None:
    """`make dev` has no bot token and no Twilio number: a reminder asked for on Telegram, WhatsApp or
    SMS is said on the server's console and kept in that app's thread, as the web's is kept in its
    own (a newcomer's finding: it was retried in silence for half an hour, then given up)."""
    api = DevApi(dev_server)
    api.say("remind me in 1 minute to stretch", surface=surface)
    assert run_scheduled_job() == 0  # not due yet
    later = datetime.now(UTC) + timedelta(minutes=2)
    monkeypatch.setattr(runtime, "now", lambda: later)
    capsys.readouterr()
    assert run_scheduled_job() == 1
    [said] = [line for line in capsys.readouterr().out.splitlines() if line.startswith("follow-up")]
    assert said.startswith(f"follow-up on {surface} to ") and said.endswith(": Reminder: stretch.")
    thread = next(c for c in api.conversations() if c["surface"] == surface)
    assert [m["content"] for m in api.messages(thread["id"])][-1] == "Reminder: stretch."


# A first-time user's pass over the page (a review of 6 December): emoji, the keyboard alone, the
# errors a person meets, and what a screen reader names.
EMOJI = "😀"  # one character to people and to the server (Python's len); two UTF-16 units to JavaScript


def test_emoji_count_as_the_server_counts_them(dev_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """90 emoji under a limit of 100: the page said "180 / 100 characters: 80 over the limit" for
    a message the server takes; 300 of them were "600 characters long", shown cut at 140."""
    monkeypatch.setenv("MAX_MESSAGE_CHARS", "100")
    runtime.reset()
    with demo_page(dev_server) as page:
        page.fill("#message-input", EMOJI * 90)
        assert page.inner_text("#counter") == "90 / 100 characters"
        assert not page.locator("#counter.over").count()
        send_on_the_web(page, EMOJI * 90)
        assert page.locator(".message.failed").count() == 0

        page.fill("#message-input", EMOJI * 300)
        assert page.inner_text("#counter") == "300 / 100 characters: 200 over the limit"
        page.click("#send")
        page.wait_for_selector(".message.failed .reason")
        assert page.inner_text(".message.failed .reason") == (
            "Not sent: it is 300 characters long, over the limit of 100. Shorten it, then retry."
        )
        assert page.inner_text(".message.failed .text") == EMOJI * 280 + "…"  # not 140, nor half of one


def test_the_conversations_open_from_the_keyboard(dev_server: str) -> None:
    """Tab reached the search results but not the conversations: a person without a mouse could
    not open their Telegram thread."""
    DevApi(dev_server).say("I moved my dentist appointment to Friday")
    with demo_page(dev_server) as page:
        page.focus("#new-conversation")
        page.keyboard.press("Tab")
        assert page.evaluate("document.activeElement.dataset.surface") == "telegram"
        page.keyboard.press("Enter")
        page.wait_for_selector("#surface-note:visible")
        assert page.locator("#messages .message .text").first.inner_text() == "I moved my dentist appointment to Friday"


def test_a_person_over_their_budget_is_told_when_to_write_again(
    dev_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 429: the page added "Retry in a moment" to the server's own sentence, after its full stop
    ("You can write again in 60 seconds.. Retry in a moment.")."""
    monkeypatch.setenv("TURNS_PER_MINUTE", "1")
    runtime.reset()
    with demo_page(dev_server) as page:
        send_on_the_web(page, "first words")
        page.fill("#message-input", "second words")
        page.click("#send")
        page.wait_for_selector(".message.failed .reason")
        reason = page.inner_text(".message.failed .reason")
    assert reason.startswith(
        "Not sent: You've written a lot in a short time, so I'm taking a pause. You can write again in "
    )
    assert reason.endswith(" seconds.") and ".." not in reason


def test_an_attachment_too_large_to_send_says_so(dev_server: str) -> None:
    """A 413 body_too_large: the page said "the request body is larger than 1000000 bytes. Retry
    in a moment.", and a retry fails the same way; it now says what to do."""
    with demo_page(dev_server) as page:
        page.evaluate("""() => { state.photo = { media_type: 'image/jpeg', data: 'A'.repeat(1100000),
          url: 'data:image/gif;base64,R0lGODlhAQABAAAAACw=' }; showAttachment(); }""")
        page.fill("#message-input", "what is this?")
        page.click("#send")
        page.wait_for_selector(".message.failed .reason")
        assert page.inner_text(".message.failed .reason") == (
            "Not sent: the message and what is attached are over the 1 MB it can carry."
            " Remove the photo, or record a shorter voice note, then retry."
        )


def test_every_field_has_a_name_a_screen_reader_reads(dev_server: str) -> None:
    """The other-app panel's list of apps had no name at all, and its text box only its example."""
    with demo_page(dev_server) as page:
        unnamed = page.evaluate("""() => [...document.querySelectorAll('input:not([type=file]), select, textarea')]
          .filter((field) => !field.labels.length && !field.getAttribute('aria-label')).map((field) => field.id)""")
    assert unnamed == []


def test_a_reload_mid_answer_shows_the_answer(
    dev_server: str, monkeypatch: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic
) -> None:
    """Reloaded while the answer was being written (the stream abandoned, the message owed): the
    question stayed on the page unanswered for good, polls or not, until the person wrote again.
    The page now resumes the chat's stream (GET /chat/<conversation>/stream), as useChat does."""
    story = "one two three four five six seven eight nine ten eleven twelve"
    fake_anthropic.answer = lambda body: story
    fake_anthropic.delta_pause_s = 0.2
    answering_with(monkeypatch, fake_anthropic)
    with demo_page(dev_server) as page:
        page.fill("#message-input", "Tell me a long story")
        page.click("#send")
        page.wait_for_function("document.querySelector('.message.assistant .text')?.textContent.includes('two')")
        page.reload()
        page.wait_for_selector("body[data-ready=true]")
        fake_anthropic.delta_pause_s = 0.0
        page.wait_for_function(
            f"[...document.querySelectorAll('.message.assistant.done .text')].some((t) => t.textContent === '{story}')"
        )
        page.wait_for_selector("body:not([data-busy])", state="attached")
        page.clock.fast_forward(POLL_MS)  # and a poll adds it no second time
        with page.expect_response(lambda response: response.url.endswith("/messages?limit=50")) as polled:
            page.clock.fast_forward(POLL_MS)
        polled.value.finished()
        assert page.evaluate(TEXTS) == ["Tell me a long story", story]


def test_sending_from_the_keyboard_keeps_the_focus(dev_server: str) -> None:
    """Tab to Send, Enter: Send was disabled while it had the focus, which fell to the page, and
    the next message began with Tab from the top; so did "Send from that app"."""
    with demo_page(dev_server) as page:
        page.fill("#message-input", "first words")
        page.focus("#send")
        page.keyboard.press("Enter")
        page.wait_for_function("document.querySelectorAll('.message.assistant.done').length === 1")
        page.wait_for_selector("body:not([data-busy])", state="attached")
        page.keyboard.type("second words")
        page.keyboard.press("Enter")
        page.wait_for_function("document.querySelectorAll('.message.assistant.done').length === 2")
        assert page.locator(".message.user .text").all_inner_texts() == ["first words", "second words"]

        page.fill("#say-text", "I moved my dentist appointment to Friday")
        page.focus("#say-send")
        page.keyboard.press("Enter")
        page.wait_for_selector("#say-log li.delivered")
        page.wait_for_selector("body:not([data-busy])", state="attached")
        assert page.evaluate("document.activeElement.id") == "say-text"


def test_a_screen_reader_hears_that_the_advisor_is_writing(
    dev_server: str, monkeypatch: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic
) -> None:
    """The typing bubble's "Your advisor is writing" was an aria-label on a plain div, which
    Chromium leaves out of the accessibility tree: a screen reader heard nothing until the text."""
    fake_anthropic.answer = lambda body: "Friday it is."
    fake_anthropic.first_token_s = 2.0
    answering_with(monkeypatch, fake_anthropic)
    with demo_page(dev_server) as page:
        page.fill("#message-input", "When is the dentist?")
        page.click("#send")
        page.wait_for_selector(".message.typing")
        said = page.locator("#messages").aria_snapshot()
        page.wait_for_selector(".message.assistant.done")
        assert page.locator("#messages").aria_snapshot() == "- text: When is the dentist?\n- paragraph: Friday it is."
    assert said == '- text: When is the dentist?\n- img "Your advisor is writing"'


def test_the_other_apps_are_named_as_people_name_them(dev_server: str) -> None:
    """The thread said "via whatsapp" and "via sms", the list "whatsapp" and "sms", the panel's log
    "sms", where the search hits, the panel's list of apps and the note above the box said
    "WhatsApp" and "SMS"."""
    api = DevApi(dev_server)
    api.say("I moved my dentist appointment to Friday", surface="whatsapp")
    api.say("The taxi is at 9", surface="sms")
    with demo_page(dev_server) as page:
        assert sorted(page.locator("#conversations small").all_inner_texts()) == ["SMS", "WhatsApp"]
        open_conversation(page, "#conversations li[data-surface=sms]", phone=False)
        page.wait_for_selector("#surface-note:visible")
        assert page.locator(".message .tag").all_inner_texts() == ["via SMS", "via SMS"]
        page.select_option("#say-surface", "sms")
        page.fill("#say-text", "And the ferry at 11")
        page.click("#say-send")
        page.wait_for_selector("#say-log li.delivered")
        assert page.locator("#say-log li .surface-sms").inner_text() == "SMS"


def test_a_photo_the_browser_cannot_open_is_said_once_and_cleared(dev_server: str, tmp_path: Path) -> None:
    """A broken image chosen: the page said "Could not read that photo: The source image could not
    be decoded.." (the browser's own sentence, and a second full stop), and the red line stayed
    after a good photo was chosen."""
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not a png at all")
    with demo_page(dev_server) as page:
        page.set_input_files("#photo-input", str(broken))
        page.wait_for_selector("#notice:visible")
        assert page.inner_text("#notice") == "Could not read that photo: this browser cannot open it as an image."
        assert page.is_hidden("#attachment")
        page.set_input_files("#photo-input", str(RECEIPT))
        page.wait_for_selector("#attachment:visible")
        assert page.is_hidden("#notice")


@contextmanager
def phone_page(url: str) -> Iterator[Page]:
    """The demo page in Chromium at a phone's size, ready to send."""
    chromium = shutil.which("chromium")
    assert chromium, "Debian's chromium is missing: `make test` installs it"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport=SIZES["phone"])  # type: ignore[arg-type]
        page.goto(url)
        page.wait_for_selector("body[data-ready=true]")
        yield page
        browser.close()


DRAWER_OPEN = "document.body.classList.contains('show-conversations')"


def test_escape_closes_a_drawer_on_a_phone(dev_server: str) -> None:
    """On a phone (or a narrow window with a keyboard), the conversations' drawer opened with Enter
    closed only with a click on Close or on the page behind: Escape did nothing."""
    with phone_page(dev_server) as page:
        page.focus("#show-conversations")
        page.keyboard.press("Enter")
        assert page.evaluate(DRAWER_OPEN)
        page.keyboard.press("Escape")
        assert not page.evaluate(DRAWER_OPEN)
        assert page.evaluate("document.activeElement.id") == "show-conversations"


def test_a_screen_reader_hears_whether_a_drawer_is_open(dev_server: str) -> None:
    """The buttons "☰ Chats" and "Other app" said nothing of the drawers they open: a screen reader
    read the same button before and after."""
    with phone_page(dev_server) as page:
        page.click("#show-elsewhere")
        assert page.get_attribute("#show-elsewhere", "aria-expanded") == "true"
        assert page.get_attribute("#show-conversations", "aria-expanded") == "false"
        page.click("#elsewhere [data-close]")
        assert page.get_attribute("#show-elsewhere", "aria-expanded") == "false"


def test_a_photo_is_attached_from_the_keyboard(dev_server: str) -> None:
    """The paperclip was a label around a hidden file input: Tab passed it by, and a person without
    a mouse could not attach a photo."""
    with demo_page(dev_server) as page:
        page.on("filechooser", lambda chooser: None)  # file choosers caught from now on: no race with the keys
        page.focus("#record")
        page.keyboard.press("Shift+Tab")
        assert page.evaluate("document.activeElement.getAttribute('aria-label')") == "Attach a photo"
        with page.expect_file_chooser(timeout=5000) as chooser:
            page.keyboard.press("Enter")
        chooser.value.set_files([])  # the person changed their mind
        with page.expect_file_chooser(timeout=5000) as chooser:
            page.keyboard.press("Space")  # as a button is pressed
        chooser.value.set_files(str(RECEIPT))
        page.wait_for_selector("#attachment:visible")


def test_a_conversation_opened_mid_answer_keeps_its_own_thread(
    dev_server: str, monkeypatch: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic
) -> None:
    """Sent on the web, then the Telegram conversation opened before the answer came: the answer's
    end made the web conversation the page's again, under the Telegram thread, and the next poll
    added the web messages to the Telegram thread."""
    DevApi(dev_server).say("I moved my dentist appointment to Friday")
    fake_anthropic.answer = lambda body: "Friday it is."
    fake_anthropic.first_token_s = 2.0
    answering_with(monkeypatch, fake_anthropic)
    with demo_page(dev_server) as page:
        telegram = page.get_attribute("#conversations li[data-surface=telegram]", "data-id")
        page.fill("#message-input", "When is the dentist?")
        page.click("#send")
        page.wait_for_selector(".message.typing")
        page.click("#conversations li[data-surface=telegram]")
        page.wait_for_selector("#surface-note:visible")
        shown = page.evaluate(TEXTS)
        page.wait_for_function("document.querySelectorAll('#conversations li').length === 2")  # the web one, stored
        page.wait_for_selector("body:not([data-busy])", state="attached")
        page.clock.fast_forward(POLL_MS)  # the page's next poll
        with page.expect_response(lambda response: response.url.endswith("/messages?limit=50")) as polled:
            page.clock.fast_forward(POLL_MS)
        polled.value.finished()
        assert page.evaluate("state.conversationId") == telegram
        assert page.get_attribute("#conversations li.active", "data-id") == telegram
        assert page.evaluate(TEXTS) == shown


def test_earlier_messages_stay_in_their_own_conversation(dev_server: str) -> None:
    """Show earlier messages in the Telegram thread, then the WhatsApp one opened before the older
    page came (a slow network): Telegram's older messages were put at the top of WhatsApp's."""
    api = DevApi(dev_server)
    for surface in ("telegram", "whatsapp"):
        for index in range(TELEGRAM_NOTES):
            api.say(f"{surface} note {index}", surface=surface)
    with demo_page(dev_server) as page:
        held: list[Route] = []
        page.route("**/messages?limit=50&before=*", lambda route: held.append(route))  # answered late
        open_conversation(page, "#conversations li[data-surface=telegram]", phone=False)
        page.wait_for_selector("#earlier")
        page.click("#earlier")
        for _ in range(50):
            if held:
                break
            page.wait_for_timeout(100)
        open_conversation(page, "#conversations li[data-surface=whatsapp]", phone=False)
        page.wait_for_function("document.querySelector('#messages .text').textContent.startsWith('whatsapp')")
        whatsapp = page.evaluate(TEXTS)
        with page.expect_response(lambda response: "before=" in response.url) as late:
            held[0].continue_()
        late.value.finished()
        page.wait_for_timeout(500)  # what the page does with it
        assert page.evaluate(TEXTS) == whatsapp


def test_the_conversation_opened_last_is_the_one_shown(dev_server: str) -> None:
    """Telegram clicked, then WhatsApp before Telegram's messages came (a slow network): WhatsApp's
    thread showed, then Telegram's replaced it, the one the person had left."""
    api = DevApi(dev_server)
    api.say("a telegram note", surface="telegram")
    api.say("a whatsapp note", surface="whatsapp")
    with demo_page(dev_server) as page:
        telegram = page.get_attribute("#conversations li[data-surface=telegram]", "data-id")
        held: list[Route] = []
        page.route(f"**/conversations/{telegram}/messages?limit=50", lambda route: held.append(route))
        page.click("#conversations li[data-surface=telegram]")
        for _ in range(50):
            if held:
                break
            page.wait_for_timeout(100)
        page.click("#conversations li[data-surface=whatsapp]")
        page.wait_for_function("document.querySelector('#messages .text')?.textContent === 'a whatsapp note'")
        with page.expect_response(lambda response: telegram in response.url) as late:
            held[0].continue_()
        late.value.finished()
        page.wait_for_timeout(500)  # what the page does with it
        assert page.locator("#messages .text").first.inner_text() == "a whatsapp note"
        assert page.inner_text("#conversations li.active small") == "WhatsApp"

        held.clear()  # and "New conversation" clicked while Telegram's messages are on their way
        page.click("#conversations li[data-surface=telegram]")
        for _ in range(50):
            if held:
                break
            page.wait_for_timeout(100)
        page.click("#new-conversation")
        with page.expect_response(lambda response: telegram in response.url) as late:
            held[0].continue_()
        late.value.finished()
        page.wait_for_timeout(500)
        assert page.inner_text("#messages") == "A new conversation. It is saved when you send its first message."


def test_a_message_sent_clears_what_went_wrong_before(dev_server: str, tmp_path: Path) -> None:
    """A red line ("Could not read that photo", "Could not use the microphone", "Could not refresh
    your conversations") stayed above the box through every message sent after it, until another
    conversation was opened."""
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not a png at all")
    with demo_page(dev_server) as page:
        page.set_input_files("#photo-input", str(broken))
        page.wait_for_selector("#notice:visible")
        send_on_the_web(page, "Never mind the photo: when is the dentist?")
        assert page.is_hidden("#notice")


def test_no_field_on_a_phone_is_small_enough_for_safari_to_zoom_into(dev_server: str) -> None:
    """The fields' text was 15 px: iPhone Safari zooms the page into a focused field under 16 px, so
    every tap on the message box zoomed the chat sideways. Chromium does not zoom; what the phone
    reads, each field's computed size, is checked instead."""
    with demo_page(dev_server, "phone") as page:
        sizes = page.evaluate("""() => Object.fromEntries(
          [...document.querySelectorAll('input:not([type=file]), select, textarea')]
            .map((field) => [field.id, parseFloat(getComputedStyle(field).fontSize)]))""")
    assert sizes and min(sizes.values()) >= 16, sizes


def test_a_screen_reader_hears_the_answer_once_not_every_piece_of_it(
    dev_server: str, monkeypatch: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic
) -> None:
    """The whole thread was one live region: every piece of a streamed answer changed it again (a
    screen reader read the answer over and over as it grew), and opening a conversation put 50
    messages in it at once. The thread is no longer live; one region says the advisor is writing,
    then the whole answer once."""
    fake_anthropic.answer = lambda body: "one two three four five six"
    fake_anthropic.delta_pause_s = 0.05
    answering_with(monkeypatch, fake_anthropic)
    with demo_page(dev_server) as page:
        assert page.get_attribute("#messages", "aria-live") is None
        page.evaluate("""() => { window.said = [];
          new MutationObserver(() => window.said.push(document.getElementById('announce').textContent))
            .observe(document.getElementById('announce'), {childList: true, characterData: true, subtree: true}); }""")
        page.fill("#message-input", "Count to six")
        page.click("#send")
        page.wait_for_selector(".message.assistant.done")
        assert page.evaluate("window.said") == ["Your advisor is writing", "one two three four five six"]
        assert page.get_attribute("#announce", "aria-live") == "polite"


def abandoned_turns(caplog: pytest.LogCaptureFixture, count: int) -> None:
    """Wait until the server has ended `count` turns as abandoned (its turn line's outcome)."""
    deadline = time.monotonic() + 10
    while sum(getattr(record, "outcome", None) == "abandoned" for record in caplog.records) < count:
        assert time.monotonic() < deadline, "the server did not end the stopped turn"
        time.sleep(0.05)


def polled_twice(page: Page) -> None:
    """Two polls of the open conversation: once the second is answered, the first has changed the page."""
    page.clock.fast_forward(POLL_MS)
    with page.expect_response(lambda response: response.url.endswith("/messages?limit=50")) as polled:
        page.clock.fast_forward(POLL_MS)
    polled.value.finished()


def stored_thread(api: DevApi) -> list[tuple[str, str]]:
    """The one web conversation's stored messages, as (role, content)."""
    (conversation,) = [c for c in api.conversations() if c["surface"] == "web"]
    return [(m["role"], m["content"]) for m in api.messages(conversation["id"])]


def test_stop_ends_the_answer_and_the_page_goes_on(
    dev_server: str, monkeypatch: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic, caplog: pytest.LogCaptureFixture
) -> None:
    """There was no Stop: an answer once asked ran to its end. Stop takes Send's place while the
    answer streams, from the keyboard too; it aborts the stream (the web's stop, docs/frontend.md),
    what was shown stays, marked, the server stores no reply, and the page goes on: the next
    message continues the conversation, a poll adds nothing twice, and a reload does not answer
    the stopped message anew."""
    story = "one two three four five six seven eight nine ten eleven twelve"
    fake_anthropic.answer = lambda body: story
    fake_anthropic.delta_pause_s = 0.2
    answering_with(monkeypatch, fake_anthropic)
    api = DevApi(dev_server)
    with demo_page(dev_server) as page:
        page.add_init_script(RECORD_FETCHES)
        page.evaluate(RECORD_FETCHES)
        assert page.is_hidden("#stop")
        page.fill("#message-input", "Tell me a long story")
        page.keyboard.press("Enter")  # the box has the focus
        page.wait_for_function("document.querySelector('.message.assistant .text')?.textContent.includes('two')")
        assert page.is_hidden("#send")
        assert page.get_by_role("button", name="Stop the answer").is_visible()
        page.keyboard.press("Tab")  # from the box, Stop is next, where Send was
        assert page.evaluate("document.activeElement.id") == "stop"
        page.keyboard.press("Enter")
        page.wait_for_selector(".message.assistant.stopped")
        shown = page.inner_text(".message.assistant.stopped .text")
        fake_anthropic.delta_pause_s = 0.0  # a server that had not stopped would now write the rest at once
        page.wait_for_selector("body:not([data-busy])", state="attached")
        assert story.startswith(shown) and "two" in shown and shown != story
        assert page.inner_text(".message.assistant.stopped .status") == "You stopped this answer. It is not saved."
        assert page.text_content("#announce") == f"Stopped. {shown}"
        assert page.is_visible("#send") and page.is_hidden("#stop")
        assert page.evaluate("document.activeElement.id") == "message-input"
        time.sleep(0.5)  # the rest of the answer, had the page still read it
        assert page.inner_text(".message.assistant.stopped .text") == shown
        abandoned_turns(caplog, 1)  # the server stopped the model, and stored no reply
        assert stored_thread(api) == [("user", "Tell me a long story")]
        # The stopped first message made the conversation: the page knows it (the list shows it open).
        assert page.text_content("#conversations li.active .title") == "Tell me a long story"

        # A poll shows the stored message no second time (the page never heard its id).
        polled_twice(page)
        assert page.evaluate(TEXTS) == ["Tell me a long story", shown]

        # The next message goes on in the same conversation, answered whole.
        fake_anthropic.answer = lambda body: "Friday it is."
        assert send_on_the_web(page, "When is the dentist?") == "Friday it is."
        assert page.evaluate(TEXTS) == ["Tell me a long story", shown, "When is the dentist?", "Friday it is."]
        assert stored_thread(api) == [
            ("user", "Tell me a long story"),
            ("user", "When is the dentist?"),
            ("assistant", "Friday it is."),
        ]

        # Stopped before any word: the typing bubble goes; a reload does not answer it anew.
        fake_anthropic.answer = lambda body: story
        fake_anthropic.first_token_s = 1.0
        page.fill("#message-input", "And another story")
        page.click("#send")
        page.wait_for_selector(".message.typing")
        page.click("#stop")
        page.wait_for_selector(".message.typing", state="detached")
        page.wait_for_selector("body:not([data-busy])", state="attached")
        assert page.text_content("#announce") == "Stopped."
        assert page.locator(".message.assistant").count() == 2
        fake_anthropic.first_token_s = 0.0
        abandoned_turns(caplog, 2)
        polled_twice(page)
        assert page.evaluate(TEXTS)[-2:] == ["Friday it is.", "And another story"]  # shown once
        page.reload()
        page.wait_for_selector("body[data-ready=true]")
        page.wait_for_selector("body:not([data-busy])", state="attached")
        texts = page.evaluate(TEXTS)
        asked = [path for method, path, status in fetched(page) if path.endswith("/stream")]
    assert texts == ["Tell me a long story", "When is the dentist?", "Friday it is.", "And another story"]
    assert asked == []
    assert stored_thread(api)[-1] == ("user", "And another story")


def test_an_answer_resumed_after_a_reload_stops_too(
    dev_server: str, monkeypatch: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic, caplog: pytest.LogCaptureFixture
) -> None:
    """The answer a reload resumes streams as a sent one does: Stop stops it, and the next reload
    (the tab remembers the stop) does not answer that message again."""
    story = "one two three four five six seven eight nine ten eleven twelve"
    fake_anthropic.answer = lambda body: story
    fake_anthropic.delta_pause_s = 0.2
    answering_with(monkeypatch, fake_anthropic)
    api = DevApi(dev_server)
    with demo_page(dev_server) as page:
        page.fill("#message-input", "Tell me a long story")
        page.click("#send")
        page.wait_for_function("document.querySelector('.message.assistant .text')?.textContent.includes('two')")
        page.reload()
        page.wait_for_selector("body[data-ready=true]")
        page.wait_for_function("document.querySelector('.message.assistant .text')?.textContent.includes('two')")
        page.click("#stop")
        page.wait_for_selector(".message.assistant.stopped")
        shown = page.inner_text(".message.assistant.stopped .text")
        abandoned_turns(caplog, 2)  # the first attempt, left by the reload, and the resumed one
        page.reload()
        page.wait_for_selector("body[data-ready=true]")
        page.wait_for_selector("body:not([data-busy])", state="attached")
        texts = page.evaluate(TEXTS)
    assert story.startswith(shown) and "two" in shown and shown != story
    assert texts == ["Tell me a long story"]
    assert stored_thread(api) == [("user", "Tell me a long story")]


# An element's nodes as [tag, ...children], its text as strings (adjacent ones as one).
MESSAGE_TREE = """(selector) => { const tree = (node) => node.nodeType === Node.TEXT_NODE ? node.textContent
  : [node.tagName.toLowerCase(), ...[...node.childNodes].map(tree)];
  const copy = document.querySelector(selector).cloneNode(true);
  copy.normalize();
  return [...copy.childNodes].map(tree); }"""
HOSTILE = '<img src=x onerror="window.pwned = 1"> <script>window.pwned = 2</script>'
MARKDOWN_ANSWER = (
    "## Your week\n"
    "**Bold**, *italic*, __strong__ and `code <b>x</b>` in snake_case_names.\n"
    "A second line.\n\n"
    "- one\n"
    "- two with [a page](https://example.com/a?b=1)\n"
    "  - nested\n\n"
    "3. third\n"
    "4. fourth\n\n"
    "```python\n"
    "print('<script>**not bold**</script>')\n"
    "```\n\n"
    f"[not a page](javascript:window.pwned=3) and {HOSTILE}"
)
MARKDOWN_TREE = [
    ["p", ["strong", "Your week"]],
    [
        "p",
        ["strong", "Bold"],
        ", ",
        ["em", "italic"],
        ", ",
        ["strong", "strong"],
        " and ",
        ["code", "code <b>x</b>"],
        " in snake_case_names.\nA second line.",
    ],
    ["ul", ["li", "one"], ["li", "two with ", ["a", "a page"], ["ul", ["li", "nested"]]]],
    ["ol", ["li", "third"], ["li", "fourth"]],
    ["pre", ["code", "print('<script>**not bold**</script>')"]],
    ["p", f"[not a page](javascript:window.pwned=3) and {HOSTILE}"],
]


def test_the_advisors_markdown_shows_as_text_set_out_and_runs_nothing(
    dev_server: str, monkeypatch: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic
) -> None:
    """The advisor's Markdown showed raw (**bold**, lists, `code`). A safe subset is now set out,
    built as nodes with text in them, never as HTML: markup in an answer (or in the person's own
    message, which stays plain text) shows as written and runs nothing; a link goes to a web page
    only, in a new tab that cannot reach back (rel=noopener)."""
    fake_anthropic.answer = lambda body: MARKDOWN_ANSWER
    fake_anthropic.delta_pause_s = 0.01  # set out again at every piece, as it streams
    answering_with(monkeypatch, fake_anthropic)
    mine = f"**not bold** `not code` {HOSTILE}"
    with demo_page(dev_server) as page:
        page.fill("#message-input", mine)
        page.click("#send")
        page.wait_for_selector(".message.assistant.done")
        streamed = page.evaluate(MESSAGE_TREE, ".message.assistant.done .text")
        link = page.eval_on_selector(
            ".message.assistant.done a", "(a) => [a.getAttribute('href'), a.target, a.rel, a.textContent]"
        )
        own = page.evaluate(MESSAGE_TREE, ".message.user .text")
        page.reload()  # the stored answer, set out the same
        page.wait_for_selector("body[data-ready=true]")
        page.wait_for_selector(".message.assistant")
        stored = page.evaluate(MESSAGE_TREE, ".message.assistant .text")
        page.wait_for_load_state("load")
        pwned = page.evaluate("window.pwned ?? null")
        run = page.evaluate("document.querySelectorAll('#messages img, #messages script').length")
        fits = page.evaluate("document.documentElement.scrollWidth === innerWidth")
    assert streamed == MARKDOWN_TREE
    assert stored == MARKDOWN_TREE
    assert link == ["https://example.com/a?b=1", "_blank", "noopener", "a page"]
    assert own == [mine]
    assert (pwned, run, fits) == (None, 0, True)


# Answers as long as a prompt injected into a forwarded message can ask the model for: each made
# the Markdown's patterns try again from every character (seconds at every piece of a stream).
SLOW_MARKDOWN = {
    "brackets": "[" * 60_000,
    "a heading's spaces": "# a" + " " * 60_000 + "x",
    "a fence's spaces": "```" + " " * 60_000 + "`",
    "backticks of every length": "".join("`" * n + "a" for n in range(1, 340)),
    "italics never closed": "*a " * 20_000,
    "bold never closed": "**a " * 15_000,
    "a list item's spaces": "-" + " " * 60_000 + "x\u2028y",
}
SET_OUT = "(answers) => answers.map((text) => markdownNodes(text).length)"
SET_OUT_AS_HTML = """(text) => { const shown = document.createElement('div');
  shown.replaceChildren(...markdownNodes(text)); return shown.innerHTML; }"""


def set_out_beside_plain_words(page: Page, text: str) -> float:
    """How many times longer `text` takes to set out than plain words of its length."""

    def least(answer: str) -> float:
        tries = []
        for _ in range(5):
            started = time.perf_counter()
            page.evaluate(SET_OUT, [answer])
            tries.append(time.perf_counter() - started)
        return min(tries)

    return least(text) / least(("plain words " * len(text))[: len(text)])


def test_a_long_hostile_answer_is_set_out_at_once(dev_server: str) -> None:
    """The advisor's Markdown read in time that grew with the square of an answer (a heading's
    spaces taken in every split, italics or code read from each mark to the end): a heading of
    60,000 spaces took 3 seconds in Chromium, backticks of every length 2.8, and the page sets an
    answer out again at every piece of its stream, so one such answer froze the tab for minutes.
    Each pattern now reads linearly; what they set out is as before."""
    with demo_page(dev_server) as page:
        page.evaluate(SET_OUT, ["warm"])
        # Each answer beside plain words of its length, the least of five tries each: how much longer
        # it takes, not how long (the host's load moves both alike). Linear, each was at most 6 times
        # its plain words here, and 16.6 once on a host running two other test runs; the patterns
        # before, 25 to 990 times (seconds against milliseconds).
        slower = {name: set_out_beside_plain_words(page, text) for name, text in SLOW_MARKDOWN.items()}
        kept = (
            "# C#",
            "## Plan ##",
            "**a *b* c**",
            "_a_b c_",
            "``a ` b``",
            "[[b](https://x.y/)",
            "```py  more\nx\n```",
        )
        trees = [page.evaluate(SET_OUT_AS_HTML, text) for text in kept]
    assert {name: times for name, times in slower.items() if times > 20} == {}
    assert trees == [
        "<p><strong>C#</strong></p>",
        "<p><strong>Plan</strong></p>",
        "<p><strong>a <em>b</em> c</strong></p>",
        "<p><em>a_b c</em></p>",
        "<p><code>a ` b</code></p>",
        '<p>[<a href="https://x.y/" target="_blank" rel="noopener">b</a></p>',
        '<pre data-language="py"><code>x</code></pre>',
    ]
