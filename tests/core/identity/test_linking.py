"""Linking on real Postgres: codes, the hourly limit, single use under a race, merging, unlinking."""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import replace
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from core.errors import LinkingNotNeeded
from core.follow_ups.capability import FollowUpRules, place_holder
from core.identity.linking import (
    CODE_ALPHABET,
    Linking,
    LinkRequest,
    LinkStatus,
    UnlinkRequest,
    code_hash,
    looks_like_code,
    mask,
    normalise_code,
)
from core.identity.policy import IdentityPolicy
from core.memory.digest import DigestJob, ExtractiveDigester, read_notes
from core.memory.retention import Retention
from core.memory.service import Memory
from core.models import Delivery, Person, Role, Sent, Surface
from core.stores.postgres_store import PostgresStore
from core.surfaces.telegram import Command, TelegramUpdate
from core.surfaces.telegram import classify as classify_telegram
from core.surfaces.whatsapp import WhatsAppForm
from core.surfaces.whatsapp import classify as classify_whatsapp
from tests.database import begin_turn_arguments, begin_turn_sql
from tests.helpers import ENGLISH, context_limits, digest_limits, execute, rows, turn_budget

AUTO = IdentityPolicy.build("auto", None, {})


@pytest.fixture
def linking(store: PostgresStore) -> Linking:
    return Linking(store, AUTO, ttl_minutes=10, attempts_per_hour=5, telegram_bot_username="advisor_bot")


def counts(database_url: str) -> dict[str, int]:
    tables = ("identities", "conversations", "messages", "link_codes", "link_attempts")
    with psycopg.connect(database_url) as connection:
        counted = {table: connection.execute(f"select count(*) from {table}").fetchone() for table in tables}
        used = connection.execute("select count(*) from link_codes where used_at is not null").fetchone()
    result = {table: int(row[0]) for table, row in counted.items() if row is not None}
    result["used_codes"] = int(used[0]) if used else -1
    return result


def talk(memory: Memory, surface: Surface, sender: str, text: str, external_id: str | None = None) -> uuid.UUID:
    start = memory.begin_turn(Person(sender_id=sender), surface, text, external_id or uuid.uuid4().hex)
    assert start.user_id is not None and start.message_id is not None and not start.degraded
    memory.finish_turn(start.user_id, start.message_id, f"re: {text}")
    return start.user_id


def test_codes_are_short_unambiguous_case_blind_and_stored_only_as_a_hash(linking: Linking, database_url: str) -> None:
    person = uuid.uuid4()
    issued = linking.new_code(person)
    assert len(issued.code) == 9 and set(issued.code) <= set(CODE_ALPHABET)
    assert issued.telegram_url == f"https://t.me/advisor_bot?start={issued.code}"
    assert issued.whatsapp_text == f"link {issued.code}"
    stored = rows(database_url, "select code_hash, user_id from link_codes where user_id = %s", person)
    assert stored == [(code_hash(issued.code), person)]
    spaced = f" {issued.code[:3].lower()} {issued.code[3:6]}-{issued.code[6:].lower()}. "
    assert normalise_code(spaced) == issued.code and looks_like_code(spaced)
    outcome = linking.redeem(Surface.TELEGRAM, "5550001", spaced)
    assert (outcome.status, outcome.user_id) == (LinkStatus.LINKED, person)


def test_a_new_code_retires_the_persons_unused_ones(linking: Linking) -> None:
    person = uuid.uuid4()
    first = linking.new_code(person)
    second = linking.new_code(person)
    assert linking.redeem(Surface.TELEGRAM, "5550002", first.code).status is LinkStatus.INVALID
    assert linking.redeem(Surface.TELEGRAM, "5550002", second.code).status is LinkStatus.LINKED


def test_linking_moves_an_auto_persons_history_to_the_web_person(
    linking: Linking, memory: Memory, database_url: str
) -> None:
    chat = f"{uuid.uuid4().int % 10**9}"
    before = talk(memory, Surface.TELEGRAM, chat, "my sister is Carmen", "upd-1")
    talk(memory, Surface.TELEGRAM, chat, "the flight is at 7:05", "upd-2")
    web_person = uuid.uuid4()
    outcome = linking.redeem(Surface.TELEGRAM, chat, linking.new_code(web_person).code)
    assert (outcome.status, outcome.user_id, outcome.moved_messages) == (LinkStatus.LINKED, web_person, 4)
    assert rows(database_url, "select count(*) from messages where user_id = %s", before) == [(0,)]
    assert rows(database_url, "select count(*) from conversations where user_id = %s", before) == [(0,)]
    assert rows(database_url, "select user_id, linked_at is not null from identities where external_id = %s", chat) == [
        (web_person, True)
    ]
    # The next message from the chat is the web person's, and sees what was said before the link.
    start = memory.begin_turn(Person(sender_id=chat), Surface.TELEGRAM, "what do you know?", "upd-3")
    assert start.user_id == web_person
    assert [m.content for m in start.history] == [
        "my sister is Carmen",
        "re: my sister is Carmen",
        "the flight is at 7:05",
        "re: the flight is at 7:05",
        "what do you know?",
    ]
    # A redelivery of an update from before the link is still recognised.
    again = memory.begin_turn(Person(sender_id=chat), Surface.TELEGRAM, "my sister is Carmen", "upd-1")
    assert again.duplicate and again.reply is not None and again.reply.content == "re: my sister is Carmen"


