"""sms_webhook end to end, the fourth surface added through core/surfaces/: the real function,
signatures computed with the twilio SDK, Twilio's REST API the local fake."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from flask.testing import FlaskClient

from core.surfaces import sms as sms_surface
from functions import runtime
from tests.database import migrated_database
from tests.fakes.anthropic_api import FakeAnthropic, text_block, tool_results, tool_use
from tests.fakes.telegram_api import FakeTelegram
from tests.fakes.twilio_api import FakeTwilio
from tests.helpers import (
    ENGLISH,
    JWT_SECRET,
    TELEGRAM_HEADERS,
    TWILIO_TOKEN,
    app_client,
    as_owner,
    bearer,
    count,
    forgotten,
    form,
    messages_of,
    rows,
    sent_texts,
    signed,
    stored_turn,
    update,
    will_delete,
)

CORPUS = Path(__file__).resolve().parents[1] / "corpus"
SMS_URL = "https://advisor.example.com/sms"
ACCOUNT_SID = "AC" + "2" * 32
SMS_FROM = "+14155238886"
DIGEST = {"X-Digest-Secret": "digest-secret-for-sms"}


@pytest.fixture
def fake_twilio() -> Iterator[FakeTwilio]:
    server = FakeTwilio(ACCOUNT_SID, TWILIO_TOKEN)
    yield server
    server.close()


@pytest.fixture
def sms_database(environment: pytest.MonkeyPatch, postgres_server: str, fake_twilio: FakeTwilio) -> Iterator[str]:
    """A database of the test's own (the job answers whatever it finds), SMS through the fake Twilio."""
    with migrated_database(postgres_server) as url:
        environment.setenv("DATABASE_URL", url)
        environment.setenv("TWILIO_AUTH_TOKEN", TWILIO_TOKEN)
        environment.setenv("PUBLIC_BASE_URL", SMS_URL)
        environment.setenv("TWILIO_ACCOUNT_SID", ACCOUNT_SID)
        environment.setenv("TWILIO_SMS_FROM", SMS_FROM)
        environment.setenv("TWILIO_API_BASE", fake_twilio.url)
        environment.setenv("DIGEST_SECRET", DIGEST["X-Digest-Secret"])
        environment.setenv("MEMORY_NOTES", "false")
        environment.setenv("OWED_REPLY_MAX_AGE", "10")
        yield url
        runtime.reset()


def number() -> str:
    return f"+3466{uuid.uuid4().int % 10**7:07d}"


def sms(body: str, sender: str, **extra: str) -> dict[str, str]:
    """The fields of Twilio's webhook for an SMS (an MMS adds NumMedia, MediaUrl0...)."""
    return {
        "From": sender,
        "To": SMS_FROM,
        "Body": body,
        "MessageSid": "SM" + uuid.uuid4().hex,
        "NumSegments": "1",
        "NumMedia": "0",
        **extra,
    }


def send(fields: dict[str, str]) -> list[str]:
    client: FlaskClient = app_client("sms_webhook")
    answered = client.post("/", data=fields, headers=signed(fields, SMS_URL))
    assert answered.status_code == 200 and answered.mimetype == "application/xml"
    return messages_of(answered.text)


def owed(fake_anthropic: FakeAnthropic, text: str, sender: str) -> None:
    """The person's SMS while the model is down: answered with the fallback, the message owed."""
    fake_anthropic.behaviour = "500"
    send(sms(text, sender))
    fake_anthropic.behaviour = "ok"


def run_the_job() -> dict[str, Any]:
    job = app_client("memory_digest").post("/", headers=DIGEST)
    assert job.status_code == 200
    body: dict[str, Any] = job.get_json()
    return body


def test_a_signed_sms_is_answered_in_twiml_and_kept_in_its_own_thread(
    sms_database: str, fake_anthropic: FakeAnthropic
) -> None:
    sender, other = number(), number()
    fake_anthropic.answer = lambda body: "Noted: the dentist on Tuesday."
    fields = sms("The dentist moved to Tuesday", sender)
    assert send(fields) == ["Noted: the dentist on Tuesday."]
    assert send(sms("My own note", other)) == ["Noted: the dentist on Tuesday."]
    assert sent_texts(fake_anthropic.requests[0])[-1].startswith("[sms · ")
    assert stored_turn(sms_database, fields["MessageSid"]) == [
        ("user", "The dentist moved to Tuesday"),
        ("assistant", "Noted: the dentist on Tuesday."),
    ]
    titles = rows(sms_database, "select surface, title from conversations order by created_at")
    assert titles == [("sms", "[SMS]"), ("sms", "[SMS]")]  # one thread each: the two numbers are two people
    forged = app_client("sms_webhook").post("/", data=fields, headers=signed(fields, SMS_URL, token="not-the-token"))
    assert forged.status_code == 403 and len(fake_anthropic.requests) == 2


def test_a_long_reply_goes_in_messages_of_at_most_1600_characters(
    sms_database: str, fake_anthropic: FakeAnthropic
) -> None:
    paragraph = "A sentence about the week's plans, written out in full. " * 20  # 1,120 characters
    fake_anthropic.answer = lambda body: f"{paragraph.strip()}\n\n{paragraph.strip()}"
    said = send(sms("Plan my week", number()))
    assert said == [f"(1/2) {paragraph.strip()}", f"(2/2) {paragraph.strip()}"]


def test_each_part_of_a_long_sms_reply_says_its_place_however_it_is_sent(
    environment: pytest.MonkeyPatch, sms_database: str, fake_anthropic: FakeAnthropic, fake_twilio: FakeTwilio
) -> None:
    """Carriers deliver each of a reply's messages on its own, in any order (a long one of many
    segments often after a short one sent later): on a basic phone the person cannot tell which
    comes first. Each part starts with its place, in TwiML and through the Messages API, also a
    part sent later from where a failure stopped; a reply of one message has none, and the thread
    keeps the reply whole (an SMS review's finding)."""
    environment.setattr(sms_surface, "SMS_LIMIT", 40)
    sender = number()
    reply = "First, book the dentist. Then call the bank about the card. Last, water the plants."
    fake_anthropic.answer = lambda body: reply
    fields = sms("What do I do today?", sender)
    said = [
        "(1/3) First, book the dentist.",
        "(2/3) Then call the bank about the card.",
        "(3/3) Last, water the plants.",
    ]
    assert send(fields) == said
    assert stored_turn(sms_database, fields["MessageSid"])[1] == ("assistant", reply)
    fake_anthropic.answer = lambda body: "Good luck."
    assert send(sms("thanks", sender)) == ["Good luck."]
    owed(fake_anthropic, "And tomorrow?", sender)
    fake_anthropic.answer = lambda body: reply
    fake_twilio.fail_once_after(1, 503, 20500)  # the second part fails: the next run sends from it
    run_the_job()
    run_the_job()
    assert [message["Body"] for message in fake_twilio.messages] == said


def test_typographic_punctuation_goes_as_gsm_7_so_one_apostrophe_does_not_triple_the_segments(
    sms_database: str, fake_anthropic: FakeAnthropic, fake_twilio: FakeTwilio
) -> None:
    """One character outside GSM-7 sends the whole SMS in UCS-2, in segments of 67 instead of 153:
    the model's curly apostrophe or dash made a 150-character answer three messages billed instead
    of one (and an old phone may show a box for it). They go as GSM-7's look-alikes, in TwiML and
    through the Messages API; letters never change (Spanish á stays), and the thread keeps the
    reply as written (an SMS review's finding)."""
    sender = number()
    reply = "It’s booked — “Dr Ruiz”, Tuesday 9:00… Sí, ahí."
    fake_anthropic.answer = lambda body: reply
    fields = sms("Did you book it?", sender)
    assert send(fields) == ['It\'s booked - "Dr Ruiz", Tuesday 9:00... Sí, ahí.']
    assert stored_turn(sms_database, fields["MessageSid"])[1] == ("assistant", reply)
    owed(fake_anthropic, "And the time?", sender)
    fake_anthropic.answer = lambda body: "At 9:00 – don’t be late."
    assert run_the_job()["owed_answered"] == 1
    assert [message["Body"] for message in fake_twilio.messages] == ["At 9:00 - don't be late."]


def test_a_public_base_url_at_a_domains_root_checks_the_url_twilio_signed(
    environment: pytest.MonkeyPatch, sms_database: str, fake_anthropic: FakeAnthropic
) -> None:
    """Twilio's console and PUBLIC_BASE_URL hold the same string, a custom domain's root with its
    slash: Twilio signs that string, and so it is checked (a review's finding: checked without the
    slash, every message was refused 403)."""
    environment.setenv("PUBLIC_BASE_URL", "https://sms.example.com/")
    fake_anthropic.answer = lambda body: "Noted."
    fields = sms("hello", number())
    answered = app_client("sms_webhook").post("/", data=fields, headers=signed(fields, "https://sms.example.com/"))
    assert answered.status_code == 200 and messages_of(answered.text) == ["Noted."]
    with_query = app_client("sms_webhook").post(
        "/?tag=1", data=fields, headers=signed(fields, "https://sms.example.com/?tag=1")
    )
    assert with_query.status_code == 200
    # The URL Twilio calls, its query included, as PUBLIC_BASE_URL: the whole of it is what is signed.
    environment.setenv("PUBLIC_BASE_URL", "https://advisor.example.com/sms?src=twilio")
    called = sms("hello again", number())
    signed_whole = signed(called, "https://advisor.example.com/sms?src=twilio")
    answered = app_client("sms_webhook").post("/?src=twilio", data=called, headers=signed_whole)
    assert answered.status_code == 200 and messages_of(answered.text) == ["Noted."]


