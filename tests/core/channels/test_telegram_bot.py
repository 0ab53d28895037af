"""TelegramBot against the fake Bot API answering with the real error bodies."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from core.channels.telegram_bot import TelegramBot
from core.models import Delivery
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
    client = TelegramBot(BOT_TOKEN, fake.url, clock=clock, sleep=clock.sleep)
    yield client
    client.close()


@pytest.mark.parametrize(
    ("failure", "delivery"),
    [
        ("blocked_by_user", Delivery.GIVEN_UP),
        ("cannot_initiate", Delivery.GIVEN_UP),
        ("user_is_blocked_as_400", Delivery.GIVEN_UP),
        ("chat_not_found", Delivery.GIVEN_UP),
        ("gateway", Delivery.OWED),
        ("too_many_requests_long", Delivery.OWED),
    ],
)
def test_each_failure_is_given_up_or_owed(
    bot: TelegramBot, fake: FakeTelegram, clock: MovedClock, failure: str, delivery: Delivery
) -> None:
    fake.fail_with(failure)
    assert bot.send_text(42, "hello", deadline=clock.now + 50) is delivery
    assert len(fake.refused) == 1 and fake.sent() == [] and clock.slept == []


@pytest.mark.parametrize(
    ("failure", "wait"), [("too_many_requests", 41.0), ("too_many_requests_2016_no_parameters", 3.0)]
)
def test_too_many_requests_is_waited_out_when_the_wait_fits_the_deadline(
    bot: TelegramBot, fake: FakeTelegram, clock: MovedClock, failure: str, wait: float
) -> None:
    fake.fail_with(failure, times=1)
    assert bot.send_text(42, "hello", deadline=clock.now + 50) is Delivery.DELIVERED
    assert clock.slept == [wait]
    assert fake.sent() == [{"chat_id": 42, "text": "hello"}]


def test_too_many_requests_past_the_deadline_is_owed_at_once(
    bot: TelegramBot, fake: FakeTelegram, clock: MovedClock
) -> None:
    fake.fail_with("too_many_requests", times=1)  # retry after 41 s
    assert bot.send_text(42, "hello", deadline=clock.now + 30) is Delivery.OWED
    assert clock.slept == [] and fake.sent() == []


def test_an_unreachable_bot_api_is_owed(clock: MovedClock) -> None:
    bot = TelegramBot(BOT_TOKEN, "http://127.0.0.1:1", clock=clock, sleep=clock.sleep)
    assert bot.send_text(42, "hello") is Delivery.OWED
    bot.close()


def test_a_reply_whose_deadline_has_passed_is_owed_and_never_reaches_telegram(
    bot: TelegramBot, fake: FakeTelegram, clock: MovedClock
) -> None:
    """Issue 30, finding 1: past the moment its attempt must have sent by, a reply is not sent late."""
    assert bot.send_text(42, "hello", deadline=clock.now) is Delivery.OWED
    assert fake.calls == [] and fake.refused == [] and clock.slept == []