def test_two_chats_of_one_person_share_one_conversation_in_time_order(
    linking: Linking, memory: Memory, database_url: str
) -> None:
    web_person = uuid.uuid4()
    first_chat, second_chat = (f"{uuid.uuid4().int % 10**9}" for _ in range(2))
    assert linking.redeem(Surface.TELEGRAM, first_chat, linking.new_code(web_person).code).status is LinkStatus.LINKED
    talk(memory, Surface.TELEGRAM, first_chat, "one")
    talk(memory, Surface.TELEGRAM, second_chat, "two")  # a stranger yet: its own auto person
    talk(memory, Surface.TELEGRAM, first_chat, "three")
    outcome = linking.redeem(Surface.TELEGRAM, second_chat, linking.new_code(web_person).code)
    assert (outcome.status, outcome.moved_messages) == (LinkStatus.LINKED, 2)
    conversations = rows(
        database_url, "select id from conversations where user_id = %s and surface = 'telegram'", web_person
    )
    assert len(conversations) == 1
    thread = rows(
        database_url,
        "select content from messages where conversation_id = %s and role = 'user' order by created_at, id",
        conversations[0][0],
    )
    assert thread == [("one",), ("two",), ("three",)]


def test_a_merged_conversation_is_counted_whole_again_by_the_web(
    linking: Linking, store: PostgresStore, database_url: str
) -> None:
    """The web's window over a conversation counts it from a mark (context.sql's
    conversation_length); a merge moves older messages in before it, so it sets the mark back
    and the web's next window is the rule's over the merged thread."""
    from core.turn.context import ContextItem, stepped_tail
    from tests.helpers import context_limits

    limit, step = 3, 2
    memory = Memory(store, context_limits(max_messages=limit, window_step=step, web_prepend=0))
    web_person = uuid.uuid4()
    first_chat, second_chat = (f"{uuid.uuid4().int % 10**9}" for _ in range(2))
    assert linking.redeem(Surface.TELEGRAM, first_chat, linking.new_code(web_person).code).status is LinkStatus.LINKED
    talk(memory, Surface.TELEGRAM, second_chat, "early")  # a stranger yet: its own auto person
    for word in ("one", "two", "three", "four"):
        talk(memory, Surface.TELEGRAM, first_chat, word)
    [(chat_conversation,)] = rows(
        database_url, "select id from conversations where user_id = %s and surface = 'telegram'", web_person
    )
    # its attempt over at once: unanswered, the next turn reads it (context.sql)
    seen = memory.begin_turn(
        Person(user_id=web_person), Surface.WEB, "seen", "web-1", chat_conversation, answer_within_s=0
    )
    assert seen.message_id is not None
    assert rows(database_url, "select counted from conversations where id = %s", chat_conversation) == [(9 - limit,)]

    outcome = linking.redeem(Surface.TELEGRAM, second_chat, linking.new_code(web_person).code)

    assert (outcome.status, outcome.moved_messages) == (LinkStatus.LINKED, 2)
    assert rows(database_url, "select counted from conversations where id = %s", chat_conversation) == [(None,)]
    again = memory.begin_turn(Person(user_id=web_person), Surface.WEB, "again", "web-2", chat_conversation)
    thread = [
        ContextItem(role, text, Surface.TELEGRAM)
        for word in ("early", "one", "two", "three", "four")
        for role, text in ((Role.USER, word), (Role.ASSISTANT, f"re: {word}"))
    ] + [ContextItem(Role.USER, "seen", Surface.WEB), ContextItem(Role.USER, "again", Surface.WEB)]
    assert [m.content for m in again.history] == [i.content for i in stepped_tail(thread, limit, step)]


