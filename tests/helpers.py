"""What several test modules share, defined once: the secrets the tests configure, each app's
requests as its sender makes them, the function under test as a cold start builds it, counting
rows, and a free port. The fixtures built on these are in the conftest files; a test module
imports from here (and from tests/fakes, tests/database), never from another test module.

The hostile and fuzzed requests for every function (the end of this module) are shared by the
property tests and `make bench`'s fuzzing figures."""

from __future__ import annotations

import base64
import hashlib
import hmac
import io
import itertools
import json
import socket
import subprocess
import sys
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode

import httpx
import jwt
import psycopg
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from flask.testing import FlaskClient
from functions_framework import create_app
from hypothesis import strategies as st
from twilio.request_validator import RequestValidator
from werkzeug.datastructures import MultiDict
from werkzeug.test import TestResponse

from core.errors import StoreUnavailable
from core.media.kinds import MediaLimits
from core.memory.digest import DigestLimits
from core.memory.service import ContextLimits, Memory, TurnBudget
from core.models import Person, TurnStart
from core.phrases.catalogue import Catalogue, Phrases
from core.stores.store import JsonScalar, MemoryStore
from core.surfaces import Delivery, Sent, Surface, SurfaceAdapter
from core.turn.request import TurnRequest, TurnResult
from core.turn.turns import Turns
from functions import runtime
from functions.http import MAX_BODY_BYTES
from functions.settings import Settings
from tests.fakes.anthropic_api import FakeAnthropic
from tests.fakes.jwks import KID, FakeJwks
from tests.fakes.telegram_api import FakeTelegram

ROOT = Path(__file__).resolve().parents[1]
MAIN = str(ROOT / "main.py")
CORPUS = ROOT / "tests" / "corpus"

BOT_TOKEN = "123456789:TEST-token-abcdef"
TELEGRAM_SECRET = "telegram-webhook-secret"
TELEGRAM_HEADERS = {"X-Telegram-Bot-Api-Secret-Token": TELEGRAM_SECRET}
JWT_SECRET = "web-jwt-secret-for-tests-32-bytes-long"
TWILIO_TOKEN = "twilio-auth-token-for-tests"
PUBLIC_BASE_URL = "https://advisor.example.com/whatsapp"
CORS_ORIGIN = "https://advisor.example.com"


# core's limits at the settings' defaults (core holds none: functions/runtime.py passes them in).

DEFAULTS = Settings.defaults()


def context_limits(**changes: Any) -> ContextLimits:
    return replace(runtime.context_limits(DEFAULTS), **changes)


def media_limits(**changes: Any) -> MediaLimits:
    return replace(runtime.media_limits(DEFAULTS), **changes)


def digest_limits(**changes: Any) -> DigestLimits:
    return replace(runtime.digest_limits(DEFAULTS), **changes)


def turn_budget(**limits: int) -> TurnBudget:
    """Only `limits` on (the others 0, as a Memory without a budget), each answer reserving
    ANTHROPIC_MAX_TOKENS's default unless `reply_tokens` says."""
    return TurnBudget(**({"reply_tokens": DEFAULTS.anthropic_max_tokens} | limits))


# The functions under test.


def production_settings(database_url: str, anthropic: FakeAnthropic, telegram: FakeTelegram) -> dict[str, str]:
    """A production-like configuration, with the fakes for Anthropic and the Bot API."""
    return {
        "APP_ENV": "production",
        "DATABASE_URL": database_url,
        "ANTHROPIC_API_KEY": "sk-ant-test",
        "ANTHROPIC_BASE_URL": anthropic.url,
        "ANTHROPIC_MAX_RETRIES": "0",
        "TELEGRAM_BOT_TOKEN": BOT_TOKEN,
        "TELEGRAM_WEBHOOK_SECRET": TELEGRAM_SECRET,
        "TELEGRAM_API_BASE": telegram.url,
        "IDENTITY_POLICY": "auto",
        # What whatsapp_webhook needs outside APP_ENV=local (something to send later from); nothing
        # listens at this base: a test that sends through Twilio sets its fake's.
        "TWILIO_ACCOUNT_SID": "AC" + "9" * 32,
        "TWILIO_WHATSAPP_FROM": "whatsapp:+14155238886",
        "TWILIO_API_BASE": "http://127.0.0.1:9",
        # Tests send many turns as one person in a second; the budget's own tests turn it on.
        "TURNS_PER_MINUTE": "0",
        "TURNS_PER_DAY": "0",
        "TOKENS_PER_DAY": "0",
    }


def as_owner(
    environment: pytest.MonkeyPatch, owner: uuid.UUID, telegram: str = "4242", whatsapp: str = "+34600111222"
) -> None:
    """The owner policy: `owner` is the person behind these Telegram ids and WhatsApp numbers."""
    environment.setenv("IDENTITY_POLICY", "owner")
    environment.setenv("OWNER_USER_ID", str(owner))
    environment.setenv("OWNER_TELEGRAM_IDS", telegram)
    environment.setenv("OWNER_WHATSAPP_NUMBERS", whatsapp)


def app_client(target: str) -> FlaskClient:
    """A new instance of the function, as a cold start would build it."""
    runtime.reset()
    return create_app(target, MAIN).test_client()


# Each app's requests, as its sender makes them.


