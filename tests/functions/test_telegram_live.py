"""Replies you can watch on Telegram (issue #22): "typing…" at once, the text as the model writes
it (sendMessageDraft), then the stored reply (sendMessage); drafts never hold the reply up."""

from __future__ import annotations

import time

import pytest

from tests.fakes.anthropic_api import FakeAnthropic
from tests.fakes.telegram_api import FakeTelegram
from tests.helpers import TELEGRAM_HEADERS, app_client, stored_turn, update

ANSWER = " ".join(f"word{index}" for index in range(40))


@pytest.fixture
def writing(fake_anthropic: FakeAnthropic) -> FakeAnthropic:
    """A model that writes 40 words over about two seconds, after 0.3 s of thought."""
    fake_anthropic.answer = lambda body: ANSWER
    fake_anthropic.first_token_s = 0.3
    fake_anthropic.delta_pause_s = 0.05
    return fake_anthropic


def methods(telegram: FakeTelegram) -> list[str]:
    return [method for method, _ in telegram.calls]


def test_typing_then_drafts_that_grow_then_the_stored_reply(
    environment: pytest.MonkeyPatch, database_url: str, writing: FakeAnthropic, fake_telegram: FakeTelegram
) -> None:
    delivery = update("Tell me about my week")
    response = app_client("telegram_webhook").post("/", json=delivery, headers=TELEGRAM_HEADERS)
    assert response.status_code == 200
    called = methods(fake_telegram)
    assert called[0] == "sendChatAction"
    assert fake_telegram.calls[0][1] == {"chat_id": 4242, "action": "typing"}
    assert called[-1] == "sendMessage"
    drafts = fake_telegram.sent("sendMessageDraft")
    assert len(drafts) >= 2
    assert {draft["draft_id"] for draft in drafts} == {delivery["update_id"]}
    assert {draft["chat_id"] for draft in drafts} == {4242}
    texts = [draft["text"] for draft in drafts]
    for shorter, longer in zip(texts, texts[1:], strict=False):
        assert longer.startswith(shorter) and len(longer) > len(shorter)
    assert ANSWER.startswith(texts[-1])
    assert set(called[1:-1]) <= {"sendMessageDraft", "sendChatAction"}
    assert fake_telegram.sent()[-1] == {"chat_id": 4242, "text": ANSWER}
    assert stored_turn(database_url, str(delivery["update_id"])) == [
        ("user", "Tell me about my week"),
        ("assistant", ANSWER),
    ]


def test_a_429_on_drafts_skips_drafts_and_leaves_the_reply_on_time(
    environment: pytest.MonkeyPatch, writing: FakeAnthropic, fake_telegram: FakeTelegram
) -> None:
    fake_telegram.fail_with("too_many_requests", method="sendMessageDraft")  # retry after 41 s
    began = time.monotonic()
    response = app_client("telegram_webhook").post("/", json=update("Busy day?"), headers=TELEGRAM_HEADERS)
    took = time.monotonic() - began
    assert response.status_code == 200
    assert [method for method, _ in fake_telegram.refused] == ["sendMessageDraft"]  # one try, then none
    assert fake_telegram.sent("sendMessageDraft") == []
    assert fake_telegram.sent() == [{"chat_id": 4242, "text": ANSWER}]
    assert took < 41  # the reply did not wait out the drafts' retry_after


@pytest.mark.parametrize(
    ("method", "error"),
    [("sendMessageDraft", "chat_not_found"), ("sendChatAction", "gateway")],
    ids=["drafts refused for good", "typing behind a 502"],
)
def test_drafts_or_typing_the_bot_api_refuses_never_cost_the_reply(
    environment: pytest.MonkeyPatch,
    database_url: str,
    writing: FakeAnthropic,
    fake_telegram: FakeTelegram,
    method: str,
    error: str,
) -> None:
    """A draft answered 400 (a Bot API that will not take drafts in this chat) stops the drafts
    after that one try; a "typing…" answered 502 is only logged: the reply goes out once, whole,
    and is stored."""
    fake_telegram.fail_with(error, method=method)
    delivery = update("How was my week?")
    response = app_client("telegram_webhook").post("/", json=delivery, headers=TELEGRAM_HEADERS)
    assert response.status_code == 200 and response.get_json() == {"ok": True, "outcome": "answered"}
    if method == "sendMessageDraft":
        assert [name for name, _ in fake_telegram.refused] == ["sendMessageDraft"]  # one try, then none
    assert fake_telegram.sent() == [{"chat_id": 4242, "text": ANSWER}]
    assert stored_turn(database_url, str(delivery["update_id"])) == [
        ("user", "How was my week?"),
        ("assistant", ANSWER),
    ]


def test_a_redelivery_sends_no_drafts(
    environment: pytest.MonkeyPatch, writing: FakeAnthropic, fake_telegram: FakeTelegram
) -> None:
    telegram = app_client("telegram_webhook")
    delivery = update("Once only")
    assert telegram.post("/", json=delivery, headers=TELEGRAM_HEADERS).status_code == 200
    before = len(fake_telegram.calls)
    again = telegram.post("/", json=delivery, headers=TELEGRAM_HEADERS)
    assert again.get_json() == {"ok": True, "outcome": "duplicate"}
    assert fake_telegram.calls[before:] == []


def test_drafts_off_shows_typing_only(
    environment: pytest.MonkeyPatch, writing: FakeAnthropic, fake_telegram: FakeTelegram
) -> None:
    environment.setenv("TELEGRAM_DRAFTS", "false")
    response = app_client("telegram_webhook").post("/", json=update("Quietly"), headers=TELEGRAM_HEADERS)
    assert response.status_code == 200
    assert methods(fake_telegram)[0] == "sendChatAction"
    assert "sendMessageDraft" not in methods(fake_telegram)
    assert fake_telegram.sent() == [{"chat_id": 4242, "text": ANSWER}]


def test_the_reply_in_the_webhook_answer_keeps_working_without_drafts(
    environment: pytest.MonkeyPatch, writing: FakeAnthropic, fake_telegram: FakeTelegram
) -> None:
    environment.setenv("TELEGRAM_REPLY_IN_WEBHOOK", "true")
    response = app_client("telegram_webhook").post("/", json=update("Inline"), headers=TELEGRAM_HEADERS)
    assert response.get_json() == {"method": "sendMessage", "chat_id": 4242, "text": ANSWER}
    assert fake_telegram.calls == []
