"""Edits and replies in the memory (turn.sql's edit_message and reply_quote), on real Postgres:
an edit corrects only the person's own message, once; a reply keeps what it answers and quotes it."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from core.identity.linking import Linking
from core.identity.policy import IdentityPolicy
from core.memory.digest import DigestJob, ExtractiveDigester, read_notes
from core.memory.service import EditResult, Memory
from core.models import Person, PlatformMessage, StoredMessage, Surface
from core.stores.postgres_store import PostgresStore
from tests.helpers import context_limits, digest_limits, execute, rows

EDITED_AT = datetime(2026, 11, 30, 9, 15, tzinfo=UTC)


def stored(database_url: str, message_id: int | None) -> tuple[object, ...]:
    """A message's content, quote, reply and edit time."""
    found = rows(database_url, "select content, quoted, replied_to, edited_at from messages where id = %s", message_id)
    assert len(found) == 1
    return found[0]


def said(memory: Memory, person: Person, text: str, ref: str, **reply: str) -> int:
    """A Telegram message of `person`, stored by a turn's begin_turn and answered; its id."""
    start = memory.begin_turn(person, Surface.TELEGRAM, text, uuid.uuid4().hex, platform=PlatformMessage(ref, **reply))
    assert start.message_id is not None and start.user_id is not None
    memory.finish_turn(start.user_id, start.message_id, "Noted.")
    return start.message_id


def test_an_edit_replaces_the_persons_own_message_once(memory: Memory, database_url: str) -> None:
    person = Person(user_id=uuid.uuid4())
    message = said(memory, person, "The dentist is on Tuesday", "42:7")
    edit = memory.edit_message(
        person, Surface.TELEGRAM, PlatformMessage("42:7"), "The dentist is on Thursday", EDITED_AT
    )
    assert edit == EditResult(found=True, edited=True, message_id=message)
    assert stored(database_url, message) == ("The dentist is on Thursday (edited)", None, None, EDITED_AT)
    # Delivered again, the same edit changes nothing; nor does an older one arriving late.
    again = memory.edit_message(
        person, Surface.TELEGRAM, PlatformMessage("42:7"), "The dentist is on Thursday", EDITED_AT
    )
    older = memory.edit_message(
        person,
        Surface.TELEGRAM,
        PlatformMessage("42:7"),
        "The dentist is on Wednesday",
        EDITED_AT - timedelta(minutes=1),
    )
    assert again == older == EditResult(found=True, edited=False, message_id=message)
    assert stored(database_url, message) == ("The dentist is on Thursday (edited)", None, None, EDITED_AT)
    # A later one replaces it again.
    later = EDITED_AT + timedelta(minutes=2)
    memory.edit_message(person, Surface.TELEGRAM, PlatformMessage("42:7"), "The dentist is on Friday", later)
    assert stored(database_url, message) == ("The dentist is on Friday (edited)", None, None, later)


def test_an_edit_never_touches_another_persons_message_of_the_same_name(memory: Memory, database_url: str) -> None:
    """edit_message filters by the person: without it, the newest message of that name (the other
    person's, stored second) would be the one corrected."""
    ana, bruno = Person(user_id=uuid.uuid4()), Person(user_id=uuid.uuid4())
    hers = said(memory, ana, "My budget is 900", "7:1")
    his = said(memory, bruno, "My budget is 400", "7:1")
    edit = memory.edit_message(ana, Surface.TELEGRAM, PlatformMessage("7:1"), "My budget is 950", EDITED_AT)
    assert edit == EditResult(found=True, edited=True, message_id=hers)
    assert stored(database_url, hers)[0] == "My budget is 950 (edited)"
    assert stored(database_url, his) == ("My budget is 400", None, None, None)
    # Nor does a stranger's edit find anything, on any surface or name.
    stranger = Person(sender_id=f"stranger-{uuid.uuid4().hex}")
    missed = memory.edit_message(stranger, Surface.TELEGRAM, PlatformMessage("7:1"), "mine now", EDITED_AT)
    assert missed == EditResult(found=False, edited=False, message_id=None)
    elsewhere = memory.edit_message(ana, Surface.WHATSAPP, PlatformMessage("7:1"), "on WhatsApp", EDITED_AT)
    assert elsewhere == EditResult(found=False, edited=False, message_id=None)
    assert stored(database_url, his) == ("My budget is 400", None, None, None)


