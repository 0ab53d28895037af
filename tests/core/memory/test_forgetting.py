"""Forgetting on real Postgres: everything of one person and nothing of anyone else, one conversation,
the confirmation window, redeliveries after the forget, and the operator's erasure."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest

from core.errors import NotFound
from core.identity.linking import Linking
from core.identity.policy import IdentityPolicy
from core.memory.forgetting import (
    ForgetRequest,
    Forgetting,
    Forgotten,
)
from core.memory.service import Memory
from core.models import Person, Surface
from core.stores.postgres_store import PostgresStore
from core.surfaces.telegram import Command, TelegramUpdate
from core.surfaces.telegram import classify as classify_telegram
from core.surfaces.whatsapp import WhatsAppForm
from core.surfaces.whatsapp import classify as classify_whatsapp
from tests.helpers import ENGLISH, digest_limits, execute, forgotten, rows, will_delete

AUTO = IdentityPolicy.build("auto", None, {})


@pytest.fixture
def forgetting(store: PostgresStore) -> Forgetting:
    return Forgetting(store, AUTO, stranger_reply="Who are you?")


def one(database_url: str, query: str, *params: Any) -> Any:
    with psycopg.connect(database_url) as connection:
        row = connection.execute(query, params).fetchone()
    assert row is not None
    return row[0]


def rows_of(database_url: str, person: uuid.UUID) -> dict[str, int]:
    return {
        table: int(one(database_url, f"select count(*) from {table} where user_id = %s", person))
        for table in ("messages", "conversations", "link_codes", "identities", "forget_requests")
    }


def turn(memory: Memory, person: Person, surface: Surface, text: str, external_id: str | None = None) -> uuid.UUID:
    start = memory.begin_turn(person, surface, text, external_id or uuid.uuid4().hex)
    assert start.user_id is not None and start.message_id is not None and not start.duplicate
    memory.finish_turn(start.user_id, start.message_id, f"re: {text}")
    return start.user_id


def chat() -> str:
    return str(700000000 + uuid.uuid4().int % 10**8)


def test_forgetting_a_person_deletes_all_of_theirs_on_every_surface_and_nothing_else(
    memory: Memory, store: PostgresStore, forgetting: Forgetting, database_url: str
) -> None:
    person, other = uuid.uuid4(), uuid.uuid4()
    telegram_chat = chat()
    Linking(store, AUTO).link(person, Surface.TELEGRAM, telegram_chat)
    turn(memory, Person(sender_id=telegram_chat), Surface.TELEGRAM, "my locker code is 4417")
    turn(memory, Person(user_id=person), Surface.WEB, "and my bank is Northwind")
    turn(memory, Person(user_id=person), Surface.WEB, "a second web conversation")
    Linking(store, AUTO).new_code(person)
    turn(memory, Person(user_id=other), Surface.WEB, "someone else entirely")
    assert rows_of(database_url, person) == {
        "messages": 6,
        "conversations": 3,
        "link_codes": 1,
        "identities": 1,
        "forget_requests": 0,
    }
    before_other = rows_of(database_url, other)

    assert forgetting.forget_everything(person) == Forgotten(messages=6, conversations=3, link_codes=1, identities=0)

    assert rows_of(database_url, person) == {
        "messages": 0,
        "conversations": 0,
        "link_codes": 0,
        "identities": 1,  # still linked: the chat is still this person, who starts from nothing
        "forget_requests": 0,
    }
    assert (
        rows_of(database_url, other)
        == before_other
        == {
            "messages": 2,
            "conversations": 1,
            "link_codes": 0,
            "identities": 0,
            "forget_requests": 0,
        }
    )
    start = memory.begin_turn(Person(sender_id=telegram_chat), Surface.TELEGRAM, "what do you know?", "after-1")
    assert start.user_id == person
    assert [message.content for message in start.history] == ["what do you know?"]


def test_a_redelivery_after_the_forget_stores_nothing_and_is_answered_like_a_duplicate(
    memory: Memory, forgetting: Forgetting, database_url: str
) -> None:
    sender = chat()
    person = turn(memory, Person(sender_id=sender), Surface.TELEGRAM, "remember the 4417", external_id="fd-tg-1")
    web = uuid.uuid4()
    turn(memory, Person(user_id=web), Surface.WEB, "web words", external_id="fd-web-1")
    forgetting.forget_everything(person)
    forgetting.forget_everything(web)

    again = memory.begin_turn(Person(sender_id=sender), Surface.TELEGRAM, "remember the 4417", "fd-tg-1")
    assert (again.duplicate, again.reply, again.message_id, again.history) == (True, None, None, [])
    again = memory.begin_turn(Person(user_id=web), Surface.WEB, "web words", "fd-web-1")
    assert (again.duplicate, again.reply, again.message_id) == (True, None, None)
    assert rows_of(database_url, person)["messages"] == rows_of(database_url, person)["conversations"] == 0
    assert rows_of(database_url, web)["messages"] == rows_of(database_url, web)["conversations"] == 0

    # A web client's message id is only the person's own: someone else's "fd-web-1" is a new message.
    stranger = memory.begin_turn(Person(user_id=uuid.uuid4()), Surface.WEB, "my own words", "fd-web-1")
    assert stranger.duplicate is False and stranger.message_id is not None
    # A new delivery after the forget is a turn, from nothing.
    fresh = memory.begin_turn(Person(sender_id=sender), Surface.TELEGRAM, "hello again", "fd-tg-2")
    assert fresh.duplicate is False and [m.content for m in fresh.history] == ["hello again"]


def test_deleting_one_conversation_deletes_it_alone_and_never_someone_elses(
    memory: Memory, forgetting: Forgetting, database_url: str
) -> None:
    person, other = uuid.uuid4(), uuid.uuid4()
    first = memory.begin_turn(Person(user_id=person), Surface.WEB, "first conversation", uuid.uuid4().hex)
    turn(memory, Person(user_id=person), Surface.WEB, "second conversation")
    theirs = memory.begin_turn(Person(user_id=other), Surface.WEB, "theirs", uuid.uuid4().hex)
    assert first.conversation_id is not None and theirs.conversation_id is not None

    for missing in (theirs.conversation_id, uuid.uuid4()):
        with pytest.raises(NotFound):
            forgetting.delete_conversation(person, missing)
    assert rows_of(database_url, person)["messages"] == 3 and rows_of(database_url, other)["messages"] == 1

    assert forgetting.delete_conversation(person, first.conversation_id) == Forgotten(messages=1, conversations=1)
    assert rows_of(database_url, person)["messages"] == 2 and rows_of(database_url, person)["conversations"] == 1
    assert rows_of(database_url, other)["messages"] == 1


def test_forget_asks_first_and_only_a_confirmation_within_five_minutes_deletes(
    memory: Memory, store: PostgresStore, forgetting: Forgetting, database_url: str
) -> None:
    sender = chat()
    person = turn(memory, Person(sender_id=sender), Surface.TELEGRAM, "keep this")
    ask, confirm = ForgetRequest(Surface.TELEGRAM, sender, False), ForgetRequest(Surface.TELEGRAM, sender, True)

    assert forgetting.answer(confirm) == ENGLISH.say("forget.no_request", request="/forget")
    assert forgetting.answer(ask) == will_delete(ENGLISH, 2, 1, "/forget confirm")
    assert rows_of(database_url, person)["messages"] == 2 and rows_of(database_url, person)["forget_requests"] == 1

    with psycopg.connect(database_url) as connection:
        connection.execute(
            "update forget_requests set requested_at = now() - interval '5 minutes 1 second' where user_id = %s",
            (person,),
        )
    assert forgetting.answer(confirm) == ENGLISH.say("forget.expired", request="/forget", minutes=5)
    assert rows_of(database_url, person)["messages"] == 2
    assert forgetting.answer(confirm) == ENGLISH.say(
        "forget.no_request", request="/forget"
    )  # the expired request is gone

    forgetting.answer(ask)
    stranger = turn(memory, Person(sender_id=chat()), Surface.TELEGRAM, "and mine")
    zones = "select user_id, timezone from person_timezones where user_id in (%s, %s) order by timezone"
    for someone, zone in ((person, "Europe/Madrid"), (stranger, "Pacific/Auckland")):
        execute(database_url, "insert into person_timezones (user_id, timezone) values (%s, %s)", someone, zone)
    # A request made on Telegram is confirmed on Telegram, not from the person's WhatsApp.
    number = f"+3461{uuid.uuid4().int % 10**7:07d}"
    Linking(store, AUTO).link(person, Surface.WHATSAPP, number)
    assert forgetting.answer(ForgetRequest(Surface.WHATSAPP, f"whatsapp:{number}", True)) == ENGLISH.say(
        "forget.no_request", request="forget"
    )
    assert forgetting.answer(confirm) == forgotten(ENGLISH, 2)
    assert rows_of(database_url, person) == {
        "messages": 0,
        "conversations": 0,
        "link_codes": 0,
        "identities": 2,
        "forget_requests": 0,
    }
    # Where they live goes too (learned from what they said, or their browser's, which says it again);
    # another person's stays.
    assert rows(database_url, zones, person, stranger) == [(stranger, "Pacific/Auckland")]
    assert forgetting.answer(ask) == ENGLISH.say("forget.nothing_stored")


def test_requests_nobody_confirmed_are_kept_a_day_at_most(
    memory: Memory, forgetting: Forgetting, database_url: str
) -> None:
    first, second = chat(), chat()
    person = turn(memory, Person(sender_id=first), Surface.TELEGRAM, "maybe I'll forget")
    turn(memory, Person(sender_id=second), Surface.TELEGRAM, "me too")
    forgetting.answer(ForgetRequest(Surface.TELEGRAM, first, False))
    with psycopg.connect(database_url) as connection:
        connection.execute(
            "update forget_requests set requested_at = now() - interval '1 day 1 minute' where user_id = %s",
            (person,),
        )
    forgetting.answer(ForgetRequest(Surface.TELEGRAM, second, False))
    assert rows_of(database_url, person)["forget_requests"] == 0


def test_a_stranger_under_the_owner_policy_gets_the_stranger_reply_and_nothing_is_deleted(
    memory: Memory, store: PostgresStore, database_url: str
) -> None:
    owner = uuid.uuid4()
    policy = IdentityPolicy.build("owner", owner, {Surface.TELEGRAM: ["4242"]})
    forgetting = Forgetting(store, policy, stranger_reply="Who are you?")
    turn(memory, Person(user_id=owner), Surface.TELEGRAM, "the owner's words")
    forgetting.answer(ForgetRequest(Surface.TELEGRAM, "4242", False))
    assert forgetting.answer(ForgetRequest(Surface.TELEGRAM, "999", True)) == "Who are you?"
    assert rows_of(database_url, owner)["messages"] == 2
    assert forgetting.answer(ForgetRequest(Surface.TELEGRAM, "4242", True)) == forgotten(ENGLISH, 2)
    assert rows_of(database_url, owner)["messages"] == 0


def test_the_operators_erasure_removes_the_identities_too(
    memory: Memory, store: PostgresStore, forgetting: Forgetting, database_url: str
) -> None:
    person, telegram_chat = uuid.uuid4(), chat()
    linking = Linking(store, AUTO)
    before = turn(memory, Person(sender_id=telegram_chat), Surface.TELEGRAM, "said before the link")
    linking.redeem(Surface.TELEGRAM, telegram_chat, "WRONGCODE")
    linking.link(person, Surface.TELEGRAM, telegram_chat)  # merges the chat's own person into `person`
    turn(memory, Person(sender_id=telegram_chat), Surface.TELEGRAM, "erase me")
    attempts = "select count(*) from link_attempts where external_id = %s"
    merged = "select count(*) from merged_people where from_user_id = %s or into_user_id = %s"
    assert (one(database_url, attempts, telegram_chat), one(database_url, merged, before, person)) == (1, 1)

    erased = forgetting.erase_person(person)

    assert erased == Forgotten(messages=4, conversations=1, link_codes=0, identities=1)
    assert rows_of(database_url, person) == dict.fromkeys(rows_of(database_url, person), 0)
    assert (one(database_url, attempts, telegram_chat), one(database_url, merged, before, person)) == (0, 0)
    # The chat's next message is a new person with no memory.
    start = memory.begin_turn(Person(sender_id=telegram_chat), Surface.TELEGRAM, "who am I?", uuid.uuid4().hex)
    assert start.user_id != person and [m.content for m in start.history] == ["who am I?"]


@pytest.mark.parametrize(
    ("text", "confirm"),
    [("/forget", False), ("/forget confirm", True), ("/forget@advisor_bot", False),
     ("/forget@Advisor_Bot confirm", True), ("/forget CONFIRM", True), ("/forget everything", False)],
)  # fmt: skip
def test_telegram_forget_commands_are_classified(text: str, confirm: bool) -> None:
    update = TelegramUpdate.model_validate(
        {
            "update_id": 1,
            "message": {"message_id": 1, "chat": {"id": 55, "type": "private"}, "from": {"id": 55}, "text": text},
        }
    )
    action = classify_telegram(update, bot_username="advisor_bot")
    assert action == Command(55, ForgetRequest(Surface.TELEGRAM, "55", confirm))


def test_a_forget_addressed_to_another_bot_is_a_message() -> None:
    message = {"message_id": 1, "chat": {"id": 55, "type": "private"}, "from": {"id": 55}, "text": "/forget@x"}
    update = TelegramUpdate.model_validate({"update_id": 1, "message": message})
    assert not isinstance(classify_telegram(update, bot_username="advisor_bot"), Command)


@pytest.mark.parametrize(
    ("body", "confirm"),
    [("forget", False), ("FORGET", False), ("  Forget  ", False), ("forget confirm", True), ("Forget  CONFIRM", True)],
)
def test_whatsapp_forget_commands_are_classified_in_any_case(body: str, confirm: bool) -> None:
    form = WhatsAppForm.from_form({"From": "whatsapp:+34600000001", "Body": body, "MessageSid": "SM1"})
    assert classify_whatsapp(form) == ForgetRequest(Surface.WHATSAPP, "+34600000001", confirm)


@pytest.mark.parametrize("body", ["forget it", "please forget", "forget confirmed"])
def test_whatsapp_sentences_with_forget_are_messages(body: str) -> None:
    form = WhatsAppForm.from_form({"From": "whatsapp:+34600000001", "Body": body, "MessageSid": "SM1"})
    assert not isinstance(classify_whatsapp(form), ForgetRequest)


@pytest.mark.parametrize("how", ["everything", "one conversation", "erasure"])
def test_forgetting_takes_the_memory_notes_written_from_what_was_forgotten(
    forgetting: Forgetting, memory: Memory, database_url: str, how: str
) -> None:
    from core.memory.digest import DigestJob, ExtractiveDigester, read_notes

    person = uuid.uuid4()
    for index in range(3):
        turn(memory, Person(user_id=person), Surface.TELEGRAM, f"my locker code is 44{index}")
    job = DigestJob(
        memory.store, ExtractiveDigester(800), digest_limits(max_messages=4, window_step=2, window_hours=24, idle_s=0)
    )
    assert job.run(person).updated == 1
    assert "my locker code is 440" in read_notes(memory.store, person).content
    telegram = memory.list_conversations(person).conversations[0].id
    with psycopg.connect(database_url) as connection:
        a_turn = "insert into turn_usage (message_id, user_id) values (-(random() * 1e15)::bigint, %s)"
        connection.execute(a_turn, (person,))
        a_note = "insert into voice_usage (user_id, message_id, seconds) values (%s, -(random() * 1e15)::bigint, 42)"
        connection.execute(a_note, (person,))
    if how == "everything":
        forgetting.forget_everything(person)
    elif how == "one conversation":
        forgetting.delete_conversation(person, telegram)
    else:
        forgetting.erase_person(person)
    assert one(database_url, "select count(*) from memory_notes where user_id = %s", person) == 0
    assert read_notes(memory.store, person).content == ""
    # The budget's counts hold no text and outlive a forget (no turns given back), not an erasure.
    usage = one(database_url, "select count(*) from turn_usage where user_id = %s", person)
    listened = one(database_url, "select count(*) from voice_usage where user_id = %s", person)
    assert (usage, listened) == ((0, 0) if how == "erasure" else (1, 1))


def test_forget_says_it_also_cancels_the_reminders_the_person_is_waiting_for(
    memory: Memory, forgetting: Forgetting, database_url: str
) -> None:
    """Asked on Telegram to remind them of two things, the person sends /forget to clear the
    history. Seen failing: the answer listed the messages and answers only, and confirming deleted
    the reminders too (they go with the conversation), so they waited for reminders that never
    came. The answer now says they are cancelled too; one already said is not counted, nor one the
    job is sending at that moment (it holds its text, and says it)."""
    sender = chat()
    start = memory.begin_turn(Person(sender_id=sender), Surface.TELEGRAM, "remind me", uuid.uuid4().hex)
    assert start.user_id is not None and start.message_id is not None
    due = [
        {"content": text, "due_at": "2027-01-04T08:00:00+00:00", "timezone": "UTC"}
        for text in ("Pills.", "Gym.", "Walk.")
    ]
    memory.finish_turn(
        start.user_id, start.message_id, "I'll remind you.", follow_ups={"schedule": due}, max_follow_ups=20
    )
    execute(database_url, "update follow_ups set status = 'sent' where content = 'Gym.'")
    execute(database_url, "update follow_ups set status = 'sending', claimed_until = now() where content = 'Walk.'")
    ask = ForgetRequest(Surface.TELEGRAM, sender, False)

    assert forgetting.answer(ask) == will_delete(ENGLISH, 2, 1, "/forget confirm", follow_ups=1)
    assert ENGLISH.say("forget.follow_ups_cancelled", follow_ups="1 reminder") in forgetting.answer(ask)
    assert forgetting.answer(ForgetRequest(Surface.TELEGRAM, sender, True)) == forgotten(ENGLISH, 2)
    assert rows(database_url, "select count(*) from follow_ups where user_id = %s", start.user_id) == [(0,)]


def test_forget_counts_only_the_persons_own_reminders(memory: Memory, forgetting: Forgetting) -> None:
    """Another person's pending reminders are not counted as the asker's (the count's user_id
    filter: without it, the answer said everyone's)."""
    due = {"content": "Pills.", "due_at": "2027-01-04T08:00:00+00:00", "timezone": "UTC"}
    senders = (chat(), chat())
    for sender in senders:
        start = memory.begin_turn(Person(sender_id=sender), Surface.TELEGRAM, "remind me", uuid.uuid4().hex)
        assert start.user_id is not None and start.message_id is not None
        memory.finish_turn(
            start.user_id, start.message_id, "I will.", follow_ups={"schedule": [due]}, max_follow_ups=20
        )
    ask = ForgetRequest(Surface.TELEGRAM, senders[0], False)
    assert forgetting.answer(ask) == will_delete(ENGLISH, 2, 1, "/forget confirm", follow_ups=1)


def test_a_turn_in_flight_during_the_forget_does_not_bring_back_the_language_it_heard(
    memory: Memory, forgetting: Forgetting, database_url: str
) -> None:
    """A voice note in Spanish is being answered when the person forgets everything from another
    app: its reply finds no message to store, and the language it heard in the forgotten message is
    not kept either (forgetting deletes the remembered language)."""
    person = uuid.uuid4()
    start = memory.begin_turn(Person(user_id=person), Surface.WEB, "una nota de voz", uuid.uuid4().hex)
    assert start.message_id is not None
    assert forgetting.forget_everything(person) == Forgotten(messages=1, conversations=1)

    stored = memory.finish_turn(person, start.message_id, "Claro.", language="es")
    memory.end_attempt(person, start.message_id, None, 0, language="pt")  # a fallback's end, the same

    assert stored is None
    assert rows(database_url, "select language from person_languages where user_id = %s", person) == []