def update(text: str, update_id: int | None = None, user_id: int = 4242, chat_type: str = "private") -> dict[str, Any]:
    """A Telegram update carrying a text message."""
    return {
        "update_id": update_id or uuid.uuid4().int % 10**9,
        "message": {
            "message_id": 1,
            "date": 1732870000,
            "chat": {"id": user_id, "type": chat_type, "first_name": "Ana"},
            "from": {"id": user_id, "is_bot": False, "first_name": "Ana"},
            "text": text,
        },
    }


WEB_CLAIMS = json.loads((CORPUS / "supabase" / "jwt_claims_example.json").read_text())


def claims(sub: uuid.UUID, **changes: Any) -> dict[str, Any]:
    """A Supabase access token's claims for `sub`, valid for an hour."""
    now = int(time.time())
    return {**WEB_CLAIMS, "sub": str(sub), "session_id": str(uuid.uuid4()), "iat": now, "exp": now + 3600, **changes}


def bearer(sub: uuid.UUID, secret: str = JWT_SECRET, **changes: Any) -> dict[str, str]:
    return {"Authorization": "Bearer " + jwt.encode(claims(sub, **changes), secret, algorithm="HS256")}


def form(body: str, sid: str | None = None, sender: str = "whatsapp:+34600111222", **extra: str) -> dict[str, str]:
    """The fields of Twilio's webhook for a WhatsApp message."""
    return {
        "From": sender,
        "To": "whatsapp:+14155238886",
        "Body": body,
        "MessageSid": sid or "SM" + uuid.uuid4().hex,
        "NumMedia": "0",
        **extra,
    }


def sms_can_send_later(environment: pytest.MonkeyPatch) -> None:
    """What sms_webhook needs outside APP_ENV=local beside its signature's settings: the account and
    the number owed replies and follow-ups are sent from (nothing here sends: no Twilio is reached)."""
    environment.setenv("TWILIO_ACCOUNT_SID", "AC" + "9" * 32)
    environment.setenv("TWILIO_SMS_FROM", "+14155238886")


def signed(fields: dict[str, str], url: str = PUBLIC_BASE_URL, token: str = TWILIO_TOKEN) -> dict[str, str]:
    return {"X-Twilio-Signature": RequestValidator(token).compute_signature(url, fields)}


DIGEST_SECRET = "digest-secret-for-tests"  # noqa: S105 (a test's, not a secret)


def one_request(function: str, environment: pytest.MonkeyPatch, **settings: str) -> TestResponse:
    """One ordinary request to `function` (main.py's name), as its caller makes it, with what the
    function needs to answer 200 set first, then `settings` over it: a turn on a chat surface,
    a run of the scheduled job."""
    if function in ("whatsapp_webhook", "sms_webhook"):
        environment.setenv("TWILIO_AUTH_TOKEN", TWILIO_TOKEN)
        environment.setenv("PUBLIC_BASE_URL", PUBLIC_BASE_URL)
    if function == "sms_webhook":
        sms_can_send_later(environment)
    if function == "memory_digest":
        environment.setenv("DIGEST_SECRET", DIGEST_SECRET)
    if function == "web_chat":
        environment.setenv("SUPABASE_JWT_SECRET", JWT_SECRET)
    for name, value in settings.items():
        environment.setenv(name, value)
    client = app_client(function)
    if function == "telegram_webhook":
        return client.post("/", json=update("hello"), headers=TELEGRAM_HEADERS)
    if function == "whatsapp_webhook":
        fields = form("hello")
        return client.post("/", data=fields, headers=signed(fields))
    if function == "sms_webhook":
        fields = {"From": "+34600111222", "To": "+14155238886", "Body": "hello", "MessageSid": "SM" + "0" * 32}
        return client.post("/", data=fields, headers=signed(fields))
    if function == "memory_digest":
        return client.post("/", headers={"X-Digest-Secret": DIGEST_SECRET})
    return client.post("/", json={"message": "hello"}, headers=bearer(uuid.uuid4()))


def messages_of(response_text: str) -> list[str]:
    """The messages of a TwiML answer."""
    root = ET.fromstring(response_text)
    assert root.tag == "Response"
    return [element.text or "" for element in root.findall("Message")]


# The AI SDK's useChat, as its DefaultChatTransport posts and reads (the web's UI message stream).


def ui_text(text: str) -> dict[str, str]:
    return {"type": "text", "text": text}


def ui_message(message_id: str, role: str, text: str, **extra: Any) -> dict[str, Any]:
    return {"id": message_id, "role": role, "parts": [ui_text(text)], **extra}


def chat_body(chat_id: str, *messages: dict[str, Any]) -> dict[str, Any]:
    """What DefaultChatTransport posts (ai 6's HttpChatTransport.sendMessages)."""
    return {"id": chat_id, "messages": list(messages), "trigger": "submit-message"}


def parts_of(text: str) -> list[Any]:
    """The stream's `data:` payloads in order, `[DONE]` as the string."""
    blocks = [block for block in text.split("\n\n") if block]
    assert all(block.startswith("data: ") for block in blocks), blocks
    return [block[6:] if block == "data: [DONE]" else json.loads(block[6:]) for block in blocks]


def new_conversation(web: FlaskClient, person: uuid.UUID) -> str:
    return str(web.post("/conversations", headers=bearer(person)).get_json()["id"])


def answer_of(response: Any) -> tuple[str, str]:
    """A UI message stream's outcome (its `data-turn` part) and the reply's words."""
    parts = parts_of(response.get_data(as_text=True))
    text = "".join(part["delta"] for part in parts if isinstance(part, dict) and part["type"] == "text-delta")
    return parts[-3]["data"]["outcome"], text


