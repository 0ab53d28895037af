"""The demo page's thread when ids are not the order: a reply's id is drawn when its turn begins
(begin_turn), so a reply stored after the page's own turn may have a lower id than what the page
shows. Real browser, `crossmem dev` in process (tests/functions/test_demo_page.py's server)."""

from __future__ import annotations

import shutil
import uuid

from playwright.sync_api import sync_playwright

from core.models import Person, Surface
from functions import runtime
from tests.functions.test_demo_page import CHROMIUM_FLAGS, POLL_MS, SIZES, dev_server, send_on_the_web  # noqa: F401

TEXTS = "[...document.querySelectorAll('#messages .message .text')].map((t) => t.textContent)"


def test_a_reply_stored_after_the_pages_turn_with_a_lower_id_appears_once(dev_server: str) -> None:  # noqa: F811
    chromium = shutil.which("chromium")
    assert chromium, "Debian's chromium is missing: `make test` installs it"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport=SIZES["desktop"])  # type: ignore[arg-type]
        page.clock.install()
        page.goto(dev_server)
        page.wait_for_selector("body[data-ready=true]")
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
        browser.close()