def test_a_custom_domain_that_passes_its_path_on_checks_the_url_twilio_signed(
    environment: pytest.MonkeyPatch, sms_database: str, fake_anthropic: FakeAnthropic
) -> None:
    """PUBLIC_BASE_URL is the full URL Twilio calls, path included (docs/configuration.md), and a
    custom domain's rewrite (Firebase Hosting's, a load balancer's) hands that path on to the
    function: it is not added a second time (a review's finding: checked against
    https://advisor.example.com/twilio/sms/twilio/sms, every message was refused 403). A base
    without it still has the function's path added (`crossmem dev`'s mounts)."""
    fake_anthropic.answer = lambda body: "Noted."
    called = "https://advisor.example.com/twilio/sms"
    environment.setenv("PUBLIC_BASE_URL", called)
    fields = sms("hello", number())
    answered = app_client("sms_webhook").post("/twilio/sms", data=fields, headers=signed(fields, called))
    assert answered.status_code == 200 and messages_of(answered.text) == ["Noted."]
    fields = sms("hello with a query", number())
    with_query = signed(fields, f"{called}?tag=1")
    assert app_client("sms_webhook").post("/twilio/sms?tag=1", data=fields, headers=with_query).status_code == 200
    environment.setenv("PUBLIC_BASE_URL", "https://advisor.example.com")
    fields = sms("hello from a mount", number())
    mounted = app_client("sms_webhook").post("/twilio/sms", data=fields, headers=signed(fields, called))
    assert mounted.status_code == 200 and messages_of(mounted.text) == ["Noted."]


CHEERS = "Well done \U0001f389."  # 12 characters, 13 as Twilio counts them: the emoji is two


def cheers(times: int) -> str:
    return " ".join([CHEERS] * times)


def test_a_reply_with_emoji_is_cut_at_1600_as_twilio_counts_them(
    sms_database: str, fake_anthropic: FakeAnthropic
) -> None:
    """Twilio refuses a body past 1,600 UTF-16 code units (its error 21617): 120 cheers are 1,559
    characters and 1,679 such units, so the first message holds 113 of them after its `(1/2) ` (a
    review's finding: cut at 1,600 characters, the reply was one message Twilio refused)."""
    fake_anthropic.answer = lambda body: f"{cheers(120)}\n\nSee you tomorrow."
    said = send(sms("I finished the marathon!", number()))
    assert said == [f"(1/2) {cheers(113)}", f"(2/2) {cheers(7)}\n\nSee you tomorrow."]
    assert len(said[0].encode("utf-16-le")) // 2 == 1587


def test_sms_messages_are_cut_at_sms_limit(
    environment: pytest.MonkeyPatch, sms_database: str, fake_anthropic: FakeAnthropic, fake_twilio: FakeTwilio
) -> None:
    """The SMS surface's own limit (core/surfaces/sms.py), in TwiML and through the Messages API."""
    environment.setattr(sms_surface, "SMS_LIMIT", 30)
    sender = number()
    fake_anthropic.answer = lambda body: "One sentence here. Another sentence here."
    said = ["(1/2) One sentence here.", "(2/2) Another sentence here."]
    assert send(sms("Hello", sender)) == said
    owed(fake_anthropic, "And now?", sender)
    assert run_the_job()["owed_answered"] == 1
    assert [message["Body"] for message in fake_twilio.messages] == said


def test_an_owed_reply_with_emoji_goes_in_bodies_twilio_takes(
    sms_database: str, fake_anthropic: FakeAnthropic, fake_twilio: FakeTwilio
) -> None:
    """Through the Messages API (owed replies, follow-ups) as in TwiML: SMS_LIMIT, as Twilio counts."""
    sender = number()
    owed(fake_anthropic, "How did I do?", sender)
    fake_anthropic.answer = lambda body: cheers(120)
    assert run_the_job()["owed_answered"] == 1
    assert [message["Body"] for message in fake_twilio.messages] == [f"(1/2) {cheers(113)}", f"(2/2) {cheers(7)}"]


@pytest.mark.parametrize(
    ("body", "extra"),
    [("STOP", {}), (" stop ", {}), ("Unsubscribe", {}), ("START", {}), ("unstop", {}), ("HELP", {}), ("info", {})]
    + [("Arrêt", {"OptOutType": "STOP"})],
)
def test_twilios_keywords_are_left_to_twilio(
    sms_database: str, fake_anthropic: FakeAnthropic, body: str, extra: dict[str, str]
) -> None:
    """Twilio answers STOP, START and HELP itself and still posts them: no reply of ours, no turn,
    nothing stored (docs/api.md, SMS)."""
    fields = sms(body, number(), **extra)
    assert send(fields) == []
    assert fake_anthropic.requests == []
    assert rows(sms_database, "select count(*) from messages") == [(0,)]
    assert rows(sms_database, "select count(*) from identities") == [(0,)]  # nor an opt-out: nothing goes there


@pytest.mark.parametrize("extra", [{}, {"OptOutType": "START"}])
def test_a_yes_answers_the_advisors_question(
    sms_database: str, fake_anthropic: FakeAnthropic, extra: dict[str, str]
) -> None:
    """ "Yes" is how a person answers "Shall I remind you at 9?". Twilio also reads it as an opt-in
    keyword (and may say so itself, re-subscribing a number that had opted out), but it still posts
    it, and the advisor must hear it: a turn, stored (a review's finding: it was dropped as a keyword,
    and the reminder the person agreed to was never set)."""
    sender = number()
    fake_anthropic.answer = lambda body: "Shall I remind you at 9?"
    send(sms("I keep forgetting my pills", sender))
    fake_anthropic.answer = lambda body: "Done: every day at 9."
    fields = sms(" Yes ", sender, **extra)
    assert send(fields) == ["Done: every day at 9."]
    assert sent_texts(fake_anthropic.requests[-1])[-1].endswith("] Yes")
    assert stored_turn(sms_database, fields["MessageSid"]) == [("user", "Yes"), ("assistant", "Done: every day at 9.")]


KEYWORD_ANSWERS = (
    "- By SMS, a reply of only STOP, STOPALL, CANCEL, END, QUIT, UNSUBSCRIBE, REVOKE or OPTOUT (any "
    "case) stops every text from you until the person sends START, and a reply of only HELP, INFO, "
    "START or UNSTOP is answered automatically: none of them reaches you. Never ask a question that "
    'one of those words alone would answer ("keep the reminder or cancel it?", "want help or more '
    'info?"); ask one that "yes" or "no" answers ("shall I drop the reminder?").'
)


@pytest.mark.parametrize(
    "settings", [{}, {"SYSTEM_PROMPT": "You are Ada, a calm coach."}, {"CONTEXT_ANNOTATIONS": "false"}]
)
def test_the_model_is_told_that_a_one_word_cancel_by_sms_stops_every_text(
    environment: pytest.MonkeyPatch, sms_database: str, fake_anthropic: FakeAnthropic, settings: dict[str, str]
) -> None:
    """An advisor that asks "Keep the 9 o'clock reminder or cancel it?" gets "Cancel": Twilio opts
    the number out, says so itself, and refuses every text after it (error 21610) until START, the
    reminders the person kept included; the message never reaches the advisor, which cannot
    answer it. The prompt, the operator's persona or not, tagged or not, says so (an SMS review's
    finding)."""
    for name, value in settings.items():
        environment.setenv(name, value)
    fake_anthropic.answer = lambda body: "Noted."
    send(sms("Remind me about the gym", number()))
    system = json.dumps(fake_anthropic.requests[0]["system"], ensure_ascii=False)
    assert KEYWORD_ANSWERS.replace('"', '\\"') in system


@pytest.mark.parametrize("body", ["stop reminding me about the gym", "\u017ftop", "\u0131nfo", "STOP\u3000"])
def test_stop_within_a_sentence_or_spelled_past_ascii_is_a_message(
    sms_database: str, fake_anthropic: FakeAnthropic, body: str
) -> None:
    """Only Twilio's own keyword is Twilio's: "ſtop" (a long s) and "ınfo" (a dotless i), which
    Python's upper() makes STOP and INFO, and STOP with an ideographic space, are messages."""
    fake_anthropic.answer = lambda body: "Understood."
    assert send(sms(body, number())) == ["Understood."]


def test_an_mms_photo_is_read_from_twilios_media_host(
    sms_database: str, fake_anthropic: FakeAnthropic, fake_twilio: FakeTwilio
) -> None:
    fields = sms("what does this receipt say?", number(), NumMedia="1", MediaContentType0="image/jpeg")
    path = f"/2010-04-01/Accounts/{ACCOUNT_SID}/Messages/{fields['MessageSid']}/Media/ME{uuid.uuid4().hex}"
    fields["MediaUrl0"] = "https://api.twilio.com" + path
    fake_twilio.media[path] = ((CORPUS / "media" / "receipt.jpg").read_bytes(), "image/jpeg")
    fake_anthropic.answer = lambda body: "It says 12.40 EUR."
    assert send(fields) == ["It says 12.40 EUR."]
    assert fake_twilio.media_requests == [path]
    blocks = fake_anthropic.requests[0]["messages"][-1]["content"]
    assert [block["type"] for block in blocks] == ["image", "text"]
    # The photo's description (the small model, here the same fake) is what the memory keeps of it.
    assert stored_turn(sms_database, fields["MessageSid"])[0] == (
        "user",
        "[photo: It says 12.40 EUR.] what does this receipt say?",
    )


def test_an_owed_sms_reply_goes_through_the_messages_api(
    sms_database: str, fake_anthropic: FakeAnthropic, fake_twilio: FakeTwilio
) -> None:
    sender = number()
    owed(fake_anthropic, "Is the pharmacy open on Sunday?", sender)
    fake_anthropic.answer = lambda body: "Yes, from 10 to 14."
    assert run_the_job()["owed_answered"] == 1
    assert fake_twilio.messages == [{"From": SMS_FROM, "To": sender, "Body": "Yes, from 10 to 14."}]