def test_memory_search_finds_an_edited_message_by_its_new_words_only(memory: Memory) -> None:
    person = Person(user_id=uuid.uuid4())
    message = said(memory, person, "Dinner with Marguerite at the Lisboa restaurant", "9:3")
    assert [hit.message.id for hit in memory.search(person.user_id, "Marguerite Lisboa")] == [message]  # type: ignore[arg-type]
    memory.edit_message(
        person, Surface.TELEGRAM, PlatformMessage("9:3"), "Dinner with Philippa at the Oporto tavern", EDITED_AT
    )
    assert person.user_id is not None
    hits = memory.search(person.user_id, "Philippa Oporto")
    assert [(hit.message.id, hit.message.content) for hit in hits] == [
        (message, "Dinner with Philippa at the Oporto tavern (edited)")
    ]
    assert memory.search(person.user_id, "Marguerite Lisboa") == []


def test_a_reply_keeps_the_message_it_answers_and_quotes_its_words(memory: Memory, database_url: str) -> None:
    person = Person(user_id=uuid.uuid4())
    first = said(memory, person, "Luna's booster is due on the 14th", "SM1")
    # WhatsApp gives only the Sid: the words are the stored message's.
    start = memory.begin_turn(
        person, Surface.TELEGRAM, "Can you remind me?", "u2", platform=PlatformMessage("SM2", reply_to="SM1")
    )
    assert start.quoted == "Luna's booster is due on the 14th"
    assert stored(database_url, start.message_id) == (
        '[replying to: "Luna\'s booster is due on the 14th"] Can you remind me?',
        "Luna's booster is due on the 14th",
        first,
        None,
    )
    assert start.history[-1].content == '[replying to: "Luna\'s booster is due on the 14th"] Can you remind me?'
    # A reply to that reply quotes its own words, not the quote inside them, nor an edit's mark.
    assert start.user_id is not None and start.message_id is not None
    memory.finish_turn(start.user_id, start.message_id, "Sure.")
    memory.edit_message(person, Surface.TELEGRAM, PlatformMessage("SM2"), "Remind me the day before?", EDITED_AT)
    nested = memory.begin_turn(
        person, Surface.TELEGRAM, "At 9, please", "u3", platform=PlatformMessage("SM3", reply_to="SM2")
    )
    assert nested.quoted == "Remind me the day before?"


def test_a_reply_quotes_the_platforms_text_in_one_line_of_at_most_300_characters(
    memory: Memory, database_url: str
) -> None:
    person = Person(user_id=uuid.uuid4())
    long_text = "word  \n" * 100
    start = memory.begin_turn(
        person, Surface.TELEGRAM, "this one", "u1", platform=PlatformMessage("1:2", reply_to="1:1", quoted=long_text)
    )
    assert start.quoted == ("word " * 60)[:299] + "…"
    content, quoted, replied_to, _ = stored(database_url, start.message_id)
    assert (content, quoted, replied_to) == (f'[replying to: "{start.quoted}"] this one', start.quoted, None)


def test_a_reply_never_finds_another_persons_message(memory: Memory, database_url: str) -> None:
    ana, bruno = Person(user_id=uuid.uuid4()), Person(user_id=uuid.uuid4())
    said(memory, ana, "my secret plan", "SMshared")
    start = memory.begin_turn(
        bruno, Surface.TELEGRAM, "what was that?", "u1", platform=PlatformMessage("SMmine", reply_to="SMshared")
    )
    assert start.quoted is None
    assert stored(database_url, start.message_id) == ("what was that?", None, None, None)


def test_what_a_turn_learns_of_a_reply_keeps_its_quote(memory: Memory, database_url: str) -> None:
    """A voice note sent as a reply: its transcript replaces the placeholder, after the quote."""
    person = Person(user_id=uuid.uuid4())
    start = memory.begin_turn(
        person,
        Surface.TELEGRAM,
        "[voice note, 0:05, not transcribed]",
        "u1",
        platform=PlatformMessage("5:2", reply_to="5:1", quoted="the list"),
    )
    assert start.user_id is not None and start.message_id is not None
    memory.finish_turn(start.user_id, start.message_id, "Got it.", user_content="[voice note, 0:05] add milk")
    assert stored(database_url, start.message_id)[0] == '[replying to: "the list"] [voice note, 0:05] add milk'


