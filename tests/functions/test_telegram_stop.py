"""Telegram's stop button (Bot API 10.3), through the real telegram_webhook: drafts carry
`can_stop` and `keep_on_stop`; a `stopped_message_generation` update for a running turn closes
the model's stream there, the reply sent and stored is the draft the person saw, the tokens the
model spent are counted, and no draft follows. A redelivered stop, a stop for a finished turn and
a stop from another chat change nothing (docs/decisions.md, Bot API 10.x).

The stop is the corpus's documented example (tests/corpus/telegram/29). It is posted while the
fake Bot API holds the turn's second draft, as a person taps stop while reading a draft: the turn
hears of it only through the database, as it would on another instance.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from flask import Response
from flask.testing import FlaskClient

from core.memory.service import Memory
from core.model.llm import approximate_tokens
from core.models import Person, Surface
from core.surfaces.telegram import WEBHOOK_UPDATES
from functions import runtime
from functions.tools.cli import main
from functions.tools.doctor import check_telegram
from tests.fakes.anthropic_api import FakeAnthropic
from tests.fakes.telegram_api import FakeTelegram
from tests.helpers import CORPUS, TELEGRAM_HEADERS, app_client, as_owner, count, execute, rows, stored_turn, update

STOP: dict[str, Any] = json.loads((CORPUS / "telegram" / "29_stopped_message_generation.json").read_text())
DRAFT_ID = STOP["stopped_message_generation"]["draft_id"]  # the update_id of the message answered
ANSWER = " ".join(f"word{index}" for index in range(200))  # ten seconds of writing
ANA, LUIS = 4242, 5151


@pytest.fixture
def writing(fake_anthropic: FakeAnthropic) -> FakeAnthropic:
    """A model that writes 200 words over about ten seconds."""
    fake_anthropic.answer = lambda body: ANSWER
    fake_anthropic.first_token_s = 0.3
    fake_anthropic.delta_pause_s = 0.05
    return fake_anthropic


def stop_from(chat: int, draft_id: int = DRAFT_ID) -> dict[str, Any]:
    stopped = {**STOP["stopped_message_generation"], "chat": {**STOP["stopped_message_generation"]["chat"]}}
    stopped["chat"]["id"], stopped["draft_id"] = chat, draft_id
    return {**STOP, "stopped_message_generation": stopped}


@pytest.fixture
def webhook(environment: pytest.MonkeyPatch) -> FlaskClient:
    """One instance of the function: its turns and the stops it records meet only in the database.
    With the day's token budget on, so that what a turn spends is counted (turn_usage)."""
    environment.setenv("TOKENS_PER_DAY", "2000000")
    return app_client("telegram_webhook")


def a_new_draft() -> int:
    """An update_id no other test of the run's database has used (the message's, the draft's)."""
    return uuid.uuid4().int % 10**9


def stops_of(database_url: str, draft_id: int) -> int:
    query = "select count(*) from stopped_generations s join messages m on m.id = s.message_id where m.external_id = %s"
    return count(database_url, query, str(draft_id))


def post(webhook: FlaskClient, body: dict[str, Any]) -> Response:
    return webhook.post("/", json=body, headers=TELEGRAM_HEADERS)


def tap_stop_on_draft(
    webhook: FlaskClient, telegram: FakeTelegram, number: int, stop: dict[str, Any], times: int = 1
) -> list[Response]:
    """Post `stop` to the webhook (`times` times: Telegram's redeliveries) while the fake Bot API
    holds the turn's `number`-th draft."""
    answers: list[Response] = []
    drafts = 0

    def before_answer(method: str, payload: dict[str, Any]) -> None:
        nonlocal drafts
        if method == "sendMessageDraft":
            drafts += 1
            if drafts == number:
                answers.extend(post(webhook, stop) for _ in range(times))

    telegram.before_answer = before_answer
    return answers


def eventually(condition: Callable[[], bool]) -> None:
    """Wait for a fake's thread to have seen the end of a connection (never a figure about time)."""
    for _ in range(500):
        if condition():
            return
        time.sleep(0.01)
    raise AssertionError("never got there")


def methods(telegram: FakeTelegram) -> list[str]:
    return [method for method, _ in telegram.calls]