def race_for(database_url: str, code: str, racers: int = 8) -> list[LinkStatus]:
    """`racers` identities, each on its own connection, redeem one code at the same moment."""
    barrier = threading.Barrier(racers)
    results: list[LinkStatus] = []

    def redeem(chat: str) -> None:
        store = PostgresStore(database_url)
        try:
            Linking(store, AUTO).identities(uuid.uuid4())  # connect before the start line
            barrier.wait()
            results.append(Linking(store, AUTO).redeem(Surface.TELEGRAM, chat, code).status)
        finally:
            store.close()

    threads = [threading.Thread(target=redeem, args=(f"race-{uuid.uuid4().hex[:8]}",)) for _ in range(racers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def test_of_two_identities_redeeming_one_code_at_once_exactly_one_wins(store: PostgresStore, database_url: str) -> None:
    web_person = uuid.uuid4()
    for _ in range(5):  # a few rounds: a race that passes once by luck would not pass every time
        code = Linking(store, AUTO).new_code(web_person).code
        assert sorted(race_for(database_url, code)) == sorted([LinkStatus.LINKED] + [LinkStatus.USED] * 7)
    linked = rows(database_url, "select count(*) from identities where user_id = %s", web_person)
    assert linked == [(5,)]


def test_wrong_expired_and_used_codes_are_refused_and_change_nothing(
    linking: Linking, memory: Memory, database_url: str
) -> None:
    chat = f"{uuid.uuid4().int % 10**9}"
    talk(memory, Surface.TELEGRAM, chat, "hello")
    owner_of_code = uuid.uuid4()
    used = linking.new_code(owner_of_code).code
    assert linking.redeem(Surface.WHATSAPP, "+34600999888", used).status is LinkStatus.LINKED
    expired = Linking(linking._store, AUTO).new_code(uuid.uuid4()).code
    with psycopg.connect(database_url) as connection:
        connection.execute(
            "update link_codes set expires_at = now() - interval '1 second' where code_hash = %s", (code_hash(expired),)
        )
    before = counts(database_url)
    assert linking.redeem(Surface.TELEGRAM, chat, "ZZZZZZZZZ").status is LinkStatus.INVALID
    assert linking.redeem(Surface.TELEGRAM, chat, expired).status is LinkStatus.EXPIRED
    assert linking.redeem(Surface.TELEGRAM, chat, used).status is LinkStatus.USED
    after = counts(database_url)
    assert after == {**before, "link_attempts": before["link_attempts"] + 3}
    assert rows(database_url, "select linked_at from identities where external_id = %s", chat) == [(None,)]
    other_chat = f"{chat}2"
    answers = [
        linking.answer(LinkRequest(Surface.TELEGRAM, other_chat, "ZZZZZZZZZ")).text,
        linking.answer(LinkRequest(Surface.TELEGRAM, other_chat, expired)).text,
        linking.answer(LinkRequest(Surface.TELEGRAM, other_chat, used)).text,
    ]
    assert answers == [
        "That code isn't valid. Check it, or ask for a new one on the web.",
        "That code has expired. Ask for a new one on the web.",
        "That code has already been used. Ask for a new one on the web.",
    ]


def test_the_sixth_wrong_code_within_an_hour_is_refused_even_when_right(linking: Linking, database_url: str) -> None:
    chat = f"{uuid.uuid4().int % 10**9}"
    for _ in range(5):
        assert linking.redeem(Surface.TELEGRAM, chat, "WRONGCODE").status is LinkStatus.INVALID
    person = uuid.uuid4()
    right = linking.new_code(person).code
    refused = linking.redeem(Surface.TELEGRAM, chat, right)
    assert refused.status is LinkStatus.TOO_MANY_ATTEMPTS and refused.retry_at is not None
    assert rows(database_url, "select count(*) from identities where user_id = %s", person) == [(0,)]
    assert linking.answer(LinkRequest(Surface.TELEGRAM, chat, right)).text.startswith("Too many wrong codes.")
    # Another identity is not limited by this one's mistakes, and the code still works for it.
    assert linking.redeem(Surface.TELEGRAM, f"{chat}1", right).status is LinkStatus.LINKED
    # When the hour has passed, the identity may try again.
    with psycopg.connect(database_url) as connection:
        connection.execute(
            "update link_attempts set attempted_at = attempted_at - interval '61 minutes' where external_id = %s",
            (chat,),
        )
    assert linking.redeem(Surface.TELEGRAM, chat, linking.new_code(person).code).status is LinkStatus.LINKED


def test_a_redelivered_start_command_says_linked_again(linking: Linking) -> None:
    person = uuid.uuid4()
    code = linking.new_code(person).code
    assert linking.redeem(Surface.TELEGRAM, "777001", code).status is LinkStatus.LINKED
    assert linking.redeem(Surface.TELEGRAM, "777001", code).status is LinkStatus.ALREADY_LINKED


def test_unlinking_starts_the_identity_as_a_new_person_and_keeps_the_thread(
    linking: Linking, memory: Memory, database_url: str
) -> None:
    web_person = uuid.uuid4()
    number = "+34600123456"
    assert linking.redeem(Surface.WHATSAPP, number, linking.new_code(web_person).code).status is LinkStatus.LINKED
    talk(memory, Surface.WHATSAPP, number, "my PIN hint is the dog's name")
    assert linking.answer(UnlinkRequest(Surface.WHATSAPP, f"whatsapp:{number}")).text.startswith("Unlinked.")
    assert linking.answer(UnlinkRequest(Surface.WHATSAPP, f"whatsapp:{number}")).text == (
        "This chat isn't linked to a web account, so there is nothing to unlink."
    )
    start = memory.begin_turn(Person(sender_id=number), Surface.WHATSAPP, "what is my PIN hint?", "SMx1")
    assert start.user_id is not None and start.user_id != web_person
    assert [(m.role, m.content) for m in start.history] == [(Role.USER, "what is my PIN hint?")]
    kept = rows(database_url, "select count(*) from messages where user_id = %s", web_person)
    assert kept == [(2,)]


def test_an_auto_identity_cannot_be_unlinked_from_its_own_memory(linking: Linking, memory: Memory) -> None:
    chat = f"{uuid.uuid4().int % 10**9}"
    person = talk(memory, Surface.TELEGRAM, chat, "hi")
    assert linking.unlink(Surface.TELEGRAM, chat) == 0
    assert memory.begin_turn(Person(sender_id=chat), Surface.TELEGRAM, "again", "x").user_id == person


def test_identities_list_and_mask(linking: Linking) -> None:
    # A number of this test's own: the session's database holds other tests' people, and the
    # corpus's +34600111222 may have come beside a BSUID there (linked, both would be listed).
    person, middle = uuid.uuid4(), f"{uuid.uuid4().int % 10**4:04d}"
    linking.link(person, Surface.TELEGRAM, "123456789")
    linking.link(person, Surface.WHATSAPP, f"whatsapp:+34 6{middle} 1222")
    listed = [(item.surface, item.external_id) for item in linking.identities(person)]
    assert listed == [(Surface.TELEGRAM, "123456789"), (Surface.WHATSAPP, f"+346{middle}1222")]
    assert [item.as_json()["external_id"] for item in linking.identities(person)] == ["•••••6789", "+34•••••1222"]
    assert mask(Surface.TELEGRAM, "42") == "42"


def test_owner_policy_needs_no_linking(store: PostgresStore) -> None:
    owner = uuid.uuid4()
    policy = IdentityPolicy.build("owner", owner, {Surface.TELEGRAM: ["4242"], Surface.WHATSAPP: ["+34600111222"]})
    linking = Linking(store, policy, stranger_reply="Private assistant.")
    with pytest.raises(LinkingNotNeeded) as refused:
        linking.new_code(owner)
    # Named for every app alike, so a new surface's owners' setting needs no edit here.
    assert str(refused.value) == (
        "IDENTITY_POLICY=owner: this assistant serves one person, whose apps are configured "
        "(the OWNER_* settings, one for each app); there is nothing to link"
    )
    # Nor does an operator's link (`crossmem link`): the policy would still turn the chat away, and
    # "linked" would be a promise the next message breaks.
    with pytest.raises(LinkingNotNeeded):
        linking.link(owner, Surface.TELEGRAM, "5555")
    assert linking.identities(owner) == []
    assert linking.answer(LinkRequest(Surface.TELEGRAM, "4242", "ABCDEFGHJ")).text == ENGLISH.say("link.not_needed")
    assert linking.answer(UnlinkRequest(Surface.TELEGRAM, "9999")).text == "Private assistant."


def test_under_the_owner_policy_nothing_to_link_is_said_in_the_owners_remembered_language(
    store: PostgresStore, database_url: str
) -> None:
    """No SQL function of its own answers it, so it asks person_language, only when the request
    states no language there is a file for: the owner's remembered Spanish, or what it states."""
    owner = uuid.uuid4()
    policy = IdentityPolicy.build("owner", owner, {Surface.TELEGRAM: ["4242"]})
    linking = Linking(store, policy)
    execute(database_url, "insert into person_languages (user_id, language) values (%s, 'es')", owner)
    request = LinkRequest(Surface.TELEGRAM, "4242", "ABCDEFGHJ")
    not_needed = "No hace falta vincular nada: este asistente sirve a una sola persona y ya te conoce aquí."
    assert linking.answer(request).text == not_needed
    assert linking.answer(request, "pt-BR").text == not_needed  # stated, but no file for it
    assert linking.answer(request, "en-GB").text == ENGLISH.say("link.not_needed")
    assert linking.answer(LinkRequest(Surface.TELEGRAM, "9999", "ABCDEFGHJ")).text == ENGLISH.say("turn.stranger")


def test_a_merge_moves_the_timezone_and_the_language_the_later_learned_winning(
    linking: Linking, memory: Memory, database_url: str
) -> None:
    """A chat's person merged into a web person by a real link: their timezone and language move
    to the survivor, unless the survivor learned theirs later; nothing stays with the merged one."""
    zone = "select timezone from person_timezones where user_id = %s"
    language = "select language from person_languages where user_id = %s"
    chat, web_person = f"77{uuid.uuid4().int % 10**7}", uuid.uuid4()
    merged = talk(memory, Surface.TELEGRAM, chat, "hola")
    execute(database_url, "insert into person_timezones (user_id, timezone) values (%s, 'Europe/Madrid')", merged)
    execute(database_url, "insert into person_languages (user_id, language) values (%s, 'es')", merged)
    code = linking.new_code(web_person).code
    assert linking.redeem(Surface.TELEGRAM, chat, code).status is LinkStatus.LINKED
    assert rows(database_url, zone, web_person) == [("Europe/Madrid",)]
    assert rows(database_url, language, web_person) == [("es",)]
    assert rows(database_url, zone, merged) == rows(database_url, language, merged) == []

    # The survivor's own, learned after the merged person's: it stays.
    other_chat = f"78{uuid.uuid4().int % 10**7}"
    learned_first = talk(memory, Surface.TELEGRAM, other_chat, "hi")
    execute(database_url, "insert into person_timezones (user_id, timezone) values (%s, 'America/Lima')", learned_first)
    execute(
        database_url,
        "update person_timezones set updated_at = now() + interval '1 minute' where user_id = %s",
        web_person,
    )
    code = linking.new_code(web_person).code
    assert linking.redeem(Surface.TELEGRAM, other_chat, code).status is LinkStatus.LINKED
    assert rows(database_url, zone, web_person) == [("Europe/Madrid",)]
    assert rows(database_url, zone, learned_first) == []


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("link ABCDEFGHJ", LinkRequest(Surface.WHATSAPP, "+34600111222", "ABCDEFGHJ")),
        ("  Link abc-def-ghj ", LinkRequest(Surface.WHATSAPP, "+34600111222", "abc-def-ghj")),
        ("LINK\tabcdefghj", LinkRequest(Surface.WHATSAPP, "+34600111222", "abcdefghj")),
        ("Link: K7M2QX9TA.", LinkRequest(Surface.WHATSAPP, "+34600111222", "K7M2QX9TA.")),
        ("link ABCDEFGH", LinkRequest(Surface.WHATSAPP, "+34600111222", "ABCDEFGH")),
        ("link", LinkRequest(Surface.WHATSAPP, "+34600111222", "")),
        ("Unlink", UnlinkRequest(Surface.WHATSAPP, "+34600111222")),
        ("link my accounts please", None),
        ("linking is fun", None),
        ("", None),
    ],
)
def test_whatsapp_link_commands(body: str, expected: LinkRequest | UnlinkRequest | None) -> None:
    form = WhatsAppForm.from_form({"From": "whatsapp:+34600111222", "Body": body, "MessageSid": "SM1"})
    action = classify_whatsapp(form)
    if expected is None:
        assert not isinstance(action, LinkRequest | UnlinkRequest)
    elif isinstance(expected, LinkRequest):
        assert action == replace(expected, delivery="SM1")  # the MessageSid: a redelivery counts once
    else:
        assert action == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("/start ABCDEFGHJ", LinkRequest(Surface.TELEGRAM, "42", "ABCDEFGHJ", consented=False)),
        ("/link Q63 C6J 332", LinkRequest(Surface.TELEGRAM, "42", "Q63 C6J 332")),
        ("link q63-c6j-332", LinkRequest(Surface.TELEGRAM, "42", "q63-c6j-332")),
        ("Q63 C6J 332", LinkRequest(Surface.TELEGRAM, "42", "Q63 C6J 332", bare=True)),
        ("link me to the article", None),
        ("yes thanks", None),
        ("/link abcdefghj", LinkRequest(Surface.TELEGRAM, "42", "abcdefghj")),
        ("/link@advisor_bot ABCDEFGHJ", LinkRequest(Surface.TELEGRAM, "42", "ABCDEFGHJ")),
        ("/Link\nabcdefghj", LinkRequest(Surface.TELEGRAM, "42", "abcdefghj")),
        ("/link", LinkRequest(Surface.TELEGRAM, "42", "")),
        ("/unlink", UnlinkRequest(Surface.TELEGRAM, "42")),
        ("/link@another_bot ABCDEFGHJ", None),
        ("/start newsletter-2026", None),
        ("/unlink everything", None),
    ],
)
def test_telegram_link_commands(text: str, expected: LinkRequest | UnlinkRequest | None) -> None:
    update = TelegramUpdate.model_validate(
        {
            "update_id": 1,
            "message": {"message_id": 1, "chat": {"id": 42, "type": "private"}, "from": {"id": 42}, "text": text},
        }
    )
    action = classify_telegram(update, None, "advisor_bot")
    if expected is None:
        assert not isinstance(action, Command)
    elif isinstance(expected, LinkRequest):
        assert action == Command(42, replace(expected, delivery="1"))  # the update_id
    else:
        assert action == Command(42, expected)