def loaded(web: FlaskClient, person: uuid.UUID, chat: str) -> list[dict[str, Any]]:
    """docs/frontend.md's loadMessages, in Python: the person's web messages under their client's id."""
    page = web.get(f"/conversations/{chat}/messages", headers=bearer(person)).get_json()
    return [
        {
            "id": message["client_id"] or str(message["id"]),
            "role": message["role"],
            "parts": [ui_text(message["content"])],
            "metadata": {"surface": message["surface"], "createdAt": message["created_at"]},
        }
        for message in page["messages"]
    ]


def owners_telegram_thread(
    environment: pytest.MonkeyPatch, database_url: str, owed_by: FakeAnthropic | None = None
) -> tuple[FlaskClient, Any, dict[str, Any], Any]:
    """The web function, as the owner whose Telegram chat said "my passport expires in May" (update
    9, answered as the fake answers; `owed_by`: that fake down for it, the message owed): the owner,
    their [Telegram] conversation as listed and that turn's result. A chat of the test's own: the
    session's database holds chat 4242 as someone else's."""
    owner = uuid.uuid4()
    chat_id = str(owner.int % 10**9)
    environment.setenv("OWNER_USER_ID", str(owner))
    environment.setenv("OWNER_TELEGRAM_IDS", chat_id)
    runtime.reset()
    web = app_client("web_chat")
    if owed_by is not None:
        owed_by.behaviour = "500"
    said = runtime.turns().run(TurnRequest(Surface.TELEGRAM, "my passport expires in May", "9", chat_id))
    if owed_by is not None:
        owed_by.behaviour = "ok"
    person = rows(database_url, "select user_id from messages where id = %s", said.message_id)[0][0]
    [telegram] = web.get("/conversations", headers=bearer(person)).get_json()["conversations"]
    return web, person, telegram, said


# One person on every app (the linking and forgetting tests).


@dataclass
class Apps:
    telegram: FlaskClient
    whatsapp: FlaskClient
    web: FlaskClient
    # This test's own chat and number: the database is shared by the whole session.
    chat: int
    number: str


def three_apps(environment: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic) -> Apps:
    """Telegram, WhatsApp and the web, configured for linking, with a chat and a number of their own."""
    fake_anthropic.answer = lambda body: "Noted."  # the person's words appear only where they were said
    environment.setenv("SUPABASE_JWT_SECRET", JWT_SECRET)
    environment.setenv("TWILIO_AUTH_TOKEN", TWILIO_TOKEN)
    environment.setenv("PUBLIC_BASE_URL", PUBLIC_BASE_URL)
    environment.setenv("TELEGRAM_BOT_USERNAME", "advisor_bot")
    chat = 515100042 + uuid.uuid4().int % 10**8 * 10**5  # wide enough that no two tests share one
    number = f"+34{uuid.uuid4().int % 10**9:09d}7888"  # so is this (15 digits, E.164's most)
    return Apps(app_client("telegram_webhook"), app_client("whatsapp_webhook"), app_client("web_chat"), chat, number)


def telegram(apps: Apps, text: str, update_id: int | None = None, chat: int | None = None) -> None:
    response = apps.telegram.post(
        "/", json=update(text, update_id, user_id=chat or apps.chat), headers=TELEGRAM_HEADERS
    )
    assert response.status_code == 200


def whatsapp(apps: Apps, text: str) -> list[str]:
    fields = form(text, sender=f"whatsapp:{apps.number}")
    response = apps.whatsapp.post("/", data=fields, headers=signed(fields))
    assert response.status_code == 200
    return messages_of(response.text)


def new_code(apps: Apps, person: uuid.UUID) -> dict[str, Any]:
    response = apps.web.post("/links", headers=bearer(person))
    assert response.status_code == 201
    body: dict[str, Any] = response.get_json()
    return body


def sent_texts(body: dict[str, Any]) -> list[str]:
    """The texts of a request to the model."""
    return [m["content"][0]["text"] if isinstance(m["content"], list) else m["content"] for m in body["messages"]]


# A store whose named SQL functions fail as a down database does.


def web_turn(turns: Turns, person: uuid.UUID, text: str, external_id: str, *, streamed: bool) -> TurnResult:
    """A web turn in a new conversation of `person`'s, streamed (the page's `stream`) or answered
    whole (`run`): its result."""
    web = turns.memory.create_conversation(person)
    asked = TurnRequest(Surface.WEB, text, external_id, user_id=person, conversation_id=web.id)
    if streamed:
        *_, result = turns.stream(asked)
    else:
        result = turns.run(asked)
    assert isinstance(result, TurnResult)
    return result


class RecordingChannel:
    """A surface's reply channel that keeps what it was given to send (and the part it was asked to
    start from), and answers `delivery`; owed, with `parts` of the text out (default: none more)."""

    def __init__(self, delivery: Delivery = Delivery.DELIVERED, parts: int | None = None) -> None:
        self.delivery = delivery
        self.parts = parts
        self.sent: list[str] = []
        self.first_parts: list[int] = []

    def show_typing(self, until: float) -> None:
        pass

    def draft(self, text: str) -> None:
        pass

    def send(self, text: str, until: float, first_part: int = 0) -> Sent:
        self.sent.append(text)
        self.first_parts.append(first_part)
        done = first_part + 1 if self.delivery is Delivery.DELIVERED else first_part
        return Sent(self.delivery, self.parts if self.parts is not None else done)