def snapshot(database_url: str) -> list[tuple[Any, ...]]:
    """Everything a stop could change: the messages, the stops, the tokens counted."""
    return [
        *rows(database_url, "select id, role, content, delivered_at from messages order by id"),
        *rows(database_url, "select message_id, user_id, stopped_at from stopped_generations order by message_id"),
        *rows(database_url, "select message_id, tokens, reserved from turn_usage order by message_id"),
    ]


def test_a_stopped_draft_closes_the_models_stream_and_the_reply_is_the_draft_shown(
    webhook: FlaskClient,
    database_url: str,
    writing: FakeAnthropic,
    fake_telegram: FakeTelegram,
    caplog: pytest.LogCaptureFixture,
) -> None:
    stopped = tap_stop_on_draft(webhook, fake_telegram, 2, STOP)
    response = post(webhook, update("Tell me everything about my week", update_id=DRAFT_ID))

    assert response.get_json() == {"ok": True, "outcome": "stopped"}
    assert [answer.get_json() for answer in stopped] == [{"ok": True, "stopped": True}]
    drafts = fake_telegram.sent("sendMessageDraft")
    assert len(drafts) == 2  # none after the one the person stopped at
    assert {(d["chat_id"], d["draft_id"], d["can_stop"], d["keep_on_stop"]) for d in drafts} == {
        (ANA, DRAFT_ID, True, True)
    }
    shown = drafts[-1]["text"].rstrip()  # a draft ends where a word did; the message as sent
    assert ANSWER.startswith(shown) and len(shown) < len(ANSWER) // 2
    called = methods(fake_telegram)
    assert called[-1] == "sendMessage" and called.count("sendMessage") == 1
    assert fake_telegram.sent() == [{"chat_id": ANA, "text": shown}]
    assert stored_turn(database_url, str(DRAFT_ID)) == [
        ("user", "Tell me everything about my week"),
        ("assistant", shown),
    ]
    eventually(lambda: len(writing.stream_ends) == 1)
    assert writing.stream_ends == ["cut"]  # the model's stream was closed before its end

    # What the model read, as it said at its start, and what it wrote until the stop: at least the
    # text shown, though its last word on what it wrote never came.
    (line,) = [record.__dict__ for record in caplog.records if record.getMessage() == "turn"]
    assert line["outcome"] == "stopped"
    assert line["output_tokens"] >= approximate_tokens(shown) > 1
    read = sum(
        writing.usages[0][key] for key in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
    )
    (message_id,) = [i for (i,) in rows(database_url, "select id from messages where external_id = %s", str(DRAFT_ID))]
    assert rows(database_url, "select tokens, reserved from turn_usage where message_id = %s", message_id) == [
        (read + line["output_tokens"], 0)
    ]
    # Its figures: begin_turn, one check before the second draft (the first had no button yet)
    # that found nothing, one that found the stop, finish_turn.
    assert line["round_trips"] == 4


def test_a_redelivered_stop_changes_nothing(
    webhook: FlaskClient, database_url: str, writing: FakeAnthropic, fake_telegram: FakeTelegram
) -> None:
    """Redelivered while the turn still writes, and once it is over."""
    draft = a_new_draft()
    stopped = tap_stop_on_draft(webhook, fake_telegram, 2, stop_from(ANA, draft), times=2)
    assert post(webhook, update("Tell me everything about my week", update_id=draft)).get_json()["outcome"] == "stopped"
    assert [answer.get_json() for answer in stopped] == [{"ok": True, "stopped": True}, {"ok": True, "stopped": False}]
    assert len(fake_telegram.sent("sendMessageDraft")) == 2 and len(fake_telegram.sent()) == 1
    fake_telegram.before_answer = None
    before, calls, asked = snapshot(database_url), len(fake_telegram.calls), len(writing.requests)

    again = post(webhook, stop_from(ANA, draft))

    assert again.status_code == 200 and again.get_json() == {"ok": True, "stopped": False}
    assert snapshot(database_url) == before
    assert stops_of(database_url, draft) == 1
    assert fake_telegram.calls[calls:] == [] and len(writing.requests) == asked


