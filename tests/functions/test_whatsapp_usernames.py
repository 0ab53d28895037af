"""WhatsApp senders known by a business-scoped user id (issue #22): people with a WhatsApp
username, whose number Meta may withhold, are served like anyone else; and "typing…" while a
turn runs."""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from core.surfaces.whatsapp import WhatsAppForm
from functions.logs import JsonLineFormatter
from tests.fakes.anthropic_api import FakeAnthropic
from tests.fakes.twilio_api import FakeTwilio
from tests.helpers import (
    CORPUS,
    ENGLISH,
    JWT_SECRET,
    PUBLIC_BASE_URL,
    SPANISH,
    TWILIO_TOKEN,
    app_client,
    as_owner,
    bearer,
    execute,
    messages_of,
    rows,
    signed,
)

ACCOUNT_SID = "AC" + "1" * 32
BSUID = "US.13491208655302741918"


def corpus_form(name: str, **changes: str) -> dict[str, str]:
    """A corpus form with a fresh MessageSid (the database is shared by the session)."""
    fields: dict[str, str] = json.loads((CORPUS / "twilio" / name).read_text())
    return {**fields, "MessageSid": "SM" + uuid.uuid4().hex, **changes}


def fresh_bsuid() -> str:
    return f"ES.{uuid.uuid4().int % 10**20:020d}"


@pytest.fixture(autouse=True)
def noted(fake_anthropic: FakeAnthropic) -> None:
    fake_anthropic.answer = lambda body: "Noted."


@pytest.fixture
def whatsapp(environment: pytest.MonkeyPatch) -> Any:
    environment.setenv("TWILIO_AUTH_TOKEN", TWILIO_TOKEN)
    environment.setenv("PUBLIC_BASE_URL", PUBLIC_BASE_URL)
    environment.setenv("SUPABASE_JWT_SECRET", JWT_SECRET)
    return app_client("whatsapp_webhook")


@pytest.fixture
def fake_twilio() -> Iterator[FakeTwilio]:
    server = FakeTwilio(ACCOUNT_SID, TWILIO_TOKEN)
    yield server
    server.close()