class FailingStore:
    """The real store, except that the SQL functions named in `failing` fail as a down database does."""

    def __init__(self, store: MemoryStore, failing: Iterable[str] = ()) -> None:
        self.store = store
        self.failing: set[str] = set(failing)
        self.failing_times: dict[str, int] = {}  # a function's next calls that fail, then it answers
        self.final = False  # the failures are the database's answer that asking again cannot change
        # A function's next call runs, and its answer is lost with the connection: the store asks
        # again with the same arguments (PostgresStore does, once).
        self.answers_lost: set[str] = set()
        self.calls: list[str] = []

    def call(self, function: str, arguments: Mapping[str, JsonScalar]) -> Any:
        self.calls.append(function)
        if self.failing_times.get(function, 0) > 0:
            self.failing_times[function] -= 1
            raise StoreUnavailable(f"{function} failed: OperationalError", final=self.final)
        if function in self.failing:
            raise StoreUnavailable(f"{function} failed: OperationalError", final=self.final)
        if function in self.answers_lost:
            self.answers_lost.discard(function)
            self.store.call(function, arguments)
        return self.store.call(function, arguments)

    def close(self) -> None:
        self.store.close()


# The database, read directly.


def rows(database_url: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(database_url) as connection:
        return connection.execute(query, params).fetchall()


def count(database_url: str, query: str, *params: Any) -> int:
    """The number a `select count(*) ...` query answers."""
    found = rows(database_url, query, *params)
    assert len(found) == 1
    return int(found[0][0])


def messages_read(connection: psycopg.Connection[Any]) -> int:
    """The rows of `messages` `connection`'s transaction has read so far, by an index or a scan."""
    found = connection.execute(
        "select idx_tup_fetch + seq_tup_read from pg_stat_xact_user_tables where relid = 'public.messages'::regclass"
    ).fetchone()
    assert found is not None
    return int(found[0])


def stored_count(database_url: str, user: uuid.UUID) -> int:
    """How many messages are stored for this person."""
    return count(database_url, "select count(*) from messages where user_id = %s", user)


def stored_with_external_id(database_url: str, external_id: str) -> int:
    """How many messages are stored with this external id (an update id, a MessageSid)."""
    return count(database_url, "select count(*) from messages where external_id = %s", external_id)


def stored_turn(database_url: str, external_id: str) -> list[tuple[str, str]]:
    """The message with this external id and its replies, as (role, content)."""
    found = rows(
        database_url,
        """select m.role, m.content from messages m
            where m.id in (select id from messages where external_id = %s)
               or m.in_reply_to in (select id from messages where external_id = %s)
            order by m.created_at, m.id""",
        external_id,
        external_id,
    )
    return [(role, content) for role, content in found]


def as_role(database_url: str, role: str, sub: uuid.UUID | None = None) -> psycopg.Connection:
    """A connection as one of Supabase's roles, with `sub` as the JWT's subject."""
    connection = psycopg.connect(database_url, autocommit=True)  # the role holds for the session
    connection.execute(f"set role {role}")
    if sub is not None:
        connection.execute("select set_config('request.jwt.claims', %s, false)", (json.dumps({"sub": str(sub)}),))
    return connection


def free_port() -> int:
    """A loopback port nobody listens on once the probe is closed."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def execute(database_url: str, query: str, *params: Any) -> None:
    """One statement, committed: a test's own change to the world (the clock moved, a row aged)."""
    with psycopg.connect(database_url) as connection:
        connection.execute(query, params)


def digest_wait_over(database_url: str, person: uuid.UUID) -> None:
    """A person backed off after a failed digest: their wait is over (its end moved a second back,
    as if waited out)."""
    execute(
        database_url,
        "update memory_notes set claimed_until = clock_timestamp() - interval '1 second'"
        " where user_id = %s and claim is null",
        person,
    )


def ogg_lasting(ogg: bytes, seconds: float) -> bytes:
    """An OGG/Opus file whose last page says it lasts `seconds` (its granule position, at 48 kHz,
    less the head's pre-skip): the length core/media/kinds.py reads, forged or not (the CRC is left)."""
    head, last = ogg.find(b"OpusHead"), ogg.rfind(b"OggS")
    pre_skip = int.from_bytes(ogg[head + 10 : head + 12], "little")
    granule = round(seconds * 48_000) + pre_skip
    return ogg[: last + 6] + granule.to_bytes(8, "little", signed=True) + ogg[last + 14 :]


def saying_on_telegram(send_text: Callable[[int, str], Delivery]) -> dict[Surface, SurfaceAdapter]:
    """The deployment's surface registry, with Telegram's follow-ups said by `send_text` (a text of
    one part)."""
    from core.surfaces import telegram

    def send_parts(chat: int, text: str, first_part: int) -> Sent:
        delivery = send_text(chat, text)
        return Sent(delivery, first_part + 1 if delivery is Delivery.DELIVERED else first_part)

    registry = dict(runtime.surfaces())
    registry[Surface.TELEGRAM] = replace(registry[Surface.TELEGRAM], say_follow_up=telegram.say_follow_up(send_parts))
    return registry


# The fixed phrases as a person reads them (core/phrases/), for exact asserts in either language.
ENGLISH = Catalogue().phrases("en")
SPANISH = Catalogue().phrases("es")
# The command menus `crossmem telegram set-webhook` sets (setMyCommands), as Telegram is sent them,
# in every private chat (PRIVATE), and taken out of Telegram's default scope (DEFAULT: groups).
PRIVATE = {"type": "all_private_chats"}
DEFAULT = {"type": "default"}
ENGLISH_MENU = [
    {"command": "start", "description": "Say hello"},
    {"command": "help", "description": "What I can do, and my commands"},
    {"command": "link", "description": "Join this chat to your web account, with the code from the web page"},
    {"command": "unlink", "description": "Stop sharing this chat with your web account"},
    {"command": "forget", "description": "Erase everything I remember of you (I ask first)"},
]
SPANISH_MENU = [
    {"command": "start", "description": "Saludar"},
    {"command": "help", "description": "Qué puedo hacer y mis comandos"},
    {"command": "link", "description": "Unir este chat a tu cuenta web, con el código de la página web"},
    {"command": "unlink", "description": "Dejar de compartir este chat con tu cuenta web"},
    {"command": "forget", "description": "Borrar todo lo que recuerdo de ti (antes te pregunto)"},
]


def will_delete(phrases: Phrases, messages: int, conversations: int, confirm: str, follow_ups: int = 0) -> str:
    """What `/forget` (or `forget`) answers before anything is deleted; `follow_ups`: the person's
    pending ones, which it cancels."""
    pending = phrases.count("count.follow_ups", follow_ups)
    cancelled = " " + phrases.say("forget.follow_ups_cancelled", follow_ups=pending) if follow_ups else ""
    return phrases.say(
        "forget.will_delete",
        messages=phrases.count("count.messages", messages),
        conversations=phrases.count("count.conversations", conversations),
        confirm=confirm,
        minutes=5,
        follow_ups_cancelled=cancelled,
    )


def forgotten(phrases: Phrases, messages: int) -> str:
    """What `/forget confirm` answers once everything is deleted."""
    return phrases.say("forget.forgotten", messages=phrases.count("count.messages", messages))


def crossmem_dev(env: dict[str, str], cwd: Path, port: int) -> subprocess.Popen[str]:
    """`crossmem dev` in its own process, as `make dev` runs it, once it answers /healthz (or the
    test fails with what it printed). The caller stops it with SIGTERM, as a process manager would.
    `-P`: the directory it runs in is not on the import path, as it is not for the console script
    `make dev` runs (`-m` alone put it there, so a module beside it loaded without PYTHONPATH)."""
    server = subprocess.Popen(
        [sys.executable, "-P", "-m", "functions.tools.cli", "dev"],
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return server
        except httpx.HTTPError:
            time.sleep(0.3)
    server.kill()
    pytest.fail("crossmem dev did not answer /healthz: " + (server.stdout.read() if server.stdout else ""))


class MovedClock:
    """A monotonic clock (time.monotonic's stand-in) that moves only when the test moves it, or
    when something sleeps on it (`sleep`, as the Telegram bot waits out a 429)."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


# Hostile and fuzzed requests for every function, shared by the property tests and
# `make bench`'s fuzzing figures.
#
# Authenticated cases start from a valid, correctly signed skeleton (a private Telegram
# text message with the right secret token; a Twilio form signed with the twilio SDK for
# PUBLIC_BASE_URL; a web send with a PyJWT token) and fuzz its fields, so most of them reach
# a turn. Hostile bodies (huge, chunked, deeply nested, invalid UTF-8, NUL bytes, odd
# content types, random bytes) are sent both with valid credentials and without. The
# unauthenticated cases carry no credentials or forged ones: a wrong secret, a forged
# signature, JWTs with `alg: none`, a public key used as an HMAC secret, an RS256 header
# with the kid of the project's EC key, an unknown kid, expired or for another audience.

MAX_MESSAGE_CHARS = 16000
TARGETS = ("telegram_webhook", "whatsapp_webhook", "web_chat")

# The exact statuses each function may answer, with valid credentials and without.
EXPECTED: dict[tuple[str, bool], frozenset[int]] = {
    ("telegram_webhook", True): frozenset({200, 400, 413, 415}),
    ("telegram_webhook", False): frozenset({401}),
    ("whatsapp_webhook", True): frozenset({200, 400, 413, 415}),
    # Without a valid signature: 403, or what the body itself earns before the signature can be
    # checked over it (415 for another content type, 413 past the limit, 400 past the fields).
    ("whatsapp_webhook", False): frozenset({400, 403, 413, 415}),
    ("web_chat", True): frozenset({200, 201, 400, 404, 413, 415}),
    ("web_chat", False): frozenset({401}),
}


def settings_for_fuzzing(jwks_url: str) -> dict[str, str]:
    """What the functions need, on top of a database, a model and the Bot API."""
    return {
        "TWILIO_AUTH_TOKEN": TWILIO_TOKEN,
        "PUBLIC_BASE_URL": PUBLIC_BASE_URL,
        "SUPABASE_JWT_SECRET": JWT_SECRET,
        "SUPABASE_JWKS_URL": jwks_url,
        "MAX_MESSAGE_CHARS": str(MAX_MESSAGE_CHARS),
    }


@dataclass(frozen=True)
class Case:
    target: str
    authenticated: bool
    body: bytes = b""
    content_type: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    method: str = "POST"
    path: str = "/"
    chunked: bool = False  # no Content-Length, a stream the server terminates
    expect_turn: bool | None = None  # True: the model must be asked; None: no claim

    @property
    def expected(self) -> frozenset[int]:
        return EXPECTED[(self.target, self.authenticated)]


def send(client: FlaskClient, case: Case) -> TestResponse:
    headers = dict(case.headers)
    if case.content_type is not None:
        headers["Content-Type"] = case.content_type
    if case.chunked:
        headers["Transfer-Encoding"] = "chunked"
        overrides = {"wsgi.input": io.BytesIO(case.body), "wsgi.input_terminated": True}
        return client.open(case.path, method=case.method, headers=headers, environ_overrides=overrides)
    return client.open(case.path, method=case.method, headers=headers, data=case.body)


# Fresh ids at every draw: a repeated update id or sender would be a redelivery, not a turn.
_ids = itertools.count(int(time.time() * 1000) % 10**9 * 1000)
fresh_id = st.builds(lambda: next(_ids))

PHRASES = st.sampled_from(["hello", "I moved my dentist to Friday", "¿qué tal?", "👋🏽 hi", "Привет", "你好", "x"])
# Text as people and fuzzers write it: any script, emoji, control characters, NUL bytes.
FUZZED_TEXT = st.builds(lambda phrase, tail: phrase + tail, PHRASES, st.text(max_size=300))
ANY_TEXT = st.one_of(
    FUZZED_TEXT,
    st.text(max_size=60),
    st.sampled_from(["", "   ", "\x00", "\x00\x00 ", "/start", "/start abc", "\u202e\u200b"]),
    st.builds(lambda n: "y" * n, st.sampled_from([MAX_MESSAGE_CHARS, MAX_MESSAGE_CHARS + 1, 200_001])),
)
# Hypothesis leans towards small integers and first choices; these odds hold as written.
ONE_IN_FIVE_IS_NOT = st.sampled_from([True, True, True, True, False])
ONE_IN_TEN = st.sampled_from([False] * 9 + [True])
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=10,
)


def converses(text: str) -> bool:
    """Whether this text, in an otherwise valid delivery, must reach the model."""
    stripped = text.strip()
    kept = stripped.replace("\x00", "")
    return (
        bool(kept.strip())
        and len(kept) <= MAX_MESSAGE_CHARS
        and not stripped.startswith("/start")
        and stripped != "/help"
    )


Body = tuple[bytes, str | None, bool]  # the bytes, the content type, sent chunked


# Hostile bodies, made from a valid one.
def hostile_bodies(valid: bytes, content_type: str) -> st.SearchStrategy[Body]:
    huge = valid + b" " * (MAX_BODY_BYTES + 1 - len(valid))
    nested = b"[" * 100_000 + b"]" * 100_000
    return st.one_of(
        st.builds(lambda at: (valid[:at] + b"\xff\xfe" + valid[at:], content_type, False), st.integers(0, len(valid))),
        st.builds(lambda at: (valid[:at] + b"\x00" + valid[at:], content_type, False), st.integers(0, len(valid))),
        st.builds(lambda raw: (raw, content_type, False), st.binary(max_size=300)),
        st.builds(
            lambda kind: (valid, kind, False),
            st.sampled_from(
                [
                    None,
                    "text/plain",
                    "multipart/form-data; boundary=x",
                    "application/json; charset=latin-1",
                    "application/x-www-form-urlencoded",
                    "application/json",
                ]
            ),
        ),
        st.just((valid, content_type, True)),
        st.just((nested, content_type, False)),
        st.just((huge, content_type, False)),
        st.just((huge, content_type, True)),
    )


def maybe_hostile(draw: st.DrawFn, valid: bytes, content_type: str) -> tuple[Body, bool]:
    """The valid body, or one time in ten a hostile one made from it; and whether it is hostile."""
    if draw(ONE_IN_TEN):
        return draw(hostile_bodies(valid, content_type)), True
    return (valid, content_type, False), False


def delivery(target: str, authenticated: bool, body: Body, headers: dict[str, str], plain: bool, text: str) -> Case:
    """A case; a plain one (valid credentials, skeleton and body) with a valid text must reach a turn."""
    raw, content_type, chunked = body
    expect_turn = True if plain and authenticated and converses(text) else None
    return Case(target, authenticated, raw, content_type, headers, chunked=chunked, expect_turn=expect_turn)


# Telegram.


# A person whose Telegram app is in Spanish (the skeleton's language_code): never `update()`'s
# default 4242, whom tests sharing a worker's database expect to be answered in English.
SKELETON_PERSON = 3434


def telegram_skeleton(update_id: int, person: int, text: str) -> dict[str, Any]:
    return {
        "update_id": update_id,
        "message": {
            "message_id": update_id % 100_000 + 1,
            "date": int(time.time()),
            "chat": {"id": person, "type": "private", "first_name": "Ana"},
            "from": {"id": person, "is_bot": False, "first_name": "Ana", "language_code": "es"},
            "text": text,
        },
    }


TELEGRAM_MUTATIONS: dict[str, Any] = {
    "group": lambda update: update["message"]["chat"].update(type="group"),
    "bot sender": lambda update: update["message"]["from"].update(is_bot=True),
    "no sender": lambda update: update["message"].pop("from"),
    "caption": lambda update: update["message"].update(caption=update["message"].pop("text"), photo=[]),
    "edited": lambda update: update.update(edited_message=update.pop("message")),
    "no chat": lambda update: update["message"].pop("chat"),
    "huge ids": lambda update: update["message"]["from"].update(id=2**70),
    "string id": lambda update: update.update(update_id="seven"),
}


@st.composite
def telegram_cases(draw: st.DrawFn, jwks: FakeJwks) -> Case:
    authenticated = draw(ONE_IN_FIVE_IS_NOT)
    secret = TELEGRAM_SECRET if authenticated else draw(st.sampled_from(["", "wrong", TELEGRAM_SECRET + "x", None]))
    headers = {} if secret is None else {"X-Telegram-Bot-Api-Secret-Token": secret}
    text = draw(st.sampled_from([FUZZED_TEXT] * 6 + [ANY_TEXT]).flatmap(lambda text: text))
    update = telegram_skeleton(draw(fresh_id), draw(fresh_id), text)
    mutation = draw(st.sampled_from([None] * 3 * len(TELEGRAM_MUTATIONS) + list(TELEGRAM_MUTATIONS)))
    if mutation is not None:
        TELEGRAM_MUTATIONS[mutation](update)
    extra = draw(st.dictionaries(st.text(max_size=8).map(lambda key: "x_" + key), JSON, max_size=2))
    update.update(extra)
    body, hostile = maybe_hostile(draw, json.dumps(update).encode(), "application/json")
    return delivery("telegram_webhook", authenticated, body, headers, mutation is None and not hostile, text)


# WhatsApp through Twilio.


def twilio_signature(
    fields: Mapping[str, str] | MultiDict[str, str], url: str = PUBLIC_BASE_URL, token: str = TWILIO_TOKEN
) -> str:
    return str(RequestValidator(token).compute_signature(url, fields))


@st.composite
def whatsapp_cases(draw: st.DrawFn, jwks: FakeJwks) -> Case:
    authenticated = draw(ONE_IN_FIVE_IS_NOT)
    text = draw(st.sampled_from([FUZZED_TEXT] * 6 + [ANY_TEXT]).flatmap(lambda text: text))
    number = f"+{draw(fresh_id) % 10**12:012d}"
    form = {
        "SmsMessageSid": "SM" + uuid.uuid4().hex,
        "NumMedia": "0",
        "ProfileName": draw(st.text(max_size=20)),
        "MessageType": "text",
        "WaId": number.lstrip("+"),
        "Body": text,
        "To": "whatsapp:+14155238886",
        "From": f"whatsapp:{number}",
        "MessageSid": "SM" + uuid.uuid4().hex,
        "AccountSid": "AC" + uuid.uuid4().hex,
        "ApiVersion": "2010-04-01",
    }
    mutation = draw(st.sampled_from([None] * 15 + ["bad from", "no sid", "media", "location", "junk field"]))
    if mutation == "bad from":
        form["From"] = draw(st.text(max_size=20))
    elif mutation == "no sid":
        del form["MessageSid"]
    elif mutation == "media":
        form.update(NumMedia=draw(st.sampled_from(["1", "11", "-1", "x"])), MediaContentType0="image/jpeg")
    elif mutation == "location":
        form.update(Body="", Latitude=draw(st.sampled_from(["41.3", "nan", "1e999", "x"])), Longitude="2.1")
    elif mutation == "junk field":
        form[draw(st.text(max_size=10))] = draw(st.text(max_size=50))
    body, hostile = maybe_hostile(draw, urlencode(form).encode(), "application/x-www-form-urlencoded")
    if authenticated:
        # Signed over what the function will parse, so a hostile body still passes the check.
        parsed = MultiDict(parse_qsl(body[0].decode("utf-8", errors="replace"), keep_blank_values=True))
        headers = {"X-Twilio-Signature": twilio_signature(parsed)}
    else:
        forged = draw(st.sampled_from(["none", "other token", "other url", "altered", "garbage"]))
        headers = {
            "none": {},
            "other token": {"X-Twilio-Signature": twilio_signature(form, token="not-the-token")},
            "other url": {"X-Twilio-Signature": twilio_signature(form, url="https://evil.example/whatsapp")},
            "altered": {"X-Twilio-Signature": twilio_signature({**form, "Body": text + "!"})},
            "garbage": {"X-Twilio-Signature": draw(st.text(alphabet="abcdefXYZ=+/0123", min_size=1, max_size=40))},
        }[forged]
    return delivery("whatsapp_webhook", authenticated, body, headers, mutation is None and not hostile, text)


# The web.


def web_token(person: uuid.UUID, **changes: Any) -> str:
    claims = {"sub": str(person), "aud": "authenticated", "role": "authenticated", "exp": int(time.time()) + 3600}
    return jwt.encode({**claims, **changes}, JWT_SECRET, algorithm="HS256")


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def hand_signed(header: dict[str, Any], claims: dict[str, Any], sign: Any) -> str:
    """A token PyJWT refuses to make: the signing input signed by `sign`."""
    signing_input = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}"
    return f"{signing_input}.{_b64(sign(signing_input.encode()))}"


_rsa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
_other_ec = ec.generate_private_key(ec.SECP256R1())


def forged_tokens(jwks: FakeJwks, person: uuid.UUID) -> dict[str, str]:
    claims = {"sub": str(person), "aud": "authenticated", "exp": int(time.time()) + 3600}
    public_pem = jwks.private_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    real = web_token(person)
    head, _, signature = real.split(".")
    return {
        "alg none": jwt.encode(claims, None, algorithm="none"),
        "public key as HMAC secret": hand_signed(
            {"alg": "HS256", "typ": "JWT", "kid": KID},
            claims,
            lambda data: hmac.new(public_pem, data, hashlib.sha256).digest(),
        ),
        "RS256 with the EC key's kid": jwt.encode(claims, _rsa, algorithm="RS256", headers={"kid": KID}),
        "unknown kid": jwt.encode(claims, jwks.private_key, algorithm="ES256", headers={"kid": "not-a-key"}),
        "another EC key, same kid": jwt.encode(claims, _other_ec, algorithm="ES256", headers={"kid": KID}),
        "expired": web_token(person, exp=int(time.time()) - 3600),
        "other audience": web_token(person, aud="anon"),
        "wrong secret": jwt.encode(claims, "not-the-secret-but-32-bytes-long!", algorithm="HS256"),
        "tampered": f"{head}.{_b64(json.dumps({**claims, 'sub': str(uuid.uuid4())}).encode())}.{signature}",
    }


HISTORY_ITEM = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant"]), "content": FUZZED_TEXT},
    optional={
        "surface": st.sampled_from(["web", "telegram", "whatsapp"]),
        "created_at": st.sampled_from(["2026-11-30T09:12:00Z", "2026-11-29T21:40:00+01:00", "2026-11-30T10:00:00"]),
        "id": st.integers(1, 10**6),
    },
)
HOSTILE_HISTORY_ITEM = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "system", ""]), "content": ANY_TEXT},
    optional={
        "created_at": st.sampled_from(
            ["0001-01-01T00:00:00+05:00", "9999-12-31T23:00:00-05:00", "0001-01-01T00:00:00", "not a date", 0]
        ),
        "id": st.integers(-(2**70), 2**70),
    },
)


@st.composite
def web_cases(draw: st.DrawFn, jwks: FakeJwks) -> Case:
    authenticated = draw(ONE_IN_FIVE_IS_NOT)
    person = uuid.uuid4()
    if authenticated:
        token = (
            jwks.sign({"sub": str(person), "aud": "authenticated", "exp": int(time.time()) + 3600})
            if draw(st.booleans())
            else web_token(person)
        )
        authorization: str | None = f"Bearer {token}"
    else:
        kind = draw(st.sampled_from(["missing", "not bearer", "garbage", "forged"]))
        authorization = {
            "missing": None,
            "not bearer": f"Basic {_b64(b'user:pass')}",
            "garbage": "Bearer " + draw(st.text(alphabet="abcXYZ012.-_", max_size=60)),
            "forged": "Bearer " + draw(st.sampled_from(sorted(forged_tokens(jwks, person).values()))),
        }[kind]
    headers = {} if authorization is None else {"Authorization": authorization}
    route = draw(st.sampled_from(["send"] * 20 + ["list", "new", "page", "nowhere"]))
    if route != "send":
        method, path = {
            "list": ("GET", "/conversations"),
            "new": ("POST", "/conversations"),
            "page": ("GET", f"/conversations/{uuid.uuid4()}/messages?before=x&limit=-5"),
            "nowhere": ("PUT", "/nowhere/" + draw(st.text(alphabet="abc/", max_size=12))),
        }[route]
        body = json.dumps({"title": draw(st.text(max_size=250))}).encode() if route == "new" else b""
        return Case("web_chat", authenticated, body, "application/json", headers, method=method, path=path)
    text = draw(st.sampled_from([FUZZED_TEXT] * 6 + [ANY_TEXT]).flatmap(lambda text: text))
    send_body: dict[str, Any] = {"message": text, "client_message_id": f"fuzz-{draw(fresh_id)}"}
    shape = draw(st.sampled_from([None] * 6 + ["history"] * 3 + ["hostile history", "conversation", "junk"]))
    if shape == "history":
        send_body["history"] = draw(st.lists(HISTORY_ITEM, max_size=20))
    elif shape == "hostile history":
        send_body["history"] = draw(st.lists(HOSTILE_HISTORY_ITEM, min_size=1, max_size=5))
    elif shape == "conversation":
        send_body["conversation_id"] = draw(st.sampled_from([str(uuid.uuid4()), "nope", "", None]))
    elif shape == "junk":
        send_body.update(draw(st.dictionaries(st.sampled_from(["message", "history", "client_message_id"]), JSON)))
    body, hostile = maybe_hostile(draw, json.dumps(send_body).encode(), "application/json")
    return delivery("web_chat", authenticated, body, headers, shape in (None, "history") and not hostile, text)


STRATEGIES = {"telegram_webhook": telegram_cases, "whatsapp_webhook": whatsapp_cases, "web_chat": web_cases}


def hold_a_follow_up(database_url: str, start: TurnStart, number: str, content: str = "Stretch now.") -> None:
    """A follow-up ("Stretch now.") held for the person of `start` (outside WhatsApp's window), as
    the job holds one; one held after it was due after it."""
    execute(
        database_url,
        "insert into follow_ups (user_id, conversation_id, surface, sender, content, due_at, status, next_attempt_at)"
        " values (%s, %s, 'whatsapp', %s, %s, clock_timestamp(), 'held', now())",
        start.user_id,
        start.conversation_id,
        number,
        content,
    )


def answered_once_with_held(memory: Memory, database_url: str, number: str, *held: str) -> TurnStart:
    """`number` wrote on WhatsApp once and was answered; then a follow-up (`held`, default "Stretch
    now.") held for them, as the job holds one outside the window. Their first turn's start."""
    first = memory.begin_turn(Person(sender_id=number), Surface.WHATSAPP, "hi", f"SM{number}-hi", sender=number)
    assert first.user_id is not None and first.message_id is not None
    memory.finish_turn(first.user_id, first.message_id, "hello", attempt=first.attempt)
    for content in held or ("Stretch now.",):
        hold_a_follow_up(database_url, first, number, content)
    return first