def test_a_stop_for_a_turn_already_finished_changes_nothing(
    webhook: FlaskClient, database_url: str, fake_anthropic: FakeAnthropic, fake_telegram: FakeTelegram
) -> None:
    fake_anthropic.answer = lambda body: "Noted."
    draft = a_new_draft()
    assert post(webhook, update("A short one", update_id=draft)).get_json() == {"ok": True, "outcome": "answered"}
    before, calls, asked = snapshot(database_url), len(fake_telegram.calls), len(fake_anthropic.requests)

    late = post(webhook, stop_from(ANA, draft))

    assert late.status_code == 200 and late.get_json() == {"ok": True, "stopped": False}
    assert snapshot(database_url) == before
    assert stops_of(database_url, draft) == 0
    assert fake_telegram.calls[calls:] == [] and len(fake_anthropic.requests) == asked
    assert stored_turn(database_url, str(draft)) == [("user", "A short one"), ("assistant", "Noted.")]


def test_a_stop_from_another_chat_never_stops_a_persons_reply(
    webhook: FlaskClient, database_url: str, writing: FakeAnthropic, fake_telegram: FakeTelegram
) -> None:
    """Luis has a memory here too; his chat naming Ana's draft stops nothing of hers."""
    whole = " ".join(ANSWER.split(" ")[:40])  # two seconds of writing
    writing.answer = lambda body: whole
    assert post(webhook, update("Hola", update_id=a_new_draft(), user_id=LUIS)).get_json()["outcome"] == "answered"
    draft = a_new_draft()
    stopped = tap_stop_on_draft(webhook, fake_telegram, 2, stop_from(LUIS, draft))

    response = post(webhook, update("Tell me everything about my week", update_id=draft))

    assert response.get_json() == {"ok": True, "outcome": "answered"}
    assert [answer.get_json() for answer in stopped] == [{"ok": True, "stopped": False}]
    assert stored_turn(database_url, str(draft))[-1] == ("assistant", whole)
    assert fake_telegram.sent()[-1] == {"chat_id": ANA, "text": whole}
    assert stops_of(database_url, draft) == 0


def owed_claims(database_url: str) -> list[int]:
    """The Telegram messages the scheduled job would take over now (its claim, rolled back)."""
    with psycopg.connect(database_url) as connection:
        (claimed,) = connection.execute(
            "select public.claim_owed_replies('telegram', 600, 60, 1000, '', 0, 0, 0, 24, 16, 4, 0, 0, 0)"
        ).fetchone() or ([],)
        connection.rollback()
    return [int(message["message_id"]) for message in claimed]