def test_a_purged_message_leaves_its_replies_without_a_reference(memory: Memory, database_url: str) -> None:
    person = Person(user_id=uuid.uuid4())
    first = said(memory, person, "the old plan", "8:1")
    start = memory.begin_turn(
        person, Surface.TELEGRAM, "still on?", "u2", platform=PlatformMessage("8:2", reply_to="8:1")
    )
    execute(database_url, "delete from messages where id = %s", first)
    assert stored(database_url, start.message_id) == (
        '[replying to: "the old plan"] still on?',
        "the old plan",
        None,
        None,
    )


def test_an_owed_reply_taken_over_by_its_redelivery_still_says_what_it_quotes(memory: Memory) -> None:
    person = Person(user_id=uuid.uuid4())
    platform = PlatformMessage("6:2", reply_to="6:1", quoted="the plan")
    first = memory.begin_turn(person, Surface.TELEGRAM, "is it still on?", "u6", platform=platform)
    assert first.user_id is not None and first.message_id is not None
    memory.end_attempt(first.user_id, first.message_id, first.attempt, 0)  # the model failed: owed
    again = memory.begin_turn(person, Surface.TELEGRAM, "is it still on?", "u6", platform=platform)
    assert (again.owed, again.message_id, again.quoted) == (True, first.message_id, "the plan")
    assert again.history[-1].content == '[replying to: "the plan"] is it still on?'


def test_the_replies_to_an_edited_message_quote_its_new_words_only(memory: Memory, database_url: str) -> None:
    """No earlier version is kept: a reply stored before the edit quoted the old words, which the
    window and memory search would still show."""
    ana, bruno = Person(user_id=uuid.uuid4()), Person(user_id=uuid.uuid4())
    dinner = said(memory, ana, "Dinner with Marguerite at the Lisboa restaurant", "9:3")
    reply = said(memory, ana, "book it for two", "9:4", reply_to="9:3")
    assert stored(database_url, reply)[:2] == (
        '[replying to: "Dinner with Marguerite at the Lisboa restaurant"] book it for two',
        "Dinner with Marguerite at the Lisboa restaurant",
    )
    # A row of another person's naming it (none can be made by a turn: reply_quote is the person's own).
    his = said(memory, bruno, "not yours", "9:5")
    execute(
        database_url,
        "update messages set replied_to = %s, quoted = 'Marguerite',"
        " content = '[replying to: \"Marguerite\"] not yours' where id = %s",
        dinner,
        his,
    )
    memory.edit_message(
        ana, Surface.TELEGRAM, PlatformMessage("9:3"), "Dinner with  Philippa\nat the Oporto tavern", EDITED_AT
    )
    assert stored(database_url, reply) == (
        '[replying to: "Dinner with Philippa at the Oporto tavern"] book it for two',
        "Dinner with Philippa at the Oporto tavern",
        dinner,
        None,
    )
    assert ana.user_id is not None
    assert memory.search(ana.user_id, "Marguerite Lisboa") == []
    assert stored(database_url, his)[:2] == ('[replying to: "Marguerite"] not yours', "Marguerite")


def test_an_edit_of_a_message_the_notes_already_hold_leaves_no_earlier_version_in_them(
    store: PostgresStore, database_url: str
) -> None:
    """No earlier version is kept anywhere (docs/decisions.md): not in the memory notes either,
    which the digest wrote from the old words once the message had left the window."""
    small = Memory(store, context_limits(max_messages=4, window_step=2))
    person = Person(user_id=uuid.uuid4())
    said(small, person, "my card PIN is 4821", "5:1")
    said(small, person, "b", "5:2")
    said(small, person, "c", "5:3")
    job = DigestJob(store, ExtractiveDigester(800), digest_limits(max_messages=4, window_step=2, idle_s=0))
    assert job.run(person.user_id).updated == 1
    assert "my card PIN is 4821" in read_notes(store, person.user_id).content  # type: ignore[arg-type]
    edit = small.edit_message(person, Surface.TELEGRAM, PlatformMessage("5:1"), "my card is blue", EDITED_AT)
    assert edit.edited
    job.run(person.user_id)
    notes = read_notes(store, person.user_id).content  # type: ignore[arg-type]
    assert "4821" not in notes, notes