def remind(content: str) -> Any:
    def answer(body: dict[str, Any]) -> Any:
        if results := tool_results(body):
            return f"Done: {results[0]['content']}"
        return [text_block("I'll remind you."), tool_use("schedule_follow_up", {"content": content, "in_minutes": 5})]

    return answer


def test_a_follow_up_asked_by_sms_is_said_through_the_messages_api(
    environment: pytest.MonkeyPatch, sms_database: str, fake_anthropic: FakeAnthropic, fake_twilio: FakeTwilio
) -> None:
    now = datetime(2026, 12, 2, 17, 0, tzinfo=UTC)
    environment.setattr(runtime, "now", lambda: now)
    sender = number()
    fake_anthropic.answer = remind("Take the pills.")
    assert send(sms("remind me in 5 minutes to take the pills", sender))[0] == "I'll remind you."
    now += timedelta(minutes=6)  # SMS has no window: however long since their last message
    assert run_the_job()["follow_ups_sent"] == 1
    assert fake_twilio.messages == [{"From": SMS_FROM, "To": sender, "Body": "Take the pills."}]
    stored = rows(sms_database, "select role, content from messages where role = 'assistant' order by id")
    assert stored[-1] == ("assistant", "Take the pills.")


def test_a_reminder_due_after_stop_is_held_and_said_late_once_after_start(
    environment: pytest.MonkeyPatch,
    sms_database: str,
    fake_anthropic: FakeAnthropic,
    fake_twilio: FakeTwilio,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """STOP by mistake, START an hour later: the reminder due in between is held with no send tried
    (Twilio would refuse it, error 21610) and nothing given up; START lets it go, and the job says it
    through the Messages API once, with when it was due (docs/decisions.md, An SMS number that opted
    out)."""
    now = datetime(2026, 12, 2, 17, 0, tzinfo=UTC)
    environment.setattr(runtime, "now", lambda: now)
    sender = number()
    fake_anthropic.answer = remind("Take the pills.")
    send(sms("remind me in 5 minutes to take the pills", sender))
    assert send(sms("STOP", sender)) == []
    assert rows(sms_database, "select external_id, opted_out_at is not null from identities") == [(sender, True)]
    fake_twilio.fail_with(400, 21610)  # as Twilio refuses every send to the number now
    now += timedelta(minutes=6)
    job = run_the_job()
    assert (job["follow_ups_sent"], job["follow_ups_held"], job["follow_ups_given_up"]) == (0, 1, 0)
    assert rows(sms_database, "select status, attempts from follow_ups") == [("held", 1)]
    assert (fake_twilio.messages, fake_twilio.refused) == ([], [])
    held = [r for r in caplog.records if r.name == "crossmem.follow_ups" and r.__dict__.get("outcome")]
    assert [(r.levelname, r.__dict__["outcome"], r.__dict__["reason"]) for r in held] == [
        ("INFO", "held", "its number opted out (STOP): held until it opts in again (START)")
    ]
    now += timedelta(minutes=10)
    assert run_the_job()["follow_ups_held"] == 0  # held, not claimed again at every run
    now += timedelta(minutes=44)
    assert send(sms("START", sender)) == []
    fake_twilio.recover()
    assert run_the_job()["follow_ups_sent"] == 1
    assert fake_twilio.messages == [
        {"From": SMS_FROM, "To": sender, "Body": "Take the pills.\n\n(due at 17:05, sent late)"}
    ]
    now += timedelta(minutes=5)
    assert run_the_job()["follow_ups_sent"] == 0
    assert len(fake_twilio.messages) == 1 and fake_twilio.refused == []
    said = rows(sms_database, "select role, content from messages order by id")
    assert said == [
        ("user", "remind me in 5 minutes to take the pills"),
        ("assistant", "I'll remind you."),
        ("assistant", "Take the pills."),
    ]


def test_start_lets_go_only_its_own_persons_held_reminders(
    environment: pytest.MonkeyPatch, sms_database: str, fake_anthropic: FakeAnthropic, fake_twilio: FakeTwilio
) -> None:
    """Two numbers texted STOP, each with a reminder held; one texts START: its reminder is said,
    the other's stays held (let go by the person's user_id, never someone else's)."""
    now = datetime(2026, 12, 2, 17, 0, tzinfo=UTC)
    environment.setattr(runtime, "now", lambda: now)
    back, away = number(), number()
    fake_anthropic.answer = remind("Take the pills.")
    send(sms("remind me in 5 minutes to take the pills", back))
    send(sms("remind me in 5 minutes to take the pills", away))
    send(sms("STOP", back))
    send(sms("STOP", away))
    now += timedelta(minutes=6)
    assert run_the_job()["follow_ups_held"] == 2
    send(sms("START", back))
    assert rows(sms_database, "select sender, status from follow_ups order by sender") == sorted(
        [(back, "pending"), (away, "held")]
    )
    assert run_the_job()["follow_ups_sent"] == 1
    assert [m["To"] for m in fake_twilio.messages] == [back]
    assert rows(sms_database, "select sender, status from follow_ups order by sender") == sorted(
        [(back, "sent"), (away, "held")]
    )


@pytest.mark.parametrize(
    ("after", "status", "released", "sent"),
    [(timedelta(days=7), "pending", (1, 0), 1), (timedelta(days=7, minutes=1), "given_up", (0, 1), 0)],
)
def test_a_reminder_held_for_start_past_a_week_is_given_up_when_start_comes(
    environment: pytest.MonkeyPatch,
    sms_database: str,
    fake_anthropic: FakeAnthropic,
    fake_twilio: FakeTwilio,
    caplog: pytest.LogCaptureFixture,
    after: timedelta,
    status: str,
    released: tuple[int, int],
    sent: int,
) -> None:
    """Held for START at most HELD_FOR_OPT_IN (a week) after it was due, by the job's clock against
    the hold's `held_until` (the week counted once): a START at the week's very end lets it go, one
    a minute later gives it up, unsaid (a reminder of a week gone), and says so in its log line."""
    now = datetime(2026, 12, 2, 17, 0, tzinfo=UTC)
    environment.setattr(runtime, "now", lambda: now)
    sender = number()
    fake_anthropic.answer = remind("Take the pills.")
    send(sms("remind me in 5 minutes to take the pills", sender))
    send(sms("STOP", sender))
    now += timedelta(minutes=6)
    assert run_the_job()["follow_ups_held"] == 1
    now = datetime(2026, 12, 2, 17, 5, tzinfo=UTC) + after  # the START, `after` past when it was due
    send(sms("START", sender))
    assert rows(sms_database, "select status from follow_ups") == [(status,)]
    assert run_the_job()["follow_ups_sent"] == sent
    said_late = "Take the pills.\n\n(due on Wed 2 Dec at 17:05, sent late)"
    assert [m["Body"] for m in fake_twilio.messages] == [said_late][:sent]
    assert fake_twilio.refused == []
    [line] = [r for r in caplog.records if r.name == "crossmem.opt_outs" and r.getMessage() == "opted in again"]
    assert (line.__dict__["released"], line.__dict__["given_up"]) == released


def test_a_reminder_held_for_a_start_that_never_comes_is_given_up_by_the_job_after_a_week(
    environment: pytest.MonkeyPatch,
    sms_database: str,
    fake_anthropic: FakeAnthropic,
    fake_twilio: FakeTwilio,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No START ever comes: held for ever, it stayed in the person's list and counted against
    FOLLOW_UPS_PER_PERSON. The job's first run past the week (HELD_FOR_OPT_IN after it was due)
    gives it up, unsaid, once, and logs it; a run at the week's very end still holds it."""
    now = datetime(2026, 12, 2, 17, 0, tzinfo=UTC)
    environment.setattr(runtime, "now", lambda: now)
    sender = number()
    fake_anthropic.answer = remind("Take the pills.")
    send(sms("remind me in 5 minutes to take the pills", sender))
    send(sms("STOP", sender))
    now += timedelta(minutes=6)
    assert run_the_job()["follow_ups_held"] == 1
    now = datetime(2026, 12, 9, 17, 5, tzinfo=UTC)  # a week after it was due, to the minute
    assert run_the_job()["follow_ups_given_up"] == 0
    assert rows(sms_database, "select status from follow_ups") == [("held",)]
    now += timedelta(minutes=1)
    job = run_the_job()
    assert (job["follow_ups_sent"], job["follow_ups_held"], job["follow_ups_given_up"]) == (0, 0, 1)
    [(held_id, status, listed)] = rows(sms_database, "select id, status, public.follow_ups_of(user_id) from follow_ups")
    assert (status, listed) == ("given_up", [])  # nothing of it left in the person's list, nor their limit
    assert (fake_twilio.messages, fake_twilio.refused) == ([], [])
    [line] = [r for r in caplog.records if r.name == "crossmem.follow_ups" and r.__dict__.get("expired")]
    assert (line.levelname, line.getMessage(), line.__dict__["expired"]) == (
        "WARNING",
        "follow-ups given up: held a week for an opt-in that never came",
        [held_id],
    )
    now += timedelta(minutes=1)
    assert run_the_job()["follow_ups_given_up"] == 0  # given up once


def test_a_start_while_the_job_holds_the_reminder_does_not_leave_it_held(
    environment: pytest.MonkeyPatch, sms_database: str, fake_anthropic: FakeAnthropic, fake_twilio: FakeTwilio
) -> None:
    """START comes between the job's claim (which read the number as opted out) and the outcome it
    records: the hold finds the number in again and leaves the reminder pending for the next run,
    not held for a START that has already come."""
    now = datetime(2026, 12, 2, 17, 0, tzinfo=UTC)
    environment.setattr(runtime, "now", lambda: now)
    sender = number()
    fake_anthropic.answer = remind("Take the pills.")
    send(sms("remind me in 5 minutes to take the pills", sender))
    send(sms("STOP", sender))
    now += timedelta(minutes=6)
    claim = uuid.uuid4()
    [(claimed,)] = rows(sms_database, "select public.claim_due_follow_ups(%s, 10, 360, %s)", now, claim)
    [row] = claimed["claimed"]
    assert row["opted_out"] == [sender]
    send(sms("START", sender))
    rows(
        sms_database,
        "select public.finish_follow_up(%s, %s, 'opted_out', now(), null, null, null, now() + interval '7 days')",
        row["id"],
        claim,
    )
    assert rows(sms_database, "select status, attempts from follow_ups") == [("pending", 0)]
    assert run_the_job()["follow_ups_sent"] == 1
    assert [(m["To"], m["Body"]) for m in fake_twilio.messages] == [(sender, "Take the pills.")]


def test_a_reminder_held_for_start_is_not_said_first_on_whatsapp(
    environment: pytest.MonkeyPatch, sms_database: str, fake_anthropic: FakeAnthropic, fake_twilio: FakeTwilio
) -> None:
    """A WhatsApp answer says first the reminders held for the person's next WhatsApp message, not
    one held for their SMS number's START (it belongs to their SMS thread, and is said there then)."""
    now = datetime(2026, 12, 2, 17, 0, tzinfo=UTC)
    environment.setattr(runtime, "now", lambda: now)
    owner, mine = uuid.uuid4(), number()
    as_owner(environment, owner, whatsapp="+34600999888")
    environment.setenv("OWNER_SMS_NUMBERS", mine)
    fake_anthropic.answer = remind("Take the pills.")
    send(sms("remind me in 5 minutes to take the pills", mine))
    send(sms("STOP", mine))
    now += timedelta(minutes=6)
    assert run_the_job()["follow_ups_held"] == 1
    fake_anthropic.answer = lambda body: "Hello."
    fields = form("hi", sender="whatsapp:+34600999888")
    answered = app_client("whatsapp_webhook").post("/", data=fields, headers=signed(fields, SMS_URL))
    assert messages_of(answered.text) == ["Hello."]
    assert rows(sms_database, "select surface, status from follow_ups") == [("sms", "held")]
    send(sms("START", mine))
    assert run_the_job()["follow_ups_sent"] == 1
    assert [(m["To"], m["Body"]) for m in fake_twilio.messages] == [(mine, "Take the pills.")]


def test_a_message_from_a_number_that_opted_out_is_kept_with_no_model_call_and_no_answer(
    sms_database: str, fake_anthropic: FakeAnthropic, fake_twilio: FakeTwilio, caplog: pytest.LogCaptureFixture
) -> None:
    """After STOP, a message that is no opt-in word: Twilio keeps the number opted out and would
    refuse any answer (error 21610). It is the person's memory, so it is stored in their thread; no
    model is asked, nothing of their day's budget is reserved, the TwiML answer is empty, and it is
    owed to nobody (the job neither answers nor gives it up). After START, the next turn reads it."""
    sender = number()
    fake_anthropic.answer = lambda body: "Noted."
    assert send(sms("My sister is Eva", sender)) == ["Noted."]
    assert send(sms("STOP", sender)) == []
    asked, usage = len(fake_anthropic.requests), count(sms_database, "select count(*) from turn_usage")
    fields = sms("and my brother is Leo", sender)
    assert send(fields) == []
    assert send(fields) == []  # Twilio's retry of it: stored once, answered by nobody
    assert len(fake_anthropic.requests) == asked
    assert stored_turn(sms_database, fields["MessageSid"]) == [("user", "and my brother is Leo")]
    assert count(sms_database, "select count(*) from turn_usage") == usage
    lines = [r for r in caplog.records if r.name == "crossmem.turn" and r.__dict__.get("outcome") == "opted_out"]
    said = [
        (r.levelname, r.__dict__["surface"], r.__dict__["model_requests"], r.__dict__["reserved_tokens"]) for r in lines
    ]
    assert said == [("INFO", "sms", 0, 0)] * 2
    job = run_the_job()
    assert (job["owed_answered"], job["owed_failed"]) == (0, 0)
    assert (fake_twilio.messages, fake_twilio.refused) == ([], [])
    send(sms("START", sender))
    assert send(sms("who are my siblings?", sender)) == ["Noted."]
    assert "and my brother is Leo" in "\n".join(sent_texts(fake_anthropic.requests[-1]))


def test_a_flood_from_a_number_that_opted_out_is_kept_within_the_budget_and_no_further(
    environment: pytest.MonkeyPatch, sms_database: str, fake_anthropic: FakeAnthropic, fake_twilio: FakeTwilio
) -> None:
    """Each message from a number that opted out counts one turn of the person's budget (no tokens),
    as every message of theirs does: past it, it is not stored, as none past the budget is, and not
    answered either (no pause to say: Twilio would refuse it). A script texting after STOP cannot
    fill the database; a redelivery of one stored stores nothing more; another number's budget is its own."""
    environment.setenv("TURNS_PER_MINUTE", "3")
    sender, other = number(), number()
    fake_anthropic.answer = lambda body: "Noted."
    assert send(sms("hi", sender)) == ["Noted."]
    assert send(sms("STOP", sender)) == []
    asked = len(fake_anthropic.requests)
    kept = [sms(text, sender) for text in ("one", "two")]
    for fields in kept:
        assert send(fields) == []
    dropped = sms("three", sender)
    assert send(dropped) == []
    assert send(kept[1]) == []  # Twilio's retry of one stored: found by its Sid, nothing counted again
    assert len(fake_anthropic.requests) == asked
    assert (fake_twilio.messages, fake_twilio.refused) == ([], [])
    theirs = "select m.role, m.content from messages m where m.sender = %s order by m.id"
    assert rows(sms_database, theirs, sender) == [("user", "hi"), ("user", "one"), ("user", "two")]
    assert stored_turn(sms_database, dropped["MessageSid"]) == []
    counted = "select m.content, u.tokens = 0 from turn_usage u join messages m on m.id = u.message_id order by m.id"
    assert rows(sms_database, counted) == [("hi", False), ("one", True), ("two", True)]
    assert send(sms("mine", other)) == ["Noted."]


def test_a_number_opted_out_for_someone_else_does_not_silence_the_owner(
    environment: pytest.MonkeyPatch, sms_database: str, fake_anthropic: FakeAnthropic
) -> None:
    """An opt-out is its identity's person's (record_opt_out keeps it so): a number whose STOP was
    recorded for the person `auto` made for it, listed for the owner since, does not silence the
    owner's turns (begin_turn reads the opt-out by the turn's person, as the job reads it by the
    follow-up's)."""
    owner, mine = uuid.uuid4(), number()
    fake_anthropic.answer = lambda body: "Noted."
    send(sms("hello", mine))
    send(sms("STOP", mine))
    runtime.reset()
    environment.setenv("IDENTITY_POLICY", "owner")
    environment.setenv("OWNER_USER_ID", str(owner))
    environment.setenv("OWNER_SMS_NUMBERS", mine)
    assert send(sms("it's me, the owner", mine)) == ["Noted."]


def opted_out(database_url: str, sender: str) -> list[tuple[Any, ...]]:
    """Whether the number's identity is opted out, as the database has it ([] for no identity)."""
    return rows(database_url, "select opted_out_at is not null from identities where external_id = %s", sender)


def test_after_stop_an_owed_reply_is_given_up_with_no_model_call_and_no_send(
    sms_database: str, fake_anthropic: FakeAnthropic, fake_twilio: FakeTwilio, caplog: pytest.LogCaptureFixture
) -> None:
    """A message owed when its number texted STOP: the job asks no model (nothing to pay for a reply
    nobody may send) and sends nothing, and it is owed no more (given up at once, counted with the
    ones the job could not send, logged without the number), not tried at every run."""
    sender = number()
    owed(fake_anthropic, "Is the pharmacy open on Sunday?", sender)
    assert send(sms("stop", sender)) == []
    asked = len(fake_anthropic.requests)
    fake_anthropic.answer = lambda body: "Yes, from 10 to 14."
    first = run_the_job()
    assert (first["owed_answered"], first["owed_failed"]) == (0, 1)
    assert len(fake_anthropic.requests) == asked
    assert (fake_twilio.messages, fake_twilio.refused) == ([], [])
    second = run_the_job()
    assert (second["owed_answered"], second["owed_failed"]) == (0, 0)
    assert rows(sms_database, "select role, content from messages order by id") == [
        ("user", "Is the pharmacy open on Sunday?")
    ]
    [line] = [r for r in caplog.records if r.name == "crossmem.owed" and "opted out" in r.getMessage()]
    assert (line.levelname, line.__dict__["surface"], line.__dict__["given_up"]) == ("WARNING", "sms", True)
    assert sender not in json.dumps(line.__dict__, default=str)


def test_after_stop_a_reply_owed_a_send_is_given_up_unsent(
    sms_database: str, fake_anthropic: FakeAnthropic, fake_twilio: FakeTwilio
) -> None:
    """A reply written while Twilio was down, owed a send, when its number texts STOP: given up at
    the next run, not sent (kept in the thread undelivered, as any reply given up is)."""
    sender = number()
    owed(fake_anthropic, "Is the pharmacy open on Sunday?", sender)
    fake_anthropic.answer = lambda body: "Yes, from 10 to 14."
    fake_twilio.fail_with(503, 20500)
    assert run_the_job()["owed_answered"] == 1  # written and stored, owed a send
    fake_twilio.recover()
    refused = len(fake_twilio.refused)
    assert send(sms("STOP", sender)) == []
    done = run_the_job()
    assert (done["owed_answered"], done["owed_failed"]) == (0, 1)
    assert (fake_twilio.messages, len(fake_twilio.refused)) == ([], refused)
    assert rows(sms_database, "select content, delivered_at, unsent_from from messages where role = 'assistant'") == [
        ("Yes, from 10 to 14.", None, None)
    ]
    assert run_the_job()["owed_failed"] == 0


@pytest.mark.parametrize(
    ("body", "extra"), [("START", {}), (" unstop ", {}), ("Yes", {}), ("Vuelvo", {"OptOutType": "START"})]
)
def test_after_start_replies_and_reminders_flow_again(
    environment: pytest.MonkeyPatch,
    sms_database: str,
    fake_anthropic: FakeAnthropic,
    fake_twilio: FakeTwilio,
    body: str,
    extra: dict[str, str],
) -> None:
    """Twilio's opt-in words (START, UNSTOP, YES; or Advanced Opt-Out's, whatever the operator made
    them, named by `OptOutType` START) opt the number in again: what is owed or due after it is
    answered and said as before."""
    now = datetime(2026, 12, 2, 17, 0, tzinfo=UTC)
    environment.setattr(runtime, "now", lambda: now)
    sender = number()
    fake_anthropic.answer = lambda body: "Noted."
    send(sms("I keep forgetting my pills", sender))
    assert send(sms("STOP", sender)) == []
    assert opted_out(sms_database, sender) == [(True,)]
    send(sms(body, sender, **extra))
    assert opted_out(sms_database, sender) == [(False,)]
    owed(fake_anthropic, "Is the pharmacy open on Sunday?", sender)
    fake_anthropic.answer = lambda body: "Yes, from 10 to 14."
    assert run_the_job()["owed_answered"] == 1
    fake_anthropic.answer = remind("Take the pills.")
    send(sms("remind me in 5 minutes to take the pills", sender))
    now += timedelta(minutes=6)
    assert run_the_job()["follow_ups_sent"] == 1
    assert [message["Body"] for message in fake_twilio.messages] == ["Yes, from 10 to 14.", "Take the pills."]


@pytest.mark.parametrize(
    ("to", "body", "extra", "out"),
    [("+18885550100", "Yes", {}, True), ("+18005550100", "yes", {"OptOutType": "START"}, True)]
    + [("+18445550100", "Vuelvo", {"OptOutType": "START"}, True), ("+18335550100", "START", {}, False)]
    + [("+18775550100", " unstop ", {"OptOutType": "START"}, False), ("+14155550100", "Yes", {}, False)],
)
def test_on_a_toll_free_number_only_start_and_unstop_opt_in_again(
    sms_database: str, fake_anthropic: FakeAnthropic, to: str, body: str, extra: dict[str, str], out: bool
) -> None:
    """The carriers keep a toll-free number's opt-out themselves and lift it only for START or
    UNSTOP (Twilio's "Opt-out keyword handling for Toll-Free SMS"): a YES, or an Advanced Opt-Out
    word, texted there leaves the number opted out, as Twilio's sends to it stay refused; texted to
    a local number, YES opts it in."""
    sender = number()
    fake_anthropic.answer = lambda body: "Noted."
    send(sms("Hello", sender, To=to))
    assert send(sms("STOP", sender, To=to)) == []
    send(sms(body, sender, To=to, **extra))
    assert opted_out(sms_database, sender) == [(out,)]


@pytest.mark.parametrize(
    ("body", "extra", "out"),
    [("STOP", {}, True), ("Quit", {}, True), ("optout", {}, True), ("Baja", {"OptOutType": "STOP"}, True)]
    + [("HELP", {}, False), ("info", {}, False), ("Ayuda", {"OptOutType": "HELP"}, False)]
    + [("stop texting me", {}, False), ("\u017ftop", {}, False)],
)
def test_only_twilios_opt_out_words_opt_a_number_out(
    sms_database: str, fake_anthropic: FakeAnthropic, body: str, extra: dict[str, str], out: bool
) -> None:
    """Twilio's default opt-out words, and whatever Advanced Opt-Out names STOP; never HELP, nor a
    message that is no keyword."""
    sender = number()
    fake_anthropic.answer = lambda body: "Noted."
    send(sms("Hello", sender))
    send(sms(body, sender, **extra))
    assert opted_out(sms_database, sender) == [(out,)]


def test_a_send_refused_as_opted_out_records_the_opt_out_when_the_stop_was_missed(
    environment: pytest.MonkeyPatch, sms_database: str, fake_anthropic: FakeAnthropic, fake_twilio: FakeTwilio
) -> None:
    """The STOP came while the webhook was down (Twilio opts the number out all the same): the first
    send refused with error 21610 records it, and nothing after it is tried, nor asked of the model;
    the reminders due are held for START, as after a STOP the webhook heard."""
    now = datetime(2026, 12, 2, 17, 0, tzinfo=UTC)
    environment.setattr(runtime, "now", lambda: now)
    sender = number()
    fake_anthropic.answer = remind("Take the pills.")
    send(sms("remind me in 5 minutes to take the pills", sender))
    send(sms("and remind me in 5 minutes to call mum", sender))
    fake_anthropic.answer = lambda body: "Yes, from 10 to 14."
    owed(fake_anthropic, "Is the pharmacy open on Sunday?", sender)
    fake_twilio.fail_with(400, 21610)
    asked = len(fake_anthropic.requests)
    now += timedelta(minutes=6)
    done = run_the_job()
    # the owed reply is written (the STOP is not known yet), and refused: that refusal is the opt-out
    assert (done["owed_answered"], done["owed_failed"], done["follow_ups_held"]) == (1, 0, 2)
    assert (len(fake_anthropic.requests), len(fake_twilio.refused)) == (asked + 1, 1)
    assert opted_out(sms_database, sender) == [(True,)]
    assert rows(sms_database, "select status from follow_ups") == [("held",), ("held",)]


def test_a_reminder_whose_own_send_is_refused_as_opted_out_is_held_for_start_and_said_once_after_it(
    environment: pytest.MonkeyPatch,
    sms_database: str,
    fake_anthropic: FakeAnthropic,
    fake_twilio: FakeTwilio,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The STOP came while the webhook was down and nothing went to the number before the reminder:
    its own send is refused with error 21610. That refusal records the opt-out, and the reminder is
    held for START, for the week, as one due after a STOP the webhook heard (it was given up, as
    any other refusal is); START lets the job say it, once."""
    now = datetime(2026, 12, 2, 17, 0, tzinfo=UTC)
    environment.setattr(runtime, "now", lambda: now)
    sender = number()
    fake_anthropic.answer = remind("Take the pills.")
    send(sms("remind me in 5 minutes to take the pills", sender))
    fake_twilio.fail_with(400, 21610)
    now += timedelta(minutes=6)
    job = run_the_job()
    assert (job["follow_ups_sent"], job["follow_ups_held"], job["follow_ups_given_up"]) == (0, 1, 0)
    assert ([m["To"] for m in fake_twilio.refused], fake_twilio.messages) == ([sender], [])
    assert rows(sms_database, "select status, attempts, held_until, unsent_from, message_id from follow_ups") == [
        ("held", 1, datetime(2026, 12, 9, 17, 5, tzinfo=UTC), None, None)
    ]
    assert opted_out(sms_database, sender) == [(True,)]
    held = [r for r in caplog.records if r.name == "crossmem.follow_ups" and r.__dict__.get("outcome")]
    assert [(r.levelname, r.__dict__["outcome"], r.__dict__["reason"]) for r in held] == [
        ("INFO", "held", "its number opted out (STOP): held until it opts in again (START)")
    ]
    now += timedelta(minutes=10)
    assert run_the_job()["follow_ups_held"] == 0 and len(fake_twilio.refused) == 1  # not tried again
    send(sms("START", sender))
    fake_twilio.recover()
    assert run_the_job()["follow_ups_sent"] == 1
    now += timedelta(minutes=5)
    assert run_the_job()["follow_ups_sent"] == 0
    assert fake_twilio.messages == [
        {"From": SMS_FROM, "To": sender, "Body": "Take the pills.\n\n(due at 17:05, sent late)"}
    ]
    assert rows(sms_database, "select role, content from messages where role = 'assistant' order by id") == [
        ("assistant", "I'll remind you."),
        ("assistant", "Take the pills."),
    ]


def owner_on_telegram_asking_by_sms(
    environment: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic
) -> tuple[uuid.UUID, str]:
    """The owner, who wrote on Telegram (chat 5161) first, asks by SMS for a reminder in 5 minutes:
    the owner and their number."""
    owner, mine = uuid.uuid4(), number()
    as_owner(environment, owner, telegram="5161")
    environment.setenv("OWNER_SMS_NUMBERS", mine)
    fake_anthropic.answer = lambda body: "Hello."
    assert (
        app_client("telegram_webhook").post("/", json=update("hi", user_id=5161), headers=TELEGRAM_HEADERS).status_code
        == 200
    )
    fake_anthropic.answer = remind("Take the pills.")
    send(sms("remind me in 5 minutes to take the pills", mine))
    return owner, mine


def test_a_reminder_whose_own_send_is_refused_as_opted_out_goes_to_the_persons_telegram(
    environment: pytest.MonkeyPatch,
    sms_database: str,
    fake_anthropic: FakeAnthropic,
    fake_twilio: FakeTwilio,
    fake_telegram: FakeTelegram,
) -> None:
    """Refused with 21610 and nothing of it out, the reminder moves once to the person's other app
    (the owner's Telegram chat), as one due after a STOP the webhook heard, and is stored there."""
    now = datetime(2026, 12, 2, 17, 0, tzinfo=UTC)
    environment.setattr(runtime, "now", lambda: now)
    owner, mine = owner_on_telegram_asking_by_sms(environment, fake_anthropic)
    fake_twilio.fail_with(400, 21610)
    now += timedelta(minutes=6)
    job = run_the_job()
    assert (job["follow_ups_sent"], job["follow_ups_held"], job["follow_ups_given_up"]) == (1, 0, 0)
    assert ([m["To"] for m in fake_twilio.refused], fake_twilio.messages) == ([mine], [])
    assert [(m["chat_id"], m["text"]) for m in fake_telegram.sent()[1:]] == [(5161, "Take the pills.")]
    assert rows(sms_database, "select surface, sender, moved_from, status from follow_ups") == [
        ("telegram", "5161", "sms", "sent")
    ]
    assert opted_out(sms_database, mine) == [(True,)]


def test_a_reminder_refused_as_opted_out_after_its_first_part_says_the_rest_after_start(
    environment: pytest.MonkeyPatch, sms_database: str, fake_anthropic: FakeAnthropic, fake_twilio: FakeTwilio
) -> None:
    """Its first part went out, then the STOP we missed refused the second (21610): held for START
    from the part it got to, as one held after a STOP the webhook heard is; START lets the job say
    the rest, numbered as the first part was, and the thread keeps it whole, once."""
    environment.setattr(sms_surface, "SMS_LIMIT", 40)
    now = datetime(2026, 12, 2, 17, 0, tzinfo=UTC)
    environment.setattr(runtime, "now", lambda: now)
    sender = number()
    fake_anthropic.answer = remind("Book the dentist at nine. Then call the bank.")
    send(sms("remind me in 5 minutes", sender))
    now += timedelta(minutes=5, seconds=30)
    fake_twilio.fail_after(1, 400, 21610)
    assert run_the_job()["follow_ups_held"] == 1
    assert rows(sms_database, "select status, held_until, unsent_from, said_as, message_id from follow_ups") == [
        ("held", datetime(2026, 12, 9, 17, 5, tzinfo=UTC), 1, "Book the dentist at nine. Then call the bank.", None)
    ]
    assert opted_out(sms_database, sender) == [(True,)]
    now += timedelta(minutes=30)
    send(sms("START", sender))
    fake_twilio.recover()
    assert run_the_job()["follow_ups_sent"] == 1
    assert [message["Body"] for message in fake_twilio.messages] == [
        "(1/2) Book the dentist at nine.",
        "(2/2) Then call the bank.",
    ]
    assert len(fake_twilio.refused) == 1
    assert rows(sms_database, "select role, content from messages where role = 'assistant' order by id") == [
        ("assistant", "I'll remind you."),
        ("assistant", "Book the dentist at nine. Then call the bank."),
    ]


@pytest.mark.parametrize("start", [False, True])
def test_a_reminder_held_for_start_after_its_first_part_went_out_is_kept_in_the_thread_when_given_up(
    environment: pytest.MonkeyPatch,
    sms_database: str,
    fake_anthropic: FakeAnthropic,
    fake_twilio: FakeTwilio,
    start: bool,
) -> None:
    """Its first part went out, the second failed for a reason that may pass, then the number texted
    STOP: held for START. Given up after its week (by the job's claim with no START, or by a START
    too late), what the person read is in their thread: the reminder whole, as the agent's message,
    undelivered (docs/decisions.md, An SMS number that opted out); the rest is never sent."""
    environment.setattr(sms_surface, "SMS_LIMIT", 40)
    now = datetime(2026, 12, 2, 17, 0, tzinfo=UTC)
    environment.setattr(runtime, "now", lambda: now)
    sender, other = number(), number()
    fake_anthropic.answer = remind("Book the dentist at nine. Then call the bank.")
    send(sms("remind me in 5 minutes", sender))
    send(sms("remind me in 5 minutes", other))
    send(sms("STOP", other))  # another person's hold, nothing of it out: given up by the claim, stored nowhere
    now += timedelta(minutes=5, seconds=30)
    fake_twilio.fail_once_after(1, 503, 20500)
    assert run_the_job()["follow_ups_retried"] == 1
    send(sms("STOP", sender))
    now += timedelta(minutes=5)
    assert run_the_job()["follow_ups_held"] == 1
    held = rows(sms_database, "select sender, status, unsent_from, message_id from follow_ups order by sender")
    assert held == sorted([(sender, "held", 1, None), (other, "held", None, None)])
    now = datetime(2026, 12, 9, 17, 6, tzinfo=UTC)  # a minute past the week
    if start:
        send(sms("START", sender))
    job = run_the_job()
    assert (job["follow_ups_sent"], job["follow_ups_given_up"]) == (0, 1 if start else 2)
    assert [message["Body"] for message in fake_twilio.messages] == ["(1/2) Book the dentist at nine."]
    kept = rows(
        sms_database,
        "select m.surface, m.role, m.content, m.delivered_at, m.user_id = f.user_id,"
        "       m.conversation_id = f.conversation_id"
        "  from follow_ups f join messages m on m.id = f.message_id where f.sender = %s",
        sender,
    )
    assert kept == [("sms", "assistant", "Book the dentist at nine. Then call the bank.", None, True, True)]
    assert rows(sms_database, "select status, message_id from follow_ups where sender = %s", other) == [
        ("given_up", None)
    ]
    assert count(sms_database, "select count(*) from messages where role = 'assistant' and content like 'Book%%'") == 1


def test_under_the_owner_policy_a_stop_from_the_owners_number_is_remembered(
    environment: pytest.MonkeyPatch, sms_database: str, fake_anthropic: FakeAnthropic, fake_twilio: FakeTwilio
) -> None:
    """The owner policy keeps no identity for the numbers its list names: the opt-out makes one,
    the owner's, and nothing is sent to that number until START, which lets the reminder held for it
    go; a stranger's STOP records nothing."""
    now = datetime(2026, 12, 2, 17, 0, tzinfo=UTC)
    environment.setattr(runtime, "now", lambda: now)
    owner, mine, stranger = uuid.uuid4(), number(), number()
    environment.setenv("IDENTITY_POLICY", "owner")
    environment.setenv("OWNER_USER_ID", str(owner))
    environment.setenv("OWNER_SMS_NUMBERS", mine)
    fake_anthropic.answer = remind("Take the pills.")
    send(sms("remind me in 5 minutes to take the pills", mine))
    assert send(sms("STOP", mine)) == [] and send(sms("STOP", stranger)) == []
    assert rows(sms_database, "select surface, external_id, user_id, opted_out_at is not null from identities") == [
        ("sms", mine, owner, True)
    ]
    now += timedelta(minutes=6)
    assert run_the_job()["follow_ups_held"] == 1
    assert (fake_twilio.messages, fake_twilio.refused) == ([], [])
    send(sms("START", mine))
    assert opted_out(sms_database, mine) == [(False,)]
    assert run_the_job()["follow_ups_sent"] == 1
    assert [(m["To"], m["Body"]) for m in fake_twilio.messages] == [(mine, "Take the pills.")]


def test_a_reminder_to_a_number_that_opted_out_goes_to_the_persons_telegram(
    environment: pytest.MonkeyPatch,
    sms_database: str,
    fake_anthropic: FakeAnthropic,
    fake_twilio: FakeTwilio,
    fake_telegram: FakeTelegram,
) -> None:
    """STOP stops texts, not the advisor: a reminder asked by SMS and due after it is refused for
    good with no send tried, as a blocked bot's is, and moves once to the app the person last wrote
    from among their others (here the owner's Telegram chat), stored once, in that conversation."""
    now = datetime(2026, 12, 2, 17, 0, tzinfo=UTC)
    environment.setattr(runtime, "now", lambda: now)
    owner, mine = owner_on_telegram_asking_by_sms(environment, fake_anthropic)
    assert send(sms("STOP", mine)) == []
    now += timedelta(minutes=6)
    job = run_the_job()
    assert (job["follow_ups_sent"], job["follow_ups_given_up"]) == (1, 0)
    assert (fake_twilio.messages, fake_twilio.refused) == ([], [])
    assert [(m["chat_id"], m["text"]) for m in fake_telegram.sent()[1:]] == [(5161, "Take the pills.")]
    assert rows(sms_database, "select surface, sender, moved_from, status from follow_ups") == [
        ("telegram", "5161", "sms", "sent")
    ]
    said = rows(sms_database, "select surface, role from messages where content = 'Take the pills.'")
    assert said == [("telegram", "assistant")]


def test_a_reminder_asked_on_the_web_is_not_pushed_to_a_number_that_opted_out(
    environment: pytest.MonkeyPatch, sms_database: str, fake_anthropic: FakeAnthropic, fake_twilio: FakeTwilio
) -> None:
    """The owner's one app is an SMS number that texted STOP: a reminder they ask for on the web is
    not said to be pushed there (the tool says it stays in the web conversation), no text is tried,
    and the job says it in that web conversation. Pushed there, Twilio refused it, no other app took
    it, and it was given up: never shown anywhere, after the model had told them it would come."""
    now = datetime(2026, 12, 2, 17, 0, tzinfo=UTC)
    environment.setattr(runtime, "now", lambda: now)
    owner, mine = uuid.uuid4(), number()
    environment.setenv("IDENTITY_POLICY", "owner")
    environment.setenv("OWNER_USER_ID", str(owner))
    environment.setenv("OWNER_SMS_NUMBERS", mine)
    environment.setenv("SUPABASE_JWT_SECRET", JWT_SECRET)
    fake_anthropic.answer = lambda body: "Hello."
    send(sms("hi", mine))
    assert send(sms("STOP", mine)) == []
    fake_twilio.fail_with(400, 21610)  # as Twilio refuses every send to the number now
    fake_anthropic.answer = remind("Take the pills.")
    web = app_client("web_chat").post("/", json={"message": "in 5 minutes remind me"}, headers=bearer(owner))
    assert web.status_code == 200
    [result] = tool_results(fake_anthropic.requests[-1])
    assert result["content"].startswith(
        "Scheduled for Wed 2 Dec 2026 17:05 (UTC). They have no app linked to this account that it can be"
        " pushed to: it will only appear in this web conversation"
    )
    now += timedelta(minutes=6)
    job = run_the_job()
    assert (job["follow_ups_sent"], job["follow_ups_given_up"]) == (1, 0)
    assert (fake_twilio.messages, fake_twilio.refused) == ([], [])
    assert rows(sms_database, "select surface, sender, moved_from, status from follow_ups") == [
        ("web", None, None, "sent")
    ]
    said = rows(sms_database, "select surface, role from messages where content = 'Take the pills.'")
    assert said == [("web", "assistant")]


def test_an_opt_out_goes_with_the_identity_when_the_person_is_erased(
    sms_database: str, fake_anthropic: FakeAnthropic
) -> None:
    """A plain forget keeps the identities (the number still opted out at Twilio: nothing goes to it);
    the operator's erasure removes the number, and its opt-out with it."""
    sender, other = number(), number()
    fake_anthropic.answer = lambda body: "Noted."
    send(sms("My sister is Eva", sender))
    send(sms("My brother is Leo", other))
    send(sms("STOP", sender))
    send(sms("STOP", other))
    [(person,)] = rows(sms_database, "select user_id from identities where external_id = %s", sender)
    rows(sms_database, "select public.forget_person(%s, false)", person)
    assert opted_out(sms_database, sender) == [(True,)]
    rows(sms_database, "select public.forget_person(%s, true)", person)
    assert (opted_out(sms_database, sender), opted_out(sms_database, other)) == ([], [(True,)])


def test_a_persons_follow_ups_carry_their_own_opt_outs_only(
    environment: pytest.MonkeyPatch, sms_database: str, fake_anthropic: FakeAnthropic
) -> None:
    """What the job's claim says of the numbers that opted out is the person's own (read by their
    user_id): someone else's STOP is not theirs to know, nor to hold their reminders."""
    now = datetime(2026, 12, 2, 17, 0, tzinfo=UTC)
    environment.setattr(runtime, "now", lambda: now)
    stopped, other = number(), number()
    fake_anthropic.answer = remind("Take the pills.")
    send(sms("remind me in 5 minutes to take the pills", stopped))
    send(sms("remind me in 5 minutes to take the pills", other))
    send(sms("STOP", stopped))
    [(claimed,)] = rows(
        sms_database,
        "select public.claim_due_follow_ups(%s, 10, 360, %s)",
        now + timedelta(minutes=6),
        uuid.uuid4(),
    )
    assert {row["sender"]: row["opted_out"] for row in claimed["claimed"]} == {stopped: [stopped], other: []}


def test_a_follow_up_the_job_sends_late_by_sms_says_when_it_was_due_in_the_language_it_is_in(
    environment: pytest.MonkeyPatch, sms_database: str, fake_anthropic: FakeAnthropic, fake_twilio: FakeTwilio
) -> None:
    """The job was down for half an hour: the reminder says when it was due (UTC here, where the
    person never said where they live). SMS states no language: a Spanish reminder says it in
    Spanish, as its words are."""
    now = datetime(2026, 12, 2, 17, 0, tzinfo=UTC)
    environment.setattr(runtime, "now", lambda: now)
    english, spanish = number(), number()
    fake_anthropic.answer = remind("Take the pills.")
    send(sms("remind me in 5 minutes to take the pills", english))
    fake_anthropic.answer = remind("Tómate las pastillas, que ya es la hora.")
    send(sms("recuérdame en 5 minutos que tome las pastillas", spanish))
    now += timedelta(minutes=35)
    assert run_the_job()["follow_ups_sent"] == 2
    assert [(m["To"], m["Body"]) for m in fake_twilio.messages] == [
        (english, "Take the pills.\n\n(due at 17:05, sent late)"),
        (spanish, "Tómate las pastillas, que ya es la hora.\n\n(programado para las 17:05, enviado con retraso)"),
    ]


def test_a_follow_up_whose_rest_goes_late_keeps_the_numbering_its_first_part_went_with(
    environment: pytest.MonkeyPatch, sms_database: str, fake_anthropic: FakeAnthropic, fake_twilio: FakeTwilio
) -> None:
    """Its first part went on time, the second failed, and the retry that says it is late: the rest
    is said as the first part was cut from, with no note added, and "(2/2)" follows "(1/2)". The
    note, "(due at 17:05, sent late)" in a part of its own, made it three: "(2/3)" then "(3/3)"."""
    environment.setattr(sms_surface, "SMS_LIMIT", 40)
    now = datetime(2026, 12, 2, 17, 0, tzinfo=UTC)
    environment.setattr(runtime, "now", lambda: now)
    sender = number()
    fake_anthropic.answer = remind("Book the dentist at nine. Then call the bank.")
    send(sms("remind me in 5 minutes", sender))
    now += timedelta(minutes=5, seconds=30)
    fake_twilio.fail_once_after(1, 503, 20500)
    assert run_the_job()["follow_ups_sent"] == 0
    now += timedelta(minutes=10)
    assert run_the_job()["follow_ups_sent"] == 1
    assert [message["Body"] for message in fake_twilio.messages] == [
        "(1/2) Book the dentist at nine.",
        "(2/2) Then call the bank.",
    ]
    stored = rows(sms_database, "select role, content from messages where role = 'assistant' order by id")
    assert stored[-1] == ("assistant", "Book the dentist at nine. Then call the bank.")


@pytest.mark.parametrize("missing", ["TWILIO_SMS_FROM", "TWILIO_ACCOUNT_SID"])
def test_without_a_number_to_send_from_later_sms_is_not_served(
    environment: pytest.MonkeyPatch, sms_database: str, fake_anthropic: FakeAnthropic, missing: str
) -> None:
    """Without them a reminder asked by SMS would be scheduled, promised, retried and given up, never
    said, and an owed reply never sent (a review's finding): outside APP_ENV=local the function refuses
    to serve, 503 with what to set, before reading anything; `make dev` says them on its console."""
    environment.delenv(missing)
    fields = sms("remind me in 5 minutes to take the pills", number())
    answered = app_client("sms_webhook").post("/", data=fields, headers=signed(fields, SMS_URL))
    assert (answered.status_code, answered.get_json()) == (
        503,
        {
            "error": "not_configured",
            "message": "set TWILIO_ACCOUNT_SID and TWILIO_SMS_FROM: nothing could be sent later",
        },
    )
    assert fake_anthropic.requests == [] and rows(sms_database, "select count(*) from messages") == [(0,)]
    environment.setenv("APP_ENV", "local")
    runtime.reset()
    fake_anthropic.answer = lambda body: "Noted."
    assert send(fields) == ["Noted."]


def test_forget_on_sms_erases_that_person_and_nobody_else(sms_database: str, fake_anthropic: FakeAnthropic) -> None:
    person, other = number(), number()
    fake_anthropic.answer = lambda body: "Noted."
    for text in ("My sister is Eva", "I live in Madrid"):
        send(sms(text, person))
    send(sms("My cat is Tom", other))
    [asked] = send(sms("Forget", person))
    code = rows(sms_database, "select code from forget_requests")[0][0]
    assert len(code) == 6 and code.isdecimal()
    assert asked == will_delete(ENGLISH, 4, 1, f"forget confirm {code}")
    assert send(sms(f"FORGET CONFIRM {code}", person)) == [forgotten(ENGLISH, 4)]
    left = rows(sms_database, "select content from messages order by id")
    assert left == [("My cat is Tom",), ("Noted.",)]


def test_a_forged_sms_cannot_confirm_forgetting_without_the_code_sent_to_the_number(
    sms_database: str, fake_anthropic: FakeAnthropic
) -> None:
    """An SMS's number is a caller ID, which a forger can set to someone else's: the request's
    answer goes to the number's holder, and without its code nothing is deleted (one guess a request)."""
    person = number()
    fake_anthropic.answer = lambda body: "Noted."
    send(sms("My sister is Eva", person))
    wrong_code = ENGLISH.say("forget.wrong_code", request="forget")
    for confirmation in ("forget confirm", "forget confirm 999999"):
        send(sms("forget", person))  # what a forger sends first; the answer reaches the holder
        code = rows(sms_database, "select code from forget_requests")[0][0]
        assert confirmation != f"forget confirm {code}"
        assert send(sms(confirmation, person)) == [wrong_code]
        assert rows(sms_database, "select count(*) from forget_requests") == [(0,)]  # the guess ended it
    send(sms("forget", person))
    first = rows(sms_database, "select code from forget_requests")[0][0]
    send(sms("forget", person))  # asked again: only the newest code confirms
    assert rows(sms_database, "select code from forget_requests")[0][0] != first  # one chance in a million
    assert send(sms(f"forget confirm {first}", person)) == [wrong_code]
    send(sms("forget", person))
    newest = rows(sms_database, "select code from forget_requests")[0][0]
    assert rows(sms_database, "select content from messages order by id") == [("My sister is Eva",), ("Noted.",)]
    assert send(sms(f"forget confirm {newest}", person)) == [forgotten(ENGLISH, 2)]
    assert rows(sms_database, "select count(*) from messages") == [(0,)]


def test_an_sms_number_is_not_the_owners_whatsapp_number(
    environment: pytest.MonkeyPatch, sms_database: str, fake_anthropic: FakeAnthropic
) -> None:
    """Under `owner`, OWNER_WHATSAPP_NUMBERS admits no SMS sender: only OWNER_SMS_NUMBERS does."""
    owner, sender = uuid.uuid4(), number()
    environment.setenv("IDENTITY_POLICY", "owner")
    environment.setenv("OWNER_USER_ID", str(owner))
    environment.setenv("OWNER_WHATSAPP_NUMBERS", sender)
    environment.setenv("STRANGER_REPLY", "This assistant is private.")
    assert send(sms("hello", sender)) == ["This assistant is private."]
    assert fake_anthropic.requests == []
    environment.setenv("OWNER_SMS_NUMBERS", sender)
    fake_anthropic.answer = lambda body: "Hello again."
    assert send(sms("hello", sender)) == ["Hello again."]
    assert rows(sms_database, "select user_id from conversations") == [(owner,)]
    assert json.dumps(fake_anthropic.requests[0]).count("hello") >= 1


def test_an_sms_past_the_budget_gets_a_polite_answer_and_nothing_stored(
    environment: pytest.MonkeyPatch, sms_database: str, fake_anthropic: FakeAnthropic
) -> None:
    environment.setenv("TURNS_PER_MINUTE", "2")
    sender, other = number(), number()
    fake_anthropic.answer = lambda body: "Noted."
    for text in ("one", "two"):
        assert send(sms(text, sender)) == ["Noted."]
    asked = len(fake_anthropic.requests)
    fields = sms("three", sender)
    [answer] = send(fields)
    assert answer.startswith("You've written a lot in a short time, so I'm taking a pause. You can write again in ")
    assert len(fake_anthropic.requests) == asked and stored_turn(sms_database, fields["MessageSid"]) == []
    assert send(sms("mine", other)) == ["Noted."]  # another number's budget is its own


def test_an_sms_number_joins_a_web_account_only_with_the_digits_sent_to_it(
    environment: pytest.MonkeyPatch, sms_database: str, fake_anthropic: FakeAnthropic
) -> None:
    """A forger who sets someone's number as the caller ID, with a code of their own web account,
    would have that number's messages join their account; the link waits for six digits that only
    the number is sent, and links once its holder types them back."""
    environment.setenv("SUPABASE_JWT_SECRET", JWT_SECRET)
    web = app_client("web_chat")
    forger, holder, victim = uuid.uuid4(), uuid.uuid4(), number()
    fake_anthropic.answer = lambda body: "Noted."
    send(sms("My PIN hint is the dog's name", victim))
    # An anonymous sign-in: a token with no email or phone, which the answer cannot call "yours".
    code = web.post("/links", headers=bearer(forger, email="", phone="")).get_json()["code"]
    [asked] = send(sms(f"link {code}", victim))  # the forger's message; the answer goes to the number
    assert asked.startswith("This code would join this number to the web account that shows no email or phone:")
    [confirmation] = [word for word in asked.split() if len(word) == 6 and word.isdecimal()]
    assert asked.endswith(f"link {code} {confirmation}")
    # The digits are the number's: those the forger's own number is sent do not link the victim's.
    [own] = send(sms(f"link {code}", number()))
    assert own.rsplit(" ", 1)[1] != confirmation
    assert send(sms(f"link {code} {own.rsplit(' ', 1)[1]}", victim)) == [ENGLISH.say("link.invalid")]
    assert send(sms(f"link {code} {(int(confirmation) + 1) % 10**6:06d}", victim)) == [ENGLISH.say("link.invalid")]
    assert rows(sms_database, "select count(*) from link_attempts where external_id = %s", victim) == [(2,)]
    assert web.get("/links", headers=bearer(forger)).get_json() == {"links": []}
    assert rows(sms_database, "select count(*) from messages where user_id = %s", forger) == [(0,)]

    code = web.post("/links", headers=bearer(holder)).get_json()["code"]
    [asked] = send(sms(code, victim))  # a bare code, as the page shows it
    confirmation = asked.rsplit(" ", 1)[1]
    assert send(sms(f"LINK {code} {confirmation}", victim))[0].startswith("Linked to the web account")
    [link] = web.get("/links", headers=bearer(holder)).get_json()["links"]
    assert link["surface"] == "sms" and link["external_id"].endswith(victim[-4:])
    assert rows(sms_database, "select count(*) from messages where user_id = %s", holder) == [(2,)]


def test_past_the_hours_wrong_codes_no_forget_request_is_taken(
    environment: pytest.MonkeyPatch, sms_database: str, fake_anthropic: FakeAnthropic
) -> None:
    """A forger's guesses are bounded as a link code's are: LINK_ATTEMPTS_PER_HOUR wrong codes from
    a number, and its next `forget` in the hour is refused, with nothing asked of anyone."""
    environment.setenv("LINK_ATTEMPTS_PER_HOUR", "3")
    person = number()
    fake_anthropic.answer = lambda body: "Noted."
    send(sms("My sister is Eva", person))
    for _ in range(3):
        send(sms("forget", person))
        assert send(sms("forget confirm 000000", person)) == [ENGLISH.say("forget.wrong_code", request="forget")]
    [refused] = send(sms("forget", person))
    assert refused.startswith("Too many wrong codes. Please try again after ")
    assert rows(sms_database, "select count(*) from forget_requests") == [(0,)]
    assert rows(sms_database, "select count(*) from messages") == [(2,)]


def test_under_the_owner_policy_only_the_number_a_forget_code_was_sent_to_may_repeat_it(
    environment: pytest.MonkeyPatch, sms_database: str, fake_anthropic: FakeAnthropic
) -> None:
    """The owner's numbers are one person: a code sent to one is not confirmed from the other (a
    forger would ask from one and guess from the other), and a wrong code is counted there too."""
    owner, first, second = uuid.uuid4(), number(), number()
    environment.setenv("IDENTITY_POLICY", "owner")
    environment.setenv("OWNER_USER_ID", str(owner))
    environment.setenv("OWNER_SMS_NUMBERS", f"{first},{second}")
    fake_anthropic.answer = lambda body: "Noted."
    send(sms("My sister is Eva", first))
    wrong_code = ENGLISH.say("forget.wrong_code", request="forget")
    send(sms("forget", first))
    [(code,)] = rows(sms_database, "select code from forget_requests")
    assert send(sms(f"forget confirm {code}", second)) == [wrong_code]  # the right code, the other number
    assert rows(sms_database, "select external_id from link_attempts") == [(second,)]
    send(sms("forget", first))
    assert send(sms("forget confirm 000000" if code != "000000" else "forget confirm 111111", first)) == [wrong_code]
    assert rows(sms_database, "select count(*) from link_attempts where external_id = %s", first) == [(1,)]
    send(sms("forget", first))
    [(code,)] = rows(sms_database, "select code from forget_requests")
    assert send(sms(f"forget confirm {code}", first)) == [forgotten(ENGLISH, 2)]


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        ({}, ENGLISH.say("whatsapp.empty")),
        ({"NumMedia": "1", "MediaContentType0": "video/3gpp"}, ENGLISH.say("media.text_only")),
    ],
    ids=["empty", "media without its url"],
)
def test_an_sms_with_no_words_is_answered_and_no_turn(
    sms_database: str, fake_anthropic: FakeAnthropic, extra: dict[str, str], said: str
) -> None:
    """A blank SMS (a carrier's empty message, or spaces), or an MMS whose media Twilio names no
    URL for: a short answer in TwiML, no model asked, nothing in the thread."""
    fields = sms("  ", number(), **extra)
    assert send(fields) == [said]
    assert fake_anthropic.requests == []
    assert rows(sms_database, "select count(*) from messages") == [(0,)]


def linked_number(web: FlaskClient, person: uuid.UUID) -> str:
    """A new number joined to `person`'s web account with the digits sent to it."""
    sender = number()
    code = web.post("/links", headers=bearer(person)).get_json()["code"]
    [asked] = send(sms(f"link {code}", sender))
    assert send(sms(f"link {code} {asked.rsplit(' ', 1)[1]}", sender))[0].startswith("Linked to the web account")
    return sender


def test_a_yes_from_another_of_the_persons_numbers_leaves_a_reminder_held_for_start(
    environment: pytest.MonkeyPatch, sms_database: str, fake_anthropic: FakeAnthropic, fake_twilio: FakeTwilio
) -> None:
    """One person, two numbers: the one that texted STOP has a reminder held for its START; a YES
    from the other (an answer to the advisor, and an opt-in word of a number that never opted out)
    lets nothing go (before, it was let go, and held again by the next run, an attempt more): the hold
    waits for the number that opted out."""
    environment.setenv("SUPABASE_JWT_SECRET", JWT_SECRET)
    now = datetime(2026, 12, 2, 17, 0, tzinfo=UTC)
    environment.setattr(runtime, "now", lambda: now)
    person, web = uuid.uuid4(), app_client("web_chat")
    stopped, other = linked_number(web, person), linked_number(web, person)
    fake_anthropic.answer = remind("Take the pills.")
    send(sms("remind me in 5 minutes to take the pills", stopped))
    send(sms("STOP", stopped))
    now += timedelta(minutes=6)
    assert run_the_job()["follow_ups_held"] == 1
    fake_anthropic.answer = lambda body: "Good."
    assert send(sms("yes", other)) == ["Good."]
    assert rows(sms_database, "select sender, status, attempts from follow_ups") == [(stopped, "held", 1)]
    assert run_the_job()["follow_ups_sent"] == 0
    assert (fake_twilio.messages, fake_twilio.refused) == ([], [])
    send(sms("START", stopped))
    assert run_the_job()["follow_ups_sent"] == 1
    assert [m["To"] for m in fake_twilio.messages] == [other]  # the number the person last wrote from
