"""web_chat end to end: real function, real JWTs (PyJWT), real Postgres, fake Anthropic."""

from __future__ import annotations

import json
import time
import types
import uuid
from typing import Any

import jwt
import psycopg
import pytest
from flask.testing import FlaskClient

from core.models import Surface
from core.turn.request import TurnRequest
from functions import runtime
from tests.fakes.anthropic_api import FakeAnthropic
from tests.fakes.jwks import FakeJwks
from tests.fakes.local_server import LocalServer, QuietHandler
from tests.helpers import CORS_ORIGIN, JWT_SECRET, app_client, as_owner, bearer, claims, stored_count


def test_a_telegram_message_reaches_the_web_exactly_once(
    web: FlaskClient, environment: pytest.MonkeyPatch, owner: uuid.UUID, fake_anthropic: FakeAnthropic
) -> None:
    as_owner(environment, owner)
    client = app_client("web_chat")
    fake_anthropic.answer = lambda body: "Noted."
    said = runtime.turns().run(
        TurnRequest(Surface.TELEGRAM, "On Telegram: I'm allergic to penicillin", "9", sender_id="4242")
    )
    conversation = client.post("/conversations", json={"title": "health"}, headers=bearer(owner)).get_json()
    # The client already shows the Telegram message (it opened that thread before): same id, sent back as history.
    history = [
        {
            "id": said.message_id,
            "role": "user",
            "content": "On Telegram: I'm allergic to penicillin",
            "surface": "telegram",
        },
        {"id": said.reply_id, "role": "assistant", "content": said.reply, "surface": "telegram"},
    ]
    response = client.post(
        "/",
        json={
            "message": "Which antibiotics should I avoid?",
            "conversation_id": conversation["id"],
            "client_message_id": "c-1",
            "history": history,
        },
        headers=bearer(owner),
    )
    assert response.status_code == 200, response.get_json()
    body = response.get_json()
    assert body["outcome"] == "answered" and body["conversation_id"] == conversation["id"]
    sent = json.dumps(fake_anthropic.requests[-1]["messages"])
    assert sent.count("allergic to penicillin") == 1
    texts = [m["content"][0]["text"] for m in fake_anthropic.requests[-1]["messages"]]
    assert texts[-1].startswith("[web · ") and texts[-1].endswith("Which antibiotics should I avoid?")
    # Without a client history the stored thread is used, and the Telegram turn is prepended once.
    client.post("/", json={"message": "And painkillers?", "conversation_id": conversation["id"]}, headers=bearer(owner))
    assert json.dumps(fake_anthropic.requests[-1]["messages"]).count("allergic to penicillin") == 1


def test_a_declined_turn_marked_in_the_clients_history_is_left_out_with_its_message(
    web: FlaskClient, fake_anthropic: FakeAnthropic
) -> None:
    """Today's body: a history item `declined` (as the history route marks a declined turn's
    reply) is left out, and the person's message before it."""
    fake_anthropic.answer = lambda body: "Sure."
    person = uuid.uuid4()
    conversation = web.post("/conversations", headers=bearer(person)).get_json()
    history = [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "Hi!"},
        {"role": "user", "content": "something the model declined"},
        {"role": "assistant", "content": "I can't help with that one.", "declined": True},
    ]
    body = {"message": "a poem, then", "conversation_id": conversation["id"], "history": history}
    assert web.post("/", json=body, headers=bearer(person)).get_json()["outcome"] == "answered"
    texts = [m["content"][0]["text"] for m in fake_anthropic.requests[-1]["messages"]]
    assert [text.split("] ", 1)[-1] for text in texts] == ["hello", "Hi!", "a poem, then"]


def test_a_retried_send_is_stored_once(web: FlaskClient, database_url: str, fake_anthropic: FakeAnthropic) -> None:
    person = uuid.uuid4()
    for _ in range(3):
        response = web.post("/", json={"message": "hello", "client_message_id": "retry-1"}, headers=bearer(person))
        assert response.status_code == 200
    assert stored_count(database_url, person) == 2 and len(fake_anthropic.requests) == 1