def waiting_on_a_lock(database_url: str, pid: int) -> bool:
    row = rows(database_url, "select wait_event_type from pg_stat_activity where pid = %s", pid)
    return bool(row) and row[0][0] == "Lock"


@pytest.mark.parametrize("already_has_a_telegram_conversation", [False, True], ids=["moved", "merged"])
def test_a_turn_arriving_while_its_chat_is_being_linked_lands_in_the_linked_thread(
    memory: Memory, database_url: str, already_has_a_telegram_conversation: bool
) -> None:
    chat, web_person = f"{uuid.uuid4().int % 10**9}", uuid.uuid4()
    talk(memory, Surface.TELEGRAM, chat, "before the link")
    if already_has_a_telegram_conversation:
        Linking(memory.store, AUTO).link(web_person, Surface.TELEGRAM, f"{chat}0")
        talk(memory, Surface.TELEGRAM, f"{chat}0", "from an earlier chat")
    linker = psycopg.connect(database_url)  # the link's transaction, held open
    linker.execute("select public.link_identity(%s, 'telegram', %s)", (web_person, chat))
    turn: dict[str, Any] = {}
    during = psycopg.connect(database_url, autocommit=True)
    pid = during.info.backend_pid

    def send() -> None:
        arguments = begin_turn_arguments(
            p_surface="telegram", p_content="during the link", p_external_id=uuid.uuid4().hex, p_sender_id=chat
        )
        turn["row"] = during.execute(begin_turn_sql(arguments), arguments).fetchone()

    thread = threading.Thread(target=send)
    thread.start()
    for _ in range(200):  # until the turn waits for the link (it must: the identity is locked)
        if waiting_on_a_lock(database_url, pid):
            break
        thread.join(0.05)
    assert waiting_on_a_lock(database_url, pid)
    linker.commit()
    thread.join()
    linker.close()
    during.close()
    assert turn["row"][0]["user_id"] == str(web_person)
    placed = rows(
        database_url,
        "select m.user_id, c.user_id from messages m join conversations c on c.id = m.conversation_id"
        " where m.content = 'during the link' and m.id = %s",
        turn["row"][0]["message_id"],
    )
    assert placed == [(web_person, web_person)]