def test_an_edit_after_a_link_leaves_no_earlier_version_in_the_merged_notes(
    store: PostgresStore, database_url: str
) -> None:
    """A Telegram chat's notes hold a message; the person links the chat to their web account,
    which has no notes yet: the account takes the chat's notes, covering nothing yet. An edit of
    that message then kept the notes (no coverage reached it) and the next digest kept the old
    words beside the new ones."""
    small = Memory(store, context_limits(max_messages=4, window_step=2))
    chat = Person(sender_id=f"tg-{uuid.uuid4().hex[:8]}")
    said(small, chat, "my card PIN is 4821", "6:1")
    said(small, chat, "b", "6:2")
    chat_id = said(small, chat, "c", "6:3")
    chat_user = rows(database_url, "select user_id from messages where id = %s", chat_id)[0][0]
    job = DigestJob(store, ExtractiveDigester(800), digest_limits(max_messages=4, window_step=2, idle_s=0))
    assert job.run(chat_user).updated == 1
    assert "my card PIN is 4821" in read_notes(store, chat_user).content
    account = uuid.uuid4()
    linking = Linking(store, IdentityPolicy("auto"), ttl_minutes=10, attempts_per_hour=5)
    linking.link(account, Surface.TELEGRAM, chat.sender_id)  # type: ignore[arg-type]
    assert "my card PIN is 4821" in read_notes(store, account).content
    edit = small.edit_message(chat, Surface.TELEGRAM, PlatformMessage("6:1"), "my card is blue", EDITED_AT)
    assert edit.edited
    job.run(account)
    notes = read_notes(store, account).content
    assert "4821" not in notes, notes
    assert notes.endswith("] my card is blue (edited)"), notes


def test_an_edit_while_the_persons_digest_runs_leaves_no_earlier_version_in_the_notes(
    store: PostgresStore,
) -> None:
    """The digest read the message's old words; the person edited it while the model wrote: the
    digest's write then stored the old words and covered the message, so its new words never
    reached the notes and the old ones stayed in them."""
    small = Memory(store, context_limits(max_messages=4, window_step=2))
    person = Person(user_id=uuid.uuid4())
    said(small, person, "my card PIN is 4821", "7:1")
    said(small, person, "b", "7:2")
    said(small, person, "c", "7:3")

    class EditedMeanwhile(ExtractiveDigester):
        def digest(self, notes: str, messages: Sequence[StoredMessage], zone: ZoneInfo | None = None) -> str:
            small.edit_message(person, Surface.TELEGRAM, PlatformMessage("7:1"), "my card is blue", EDITED_AT)
            return super().digest(notes, messages, zone)

    limits = digest_limits(max_messages=4, window_step=2, idle_s=0)
    DigestJob(store, EditedMeanwhile(800), limits).run(person.user_id)
    DigestJob(store, ExtractiveDigester(800), limits).run(person.user_id)
    notes = read_notes(store, person.user_id).content  # type: ignore[arg-type]
    assert "4821" not in notes, notes
    assert notes.endswith("] my card is blue (edited)"), notes


def test_an_edit_touches_its_own_persons_notes_and_digest_only(store: PostgresStore) -> None:
    """Another person's notes, covering messages later than the one edited, and their digest
    running meanwhile: the edit leaves both alone (edit_message's notes filter by person)."""
    small = Memory(store, context_limits(max_messages=4, window_step=2))
    limits = digest_limits(max_messages=4, window_step=2, idle_s=0)
    editor, other = Person(user_id=uuid.uuid4()), Person(user_id=uuid.uuid4())
    for text, ref in (("my card PIN is 4821", "8:1"), ("b", "8:2"), ("c", "8:3")):
        said(small, editor, text, ref)
    assert DigestJob(store, ExtractiveDigester(800), limits).run(editor.user_id).updated == 1
    for text, ref in (("my sister's name is Ana", "9:1"), ("b", "9:2"), ("c", "9:3")):
        said(small, other, text, ref)
    assert DigestJob(store, ExtractiveDigester(800), limits).run(other.user_id).updated == 1
    before = read_notes(store, other.user_id)  # type: ignore[arg-type]
    for text, ref in (("d", "9:4"), ("e", "9:5")):
        said(small, other, text, ref)

    class EditedElsewhere(ExtractiveDigester):
        def digest(self, notes: str, messages: Sequence[StoredMessage], zone: ZoneInfo | None = None) -> str:
            small.edit_message(editor, Surface.TELEGRAM, PlatformMessage("8:1"), "my card is blue", EDITED_AT)
            return super().digest(notes, messages, zone)

    assert DigestJob(store, EditedElsewhere(800), limits).run(other.user_id).updated == 1
    after = read_notes(store, other.user_id)  # type: ignore[arg-type]
    assert after.content.startswith(before.content + "\n"), after.content
    assert read_notes(store, editor.user_id).content == ""  # type: ignore[arg-type]  # theirs went