def test_a_client_id_names_one_message_of_the_person_and_another_conversation_is_refused(
    web: FlaskClient, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    """docs/api.md: a page whose ids repeat in every chat (`msg-1` in each) gets 409 for the second
    chat's, with nothing stored or asked, not the first chat's reply; a retry without a
    conversation, or naming its own, is answered with the stored reply."""
    fake_anthropic.answer = lambda body: "About the boiler: call the plumber."
    person = uuid.uuid4()
    first = web.post("/", json={"message": "the boiler broke", "client_message_id": "msg-1"}, headers=bearer(person))
    chat = first.get_json()["conversation_id"]
    other = web.post("/conversations", headers=bearer(person)).get_json()["id"]
    reused = web.post(
        "/",
        json={"message": "a poem please", "conversation_id": other, "client_message_id": "msg-1"},
        headers=bearer(person),
    )
    assert (reused.status_code, reused.get_json()) == (
        409,
        {
            "error": "message_id_in_another_conversation",
            "message": "this message id is another message of yours (in another conversation, or one you deleted):"
            " give each message an id of its own across conversations (useChat's generateId does)",
        },
    )
    for retry in ({}, {"conversation_id": chat}):
        again = web.post(
            "/", json={"message": "the boiler broke", "client_message_id": "msg-1", **retry}, headers=bearer(person)
        ).get_json()
        assert (again["outcome"], again["reply"], again["conversation_id"]) == (
            "redelivered",
            "About the boiler: call the plumber.",
            chat,
        )
    assert stored_count(database_url, person) == 2 and len(fake_anthropic.requests) == 1
    # Its conversation deleted, the id is still one the person used: refused in another one, not
    # answered with nothing; without a conversation, or in the deleted one, never stored again.
    assert web.delete(f"/conversations/{chat}", headers=bearer(person)).status_code == 204
    after = web.post(
        "/",
        json={"message": "a poem please", "conversation_id": other, "client_message_id": "msg-1"},
        headers=bearer(person),
    )
    assert (after.status_code, after.get_json()) == (reused.status_code, reused.get_json())
    # Someone else's conversation is not theirs to be refused in: answered as a missing one is.
    stranger = web.post("/conversations", headers=bearer(uuid.uuid4())).get_json()["id"]
    for retry in ({}, {"conversation_id": chat}, {"conversation_id": stranger}):
        again = web.post(
            "/", json={"message": "the boiler broke", "client_message_id": "msg-1", **retry}, headers=bearer(person)
        )
        assert (again.status_code, again.get_json()["outcome"]) == (200, "duplicate")
    assert stored_count(database_url, person) == 0 and len(fake_anthropic.requests) == 1


def test_a_message_sent_without_a_client_id_is_listed_under_the_key_made_for_it(
    web: FlaskClient, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    """docs/api.md: the history route gives the key the server made (`web-<uuid>`), which sends
    the message again stored once."""
    person = uuid.uuid4()
    sent = web.post("/", json={"message": "hello"}, headers=bearer(person)).get_json()
    chat = sent["conversation_id"]
    page = web.get(f"/conversations/{chat}/messages", headers=bearer(person)).get_json()["messages"]
    made, reply = (message["client_id"] for message in page)
    assert made.startswith("web-") and uuid.UUID(made[4:]) and reply is None
    again = web.post(
        "/", json={"message": "hello", "conversation_id": chat, "client_message_id": made}, headers=bearer(person)
    )
    assert (again.get_json()["outcome"], again.get_json()["message_id"]) == ("redelivered", sent["message_id"])
    assert stored_count(database_url, person) == 2 and len(fake_anthropic.requests) == 1


def test_an_es256_token_from_the_projects_jwks_is_accepted(
    environment: pytest.MonkeyPatch, jwks: FakeJwks, fake_anthropic: FakeAnthropic
) -> None:
    environment.setenv("SUPABASE_JWKS_URL", jwks.url)
    client = app_client("web_chat")
    person = uuid.uuid4()
    headers = {"Authorization": "Bearer " + jwks.sign(claims(person))}
    assert client.get("/conversations", headers=headers).status_code == 200
    assert client.post("/", json={"message": "hi"}, headers=headers).status_code == 200
    assert jwks.fetches == 1  # fetched once, then cached by the instance
    forged = {"Authorization": "Bearer " + FakeJwks().sign(claims(person))}  # same kid, another key
    assert client.get("/conversations", headers=forged).status_code == 401


def test_a_jwks_that_cannot_be_reached_is_503_not_401(
    environment: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic
) -> None:
    """The project's keys unreachable is a failure of ours: a 401 would have the page renew a valid
    token, then sign the person out."""
    down = FakeJwks()
    environment.setenv("SUPABASE_JWKS_URL", down.url)
    client = app_client("web_chat")
    headers = {"Authorization": "Bearer " + down.sign(claims(uuid.uuid4()))}
    down.close()
    response = client.get("/conversations", headers=headers)
    assert (response.status_code, response.get_json()["error"]) == (503, "auth_unavailable")
    assert response.get_json()["message"].startswith("the project's signing keys could not be fetched: ")


@pytest.mark.parametrize(
    "answer",
    [
        b"<html>Supabase is under maintenance</html>",  # not JSON
        b'{"keys": []}',  # a key set with no key
        b'{"keys": [{"kty": "EC"}]}',  # no usable key
        b'{"keys": [{"kty": "oct", "k": "c2VjcmV0"}]}',  # a key, but none to sign with (no kid)
        b"[]",  # JSON, not a key set
        "<html>Wartungsarbeiten \u2013 bitte sp\u00e4ter</html>".encode("latin-1", "replace"),  # not UTF-8
        b"[" * 100_000,  # JSON nested past Python's recursion limit
    ],
    ids=["html", "no-keys", "unusable-key", "no-signing-key", "not-an-object", "latin-1", "deep"],
)
def test_a_jwks_that_answers_no_usable_key_set_is_503_not_a_crash(
    environment: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic, answer: bytes
) -> None:
    """An endpoint that answers, but not with a usable key set, is a failure of ours as when it
    cannot be reached: never a 500, nor a 401 that signs a person with a valid token out."""

    class Handler(QuietHandler):
        def do_GET(self) -> None:
            self.answer_bytes(200, answer, "application/json")

    server = LocalServer(Handler)
    try:
        environment.setenv("SUPABASE_JWKS_URL", f"{server.url}/auth/v1/.well-known/jwks.json")
        client = app_client("web_chat")
        response = client.get(
            "/conversations", headers={"Authorization": "Bearer " + FakeJwks().sign(claims(uuid.uuid4()))}
        )
        assert (response.status_code, response.get_json()["error"]) == (503, "auth_unavailable")
        assert response.get_json()["message"].startswith("the project's signing keys are not a usable key set: ")
    finally:
        server.close()


@pytest.mark.parametrize(
    "answer",
    # (JSON that is no key set, `[]`, PyJWT answers there as for a key the set lacks: a 401)
    [b"<html>Supabase is under maintenance</html>", b"[" * 100_000],
    ids=["html", "deep"],
)
def test_a_jwks_fetched_again_for_an_unknown_key_that_answers_no_key_set_is_503_not_a_crash(
    environment: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic, answer: bytes
) -> None:
    """A token naming a key the set lacks has PyJWT fetch the set again: that fetch failing is ours
    too (it was a bare 500), and the next token of a known key is still accepted."""
    keys = FakeJwks()
    fetches: list[str] = []

    class Handler(QuietHandler):
        def do_GET(self) -> None:
            fetches.append(self.path)
            if len(fetches) == 1:
                self.answer_json(200, keys.document)
            else:
                self.answer_bytes(200, answer, "application/json")

    server = LocalServer(Handler)
    try:
        environment.setenv("SUPABASE_JWKS_URL", f"{server.url}/auth/v1/.well-known/jwks.json")
        client = app_client("web_chat")
        person = uuid.uuid4()
        known = {"Authorization": "Bearer " + keys.sign(claims(person))}
        assert client.get("/conversations", headers=known).status_code == 200
        later = time.monotonic() + 60  # past PyJWT's cooldown (30 s) between two fetches
        environment.setattr(jwt.jwks_client, "time", types.SimpleNamespace(monotonic=lambda: later))
        unknown = jwt.encode(claims(person), keys.private_key, algorithm="ES256", headers={"kid": "another"})
        response = client.get("/conversations", headers={"Authorization": "Bearer " + unknown})
        assert (response.status_code, response.get_json()["error"]) == (503, "auth_unavailable")
        assert response.get_json()["message"].startswith("the project's signing keys are not a usable key set: ")
        assert len(fetches) == 2
        assert client.get("/conversations", headers=known).status_code == 200
    finally:
        server.close()


def test_a_token_naming_a_key_the_jwks_lacks_is_401(
    environment: pytest.MonkeyPatch, jwks: FakeJwks, fake_anthropic: FakeAnthropic
) -> None:
    environment.setenv("SUPABASE_JWKS_URL", jwks.url)
    client = app_client("web_chat")
    token = jwt.encode(claims(uuid.uuid4()), jwks.private_key, algorithm="ES256", headers={"kid": "another"})
    response = client.get("/conversations", headers={"Authorization": "Bearer " + token})
    assert (response.status_code, response.get_json()["message"]) == (401, "the token's signing key is unknown")


@pytest.mark.parametrize(
    "case",
    [
        "expired",
        "wrong-audience",
        "tampered",
        "wrong-secret",
        "missing",
        "not-bearer",
        "no-sub",
        "sub-no-uuid",
        "alg-none",
    ],
)
def test_bad_tokens_are_401_and_store_nothing(
    web: FlaskClient, case: str, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    person = uuid.uuid4()
    headers: dict[str, str]
    if case == "expired":
        headers = bearer(person, exp=int(time.time()) - 3600)
    elif case == "wrong-audience":
        headers = bearer(person, aud="anon")
    elif case == "tampered":
        token = bearer(person)["Authorization"]
        header, payload, signature = token.removeprefix("Bearer ").split(".")
        other = jwt.encode(claims(uuid.uuid4()), "x" * 32, algorithm="HS256").split(".")[1]
        headers = {"Authorization": f"Bearer {header}.{other}.{signature}"}
    elif case == "wrong-secret":
        headers = bearer(person, secret="another-secret-of-32-bytes-length!")
    elif case == "missing":
        headers = {}
    elif case == "not-bearer":
        headers = {"Authorization": "Basic dXNlcjpwYXNz"}
    elif case == "no-sub":
        token = jwt.encode({k: v for k, v in claims(person).items() if k != "sub"}, JWT_SECRET, algorithm="HS256")
        headers = {"Authorization": f"Bearer {token}"}
    elif case == "sub-no-uuid":  # signed with the project's secret, for no user (a service's token)
        token = jwt.encode({**claims(person), "sub": "cron"}, JWT_SECRET, algorithm="HS256")
        headers = {"Authorization": f"Bearer {token}"}
    else:
        headers = {"Authorization": "Bearer " + jwt.encode(claims(person), None, algorithm="none")}
    response = web.post("/", json={"message": "let me in"}, headers=headers)
    assert response.status_code == 401 and response.get_json()["error"] == "unauthorized"
    assert response.get_json()["message"]
    if case == "sub-no-uuid":
        assert response.get_json()["message"] == "the token's subject is not a user id"
    assert stored_count(database_url, person) == 0 and fake_anthropic.requests == []


def test_the_conversations_are_paged_the_latest_active_first(web: FlaskClient, database_url: str) -> None:
    """A person with more conversations than a page reaches every one (GET /conversations gave the
    50 latest and no way to the others), once each, while the last one listed is talked in again
    or deleted."""
    person = uuid.uuid4()
    made = [web.post("/conversations", json={"title": f"c{n}"}, headers=bearer(person)).get_json() for n in range(6)]

    def say(conversation: int) -> None:
        said = {"message": "back to it", "conversation_id": made[conversation]["id"]}
        assert web.post("/", json=said, headers=bearer(person)).status_code == 200

    def page(query: str) -> tuple[list[str], bool, str | None]:
        response = web.get(f"/conversations{query}", headers=bearer(person))
        assert response.status_code == 200, response.get_json()
        body = response.get_json()
        return [c["title"] for c in body["conversations"]], body["has_more"], body["next"]

    say(1)
    assert page("") == (["c1", "c5", "c4", "c3", "c2", "c0"], False, None)
    first, more, after_first = page("?limit=2")
    assert (first, more) == (["c1", "c5"], True)
    second, more, after_second = page(f"?limit=2&before={after_first}")
    assert (second, more) == (["c4", "c3"], True)
    say(3)  # the last one listed, talked in again, then deleted: the next page goes on all the same
    assert page(f"?limit=2&before={after_second}") == (["c2", "c0"], False, None)
    assert web.delete(f"/conversations/{made[3]['id']}", headers=bearer(person)).status_code == 204
    assert page(f"?limit=2&before={after_second}") == (["c2", "c0"], False, None)
    assert page(f"?limit=1&before={after_second}")[:2] == (["c2"], True)

    with psycopg.connect(database_url, autocommit=True) as connection:  # a tie: by id, each once
        connection.execute("update conversations set updated_at = '2026-12-01T12:00:00Z' where user_id = %s", (person,))
    listed, query = [], "?limit=2"
    while True:
        titles, more, after = page(query)
        listed += titles
        if not more:
            break
        query = f"?limit=2&before={after}"
    by_id = sorted((c["id"], c["title"]) for c in made if c["title"] != "c3")
    assert listed == [title for _, title in by_id]

    refused = {
        "?before=c1": "before must be a page's `next`, not 'c1'",
        f"?before={made[0]['id']}": f"before must be a page's `next`, not '{made[0]['id']}'",
        "?limit=0": "limit must be a whole number from 1 to 200, not '0'",
        "?limit=201": "limit must be a whole number from 1 to 200, not '201'",
    }
    for query, reason in refused.items():
        response = web.get(f"/conversations{query}", headers=bearer(person))
        assert (response.status_code, response.get_json()["message"]) == (400, reason), query


def test_a_person_holds_at_most_the_empty_conversations_the_setting_allows(
    environment: pytest.MonkeyPatch, database_url: str
) -> None:
    """POST /conversations stores a row no turn and no budget counts: past
    EMPTY_CONVERSATIONS_PER_PERSON empty ones it is refused with the reason, nothing stored, until
    the person writes in one or deletes one. Another person's empty ones are not theirs."""
    for name, value in {"SUPABASE_JWT_SECRET": JWT_SECRET, "EMPTY_CONVERSATIONS_PER_PERSON": "2"}.items():
        environment.setenv(name, value)
    web = app_client("web_chat")
    alice, mallory = uuid.uuid4(), uuid.uuid4()

    def start(person: uuid.UUID) -> tuple[int, Any]:
        response = web.post("/conversations", json={"title": "next"}, headers=bearer(person))
        return response.status_code, response.get_json()

    def conversations(person: uuid.UUID) -> int:
        with psycopg.connect(database_url) as connection:
            row = connection.execute("select count(*) from conversations where user_id = %s", (person,)).fetchone()
        assert row is not None
        return int(row[0])

    first, second = start(alice)[1], start(alice)[1]
    refused = {
        "error": "too_many_empty_conversations",
        "message": "you already have 2 conversations you have not written in: write in one of them, or delete"
        " one, before starting another",
    }
    assert start(alice) == (409, refused)
    assert conversations(alice) == 2
    assert start(mallory)[0] == 201  # Alice's empty conversations are not Mallory's
    said = {"message": "the trip", "conversation_id": first["id"]}
    assert web.post("/", json=said, headers=bearer(alice)).status_code == 200
    assert start(alice)[0] == 201  # written in: no longer empty
    assert start(alice) == (409, refused)
    assert web.delete(f"/conversations/{second['id']}", headers=bearer(alice)).status_code == 204
    fourth = start(alice)
    assert fourth[0] == 201
    # a first message without a conversation starts one written in, which does not count
    assert web.post("/", json={"message": "a new thread"}, headers=bearer(alice)).status_code == 200
    assert web.delete(f"/conversations/{fourth[1]['id']}", headers=bearer(alice)).status_code == 204
    assert start(alice)[0] == 201
    assert (conversations(alice), conversations(mallory)) == (4, 1)


def test_nobody_reaches_another_persons_conversation(web: FlaskClient, database_url: str) -> None:
    alice, mallory = uuid.uuid4(), uuid.uuid4()
    conversation = web.post("/conversations", headers=bearer(alice)).get_json()
    web.post("/", json={"message": "my secret plan", "conversation_id": conversation["id"]}, headers=bearer(alice))
    before = stored_count(database_url, alice)
    attempts = [
        web.get(f"/conversations/{conversation['id']}/messages", headers=bearer(mallory)),
        web.post("/", json={"message": "hi", "conversation_id": conversation["id"]}, headers=bearer(mallory)),
        web.post(
            "/",
            json={"message": "hi", "conversation_id": conversation["id"]},
            headers=bearer(
                mallory,
            ),
            environ_base={"HTTP_ACCEPT": "text/event-stream"},
        ),
    ]
    assert [response.status_code for response in attempts] == [404, 404, 404]
    assert "secret plan" not in json.dumps([response.get_json() for response in attempts])
    listed = web.get("/conversations", headers=bearer(mallory)).get_json()
    assert listed == {"conversations": [], "has_more": False, "next": None}
    # a place of Alice's conversation as where Mallory's list goes on lists Mallory's, none
    place = f"?before=99999999999999999-{conversation['id']}"
    assert web.get(f"/conversations{place}", headers=bearer(mallory)).get_json() == listed
    assert stored_count(database_url, alice) == before and stored_count(database_url, mallory) == 0
    own = web.get(f"/conversations/{conversation['id']}/messages", headers=bearer(alice)).get_json()
    assert [m["content"] for m in own["messages"]][0] == "my secret plan"


def test_streaming_sends_several_events_and_stores_what_was_streamed(
    web: FlaskClient, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    person = uuid.uuid4()
    fake_anthropic.answer = lambda body: "Here is a fairly long answer that arrives piece by piece, as written."
    response = web.post(
        "/", json={"message": "stream please"}, headers={**bearer(person), "Accept": "text/event-stream"}
    )
    assert response.status_code == 200 and response.mimetype == "text/event-stream"
    events = [block for block in response.get_data(as_text=True).split("\n\n") if block]
    deltas = [json.loads(e.split("data: ", 1)[1])["text"] for e in events if e.startswith("event: delta")]
    done = [json.loads(e.split("data: ", 1)[1]) for e in events if e.startswith("event: done")]
    assert len(deltas) > 1 and len(done) == 1 and events[-1].startswith("event: done")
    with psycopg.connect(database_url) as connection:
        row = connection.execute(
            "select content from messages where user_id = %s and role = 'assistant'", (person,)
        ).fetchone()
    assert row == ("".join(deltas),) == (done[0]["reply"],)


@pytest.mark.parametrize(
    ("request_kwargs", "status", "error"),
    [
        ({"data": "not json", "content_type": "application/json"}, 400, "bad_request"),
        ({"json": {"message": ""}}, 400, "empty_message"),
        ({"json": {"message": "x" * 20_000}}, 413, "message_too_long"),
        ({"json": {"message": "hi", "conversation_id": str(uuid.uuid4())}}, 404, "not_found"),
        ({"json": {"message": "hi", "conversation_id": "not-a-uuid"}}, 400, "bad_request"),
        ({"json": {"text": "wrong field"}}, 400, "bad_request"),
    ],
    ids=["not-json", "empty", "too-long", "unknown-conversation", "bad-uuid", "wrong-shape"],
)
def test_bad_input_is_a_4xx_with_a_json_reason(
    web: FlaskClient, request_kwargs: dict[str, Any], status: int, error: str
) -> None:
    response = web.post("/", headers=bearer(uuid.uuid4()), **request_kwargs)
    assert response.status_code == status
    assert response.get_json()["error"] == error and response.get_json()["message"]


def test_unknown_routes_are_404_json_and_a_known_path_with_another_method_405(web: FlaskClient) -> None:
    response = web.get("/nowhere", headers=bearer(uuid.uuid4()))
    assert response.status_code == 404 and response.get_json()["error"] == "not_found"
    wrong = web.delete("/conversations", headers=bearer(uuid.uuid4()))
    assert wrong.status_code == 405 and wrong.get_json()["error"] == "method_not_allowed"
    assert wrong.headers["Allow"] == "GET, POST"
    head = web.head("/conversations", headers=bearer(uuid.uuid4()))  # a GET may run a turn: never for a HEAD
    assert (head.status_code, head.headers["Allow"]) == (405, "GET, POST")
    assert web.head("/nowhere", headers=bearer(uuid.uuid4())).status_code == 404
    linking = web.put("/links/telegram", headers=bearer(uuid.uuid4()))
    assert (linking.status_code, linking.headers["Allow"]) == (405, "DELETE")


@pytest.mark.parametrize(
    "path",
    [
        "/follow-ups/\u0661\u0662",  # digits, but not ASCII ones: no follow-up's id
        "/follow-ups/1234567890123456789",  # 19 digits: past the id's 18
        "/follow-ups/-1",
        "/links/web",  # the web is the account the others link to, not a linkable app
        "/links/fax",
        "/conversations/00000000-0000-4000-8000-00000000000g",
    ],
)
def test_an_id_its_converter_refuses_is_no_such_path(web: FlaskClient, path: str) -> None:
    response = web.delete(path, headers=bearer(uuid.uuid4()))
    assert (response.status_code, response.get_json()["error"]) == (404, "not_found")
    assert response.get_json()["message"] == f"no route DELETE {path}"


def test_a_trailing_slash_finds_the_same_route(web: FlaskClient) -> None:
    response = web.get("/follow-ups/", headers=bearer(uuid.uuid4()))
    assert (response.status_code, response.get_json()) == (200, {"follow_ups": []})


def test_cors_preflight_is_answered_without_the_database(web: FlaskClient, environment: pytest.MonkeyPatch) -> None:
    environment.setenv("DATABASE_URL", "postgresql://postgres@127.0.0.1:1/postgres")
    client = app_client("web_chat")
    allowed = client.options(
        "/", headers={"Origin": "https://advisor.example.com", "Access-Control-Request-Method": "POST"}
    )
    assert allowed.status_code == 204
    assert allowed.headers["Access-Control-Allow-Origin"] == "https://advisor.example.com"
    assert "Authorization" in allowed.headers["Access-Control-Allow-Headers"]
    denied = client.options("/", headers={"Origin": "https://evil.example.com"})
    assert denied.status_code == 403 and "Access-Control-Allow-Origin" not in denied.headers
    assert denied.get_json() == {"error": "forbidden", "message": "this origin is not in CORS_ORIGINS"}
    assert runtime.store.cache_info().currsize == 0  # no database client was even built


def test_a_page_on_another_origin_may_read_retry_after_and_allow(
    web: FlaskClient, fake_anthropic: FakeAnthropic
) -> None:
    """A cross-origin fetch reads only the headers the answer exposes: a retry's `Retry-After` (409
    `still_answering`), a 405's `Allow`, the export's `Content-Disposition`, the UI message stream's header."""
    person = uuid.uuid4()
    origin = {**bearer(person), "Origin": CORS_ORIGIN}
    events = runtime.turns().stream(TurnRequest(Surface.WEB, "hi", "c-1", user_id=person, deadline_s=30))
    next(events)  # the first attempt holds the message
    try:
        retry = web.post("/", json={"message": "hi", "client_message_id": "c-1"}, headers=origin)
    finally:
        events.close()
    assert retry.status_code == 409 and "Retry-After" in retry.headers
    exposed = "Retry-After, Allow, Content-Disposition, x-vercel-ai-ui-message-stream"
    assert retry.headers["Access-Control-Expose-Headers"] == exposed
    refused = web.put("/conversations", headers=origin)
    assert refused.status_code == 405 and refused.headers["Access-Control-Expose-Headers"] == exposed


def test_with_the_database_down_the_web_still_answers(web: FlaskClient, environment: pytest.MonkeyPatch) -> None:
    environment.setenv("DATABASE_URL", "postgresql://postgres@127.0.0.1:1/postgres")
    client = app_client("web_chat")
    response = client.post("/", json={"message": "still there?"}, headers=bearer(uuid.uuid4()))
    assert response.status_code == 200 and "still there?" in response.get_json()["reply"]
    listed = client.get("/conversations", headers=bearer(uuid.uuid4()))
    assert listed.status_code == 503 and listed.get_json()["error"] == "store_unavailable"


@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("/conversations/------------------------------------/messages", 404),
        ("/conversations/not-a-uuid/messages", 404),
        ("/conversations/00000000-0000-4000-8000-000000000000/messages?limit=5", 404),
    ],
)
def test_odd_conversation_ids_are_not_found(web: FlaskClient, path: str, status: int) -> None:
    response = web.get(path, headers=bearer(uuid.uuid4()))
    assert response.status_code == status and response.get_json()["error"] == "not_found"


@pytest.mark.parametrize(
    ("query", "reason"),
    [
        ("limit=abc", "limit must be a whole number from 1 to 200, not 'abc'"),
        ("limit=0", "limit must be a whole number from 1 to 200, not '0'"),
        ("limit=-5", "limit must be a whole number from 1 to 200, not '-5'"),
        ("limit=201", "limit must be a whole number from 1 to 200, not '201'"),
        ("limit=", "limit must be a whole number from 1 to 200, not ''"),
        ("limit=2.5", "limit must be a whole number from 1 to 200, not '2.5'"),
        ("limit=1_0", "limit must be a whole number from 1 to 200, not '1_0'"),
        ("before=xyz", "before must be a message id (a whole number from 1), not 'xyz'"),
        ("before=0", "before must be a message id (a whole number from 1), not '0'"),
        ("before=-1", "before must be a message id (a whole number from 1), not '-1'"),
        ("before=9223372036854775808", f"before must be a message id (a whole number from 1), not '{2**63}'"),
        ("limit=10&before=xyz", "before must be a message id (a whole number from 1), not 'xyz'"),
    ],
)
def test_bad_paging_parameters_are_refused_with_the_reason(web: FlaskClient, query: str, reason: str) -> None:
    person = uuid.uuid4()
    conversation = web.post("/conversations", headers=bearer(person)).get_json()
    response = web.get(f"/conversations/{conversation['id']}/messages?{query}", headers=bearer(person))
    assert response.status_code == 400
    assert response.get_json() == {"error": "bad_request", "message": reason}


def test_pages_say_whether_older_messages_are_left(web: FlaskClient) -> None:
    person = uuid.uuid4()
    first = web.post("/", json={"message": "one"}, headers=bearer(person)).get_json()
    conversation = first["conversation_id"]
    web.post("/", json={"message": "two", "conversation_id": conversation}, headers=bearer(person))
    path = f"/conversations/{conversation}/messages"

    newest = web.get(f"{path}?limit=3", headers=bearer(person)).get_json()
    assert [m["role"] for m in newest["messages"]] == ["assistant", "user", "assistant"]
    assert newest["messages"][1]["content"] == "two" and newest["has_more"] is True
    rest = web.get(f"{path}?limit=3&before={newest['messages'][0]['id']}", headers=bearer(person)).get_json()
    assert [m["content"] for m in rest["messages"]] == ["one"] and rest["has_more"] is False
    everything = web.get(f"{path}?limit=4", headers=bearer(person)).get_json()
    assert len(everything["messages"]) == 4 and everything["has_more"] is False
    by_default = web.get(path, headers=bearer(person)).get_json()
    assert len(by_default["messages"]) == 4 and by_default["has_more"] is False


def test_without_a_way_to_verify_tokens_it_refuses_to_serve(environment: pytest.MonkeyPatch) -> None:
    response = app_client("web_chat").get("/conversations", headers=bearer(uuid.uuid4()))
    assert response.status_code == 503 and response.get_json()["error"] == "not_configured"
    assert "SUPABASE_JWT_SECRET" in response.get_json()["message"]


def test_a_head_request_never_runs_a_turn(web: FlaskClient, database_url: str, fake_anthropic: FakeAnthropic) -> None:
    """werkzeug's Map answers HEAD with a GET route's handler (functions/web.py): HEAD on the
    chat's stream resumes an unanswered message, a model call whose answer is thrown away (old
    web.py: 405). HEAD should be refused, or answered without running a GET handler."""
    person = uuid.uuid4()
    chat = str(web.post("/conversations", headers=bearer(person)).get_json()["id"])
    fake_anthropic.behaviour = "500"  # the first attempt ends in the fallback: the message stays unanswered
    body = {"id": chat, "messages": [{"id": "u-1", "role": "user", "parts": [{"type": "text", "text": "hello?"}]}]}
    assert web.post("/", json={**body, "trigger": "submit-message"}, headers=bearer(person)).status_code == 200
    fake_anthropic.behaviour = "ok"
    asked = len(fake_anthropic.requests)
    head = web.head(f"/{chat}/stream", headers=bearer(person))
    assert len(fake_anthropic.requests) == asked, "a HEAD asked the model"
    assert head.status_code == 405