def test_a_stop_that_outlives_the_instance_writing_is_kept_by_the_redelivery_and_the_job(
    webhook: FlaskClient,
    database_url: str,
    memory: Memory,
    writing: FakeAnthropic,
    fake_telegram: FakeTelegram,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The instance writing Ana's reply died with her stop on its way: the message is stored, has
    no reply, and its attempt's time is up, so it is owed, and the stop is recorded. Its
    redelivery takes it over and writes nothing: no model call, no draft, no message, nothing
    stored, and a 200 (Telegram redelivers no more); the scheduled job does not claim it either.
    She tapped stop: a whole answer minutes later is the opposite (docs/decisions.md)."""
    draft = a_new_draft()
    said = "Tell me everything about my week"
    start = memory.begin_turn(Person(sender_id=str(ANA)), Surface.TELEGRAM, said, str(draft), sender=str(ANA))
    execute(
        database_url,
        "update messages set answer_by = clock_timestamp() - interval '1 second' where id = %s",
        start.message_id,
    )
    assert start.message_id in owed_claims(database_url)  # owed, as any message whose writer died

    assert post(webhook, stop_from(ANA, draft)).get_json() == {"ok": True, "stopped": True}
    assert start.message_id not in owed_claims(database_url)
    asked = len(writing.requests)
    response = post(webhook, update(said, update_id=draft))

    assert response.status_code == 200 and response.get_json() == {"ok": True, "outcome": "stopped"}
    assert len(writing.requests) == asked and fake_telegram.calls == []
    assert stored_turn(database_url, str(draft)) == [("user", said)]
    (line,) = [record.__dict__ for record in caplog.records if record.getMessage() == "turn"]
    assert (line["outcome"], line["owed"], line["round_trips"]) == ("stopped", True, 3)  # begin, ask, end
    # A redelivery after that one: the same, and the message is still nobody's to answer.
    assert post(webhook, update(said, update_id=draft)).get_json() == {"ok": True, "outcome": "stopped"}
    assert start.message_id not in owed_claims(database_url)
    assert len(writing.requests) == asked and fake_telegram.calls == []


def test_the_webhook_is_set_up_to_get_the_stop_button(
    environment: pytest.MonkeyPatch, fake_telegram: FakeTelegram
) -> None:
    assert main(["telegram", "set-webhook", "--url", "https://advisor.example.com/telegram_webhook"]) == 0
    method, payload = fake_telegram.calls[0]  # then the command menus
    assert method == "setWebhook"
    assert payload["allowed_updates"] == [
        "message",
        "edited_message",
        "callback_query",
        "my_chat_member",
        "stopped_message_generation",
    ]
    assert tuple(payload["allowed_updates"]) == WEBHOOK_UPDATES


def test_a_running_turn_on_another_thread_hears_the_stop_only_through_the_database(
    webhook: FlaskClient, database_url: str, writing: FakeAnthropic, fake_telegram: FakeTelegram
) -> None:
    """The stop posted from the test's own thread, not from inside the Bot API's answer: the turn
    stops at the check after it, whichever draft that is."""
    draft, answered = a_new_draft(), []
    turn = threading.Thread(
        target=lambda: answered.append(post(webhook, update("Tell me everything", update_id=draft)))
    )
    turn.start()
    eventually(lambda: bool(fake_telegram.sent("sendMessageDraft")))
    assert post(webhook, stop_from(ANA, draft)).get_json() == {"ok": True, "stopped": True}
    turn.join(60)
    assert answered[0].get_json() == {"ok": True, "outcome": "stopped"}
    shown = fake_telegram.sent("sendMessageDraft")[-1]["text"].rstrip()
    assert fake_telegram.sent() == [{"chat_id": ANA, "text": shown}]
    assert stored_turn(database_url, str(draft))[-1] == ("assistant", shown)
    assert len(shown) < len(ANSWER) // 2


def test_the_doctor_fails_a_webhook_that_never_gets_the_stop_button(
    environment: pytest.MonkeyPatch, fake_telegram: FakeTelegram
) -> None:
    """A webhook set before Bot API 10.3 (or by another tool) lists its kinds without the stop."""
    ours = "https://advisor.example.com/telegram_webhook"
    before = ["message", "edited_message", "callback_query", "my_chat_member"]
    fake_telegram.webhook_info = {"url": ours, "pending_update_count": 0, "allowed_updates": before}
    check = check_telegram(runtime.settings(), [ours], "europe-west1")
    assert (check.status, check.detail) == (
        "fail",
        "Telegram sends no stopped_message_generation update (allowed_updates)",
    )
    assert check.fix is not None and f"crossmem telegram set-webhook --url {ours}" in check.fix

    fake_telegram.webhook_info["allowed_updates"] = list(WEBHOOK_UPDATES)
    assert check_telegram(runtime.settings(), [ours], "europe-west1").status == "ok"


def test_under_the_owner_policy_the_owners_stop_stops_the_reply(
    environment: pytest.MonkeyPatch,
    owner: uuid.UUID,
    database_url: str,
    writing: FakeAnthropic,
    fake_telegram: FakeTelegram,
) -> None:
    """The owner policy keeps no identity row for the owner's chat: a stop looked up by the chat's
    identity found nobody, was answered `stopped: false`, and the whole answer went on (a review's
    finding). The owner's stop is theirs; a stranger's, under the same policy, stops nothing."""
    as_owner(environment, owner, telegram="7373")
    webhook = app_client("telegram_webhook")
    draft = a_new_draft()
    stopped = tap_stop_on_draft(webhook, fake_telegram, 2, stop_from(7373, draft))

    response = post(webhook, update("Tell me everything about my week", update_id=draft, user_id=7373))

    assert [answer.get_json() for answer in stopped] == [{"ok": True, "stopped": True}]
    assert response.get_json() == {"ok": True, "outcome": "stopped"}
    assert len(fake_telegram.sent("sendMessageDraft")) == 2
    shown = fake_telegram.sent("sendMessageDraft")[-1]["text"].rstrip()
    assert fake_telegram.sent() == [{"chat_id": 7373, "text": shown}]
    assert stored_turn(database_url, str(draft)) == [("user", "Tell me everything about my week"), ("assistant", shown)]
    assert post(webhook, stop_from(7474, draft)).get_json() == {"ok": True, "stopped": False}
