"""The soak's people, as a locust file: `make soak` runs it in a process of its own.

Each locust user is one person writing one message at a time and moving between surfaces.
The first three users are the owner (one on each surface, at once, on the owner-policy
deployment); the others are `auto` people. Deliveries retry as the platforms do: Telegram
and Twilio deliver the same update or form again, later, after a non-2xx answer or a
timeout; the web page sends the same client message id again. Every message is recorded as
a JSON line in SOAK_RECORDS for bench/soak.py to check against the database.

Settings come from the environment (SOAK_*), written by bench/soak.py.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import time
import uuid
from typing import Any

import gevent
import jwt
from locust import HttpUser, between, task

from bench.soak_identities import OWNER_DEVICES, telegram_id, web_user, whatsapp_sender
from core.channels.whatsapp import sign_form

ENV = os.environ
RECORDS = ENV.get("SOAK_RECORDS", "soak-records.jsonl")
STOP_AT = float(ENV.get("SOAK_STOP_AT", "0"))  # epoch seconds: no new message after this
GIVE_UP_AT = float(ENV.get("SOAK_GIVE_UP_AT", "0"))  # epoch seconds: no retry after this
TIMEOUT_S = {"telegram": 20.0, "whatsapp": 15.0, "web": 30.0}  # Twilio waits 15 s
PACE = float(ENV.get("SOAK_PACE", "1"))  # a person's pauses, scaled (the quick soak's are a tenth)
WORDS = "budget flight dentist Friday sister Carmen train museum lunch invoice garden".split()

_numbers = itertools.count()


class Person(HttpUser):
    wait_time = between(10 * PACE, 30 * PACE)
    host = ENV.get("SOAK_WEB_URL", "http://127.0.0.1:1")

    def on_start(self) -> None:
        self.person = next(_numbers)
        self.owner = self.person < OWNER_DEVICES
        if self.owner:
            self.surface = ("telegram", "whatsapp", "web")[self.person]
        else:
            self.surface = random.choice(("telegram", "whatsapp"))
        self.sequence = 0
        self.conversation_id: str | None = None
        self.update_ids = itertools.count(self.person * 1_000_000 + 1)
        # A first message on each surface before the measured phases: from then on every
        # thread has history, so an answer shown only its new message was made without memory.
        surfaces = [self.surface] if self.owner else random.sample(("telegram", "whatsapp", "web"), 3)
        for surface in surfaces:
            gevent.sleep(random.uniform(0, 10 * PACE))
            self.surface = surface
            self.say_something()

    @task
    def say_something(self) -> None:
        if time.time() >= STOP_AT:
            gevent.sleep(1)
            return
        if not self.owner and self.sequence > 2 and random.random() < 0.3:
            self.surface = random.choice([s for s in ("telegram", "whatsapp", "web") if s != self.surface])
        self.sequence += 1
        token = f"p{self.person}-m{self.sequence}"
        text = f"message {token}: " + " ".join(random.choices(WORDS, k=random.randint(3, 12)))
        record: dict[str, Any] = {
            "person": self.person,
            "owner": self.owner,
            "surface": self.surface,
            "token": token,
            "sequence": self.sequence,
            "sent_at": time.time(),
            "statuses": [],
        }
        send = {"telegram": self._telegram, "whatsapp": self._whatsapp, "web": self._web}[self.surface]
        send(text, record)
        with open(RECORDS, "a") as records:
            records.write(json.dumps(record) + "\n")

    def _deliver(self, record: dict[str, Any], attempt: Any) -> Any:
        """Deliver until a 2xx answer, waiting 1 to 3 s after a failure, as a platform retries."""
        while True:
            began = time.perf_counter()
            response = attempt()  # locust's client answers a timeout or a refused connection with status 0
            status = response.status_code
            record["statuses"].append(status)
            if 200 <= status < 300:
                record["answered"] = True
                record["latency_ms"] = round((time.perf_counter() - began) * 1000, 1)
                return response
            if time.time() > GIVE_UP_AT:
                record["answered"] = False
                return None
            gevent.sleep(random.uniform(1, 3))

    def _telegram(self, text: str, record: dict[str, Any]) -> None:
        update_id = next(self.update_ids)
        record["external_id"] = str(update_id)
        chat = telegram_id(self.person)
        update = {
            "update_id": update_id,
            "message": {
                "message_id": self.sequence,
                "date": int(time.time()),
                "chat": {"id": chat, "type": "private", "first_name": "Soak"},
                "from": {"id": chat, "is_bot": False, "first_name": "Soak"},
                "text": text,
            },
        }
        url = ENV["SOAK_OWNER_TELEGRAM_URL" if self.owner else "SOAK_TELEGRAM_URL"]
        headers = {"X-Telegram-Bot-Api-Secret-Token": ENV["SOAK_TELEGRAM_SECRET"]}
        self._deliver(
            record,
            lambda: self.client.post(url, json=update, headers=headers, timeout=TIMEOUT_S["telegram"], name="telegram"),
        )

    def _whatsapp(self, text: str, record: dict[str, Any]) -> None:
        sid = "SM" + uuid.uuid4().hex
        record["external_id"] = sid
        form = {
            "MessageSid": sid,
            "AccountSid": "AC" + "0" * 32,
            "From": f"whatsapp:{whatsapp_sender(self.person)}",
            "To": "whatsapp:+14155238886",
            "Body": text,
            "NumMedia": "0",
        }
        public_url = ENV["SOAK_PUBLIC_BASE_URL"]
        signature = sign_form(ENV["SOAK_TWILIO_TOKEN"], public_url, form)
        url = ENV["SOAK_OWNER_WHATSAPP_URL" if self.owner else "SOAK_WHATSAPP_URL"]
        headers = {"X-Twilio-Signature": signature}
        response = self._deliver(
            record,
            lambda: self.client.post(url, data=form, headers=headers, timeout=TIMEOUT_S["whatsapp"], name="whatsapp"),
        )
        if response is not None:
            record["answer"] = response.text

    def _web(self, text: str, record: dict[str, Any]) -> None:
        client_id = f"web-{uuid.uuid4()}"
        record["external_id"] = client_id
        record["new_conversation"] = self.conversation_id is None
        sub = ENV["SOAK_OWNER_USER_ID"] if self.owner else web_user(self.person)
        now = int(time.time())
        claims = {"sub": sub, "aud": "authenticated", "role": "authenticated", "iat": now, "exp": now + 3600}
        token = jwt.encode(claims, ENV["SOAK_JWT_SECRET"], algorithm="HS256")
        body: dict[str, Any] = {"message": text, "client_message_id": client_id}
        if self.conversation_id:
            body["conversation_id"] = self.conversation_id
        streamed = random.random() < 0.5
        headers = {"Authorization": f"Bearer {token}"}
        if streamed:
            headers["Accept"] = "text/event-stream"
        response = self._deliver(
            record,
            lambda: self.client.post(
                ENV["SOAK_WEB_URL"], json=body, headers=headers, timeout=TIMEOUT_S["web"], name="web"
            ),
        )
        if response is None:
            return
        result = _done_event(response.text) if streamed else response.json()
        record["answer"] = result.get("reply")
        self.conversation_id = result.get("conversation_id") or self.conversation_id


def _done_event(body: str) -> dict[str, Any]:
    for block in body.split("\n\n"):
        if block.startswith("event: done\n"):
            return dict(json.loads(block.split("data: ", 1)[1]))
    return {}
