"""Telegram's live reply (core/channels/live_reply.py) against the fake Bot API, on a clock the
test moves (issue 30, finding 9): a 429 pauses the drafts until its `retry_after` and they go on;
`stop()` ends the thread, so nothing follows the message; the stop button (issue 32) ends the
drafts at the one the person saw."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

from core.channels.live_reply import LiveReply
from core.channels.telegram_bot import TelegramBot, TelegramChannel
from core.errors import StoreUnavailable
from core.models import Delivery, Sent
from tests.fakes.telegram_api import FakeTelegram
from tests.helpers import BOT_TOKEN, MovedClock


@pytest.fixture
def fake() -> Iterator[FakeTelegram]:
    server = FakeTelegram(BOT_TOKEN)
    yield server
    server.close()


@pytest.fixture
def clock() -> MovedClock:
    return MovedClock()


@pytest.fixture
def bot(fake: FakeTelegram, clock: MovedClock) -> Iterator[TelegramBot]:
    client = TelegramBot(BOT_TOKEN, fake.url, clock=clock)
    yield client
    client.close()


def eventually(condition: Callable[[], bool]) -> None:
    """Wait for the live reply's thread to have done something (never a figure about time)."""
    for _ in range(500):
        if condition():
            return
        time.sleep(0.01)
    raise AssertionError("the live reply's thread never got there")


def moved_until(clock: MovedClock, condition: Callable[[], bool]) -> None:
    """Move the clock a little at a time until the thread has done something: the thread reads the
    clock after each call it makes, so one big step could land before or after that read."""
    for _ in range(400):
        if condition():
            return
        clock.now += 0.25
        time.sleep(0.01)
    raise AssertionError("the live reply's thread never got there")


def methods(fake: FakeTelegram) -> list[str]:
    return [method for method, _ in fake.calls]


def test_a_429_on_drafts_pauses_them_until_its_retry_after_and_then_they_go_on(
    fake: FakeTelegram, bot: TelegramBot, clock: MovedClock, caplog: pytest.LogCaptureFixture
) -> None:
    fake.fail_with("too_many_requests", times=1, method="sendMessageDraft")  # retry after 41 s
    live = LiveReply(bot.call, 42, 7, clock=clock, lasts_s=120)
    live.start(clock.now + 120)
    live.show("Hello")
    # The thread has read the 429 and set its pause (from the clock as it was) before time moves.
    eventually(lambda: any(r.getMessage() == "drafts paused: Too Many Requests" for r in caplog.records))

    clock.now += 40  # still inside the 41 s
    live.show("Hello there")
    time.sleep(0.3)  # what the thread would take to send a draft it wanted
    assert fake.sent("sendMessageDraft") == []

    clock.now += 1.5
    live.show("Hello there, Ana")
    eventually(lambda: bool(fake.sent("sendMessageDraft")))
    live.stop()
    assert fake.sent("sendMessageDraft") == [{"chat_id": 42, "draft_id": 7, "text": "Hello there, Ana"}]


def test_stop_ends_the_drafts_and_nothing_reaches_telegram_after_the_message(
    fake: FakeTelegram, bot: TelegramBot, clock: MovedClock
) -> None:
    channel = TelegramChannel(bot, 42, draft_id=7, drafts=True)
    channel.show_typing(clock.now + 60)
    channel.draft("Hel")
    eventually(lambda: bool(fake.sent("sendMessageDraft")))
    channel.draft("Hello")  # waits for the next draft's turn, a second later
    assert channel.send("Hello, Ana.", clock.now + 60) == Sent(Delivery.DELIVERED, 1)

    clock.now += 10  # a thread still running would now send its draft, and typing
    channel.draft("Hello, Ana.")  # as a late piece of the model's text would wake it
    time.sleep(0.3)
    called = methods(fake)
    assert called[-1] == "sendMessage"
    assert called.count("sendMessage") == 1
    assert fake.sent("sendMessageDraft") == [{"chat_id": 42, "draft_id": 7, "text": "Hel"}]


def test_the_drafts_end_with_the_attempts_time(fake: FakeTelegram, bot: TelegramBot, clock: MovedClock) -> None:
    """Past the moment the attempt must have sent by, the message may be someone else's to answer."""
    channel = TelegramChannel(bot, 42, draft_id=7, drafts=True)
    channel.show_typing(clock.now + 30)
    channel.draft("Hel")
    eventually(lambda: bool(fake.sent("sendMessageDraft")))
    clock.now += 31
    channel.draft("Hello")
    time.sleep(0.3)
    assert channel.send("Hello, Ana.", clock.now - 1) == Sent(Delivery.OWED, 0)
    assert [method for method in methods(fake) if method != "sendChatAction"] == ["sendMessageDraft"]


def test_a_tap_on_stop_ends_the_drafts_at_the_one_shown(
    fake: FakeTelegram, bot: TelegramBot, clock: MovedClock
) -> None:
    """Bot API 10.3: the drafts carry the stop button; a tap (the database says so) is heard at the
    check before the next draft, which never goes, nor does anything after it."""
    tapped: list[bool] = []
    live = LiveReply(bot.call, 42, 7, clock=clock, lasts_s=120, stop_asked=lambda: bool(tapped))
    live.start(clock.now + 120)
    live.show("Hel")
    eventually(lambda: bool(fake.sent("sendMessageDraft")))
    assert live.checks == 0  # no button before the first draft: nothing to ask
    tapped.append(True)
    live.show("Hello, Ana. ")
    moved_until(clock, lambda: live.stopped() is not None)
    clock.now += 10  # a thread still running would now send its draft
    live.show("Hello, Ana. How was")
    time.sleep(0.3)
    assert live.stopped() == "Hel"
    assert live.checks == 1
    assert fake.sent("sendMessageDraft") == [
        {"chat_id": 42, "draft_id": 7, "text": "Hel", "can_stop": True, "keep_on_stop": True}
    ]
    assert methods(fake) == ["sendChatAction", "sendMessageDraft"]


def test_a_stop_check_that_fails_ends_the_checks_and_the_button_not_the_drafts(
    fake: FakeTelegram, bot: TelegramBot, clock: MovedClock
) -> None:
    def down() -> bool:
        raise StoreUnavailable("generation_stopped failed: OperationalError")

    live = LiveReply(bot.call, 42, 7, clock=clock, lasts_s=120, stop_asked=down)
    live.start(clock.now + 120)
    live.show("Hel")
    eventually(lambda: len(fake.sent("sendMessageDraft")) == 1)
    live.show("Hello")
    moved_until(clock, lambda: len(fake.sent("sendMessageDraft")) == 2)
    live.show("Hello, Ana")
    moved_until(clock, lambda: len(fake.sent("sendMessageDraft")) == 3)
    live.stop()
    assert live.checks == 1 and live.stopped() is None
    # A button nobody can hear is not shown again.
    assert [("can_stop" in draft) for draft in fake.sent("sendMessageDraft")] == [True, False, False]