def test_a_sender_known_only_by_a_bsuid_is_answered_and_remembered(
    whatsapp: Any, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    sender = fresh_bsuid()
    fields = corpus_form("08_text_bsuid_username.json", From=f"whatsapp:{sender}", ExternalUserIdentifier=sender)
    answered = whatsapp.post("/", data=fields, headers=signed(fields))
    assert answered.status_code == 200
    assert messages_of(answered.text) == ["Noted."]
    assert fake_anthropic.requests[-1]["messages"][-1]["content"][0]["text"].endswith("Hola, ¿me recuerdas?")
    stored = rows(
        database_url, "select user_id from identities where surface = 'whatsapp' and external_id = %s", sender
    )
    assert len(stored) == 1
    second = corpus_form("08_text_bsuid_username.json", From=f"whatsapp:{sender}", Body="¿Qué te dije?")
    whatsapp.post("/", data=second, headers=signed(second))
    texts = [block["content"][0]["text"] for block in fake_anthropic.requests[-1]["messages"]]
    assert any(text.endswith("Hola, ¿me recuerdas?") for text in texts)


def test_a_bsuid_is_kept_exactly_as_received(whatsapp: Any, database_url: str, fake_anthropic: FakeAnthropic) -> None:
    mixed = f"BR.aBc{uuid.uuid4().hex[:10]}XyZ"
    fields = corpus_form("08_text_bsuid_username.json", From=f"whatsapp:{mixed}", ExternalUserIdentifier=mixed)
    assert whatsapp.post("/", data=fields, headers=signed(fields)).status_code == 200
    assert rows(database_url, "select external_id from identities where external_id = %s", mixed) == [(mixed,)]
    assert rows(database_url, "select count(*) from identities where external_id = %s", mixed.upper()) == [(0,)]


def test_under_the_owner_policy_a_bsuid_in_the_allow_list_is_the_owner(
    environment: pytest.MonkeyPatch, whatsapp: Any, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    owner = uuid.uuid4()
    as_owner(environment, owner, whatsapp=f"+34600999888, {BSUID}")
    client = app_client("whatsapp_webhook")
    fields = corpus_form("08_text_bsuid_username.json")
    answered = client.post("/", data=fields, headers=signed(fields))
    assert messages_of(answered.text) == ["Noted."]
    assert rows(database_url, "select count(*) from messages where user_id = %s", owner) == [(2,)]
    stranger = corpus_form("08_text_bsuid_username.json", From=f"whatsapp:{fresh_bsuid()}")
    refused = client.post("/", data=stranger, headers=signed(stranger))
    # "Hola, ¿me recuerdas?": a stranger who writes Spanish is refused in Spanish (core/phrases/).
    assert messages_of(refused.text) == [SPANISH.say("turn.stranger")]
    assert rows(database_url, "select count(*) from messages where user_id = %s", owner) == [(2,)]


def test_link_code_from_a_bsuid_links_it_and_the_links_list_masks_it(
    environment: pytest.MonkeyPatch, whatsapp: Any, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    person, sender = uuid.uuid4(), fresh_bsuid()
    web = app_client("web_chat")
    code = web.post("/links", headers=bearer(person)).get_json()["code"]
    fields = corpus_form("08_text_bsuid_username.json", From=f"whatsapp:{sender}", Body=f"link {code}")
    answered = whatsapp.post("/", data=fields, headers=signed(fields))
    assert messages_of(answered.text)[0].startswith("Linked to the web account u•••@example.com!")
    assert rows(database_url, "select user_id from identities where external_id = %s", sender) == [(person,)]
    listed = web.get("/links", headers=bearer(person)).get_json()["links"]
    assert [(item["surface"], item["external_id"]) for item in listed] == [
        ("whatsapp", "ES." + "•" * (len(sender) - 7) + sender[-4:])
    ]


def test_a_whatsapp_turn_shows_typing_for_its_message_and_a_failing_indicator_costs_nothing(
    environment: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic, fake_twilio: FakeTwilio
) -> None:
    environment.setenv("TWILIO_AUTH_TOKEN", TWILIO_TOKEN)
    environment.setenv("PUBLIC_BASE_URL", PUBLIC_BASE_URL)
    environment.setenv("TWILIO_ACCOUNT_SID", ACCOUNT_SID)
    environment.setenv("TWILIO_API_BASE", fake_twilio.url)
    fields = corpus_form("08_text_bsuid_username.json", From=f"whatsapp:{fresh_bsuid()}")
    answered = app_client("whatsapp_webhook").post("/", data=fields, headers=signed(fields))
    assert messages_of(answered.text) == ["Noted."]
    for _ in range(100):  # the indicator has a thread of its own
        if fake_twilio.typing:
            break
        time.sleep(0.02)
    assert fake_twilio.typing == [{"channel": "whatsapp", "messageId": fields["MessageSid"]}]

    environment.setenv("TWILIO_API_BASE", "http://127.0.0.1:9")  # nothing listens: the indicator fails
    failing = corpus_form("08_text_bsuid_username.json", From=f"whatsapp:{fresh_bsuid()}", Body="still there?")
    answered = app_client("whatsapp_webhook").post("/", data=failing, headers=signed(failing))
    assert messages_of(answered.text) == ["Noted."]


def test_the_typing_indicator_can_be_turned_off(
    environment: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic, fake_twilio: FakeTwilio
) -> None:
    environment.setenv("TWILIO_AUTH_TOKEN", TWILIO_TOKEN)
    environment.setenv("PUBLIC_BASE_URL", PUBLIC_BASE_URL)
    environment.setenv("TWILIO_ACCOUNT_SID", ACCOUNT_SID)
    environment.setenv("TWILIO_API_BASE", fake_twilio.url)
    environment.setenv("WHATSAPP_TYPING_INDICATOR", "false")
    fields = corpus_form("08_text_bsuid_username.json", From=f"whatsapp:{fresh_bsuid()}")
    assert app_client("whatsapp_webhook").post("/", data=fields, headers=signed(fields)).status_code == 200
    time.sleep(0.5)  # what an indicator's thread would take
    assert fake_twilio.typing == []


def test_no_log_line_carries_the_senders_bsuid_or_number(
    whatsapp: Any, fake_anthropic: FakeAnthropic, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    sender = fresh_bsuid()
    fields = corpus_form("09_text_bsuid_with_number.json", From=f"whatsapp:{sender}", ExternalUserIdentifier=sender)
    assert whatsapp.post("/", data=fields, headers=signed(fields)).status_code == 200
    lines = [JsonLineFormatter().format(record) for record in caplog.records]
    assert any('"message": "turn"' in line for line in lines)
    assert not [line for line in lines if sender in line or "34600111222" in line]


def one_thread(database_url: str, *ids: str) -> set[Any]:
    found = rows(
        database_url,
        "select distinct user_id from identities where surface = 'whatsapp' and external_id = any(%s)",
        list(ids),
    )
    return {row[0] for row in found}


def test_a_known_number_that_arrives_with_a_bsuid_stays_one_person(
    whatsapp: Any, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    number, sender = f"+3467{uuid.uuid4().int % 10**7:07d}", fresh_bsuid()
    before = corpus_form(
        "01_text_profilename_waid.json", From=f"whatsapp:{number}", WaId=number[1:], Body="Mi hermana es Carmen"
    )
    assert whatsapp.post("/", data=before, headers=signed(before)).status_code == 200
    both = corpus_form(
        "09_text_bsuid_with_number.json", From=f"whatsapp:{sender}", ExternalUserIdentifier=sender, WaId=number[1:]
    )
    assert whatsapp.post("/", data=both, headers=signed(both)).status_code == 200
    only = corpus_form("08_text_bsuid_username.json", From=f"whatsapp:{sender}", Body="¿Cómo se llama mi hermana?")
    assert whatsapp.post("/", data=only, headers=signed(only)).status_code == 200
    assert len(one_thread(database_url, number, sender)) == 1
    texts = [block["content"][0]["text"] for block in fake_anthropic.requests[-1]["messages"]]
    assert any(text.endswith("Mi hermana es Carmen") for text in texts)


def test_a_number_first_seen_beside_a_known_bsuid_joins_its_person(
    whatsapp: Any, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    number, sender = f"+3468{uuid.uuid4().int % 10**7:07d}", fresh_bsuid()
    first = corpus_form("08_text_bsuid_username.json", From=f"whatsapp:{sender}", ExternalUserIdentifier=sender)
    assert whatsapp.post("/", data=first, headers=signed(first)).status_code == 200
    both = corpus_form(
        "09_text_bsuid_with_number.json", From=f"whatsapp:{sender}", ExternalUserIdentifier=sender, WaId=number[1:]
    )
    assert whatsapp.post("/", data=both, headers=signed(both)).status_code == 200
    later = corpus_form("01_text_profilename_waid.json", From=f"whatsapp:{number}", WaId=number[1:])
    assert whatsapp.post("/", data=later, headers=signed(later)).status_code == 200
    assert len(one_thread(database_url, number, sender)) == 1


def test_a_linked_number_keeps_its_link_when_its_bsuid_appears_and_unlink_lets_both_go(
    whatsapp: Any, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    person, number, sender = uuid.uuid4(), f"+3469{uuid.uuid4().int % 10**7:07d}", fresh_bsuid()
    code = app_client("web_chat").post("/links", headers=bearer(person)).get_json()["code"]
    link = corpus_form("01_text_profilename_waid.json", From=f"whatsapp:{number}", WaId=number[1:], Body=f"link {code}")
    assert whatsapp.post("/", data=link, headers=signed(link)).status_code == 200
    both = corpus_form(
        "09_text_bsuid_with_number.json", From=f"whatsapp:{sender}", ExternalUserIdentifier=sender, WaId=number[1:]
    )
    assert whatsapp.post("/", data=both, headers=signed(both)).status_code == 200
    assert one_thread(database_url, number, sender) == {person}
    unlink = corpus_form("09_text_bsuid_with_number.json", From=f"whatsapp:{sender}", WaId=number[1:], Body="unlink")
    answered = whatsapp.post("/", data=unlink, headers=signed(unlink))
    assert messages_of(answered.text)[0].startswith("Unlinked.")
    assert rows(database_url, "select count(*) from identities where external_id = any(%s)", [number, sender]) == [(0,)]


def test_a_number_passed_to_someone_else_with_a_bsuid_of_their_own_starts_anew(
    whatsapp: Any, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    number, owner, newcomer = f"+3472{uuid.uuid4().int % 10**7:07d}", fresh_bsuid(), fresh_bsuid()
    before = corpus_form(
        "09_text_bsuid_with_number.json", From=f"whatsapp:{owner}", ExternalUserIdentifier=owner, WaId=number[1:]
    )
    assert whatsapp.post("/", data=before, headers=signed(before)).status_code == 200
    recycled = corpus_form(
        "09_text_bsuid_with_number.json", From=f"whatsapp:{newcomer}", ExternalUserIdentifier=newcomer, WaId=number[1:]
    )
    assert whatsapp.post("/", data=recycled, headers=signed(recycled)).status_code == 200
    assert len(one_thread(database_url, owner, newcomer)) == 2
    assert one_thread(database_url, number) == one_thread(database_url, owner)


def test_a_wa_id_that_is_not_all_digits_is_no_number() -> None:
    fields = corpus_form("09_text_bsuid_with_number.json", WaId="US.12025550123")
    assert WhatsAppForm.from_form(fields).also_known_as is None
    assert WhatsAppForm.from_form(corpus_form("09_text_bsuid_with_number.json")).also_known_as == "+34600111222"


OWNER_NUMBER = "+15550001111"
PRIVATE = "Sorry, this is a private assistant and I can't talk with you."


def test_under_the_owner_policy_a_bsuid_not_listed_is_a_stranger_whatever_number_it_carries(
    environment: pytest.MonkeyPatch,
    whatsapp: Any,
    database_url: str,
    fake_anthropic: FakeAnthropic,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 30, finding 4: a BSUID carrying the owner's number (`WaId`, or the number as `From`
    beside an `ExternalUserIdentifier`) was served as the owner. The number alone still is."""
    owner, someone = uuid.uuid4(), fresh_bsuid()
    as_owner(environment, owner, whatsapp=OWNER_NUMBER)
    client = app_client("whatsapp_webhook")
    asked = len(fake_anthropic.requests)
    caplog.set_level(logging.WARNING, logger="crossmem.identity")
    carried = corpus_form(
        "09_text_bsuid_with_number.json",
        From=f"whatsapp:{someone}",
        ExternalUserIdentifier=someone,
        WaId=OWNER_NUMBER[1:],
    )
    assert messages_of(client.post("/", data=carried, headers=signed(carried)).text) == [PRIVATE]
    beside = corpus_form(
        "09_text_bsuid_with_number.json", From=f"whatsapp:{OWNER_NUMBER}", ExternalUserIdentifier=someone, WaId=""
    )
    assert messages_of(client.post("/", data=beside, headers=signed(beside)).text) == [PRIVATE]
    assert len(fake_anthropic.requests) == asked
    assert rows(database_url, "select count(*) from messages where user_id = %s", owner) == [(0,)]
    warned = [JsonLineFormatter().format(record) for record in caplog.records if record.name == "crossmem.identity"]
    assert len(warned) == 2 and "list the BSUID" in warned[0]
    assert not [line for line in warned if someone in line or OWNER_NUMBER[1:] in line]

    alone = corpus_form("01_text_profilename_waid.json", From=f"whatsapp:{OWNER_NUMBER}", WaId=OWNER_NUMBER[1:])
    assert messages_of(client.post("/", data=alone, headers=signed(alone)).text) == ["Noted."]
    assert rows(database_url, "select count(*) from messages where user_id = %s", owner) == [(2,)]


def test_under_the_owner_policy_a_listed_bsuid_is_the_owner_with_or_without_a_number(
    environment: pytest.MonkeyPatch, whatsapp: Any, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    """The other direction: the listed BSUID is the owner's, carrying the listed number, another
    number or none, and another BSUID carrying the listed number is not (the owner's thread is not
    shown to it: no model request)."""
    owner, listed, other = uuid.uuid4(), fresh_bsuid(), fresh_bsuid()
    as_owner(environment, owner, whatsapp=f"{OWNER_NUMBER}, {listed}")
    client = app_client("whatsapp_webhook")
    for wa_id in (OWNER_NUMBER[1:], "34600123123", ""):
        fields = corpus_form(
            "09_text_bsuid_with_number.json", From=f"whatsapp:{listed}", ExternalUserIdentifier=listed, WaId=wa_id
        )
        assert messages_of(client.post("/", data=fields, headers=signed(fields)).text) == ["Noted."]
    assert rows(database_url, "select count(*) from messages where user_id = %s", owner) == [(6,)]
    asked = len(fake_anthropic.requests)
    impostor = corpus_form(
        "09_text_bsuid_with_number.json", From=f"whatsapp:{other}", ExternalUserIdentifier=other, WaId=OWNER_NUMBER[1:]
    )
    assert messages_of(client.post("/", data=impostor, headers=signed(impostor)).text) == [PRIVATE]
    assert len(fake_anthropic.requests) == asked
    assert rows(database_url, "select count(*) from messages where user_id = %s", owner) == [(6,)]


def test_unlink_from_a_bsuid_is_said_in_the_senders_language_never_the_numbers_previous_holders(
    whatsapp: Any, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    """A number that changed hands arrives beside a newcomer's BSUID: their `unlink` is answered by
    what they wrote (English), not in the Spanish its previous holder's person remembers (seen
    failing with the number's remembered language used when the sender has none)."""
    number, newcomer = f"+3473{uuid.uuid4().int % 10**7:07d}", fresh_bsuid()
    holder = uuid.uuid4()
    code = app_client("web_chat").post("/links", headers=bearer(holder)).get_json()["code"]
    link = corpus_form("01_text_profilename_waid.json", From=f"whatsapp:{number}", WaId=number[1:], Body=f"link {code}")
    assert whatsapp.post("/", data=link, headers=signed(link)).status_code == 200
    assert one_thread(database_url, number) == {holder}
    # The holder's Spanish, as a voice note heard in Spanish leaves it (test_remembered_language.py).
    execute(database_url, "insert into person_languages (user_id, language) values (%s, 'es')", holder)
    unlink = corpus_form("09_text_bsuid_with_number.json", From=f"whatsapp:{newcomer}", WaId=number[1:], Body="unlink")
    answered = messages_of(whatsapp.post("/", data=unlink, headers=signed(unlink)).text)
    assert answered[0].startswith("Unlinked.")


def test_forget_sent_first_with_a_bsuid_beside_a_known_number_forgets_the_numbers_thread(
    whatsapp: Any, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    """The turn would join the BSUID to the number's person (and read its thread): so must
    `forget`, which otherwise answered that nothing was stored and forgot nothing."""
    number, sender = f"+3473{uuid.uuid4().int % 10**7:07d}", fresh_bsuid()
    before = corpus_form(
        "01_text_profilename_waid.json", From=f"whatsapp:{number}", WaId=number[1:], Body="Mi hermana es Carmen"
    )
    assert whatsapp.post("/", data=before, headers=signed(before)).status_code == 200
    (person,) = one_thread(database_url, number)
    for body in ("forget", "forget confirm"):
        command = corpus_form(
            "09_text_bsuid_with_number.json",
            From=f"whatsapp:{sender}",
            ExternalUserIdentifier=sender,
            WaId=number[1:],
            Body=body,
        )
        answered = whatsapp.post("/", data=command, headers=signed(command))
        said = messages_of(answered.text)
        assert ENGLISH.say("forget.nothing_stored") not in said and SPANISH.say("forget.nothing_stored") not in said
    assert rows(database_url, "select count(*) from messages where user_id = %s", person) == [(0,)]


def test_link_sent_first_with_a_bsuid_beside_a_known_number_takes_the_numbers_thread_along(
    whatsapp: Any, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    """The number's thread is the sender's (a turn from the BSUID would have joined it): linking
    from the BSUID links the person, both ids, not the BSUID alone, away from its own past."""
    person, number, sender = uuid.uuid4(), f"+3474{uuid.uuid4().int % 10**7:07d}", fresh_bsuid()
    before = corpus_form(
        "01_text_profilename_waid.json", From=f"whatsapp:{number}", WaId=number[1:], Body="Mi hermana es Carmen"
    )
    assert whatsapp.post("/", data=before, headers=signed(before)).status_code == 200
    code = app_client("web_chat").post("/links", headers=bearer(person)).get_json()["code"]
    link = corpus_form(
        "09_text_bsuid_with_number.json",
        From=f"whatsapp:{sender}",
        ExternalUserIdentifier=sender,
        WaId=number[1:],
        Body=f"link {code}",
    )
    assert whatsapp.post("/", data=link, headers=signed(link)).status_code == 200
    ask = corpus_form(
        "09_text_bsuid_with_number.json",
        From=f"whatsapp:{sender}",
        ExternalUserIdentifier=sender,
        WaId=number[1:],
        Body="¿Cómo se llama mi hermana?",
    )
    assert whatsapp.post("/", data=ask, headers=signed(ask)).status_code == 200
    assert one_thread(database_url, number, sender) == {person}
    texts = [block["content"][0]["text"] for block in fake_anthropic.requests[-1]["messages"]]
    assert any(text.endswith("Mi hermana es Carmen") for text in texts)
