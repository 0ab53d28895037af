"""Fuzzing with the budget on (issue #23): a person past their budget tries every combination
of conversation ids, client message ids, surfaces and streaming, and none reaches the model.

One person has a web account with a Telegram chat and a WhatsApp number linked to it, and
spends TURNS_PER_DAY on three turns: one answered on each of the web and Telegram, and one on
WhatsApp that ended in the fallback (an owed message, which a redelivery would answer if the
budget let it). Then each case sends, through the real functions:

- web, JSON or streamed: no conversation, their own, a new one (`POST /conversations` first),
  another person's, or a random id; a client id already used (theirs or another person's),
  a new one, or none;
- Telegram: an update id already stored, or a new one;
- WhatsApp: a MessageSid already stored (the owed one among them), or a new one.

`over_budget_reached_model` counts the cases during which the fake Anthropic API received a
request; `stored` the messages the cases added. Both must stay 0.

`python -m bench.fuzz_budget` runs this part alone and updates `fuzz_budget_on` in
bench/results.json.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import jwt
import psycopg
from flask.testing import FlaskClient
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from twilio.request_validator import RequestValidator

from bench.results import run_alone
from functions import runtime
from tests.fakes.anthropic_api import FakeAnthropic
from tests.fakes.telegram_api import FakeTelegram
from tests.helpers import BOT_TOKEN, TELEGRAM_SECRET, app_client, production_settings

CASES = 2_000
JWT_SECRET = "web-jwt-secret-for-budget-fuzzing-32-bytes"
TWILIO_TOKEN = "twilio-auth-token-for-budget-fuzzing"
PUBLIC_BASE_URL = "https://advisor.example.com/whatsapp"
TURNS_PER_DAY = 3


@dataclass
class Spent:
    """The person over budget, and what they have already used."""

    person: uuid.UUID
    chat: int
    number: str
    conversation: str
    client_ids: list[str]
    update_ids: list[int]
    message_sids: list[str]
    other_conversation: str
    other_client_id: str
    # The empty conversations the cases made: past EMPTY_CONVERSATIONS_PER_PERSON, the last is reused.
    empty: list[str] = field(default_factory=list)


def token(person: uuid.UUID) -> dict[str, str]:
    claims = {"sub": str(person), "aud": "authenticated", "role": "authenticated", "exp": 4102444800}
    return {"Authorization": "Bearer " + jwt.encode(claims, JWT_SECRET, algorithm="HS256")}


def telegram_update(chat: int, update_id: int, text: str) -> dict[str, Any]:
    sender = {"id": chat, "is_bot": False, "first_name": "Ana"}
    message = {"message_id": 1, "date": 1764590000, "chat": {"id": chat, "type": "private"}, "from": sender}
    return {"update_id": update_id, "message": {**message, "text": text}}


def whatsapp_form(number: str, sid: str, text: str) -> tuple[dict[str, str], dict[str, str]]:
    form = {"From": f"whatsapp:{number}", "To": "whatsapp:+14155238886", "Body": text, "MessageSid": sid}
    form["NumMedia"] = "0"
    return form, {"X-Twilio-Signature": RequestValidator(TWILIO_TOKEN).compute_signature(PUBLIC_BASE_URL, form)}


@contextmanager
def budget_environment(database_url: str) -> Iterator[FakeAnthropic]:
    anthropic, telegram = FakeAnthropic(), FakeTelegram(BOT_TOKEN)
    saved = dict(os.environ)
    os.environ.update(
        {
            **production_settings(database_url, anthropic, telegram),
            "TURNS_PER_DAY": str(TURNS_PER_DAY),
            "TWILIO_AUTH_TOKEN": TWILIO_TOKEN,
            "PUBLIC_BASE_URL": PUBLIC_BASE_URL,
            "SUPABASE_JWT_SECRET": JWT_SECRET,
        }
    )
    try:
        yield anthropic
    finally:
        runtime.reset()
        os.environ.clear()
        os.environ.update(saved)
        anthropic.close()
        telegram.close()


def spend_the_budget(database_url: str, clients: dict[str, FlaskClient], anthropic: FakeAnthropic) -> Spent:
    person, other = uuid.uuid4(), uuid.uuid4()
    chat, number = 700000000 + uuid.uuid4().int % 10**8, f"+3465{uuid.uuid4().int % 10**7:07d}"
    with psycopg.connect(database_url, autocommit=True) as connection:
        connection.execute("select public.link_identity(%s, 'telegram', %s)", (person, str(chat)))
        connection.execute("select public.link_identity(%s, 'whatsapp', %s)", (person, number))
    theirs = clients["web_chat"].post(
        "/", json={"message": "the other's", "client_message_id": "o-1"}, headers=token(other)
    )
    web = clients["web_chat"].post("/", json={"message": "first", "client_message_id": "c-1"}, headers=token(person))
    update_id = uuid.uuid4().int % 10**9
    clients["telegram_webhook"].post(
        "/",
        json=telegram_update(chat, update_id, "second"),
        headers={"X-Telegram-Bot-Api-Secret-Token": TELEGRAM_SECRET},
    )
    anthropic.behaviour = "500"  # the third ends in the fallback: an owed message
    sid = "SM" + uuid.uuid4().hex
    form, signature = whatsapp_form(number, sid, "third")
    clients["whatsapp_webhook"].post("/", data=form, headers=signature)
    anthropic.behaviour = "ok"
    assert web.status_code == 200 and theirs.status_code == 200
    return Spent(
        person=person,
        chat=chat,
        number=number,
        conversation=web.get_json()["conversation_id"],
        client_ids=["c-1"],
        update_ids=[update_id],
        message_sids=[sid],
        other_conversation=theirs.get_json()["conversation_id"],
        other_client_id="o-1",
    )


def new_conversation(web: FlaskClient, spent: Spent) -> str:
    """A new conversation, as a page makes one: while the person holds as many empty ones as they
    may, the last one made (an over-budget case stores nothing in it, so it stays empty)."""
    made = web.post("/conversations", headers=token(spent.person))
    if made.status_code == 409 and made.get_json()["error"] == "too_many_empty_conversations" and spent.empty:
        return spent.empty[-1]
    spent.empty.append(made.get_json()["id"])
    return spent.empty[-1]


def send(clients: dict[str, FlaskClient], spent: Spent, case: dict[str, Any]) -> int:
    """One case; the HTTP status it was answered with."""
    text = case["text"] or "x"
    if case["surface"] == "telegram":
        update_id = spent.update_ids[0] if case["seen"] else uuid.uuid4().int % 10**9
        headers = {"X-Telegram-Bot-Api-Secret-Token": TELEGRAM_SECRET}
        return (
            clients["telegram_webhook"]
            .post("/", json=telegram_update(spent.chat, update_id, text), headers=headers)
            .status_code
        )
    if case["surface"] == "whatsapp":
        sid = spent.message_sids[0] if case["seen"] else "SM" + uuid.uuid4().hex
        form, signature = whatsapp_form(spent.number, sid, text)
        return clients["whatsapp_webhook"].post("/", data=form, headers=signature).status_code
    web = clients["web_chat"]
    conversation = {
        "none": None,
        "own": spent.conversation,
        "new": "new",
        "another person's": spent.other_conversation,
        "random": str(uuid.uuid4()),
    }[case["conversation"]]
    if conversation == "new":
        conversation = new_conversation(web, spent)
    client_id = {
        "none": None,
        "seen": spent.client_ids[0],
        "another person's": spent.other_client_id,
        "new": f"c-{uuid.uuid4()}",
    }[case["client_id"]]
    body: dict[str, Any] = {"message": text}
    if conversation is not None:
        body["conversation_id"] = conversation
    if client_id is not None:
        body["client_message_id"] = client_id
    headers = {**token(spent.person), **({"Accept": "text/event-stream"} if case["streamed"] else {})}
    return web.post("/", json=body, headers=headers).status_code


CASE = st.fixed_dictionaries(
    {
        "surface": st.sampled_from(["web", "web", "web", "telegram", "whatsapp"]),
        "streamed": st.booleans(),
        "conversation": st.sampled_from(["none", "own", "new", "another person's", "random"]),
        "client_id": st.sampled_from(["none", "seen", "another person's", "new"]),
        "seen": st.booleans(),
        "text": st.text(min_size=0, max_size=40),
    }
)


def count(database_url: str, query: str) -> int:
    with psycopg.connect(database_url) as connection:
        row = connection.execute(query).fetchone()
    assert row is not None
    return int(row[0])


def run(database_url: str, cases: int = CASES) -> dict[str, int]:
    figures: Counter[str] = Counter()
    with budget_environment(database_url) as anthropic:
        clients = {target: app_client(target) for target in ("telegram_webhook", "whatsapp_webhook", "web_chat")}
        runtime.settings()
        spent = spend_the_budget(database_url, clients, anthropic)
        stored_before = count(database_url, "select count(*) from messages")

        @given(case=CASE)
        @settings(
            max_examples=cases,
            phases=[Phase.generate],
            database=None,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        )
        def fuzz(case: dict[str, Any]) -> None:
            asked = len(anthropic.requests)
            status = send(clients, spent, case)
            figures["cases"] += 1
            figures["status_500"] += status >= 500
            figures["over_budget_reached_model"] += len(anthropic.requests) > asked

        quiet = logging.getLogger("crossmem")
        level = quiet.level
        quiet.setLevel(logging.ERROR)  # not 2,000 turn lines
        try:
            fuzz()
        finally:
            quiet.setLevel(level)
        figures["stored"] = count(database_url, "select count(*) from messages") - stored_before
    keys = ("cases", "over_budget_reached_model", "stored", "status_500")
    return {key: figures[key] for key in keys}


def main() -> None:
    run_alone("fuzz_budget_on", run)


if __name__ == "__main__":
    main()