def test_a_reply_written_after_its_question_was_merged_is_stored_with_it(
    linking: Linking, memory: Memory, database_url: str
) -> None:
    chat, web_person = f"{uuid.uuid4().int % 10**9}", uuid.uuid4()
    asked = memory.begin_turn(Person(sender_id=chat), Surface.TELEGRAM, "hi, are you there?", "upd-merge-1")
    assert asked.user_id is not None and asked.message_id is not None
    assert linking.redeem(Surface.TELEGRAM, chat, linking.new_code(web_person).code).status is LinkStatus.LINKED
    reply_id = memory.finish_turn(asked.user_id, asked.message_id, "yes, here", delivered=False)
    assert reply_id is not None
    memory.record_delivery(asked.user_id, reply_id, None, Sent(Delivery.DELIVERED, 1))
    assert rows(database_url, "select user_id, delivered_at is not null from messages where id = %s", reply_id) == [
        (web_person, True)
    ]
    # Someone who was never merged cannot write into that thread.
    assert memory.finish_turn(uuid.uuid4(), asked.message_id, "intruder") is None


def test_a_chat_linked_to_one_account_is_not_taken_by_another_accounts_code(
    linking: Linking, memory: Memory, database_url: str
) -> None:
    chat, first, second = f"{uuid.uuid4().int % 10**9}", uuid.uuid4(), uuid.uuid4()
    assert linking.redeem(Surface.TELEGRAM, chat, linking.new_code(first).code).status is LinkStatus.LINKED
    talk(memory, Surface.TELEGRAM, chat, "said to the first account")
    code = linking.new_code(second).code
    before = counts(database_url)
    assert linking.redeem(Surface.TELEGRAM, chat, code).status is LinkStatus.LINKED_ELSEWHERE
    assert counts(database_url) == before  # the code is not spent, no wrong attempt is counted
    assert linking.answer(LinkRequest(Surface.TELEGRAM, chat, code)).text == (
        "This chat is linked to another web account. Unlink it first (/unlink), then send the code again."
    )
    assert linking.link(second, Surface.TELEGRAM, chat).status is LinkStatus.LINKED_ELSEWHERE
    linking.unlink(Surface.TELEGRAM, chat)
    assert linking.redeem(Surface.TELEGRAM, chat, code).status is LinkStatus.LINKED
    assert rows(database_url, "select count(*) from messages where user_id = %s", first) == [(2,)]
    assert rows(database_url, "select count(*) from messages where user_id = %s", second) == [(0,)]


