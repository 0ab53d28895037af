"""whatsapp_webhook end to end: real function, signatures computed with the twilio SDK."""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from flask.testing import FlaskClient
from twilio.request_validator import RequestValidator

from core.models import Surface
from core.turn.request import TurnRequest
from functions import runtime
from tests.fakes.anthropic_api import FakeAnthropic, echo_last_message
from tests.helpers import (
    PUBLIC_BASE_URL,
    TWILIO_TOKEN,
    app_client,
    as_owner,
    form,
    messages_of,
    signed,
    stored_turn,
    stored_with_external_id,
)

CORPUS = Path(__file__).resolve().parents[1] / "corpus" / "twilio"


@pytest.fixture
def whatsapp(environment: pytest.MonkeyPatch) -> FlaskClient:
    environment.setenv("TWILIO_AUTH_TOKEN", TWILIO_TOKEN)
    environment.setenv("PUBLIC_BASE_URL", PUBLIC_BASE_URL)
    return app_client("whatsapp_webhook")


def post(client: FlaskClient, fields: dict[str, str], headers: dict[str, str] | None = None, **kwargs: str):  # type: ignore[no-untyped-def]
    return client.post("/", data=fields, headers=signed(fields) if headers is None else headers, **kwargs)


def test_the_corpus_vectors_validate_with_the_same_sdk() -> None:
    vectors = json.loads((CORPUS / "signature_vectors.json").read_text())["vectors"]
    checked = 0
    for vector in vectors:
        if "params" not in vector:
            continue
        valid = RequestValidator(vector["auth_token"]).validate(
            vector["url"], vector["params"], vector["expected_signature"]
        )
        assert valid == vector["expect_valid"], vector["id"]
        checked += 1
    assert checked >= 5


def test_telegram_and_web_reach_the_next_whatsapp_message(
    whatsapp: FlaskClient, environment: pytest.MonkeyPatch, owner: uuid.UUID, fake_anthropic: FakeAnthropic
) -> None:
    as_owner(environment, owner, whatsapp="+34 600 111 222")  # compared as +digits
    client = app_client("whatsapp_webhook")
    turns = runtime.turns()
    turns.run(TurnRequest(Surface.TELEGRAM, "On Telegram: the meeting moved to 3pm", "1", sender_id="4242"))
    web = turns.memory.create_conversation(owner)
    turns.run(TurnRequest(Surface.WEB, "On the web: bring the blue folder", "w", user_id=owner, conversation_id=web.id))
    response = post(client, form("What do I need for the meeting?"))
    assert response.status_code == 200 and response.mimetype == "application/xml"
    texts = [m["content"][0]["text"] for m in fake_anthropic.requests[-1]["messages"]]
    assert texts[0].endswith("On Telegram: the meeting moved to 3pm")
    assert texts[2].endswith("On the web: bring the blue folder")
    assert texts[-1].startswith("[whatsapp · ")
    assert messages_of(response.get_data(as_text=True)) == ["Claude heard: " + texts[-1]]


def test_a_valid_signature_is_accepted_even_behind_a_proxy(whatsapp: FlaskClient) -> None:
    fields = form("hello from behind the load balancer")
    response = whatsapp.post("/", data=fields, headers=signed(fields), base_url="http://internal-host:8080")
    assert response.status_code == 200


