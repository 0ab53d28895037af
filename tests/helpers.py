"""What several test modules share, defined once: the secrets the tests configure, each app's
requests as its sender makes them, the function under test as a cold start builds it, counting
rows, and a free port. The fixtures built on these are in the conftest files; a test module
imports from here (and from tests/fakes, tests/database), never from another test module."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import jwt
import psycopg
import pytest
from flask.testing import FlaskClient
from functions_framework import create_app
from twilio.request_validator import RequestValidator

from core.digest import DigestLimits
from core.errors import StoreUnavailable
from core.media import MediaLimits
from core.memory import ContextLimits, TurnBudget
from core.phrases.catalogue import Catalogue, Phrases
from core.stores.store import JsonScalar, MemoryStore
from core.surfaces import Delivery, Surface, SurfaceAdapter
from functions import runtime
from functions.settings import Settings
from tests.fakes.anthropic_api import FakeAnthropic
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


def signed(fields: dict[str, str], url: str = PUBLIC_BASE_URL, token: str = TWILIO_TOKEN) -> dict[str, str]:
    return {"X-Twilio-Signature": RequestValidator(token).compute_signature(url, fields)}


def messages_of(response_text: str) -> list[str]:
    """The messages of a TwiML answer."""
    root = ET.fromstring(response_text)
    assert root.tag == "Response"
    return [element.text or "" for element in root.findall("Message")]


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
    chat = 515100042 + uuid.uuid4().int % 10**4 * 10**5
    number = f"+3460{uuid.uuid4().int % 10**4:04d}7888"
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


class FailingStore:
    """The real store, except that the SQL functions named in `failing` fail as a down database does."""

    def __init__(self, store: MemoryStore, failing: Iterable[str] = ()) -> None:
        self.store = store
        self.failing: set[str] = set(failing)

    def call(self, function: str, arguments: Mapping[str, JsonScalar]) -> Any:
        if function in self.failing:
            raise StoreUnavailable(f"{function} failed: OperationalError")
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


def ogg_lasting(ogg: bytes, seconds: float) -> bytes:
    """An OGG/Opus file whose last page says it lasts `seconds` (its granule position, at 48 kHz,
    less the head's pre-skip): the length core/media.py reads, forged or not (the CRC is left)."""
    head, last = ogg.find(b"OpusHead"), ogg.rfind(b"OggS")
    pre_skip = int.from_bytes(ogg[head + 10 : head + 12], "little")
    granule = round(seconds * 48_000) + pre_skip
    return ogg[: last + 6] + granule.to_bytes(8, "little", signed=True) + ogg[last + 14 :]


def saying_on_telegram(send_text: Callable[[int, str], Delivery]) -> dict[Surface, SurfaceAdapter]:
    """The deployment's surface registry, with Telegram's follow-ups said by `send_text`."""
    from core.surfaces import telegram

    registry = dict(runtime.surfaces())
    registry[Surface.TELEGRAM] = replace(registry[Surface.TELEGRAM], say_follow_up=telegram.say_follow_up(send_text))
    return registry


# The fixed phrases as a person reads them (core/phrases/), for exact asserts in either language.
ENGLISH = Catalogue().phrases("en")
SPANISH = Catalogue().phrases("es")


def will_delete(phrases: Phrases, messages: int, conversations: int, confirm: str) -> str:
    """What `/forget` (or `forget`) answers before anything is deleted."""
    return phrases.say(
        "forget.will_delete",
        messages=phrases.count("count.messages", messages),
        conversations=phrases.count("count.conversations", conversations),
        confirm=confirm,
        minutes=5,
    )


def forgotten(phrases: Phrases, messages: int) -> str:
    """What `/forget confirm` answers once everything is deleted."""
    return phrases.say("forget.forgotten", messages=phrases.count("count.messages", messages))


def crossmem_dev(env: dict[str, str], cwd: Path, port: int) -> subprocess.Popen[str]:
    """`crossmem dev` in its own process, as `make dev` runs it, once it answers /healthz (or the
    test fails with what it printed). The caller stops it with SIGTERM, as a process manager would."""
    server = subprocess.Popen(
        [sys.executable, "-m", "functions.tools.cli", "dev"],
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