def test_an_old_code_sent_again_after_unlinking_is_used_not_linked(linking: Linking) -> None:
    person = uuid.uuid4()
    code = linking.new_code(person).code
    assert linking.redeem(Surface.WHATSAPP, "+34600555444", code).status is LinkStatus.LINKED
    assert linking.unlink(Surface.WHATSAPP, "+34600555444") == 1
    assert linking.redeem(Surface.WHATSAPP, "+34600555444", code).status is LinkStatus.USED


def test_a_redelivery_after_merging_into_an_existing_conversation_is_recognised(
    linking: Linking, memory: Memory
) -> None:
    web_person, first_chat, second_chat = uuid.uuid4(), f"{uuid.uuid4().int % 10**9}", f"{uuid.uuid4().int % 10**9}"
    linking.link(web_person, Surface.TELEGRAM, first_chat)
    talk(memory, Surface.TELEGRAM, first_chat, "first chat")
    talk(memory, Surface.TELEGRAM, second_chat, "second chat, before the link", "upd-second-1")
    assert linking.link(web_person, Surface.TELEGRAM, second_chat).moved_messages == 2
    again = memory.begin_turn(
        Person(sender_id=second_chat), Surface.TELEGRAM, "second chat, before the link", "upd-second-1"
    )
    assert again.duplicate and again.user_id == web_person
    assert again.reply is not None and again.reply.content == "re: second chat, before the link"


@pytest.mark.parametrize(
    ("chat_id", "sender_id", "linked"), [(42, 42, True), (42, 42.0, True), ("x", "x", False), (True, True, False)]
)
def test_a_confirm_button_links_only_from_a_chat_whose_id_is_a_number(
    chat_id: object, sender_id: object, linked: bool
) -> None:
    """Telegram's chat ids are numbers: a body that names another kind (equal on both sides) is no
    button of ours, not a 500."""
    update = TelegramUpdate.model_validate(
        {
            "update_id": 1,
            "callback_query": {
                "id": "q-1",
                "data": "link:ABCDEFGHJ",
                "from": {"id": sender_id},
                "message": {"message_id": 7, "chat": {"id": chat_id, "type": "private"}},
            },
        }
    )
    action = classify_telegram(update, None, "advisor_bot")
    request = LinkRequest(Surface.TELEGRAM, "42", "ABCDEFGHJ", consented=True, delivery=str(update.update_id))
    expected = Command(42, request, callback_query_id="q-1")
    assert (action == expected) if linked else not isinstance(action, Command)


def sessions_waiting(database_url: str) -> int:
    """How many sessions of the database wait for a lock now."""
    found = rows(
        database_url,
        "select count(*) from pg_stat_activity where datname = current_database() and wait_event_type = 'Lock'",
    )
    return int(found[0][0])


def waiting_for_a_lock(database_url: str) -> bool:
    return sessions_waiting(database_url) > 0


def until_waiting(database_url: str, sessions: int) -> None:
    """Until `sessions` sessions wait for a lock (a bounded wait, then the test fails)."""
    for _ in range(500):
        if sessions_waiting(database_url) >= sessions:
            return
        time.sleep(0.02)
    assert sessions_waiting(database_url) >= sessions