@pytest.mark.parametrize("tamper", ["changed-param", "wrong-token", "http-for-https", "missing-header", "extra-param"])
def test_a_bad_signature_is_403_and_stores_nothing(
    whatsapp: FlaskClient, tamper: str, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    fields = form("transfer everything")
    headers = signed(fields)
    if tamper == "changed-param":
        fields = {**fields, "Body": "transfer nothing"}
    elif tamper == "wrong-token":
        headers = signed(fields, token="not-the-token")
    elif tamper == "http-for-https":
        headers = signed(fields, url=PUBLIC_BASE_URL.replace("https://", "http://"))
    elif tamper == "missing-header":
        headers = {}
    else:
        fields = {**fields, "NumMedia": "1"}
    response = post(whatsapp, fields, headers)
    assert response.status_code == 403
    assert stored_with_external_id(database_url, fields["MessageSid"]) == 0 and fake_anthropic.requests == []


def test_the_sha256_shared_key_algorithm_is_accepted(whatsapp: FlaskClient, environment: pytest.MonkeyPatch) -> None:
    environment.setenv("TWILIO_WEBHOOK_SHARED_KEY", "shared-key-secret")
    client = app_client("whatsapp_webhook")
    fields = form("signed with the shared key")
    signature = RequestValidator("shared-key-secret").compute_signature(PUBLIC_BASE_URL, fields, "HMAC_SHA256")
    settings = "key=webhooks_sharedkey_1,algorithm=HMAC_SHA256"
    headers = {"X-Twilio-Signature": signature, "X-Twilio-Webhooks-Signature-Settings": settings}
    assert post(client, fields, headers).status_code == 200
    sha1_with_settings = {**signed(fields), "X-Twilio-Webhooks-Signature-Settings": settings}
    assert post(client, fields, sha1_with_settings).status_code == 403


# The README's table: what each kind of real inbound message gets.
CORPUS_ANSWERS = {
    "01_text_profilename_waid.json": "turn",
    "02_media_image.json": "media",  # the media itself: tests/functions/test_media.py
    "03_location_address_label.json": "turn",  # as text: tests/functions/test_places.py
    "04_reply_profilename_waid.json": "turn",
    "05_location_messagetype.json": "turn",
    "06_contact_vcard_media.json": "not readable",  # stored as a file not read, never fetched
    "07_text_basic_2019.json": "turn",
    "10_reply_to_own_message.json": "turn",  # its quote: tests/functions/test_replies.py
}


@pytest.mark.parametrize("name", sorted(CORPUS_ANSWERS))
def test_real_payloads_get_valid_twiml(
    whatsapp: FlaskClient, name: str, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    fields = json.loads((CORPUS / name).read_text())
    fields["MessageSid"] = fields.get("MessageSid", "SM") + uuid.uuid4().hex[:8]  # the captures share masked SIDs
    response = post(whatsapp, fields)
    assert response.status_code == 200
    replies = messages_of(response.get_data(as_text=True))
    expected = CORPUS_ANSWERS[name]
    if expected == "turn":
        assert replies == ["Claude heard: " + fake_anthropic.requests[-1]["messages"][-1]["content"][0]["text"]]
        assert stored_with_external_id(database_url, fields["MessageSid"]) == 1
    elif expected == "media":  # of another account than the tests' (none configured): not fetched
        assert len(replies) == 1 and replies[0].startswith("Sorry, I couldn't use what you sent")
        assert fake_anthropic.requests == [] and stored_with_external_id(database_url, fields["MessageSid"]) == 1
    else:
        assert replies == [
            "I can read photos, PDFs and voice notes, not this kind of file. Could you tell me in words what it says?"
        ]
        assert fake_anthropic.requests == [] and stored_with_external_id(database_url, fields["MessageSid"]) == 1


def test_a_video_with_a_caption_is_a_turn_of_its_caption(whatsapp: FlaskClient, fake_anthropic: FakeAnthropic) -> None:
    fields = form(
        "this is my new bike", NumMedia="1", MediaUrl0="https://api.twilio.com/x", MediaContentType0="video/mp4"
    )
    assert messages_of(post(whatsapp, fields).get_data(as_text=True))[0].endswith("this is my new bike")


def test_a_long_answer_is_split_into_escaped_messages(whatsapp: FlaskClient, fake_anthropic: FakeAnthropic) -> None:
    sentence = 'Compare <options> & "costs" before you sign anything. '
    long_answer = "\n\n".join("".join(sentence for _ in range(10)).strip() for _ in range(10))
    assert len(long_answer) > 5000
    fake_anthropic.answer = lambda body: long_answer
    response = post(whatsapp, form("give me the long version"))
    raw = response.get_data(as_text=True)
    assert "&lt;options&gt; &amp;" in raw
    parts = messages_of(raw)
    assert len(parts) >= 4 and all(len(part) <= 1600 for part in parts)
    assert " ".join(" ".join(parts).split()) == " ".join(long_answer.split())


def test_a_model_slower_than_the_deadline_gets_the_fallback_in_time(
    whatsapp: FlaskClient, environment: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic, database_url: str
) -> None:
    environment.setenv("WHATSAPP_MODEL_DEADLINE", "1")
    environment.setenv("FALLBACK_REPLY", "One moment, please try again.")
    client = app_client("whatsapp_webhook")
    fake_anthropic.behaviour, fake_anthropic.slow_s = "slow", 2.5
    fields = form("are you slow today?")
    response = post(client, fields)
    assert messages_of(response.get_data(as_text=True)) == ["One moment, please try again."]
    assert stored_with_external_id(database_url, fields["MessageSid"]) == 1


@pytest.mark.parametrize("function", ["whatsapp_webhook", "sms_webhook"])
def test_a_cold_starts_imports_count_toward_twilios_wait(
    whatsapp: FlaskClient,
    environment: pytest.MonkeyPatch,
    fake_anthropic: FakeAnthropic,
    database_url: str,
    function: str,
) -> None:
    """Twilio waits 15 s for the TwiML answer from when it called, and a cold start spends some of
    them importing what serves the request (2.7 s here) before the turn begins. Stamped 13 s
    before the turn, the request leaves the turn one second of Twilio's 14: a model that answers at
    1.5 s is not said in a TwiML Twilio has stopped waiting for (and recorded as said), but left
    owed, for the job to send; a request stamped as it came is answered in its TwiML."""
    environment.setenv("TWILIO_SMS_FROM", "+14155238886")
    fake_anthropic.behaviour, fake_anthropic.slow_s = "slow", 1.5
    fake_anthropic.answer = lambda body: "Lunch at one."
    for arrived_s_before, said in ((13.0, []), (0.0, ["Lunch at one."])):
        client = app_client(function)
        entry = sys.modules["main"]
        environment.setattr(entry, "monotonic", lambda before=arrived_s_before: time.monotonic() - before)
        sender = "+3466" + str(uuid.uuid4().int % 10**7).zfill(7)
        fields = (
            form("lunch?", sender=f"whatsapp:{sender}")
            if function == "whatsapp_webhook"
            else {"From": sender, "To": "+14155238886", "Body": "lunch?", "MessageSid": "SM" + uuid.uuid4().hex}
        )
        assert (arrived_s_before, messages_of(post(client, fields).get_data(as_text=True))) == (arrived_s_before, said)
        assert stored_turn(database_url, fields["MessageSid"]) == [
            ("user", "lunch?"),
            *(("assistant", s) for s in said),
        ]


def test_the_same_message_sid_three_times_is_one_turn(
    whatsapp: FlaskClient, fake_anthropic: FakeAnthropic, database_url: str
) -> None:
    fields = form("only once please")
    answers = [messages_of(post(whatsapp, fields).get_data(as_text=True)) for _ in range(3)]
    assert answers[0] == answers[1] == answers[2] and len(answers[0]) == 1
    assert stored_with_external_id(database_url, fields["MessageSid"]) == 1
    assert len(fake_anthropic.requests) == 1


@pytest.mark.parametrize("case", ["missing-from", "not-whatsapp", "2MB", "json-body", "no-sid"])
def test_malformed_forms_are_4xx_never_500(whatsapp: FlaskClient, case: str, fake_anthropic: FakeAnthropic) -> None:
    fields = form("hi")
    if case == "missing-from":
        del fields["From"]
    elif case == "not-whatsapp":
        fields["From"] = "+34600111222"
    elif case == "no-sid":
        del fields["MessageSid"]
    elif case == "2MB":
        fields["Body"] = "x" * 2_000_000
    if case == "json-body":
        response = whatsapp.post("/", json=fields, headers=signed(fields))
    else:
        response = post(whatsapp, fields)
    assert 400 <= response.status_code < 500
    assert fake_anthropic.requests == []


def test_without_an_auth_token_it_refuses_to_serve(environment: pytest.MonkeyPatch) -> None:
    environment.setenv("PUBLIC_BASE_URL", PUBLIC_BASE_URL)
    response = post(app_client("whatsapp_webhook"), form("hi"))
    assert response.status_code == 503


def test_the_owner_policy_turns_away_unknown_numbers(
    whatsapp: FlaskClient,
    environment: pytest.MonkeyPatch,
    owner: uuid.UUID,
    database_url: str,
    fake_anthropic: FakeAnthropic,
) -> None:
    as_owner(environment, owner, whatsapp="+34 600-111-222")
    client = app_client("whatsapp_webhook")
    stranger = form("hello?", sender="whatsapp:+447700900123")
    replies = messages_of(post(client, stranger).get_data(as_text=True))
    assert len(replies) == 1 and "private assistant" in replies[0]
    assert stored_with_external_id(database_url, stranger["MessageSid"]) == 0 and fake_anthropic.requests == []
    known = form("it's me", sender="whatsapp:+34600111222")
    assert messages_of(post(client, known).get_data(as_text=True)) != replies
    assert stored_with_external_id(database_url, known["MessageSid"]) == 1


def test_an_algorithm_twilio_has_not_is_refused_before_the_sdk_logs_it(
    whatsapp: FlaskClient, environment: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The settings header is the caller's: a forged post naming an algorithm of its own is a 403,
    and writes no line naming it (the SDK warns for each one it is handed)."""
    environment.setenv("TWILIO_WEBHOOK_SHARED_KEY", "shared-key-secret")
    client = app_client("whatsapp_webhook")
    fields = form("forged")
    headers = {**signed(fields), "X-Twilio-Webhooks-Signature-Settings": "key=k,algorithm=FOO"}
    with caplog.at_level(logging.DEBUG):
        for _ in range(3):
            assert post(client, fields, headers).status_code == 403
    assert [record.getMessage() for record in caplog.records if "FOO" in record.getMessage()] == []
    assert [vars(record).get("algorithm") for record in caplog.records if vars(record).get("algorithm")] == []


def test_the_twiml_answer_is_xml_whatever_the_text_holds(whatsapp: FlaskClient, fake_anthropic: FakeAnthropic) -> None:
    """Text pasted from Word carries its line break (U+000B), which XML 1.0 forbids: written as it is,
    Twilio cannot read the answer and sends nothing of it (a review's finding). It goes as a line
    break; other characters XML forbids go."""
    fake_anthropic.answer = lambda body: "Your list:\x0bmilk\x0beggs\x01"
    fields = form("milk\x0beggs: remember my list", sender="whatsapp:+34600770001")
    answered = post(whatsapp, fields)
    assert answered.status_code == 200
    assert messages_of(answered.get_data(as_text=True)) == ["Your list:\nmilk\neggs"]


def test_a_redelivery_while_the_first_attempt_still_answers_gets_an_empty_answer_and_one_reply(
    whatsapp: FlaskClient, fake_anthropic: FakeAnthropic, database_url: str
) -> None:
    """Twilio posts a MessageSid again while its first request is still with the model (Twilio's
    retry after a dropped connection): the second gets an empty TwiML answer at once, not a 5xx
    and not a second reply; the first answers, and the model is asked once."""
    # The model answers once the second post has been answered, however slow the machine (a model
    # that took 1.5 s lost to a second instance that took longer to get there).
    retried = threading.Event()

    def answer_after_the_retry(body: dict[str, Any]) -> str:
        retried.wait(30)
        return echo_last_message(body)

    fake_anthropic.answer = answer_after_the_retry
    fields = form("are you still there?")
    first: dict[str, str] = {}
    running = threading.Thread(target=lambda: first.update(answer=post(whatsapp, fields).get_data(as_text=True)))
    running.start()
    deadline = time.monotonic() + 30
    while not fake_anthropic.requests:
        assert time.monotonic() < deadline, "the first attempt never reached the model"
        time.sleep(0.02)
    again = post(app_client("whatsapp_webhook"), fields)
    retried.set()
    running.join()
    assert again.status_code == 200 and messages_of(again.get_data(as_text=True)) == []
    assert len(messages_of(first["answer"])) == 1
    assert messages_of(first["answer"])[0].startswith("Claude heard: ")
    assert stored_with_external_id(database_url, fields["MessageSid"]) == 1
    assert len(fake_anthropic.requests) == 1


def test_under_the_owner_policy_an_empty_message_from_a_stranger_gets_the_strangers_answer(
    whatsapp: FlaskClient, environment: pytest.MonkeyPatch, owner: uuid.UUID, fake_anthropic: FakeAnthropic
) -> None:
    """An empty message, or a location with no place in it, from a number that is not the owner's:
    the stranger's answer, not "What would you like to tell me?"; the owner's gets the notice."""
    as_owner(environment, owner, whatsapp="+34600111222")
    environment.setenv("STRANGER_REPLY", "This assistant is private.")
    client = app_client("whatsapp_webhook")
    for extra in ({}, {"MessageType": "location"}):
        stranger = form("", sender="whatsapp:+447700900123", **extra)
        assert messages_of(post(client, stranger).get_data(as_text=True)) == ["This assistant is private."]
    owners = messages_of(post(client, form("", sender="whatsapp:+34600111222")).get_data(as_text=True))
    assert owners == ["I received an empty message. What would you like to tell me?"]
    assert fake_anthropic.requests == []