def test_a_link_and_an_attempt_ending_at_once_neither_deadlocks_and_the_attempt_counts_for_the_person(
    own_database: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A link takes the chat's conversation, then its messages, then its language row; end_attempt
    took the language row first (a review's note), and now takes the conversation first, as the
    link does: it waits for the link, holding nothing the link needs. The link here takes the
    conversation in its transaction before its own call, so that the attempt always meets it so;
    the attempt then ends for the person the chat was linked into."""
    store = PostgresStore(own_database)
    try:
        memory = Memory(store, context_limits(), turn_budget(tokens_per_day=1_000_000, reply_tokens=100))
        chat = f"lock-{uuid.uuid4().hex[:8]}"
        start = memory.begin_turn(Person(sender_id=chat), Surface.TELEGRAM, "hola", f"{chat}-1", sender=chat)
        assert start.user_id is not None and start.message_id is not None
        execute(own_database, "insert into person_languages (user_id, language) values (%s, 'en')", start.user_id)
        web_person = uuid.uuid4()

        with psycopg.connect(own_database) as link:
            link.execute("select from conversations where user_id = %s for update", (start.user_id,))
            ending = threading.Thread(
                target=lambda: memory.end_attempt(
                    start.user_id, start.message_id, start.attempt, 40, reserved=start.reserved_tokens, language="es"
                )
            )
            ending.start()
            until_waiting(own_database, 1)  # the attempt waits for the conversation
            linked = link.execute("select link_identity(%s, 'telegram', %s)", (web_person, chat)).fetchone()
            link.commit()
        ending.join(20)
        assert linked is not None and linked[0]["status"] == "linked"
        assert "end_attempt failed" not in caplog.text
        assert rows(
            own_database,
            "select user_id, language from person_languages where user_id in (%s, %s)",
            start.user_id,
            web_person,
        ) == [(web_person, "es")]
        assert rows(
            own_database, "select user_id, tokens, reserved from turn_usage where message_id = %s", start.message_id
        ) == [(web_person, 40, 0)]
    finally:
        store.close()


def test_an_attempt_ending_with_a_held_place_while_its_chat_is_linked_never_deadlocks(own_database: str) -> None:
    """end_attempt frees the places its turn's schedule tool held (follow-ups `reserved`); a link
    moving the chat's conversation moves its follow-ups, places included, before its messages. With
    the message locked first, the attempt held the message the link waited for while it waited for
    the place the link held: Postgres undid one of them (a deadlock). Interleaved here at that very
    point: a third session holds the person's language row, which the attempt takes after its
    message (and, now, its conversation), until the link waits too. Now the attempt takes the
    conversation first, as the link and finish_turn do: the link waits for it, and both end."""
    store = PostgresStore(own_database)
    try:
        memory = Memory(store, context_limits(), turn_budget())
        chat = f"lock-{uuid.uuid4().hex[:8]}"
        start = memory.begin_turn(Person(sender_id=chat), Surface.TELEGRAM, "remind me", f"{chat}-1", sender=chat)
        assert start.user_id is not None and start.message_id is not None
        due = {"content": "Stretch.", "due_at": "2099-01-01T09:00:00+00:00", "timezone": "UTC"}
        assert place_holder(store, start.user_id, start.message_id, FollowUpRules(max_pending=5))(1, due, []) is True
        execute(own_database, "insert into person_languages (user_id, language) values (%s, 'en')", start.user_id)
        web_person = uuid.uuid4()
        answers: dict[str, Any] = {}
        failures: list[BaseException] = []

        def run(name: str, query: str, *params: Any) -> None:
            try:
                with psycopg.connect(own_database, autocommit=True) as session:
                    found = session.execute(query, params).fetchone()
                    answers[name] = found[0] if found else None
            except psycopg.Error as exc:
                failures.append(exc)

        with psycopg.connect(own_database) as language:
            language.execute("select from person_languages where user_id = %s for update", (start.user_id,))
            ending = threading.Thread(
                target=run,
                args=(
                    "ended",
                    "select public.end_attempt(%s, %s, %s, 0, null, 0, 'es', false, null, null)",
                    start.user_id,
                    start.message_id,
                    start.attempt,
                ),
            )
            ending.start()
            until_waiting(own_database, 1)  # the attempt, for the language row
            linking = threading.Thread(
                target=run,
                args=("linked", "select public.link_identity(%s, 'telegram', %s)", web_person, chat),
            )
            linking.start()
            until_waiting(own_database, 2)  # the link too, for what the attempt holds
            language.commit()
        ending.join(30)
        linking.join(30)
        assert failures == []
        assert answers["ended"] == {"owed": True}
        assert (answers["linked"]["status"], answers["linked"]["moved_messages"]) == ("linked", 1)
        assert rows(own_database, "select count(*) from follow_ups") == [(0,)]  # the place freed
        assert rows(own_database, "select user_id, content from messages") == [(web_person, "remind me")]
        assert rows(own_database, "select user_id, language from person_languages") == [(web_person, "es")]
    finally:
        store.close()


def test_an_attempt_naming_someone_elses_message_waits_for_none_of_their_locks(own_database: str) -> None:
    """end_attempt's first lock, the message's conversation, is the caller's own or nobody's: another
    person naming this person's message (a forged or confused id) neither waits for their
    conversation (held here, as a link holds it) nor changes anything of theirs."""
    store = PostgresStore(own_database)
    try:
        memory = Memory(store, context_limits(), turn_budget())
        chat = f"lock-{uuid.uuid4().hex[:8]}"
        start = memory.begin_turn(Person(sender_id=chat), Surface.TELEGRAM, "mine", f"{chat}-1", sender=chat)
        assert start.user_id is not None and start.message_id is not None
        before = rows(own_database, "select answer_by from messages where id = %s", start.message_id)
        with psycopg.connect(own_database) as link, psycopg.connect(own_database, autocommit=True) as other:
            link.execute("select from conversations where user_id = %s for update", (start.user_id,))
            other.execute("set lock_timeout = '5s'")  # a wait at all would be the filter lost; never reached
            ended = other.execute(
                "select public.end_attempt(%s, %s, %s, 0, null, 0, null, false, null, null)",
                (uuid.uuid4(), start.message_id, start.attempt),
            ).fetchone()
        assert ended == ({"owed": False},)
        assert rows(own_database, "select answer_by from messages where id = %s", start.message_id) == before
    finally:
        store.close()


@pytest.mark.parametrize("merged", [False, True], ids=["conversation-moved", "into-the-persons-own"])
def test_a_link_and_a_reply_stored_at_once_neither_deadlocks_and_the_reply_is_the_persons(
    own_database: str, merged: bool
) -> None:
    """finish_turn took the language row, then met the link on the chat's conversation, which the
    link holds before it takes the language: they deadlocked. The reply now waits for the link
    (the conversation first, as the link takes it) and is stored in the thread it was moved to,
    the person's: never under the chat's old id, out of every context."""
    store = PostgresStore(own_database)
    try:
        memory = Memory(store, context_limits(), turn_budget())
        chat = f"lock-{uuid.uuid4().hex[:8]}"
        web_person = uuid.uuid4()
        if merged:  # the person already has a Telegram conversation: the chat's messages move into it
            execute(
                own_database,
                "insert into conversations (user_id, surface, title) values (%s, 'telegram', 'T')",
                web_person,
            )
        start = memory.begin_turn(Person(sender_id=chat), Surface.TELEGRAM, "hola", f"{chat}-1", sender=chat)
        assert start.user_id is not None and start.message_id is not None
        execute(own_database, "insert into person_languages (user_id, language) values (%s, 'en')", start.user_id)

        stored: list[int | None] = []
        with psycopg.connect(own_database) as link:
            link.execute("select from conversations where user_id = %s for update", (start.user_id,))
            finishing = threading.Thread(
                target=lambda: stored.append(
                    memory.finish_turn(start.user_id, start.message_id, "¡hola!", language="es")
                )
            )
            finishing.start()
            while not waiting_for_a_lock(own_database):  # the reply waits for the conversation
                time.sleep(0.02)
            linked = link.execute("select link_identity(%s, 'telegram', %s)", (web_person, chat)).fetchone()
            link.commit()
        finishing.join(20)
        assert linked is not None and linked[0]["status"] == "linked"
        assert stored and stored[0] is not None
        assert rows(own_database, "select user_id, role, content from messages order by id") == [
            (web_person, "user", "hola"),
            (web_person, "assistant", "¡hola!"),
        ]
        assert rows(own_database, "select count(distinct conversation_id) from messages") == [(1,)]
        assert rows(own_database, "select user_id, language from person_languages") == [(web_person, "es")]
    finally:
        store.close()


def test_a_deep_link_asks_before_taking_a_chat_whose_messages_were_purged_but_whose_memory_stays(
    own_database: str,
) -> None:
    """The purge deleted the chat's messages; its memory notes, follow-ups and time zone stay. A
    deep link's `/start CODE` is one tap on a link anyone can make: it must not move that memory
    to the code's account without the chat's consent."""
    store = PostgresStore(own_database, max_connections=4)
    memory = Memory(store, context_limits(max_messages=4, window_step=2))
    linking = Linking(store, AUTO, ttl_minutes=10, attempts_per_hour=5)
    chat = f"{uuid.uuid4().int % 10**9}"
    for text in ("my diagnosis came back positive", "x", "y"):
        victim = talk(memory, Surface.TELEGRAM, chat, text)
    limits = digest_limits(max_messages=4, window_step=2, window_hours=24, idle_s=0)
    assert DigestJob(store, ExtractiveDigester(800), limits).run(victim).updated == 1
    assert "my diagnosis came back positive" in read_notes(store, victim).content
    execute(own_database, "update messages set created_at = created_at - interval '100 days'")
    assert Retention(store, batch_size=100, in_flight=timedelta(minutes=2)).purge(timedelta(days=90)).deleted == 6

    stranger = uuid.uuid4()
    outcome = linking.redeem(Surface.TELEGRAM, chat, linking.new_code(stranger).code, consented=False)
    assert outcome.status is LinkStatus.NEEDS_CONSENT
    assert read_notes(store, stranger).content == ""
    said = linking.answer(LinkRequest(Surface.TELEGRAM, chat, linking.new_code(stranger).code, consented=False))
    assert said.text.startswith("This code would join this chat") and "0 messages" not in said.text, said.text
    store.close()


def test_unlinking_counts_only_the_reminders_of_the_person_the_chat_leaves(linking: Linking, memory: Memory) -> None:
    """A chat linked to one web account asks for a reminder and is unlinked (the reminder stays
    with that account), then is linked to another account and unlinked again: its answer counts
    none, the first account's reminder being no longer its person's (the count's user_id filter:
    without it, the second answer said 1 reminder)."""
    chat = f"{uuid.uuid4().int % 10**9}"
    first, second = uuid.uuid4(), uuid.uuid4()
    linking.link(first, Surface.TELEGRAM, chat)
    start = memory.begin_turn(Person(sender_id=chat), Surface.TELEGRAM, "remind me at 9", uuid.uuid4().hex, sender=chat)
    assert start.user_id == first and start.message_id is not None
    due = {"content": "Pills.", "due_at": "2027-01-04T09:00:00+00:00", "timezone": "UTC"}
    memory.finish_turn(first, start.message_id, "I will.", follow_ups={"schedule": [due]}, max_follow_ups=20)
    waiting = ENGLISH.say("link.unlinked_follow_ups", follow_ups=ENGLISH.count("count.follow_ups", 1))
    assert linking.answer(UnlinkRequest(Surface.TELEGRAM, chat)).text == ENGLISH.say("link.unlinked") + " " + waiting
    linking.link(second, Surface.TELEGRAM, chat)
    assert linking.answer(UnlinkRequest(Surface.TELEGRAM, chat)).text == ENGLISH.say("link.unlinked")
