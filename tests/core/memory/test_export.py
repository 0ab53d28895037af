"""Exporting on real Postgres: everything held of one person, exactly, and nothing of anyone else's,
though the other person has a row in every table the export reads; a person of thousands of messages
read a page at a time."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from core.errors import StoreUnavailable
from core.memory.export import Export
from core.stores.postgres_store import PostgresStore
from core.stores.store import JsonScalar

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)


def clock() -> datetime:
    return NOW


def held_of(
    url: str, person: uuid.UUID, *, tag: str, chat: str, first_turn: str = "2026-03-01 09:00Z"
) -> dict[str, Any]:
    """A row of `person` in every table the export reads, each with `tag` in what can carry it."""
    conversation, web = uuid.uuid4(), uuid.uuid4()
    with psycopg.connect(url) as connection:
        connection.execute(
            """insert into conversations (id, user_id, surface, title, created_at, updated_at, unstored_message_at,
                                          unstored_message_from) values
                   (%s, %s, 'telegram', '[Telegram]', '2026-03-01 09:00Z', '2026-03-02 10:00Z', '2026-03-02 09:30Z',
                    %s),
                   (%s, %s, 'web', %s, '2026-03-03 08:00Z', '2026-03-03 08:01Z', null, null)""",
            (conversation, person, chat, web, person, f"{tag} plans"),
        )
        ids = [
            row[0]
            for row in connection.execute(
                """insert into messages (conversation_id, user_id, surface, role, content, created_at) values
                       (%(c)s, %(p)s, 'telegram', 'user', %(t)s || ': my locker is 4417', '2026-03-01 09:00Z'),
                       (%(c)s, %(p)s, 'telegram', 'assistant', 'Noted.', '2026-03-01 09:00:02Z'),
                       (%(w)s, %(p)s, 'web', 'user', %(t)s || ': remind me of the dentist', '2026-03-03 08:00Z')
                   returning id""",
                {"c": conversation, "w": web, "p": person, "t": tag},
            ).fetchall()
        ]
        connection.execute(
            """insert into memory_notes (user_id, content, written_at, covered_until_at, covered_until_id)
               values (%s, %s, '2026-03-02 00:00Z', '2026-03-01 09:00:02Z', %s)""",
            (person, f"{tag} keeps a locker", ids[1]),
        )
        connection.execute(
            """insert into follow_ups (user_id, conversation_id, surface, sender, content, due_at, timezone,
                                       status, next_attempt_at, created_at, sent_at) values
                   (%(p)s, %(w)s, 'web', null, %(t)s || ': dentist', '2026-03-04 09:00Z', 'Europe/Madrid',
                    'sent', '2026-03-04 09:00Z', '2026-03-03 08:00Z', '2026-03-04 09:00:05Z'),
                   (%(p)s, %(c)s, 'telegram', %(chat)s, %(t)s || ': call mum', '2027-01-10 18:00Z', 'Europe/Madrid',
                    'pending', '2027-01-10 18:00Z', '2026-03-03 08:00Z', null)""",
            {"p": person, "w": web, "c": conversation, "t": tag, "chat": chat},
        )
        connection.execute(
            """insert into identities (surface, external_id, user_id, created_at, linked_at, opted_out_at)
               values ('telegram', %s, %s, '2026-03-01 09:00Z', '2026-03-01 09:05Z', null),
                      ('sms', %s, %s, '2026-03-01 09:20Z', '2026-03-01 09:25Z', '2026-03-02 11:00Z')""",
            (chat, person, f"+34{chat}", person),
        )
        merged = uuid.uuid4()
        connection.execute(
            "insert into merged_people (from_user_id, into_user_id, merged_at) values (%s, %s, '2026-03-01 09:05Z')",
            (merged, person),
        )
        connection.execute("insert into person_languages (user_id, language) values (%s, 'es')", (person,))
        connection.execute(
            "insert into person_timezones (user_id, timezone, stated) values (%s, 'Europe/Madrid', true)", (person,)
        )
        connection.execute(
            """insert into turn_usage (message_id, user_id, at, tokens) values
                   (%s, %s, '2026-03-03 08:00Z', 1200), (%s, %s, %s, 800)""",
            (ids[2], person, ids[0], person, first_turn),
        )
        connection.execute(
            "insert into voice_usage (user_id, message_id, at, seconds) values (%s, %s, '2026-03-03 08:00Z', 42)",
            (person, ids[2]),
        )
        connection.execute(
            """insert into link_codes (code_hash, user_id, created_at, expires_at, used_at, used_by_surface)
               values (%s, %s, '2026-03-01 09:00Z', '2026-03-01 09:10Z', '2026-03-01 09:05Z', 'telegram')""",
            (uuid.uuid4().hex * 2, person),
        )
        connection.execute(
            "insert into forget_requests (user_id, surface, requested_at) values (%s, 'telegram', '2026-03-05 10:00Z')",
            (person,),
        )
    return {"conversation": str(conversation), "web": str(web), "ids": ids, "merged": str(merged)}


def exported(store: PostgresStore, person: uuid.UUID, page_size: int) -> dict[str, Any]:
    parsed: dict[str, Any] = json.loads("".join(Export(store, clock, page_size=page_size).pieces(person)))
    return parsed


def test_the_export_is_everything_held_of_the_person_and_nothing_of_anyone_else(
    store: PostgresStore, database_url: str
) -> None:
    person, other = uuid.uuid4(), uuid.uuid4()
    chat = str(700000000 + uuid.uuid4().int % 10**8)
    # The other person first and last: a read that drops its user_id filter finds their rows.
    held_of(database_url, other, tag="OTHER", chat=str(int(chat) + 1), first_turn="2026-02-01 09:00Z")
    mine = held_of(database_url, person, tag="Ana", chat=chat)
    held_of(database_url, uuid.uuid4(), tag="THIRD", chat=str(int(chat) + 2), first_turn="2026-02-01 09:00Z")
    conversation, web, ids = mine["conversation"], mine["web"], mine["ids"]

    assert exported(store, person, page_size=2) == {
        "format": "crossmem-export/1",
        "exported_at": "2026-12-06T12:00:00+00:00",
        "user_id": str(person),
        "messages_total": 3,
        "conversations": [
            {
                "id": conversation,
                "surface": "telegram",
                "title": "[Telegram]",
                "created_at": "2026-03-01T09:00:00+00:00",
                "updated_at": "2026-03-02T10:00:00+00:00",
                # a message of theirs the thread does not keep (a command): WhatsApp's window opens on it
                "unstored_message_at": "2026-03-02T09:30:00+00:00",
                "unstored_message_from": chat,
            },
            {
                "id": web,
                "surface": "web",
                "title": "Ana plans",
                "created_at": "2026-03-03T08:00:00+00:00",
                "updated_at": "2026-03-03T08:01:00+00:00",
                "unstored_message_at": None,
                "unstored_message_from": None,
            },
        ],
        "memory_notes": {
            "content": "Ana keeps a locker",
            "written_at": "2026-03-02T00:00:00+00:00",
            "covered_until": "2026-03-01T09:00:02+00:00",
        },
        "follow_ups": [
            {
                "id": ANY_ID,
                "conversation_id": web,
                "surface": "web",
                "content": "Ana: dentist",
                "due_at": "2026-03-04T09:00:00+00:00",
                "timezone": "Europe/Madrid",
                "status": "sent",
                "created_at": "2026-03-03T08:00:00+00:00",
                "sent_at": "2026-03-04T09:00:05+00:00",
            },
            {
                "id": ANY_ID,
                "conversation_id": conversation,
                "surface": "telegram",
                "content": "Ana: call mum",
                "due_at": "2027-01-10T18:00:00+00:00",
                "timezone": "Europe/Madrid",
                "status": "pending",
                "created_at": "2026-03-03T08:00:00+00:00",
                "sent_at": None,
            },
        ],
        # Their own ids, unmasked: they are theirs (GET /links masks them on a screen).
        "identities": [
            {
                "surface": "sms",
                "external_id": f"+34{chat}",
                "created_at": "2026-03-01T09:20:00+00:00",
                "linked_at": "2026-03-01T09:25:00+00:00",
                "opted_out_at": "2026-03-02T11:00:00+00:00",  # its STOP
            },
            {
                "surface": "telegram",
                "external_id": chat,
                "created_at": "2026-03-01T09:00:00+00:00",
                "linked_at": "2026-03-01T09:05:00+00:00",
                "opted_out_at": None,
            },
        ],
        "merged_from": [{"user_id": mine["merged"], "merged_at": "2026-03-01T09:05:00+00:00"}],
        "language": "es",
        "timezone": "Europe/Madrid",
        "timezone_stated": True,  # they said it (set_timezone): not a browser's
        "usage": {"turns": 2, "tokens": 2000, "voice_seconds": 42, "since": "2026-03-01T09:00:00+00:00"},
        "link_codes": [
            {
                "created_at": "2026-03-01T09:00:00+00:00",
                "expires_at": "2026-03-01T09:10:00+00:00",
                "used_at": "2026-03-01T09:05:00+00:00",
                "used_by_surface": "telegram",
            }
        ],
        "forget_requests": [{"surface": "telegram", "requested_at": "2026-03-05T10:00:00+00:00"}],
        "messages": [
            {
                "id": ids[0],
                "conversation_id": conversation,
                "surface": "telegram",
                "role": "user",
                "content": "Ana: my locker is 4417",
                "created_at": "2026-03-01T09:00:00+00:00",
                "edited_at": None,
                "declined": False,
            },
            {
                "id": ids[1],
                "conversation_id": conversation,
                "surface": "telegram",
                "role": "assistant",
                "content": "Noted.",
                "created_at": "2026-03-01T09:00:02+00:00",
                "edited_at": None,
                "declined": False,
            },
            {
                "id": ids[2],
                "conversation_id": web,
                "surface": "web",
                "role": "user",
                "content": "Ana: remind me of the dentist",
                "created_at": "2026-03-03T08:00:00+00:00",
                "edited_at": None,
                "declined": False,
            },
        ],
    }


class AnyId:
    """A follow-up's id, drawn by the table's identity: any whole number."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, int) and not isinstance(other, bool)


ANY_ID: Any = AnyId()


def test_a_person_never_seen_exports_an_empty_record(store: PostgresStore) -> None:
    person = uuid.uuid4()
    found = exported(store, person, page_size=500)
    assert found["messages"] == [] and found["conversations"] == [] and found["identities"] == []
    assert (found["memory_notes"], found["language"], found["timezone"], found["timezone_stated"]) == (
        None,
        None,
        None,
        None,
    )
    assert found["usage"] == {"turns": 0, "tokens": 0, "voice_seconds": 0, "since": None}


class CountedStore:
    """The real store, its calls counted (how many pages the export read)."""

    def __init__(self, store: PostgresStore) -> None:
        self.store, self.calls = store, 0

    def call(self, function: str, arguments: Mapping[str, JsonScalar]) -> Any:
        self.calls += 1
        return self.store.call(function, arguments)

    def close(self) -> None:
        self.store.close()


def test_a_person_of_thousands_of_messages_is_read_a_page_at_a_time(store: PostgresStore, database_url: str) -> None:
    person, conversation = uuid.uuid4(), uuid.uuid4()
    with psycopg.connect(database_url) as connection:
        connection.execute(
            "insert into conversations (id, user_id, surface, title) values (%s, %s, 'web', 'long')",
            (conversation, person),
        )
        # 5,001 messages, many on the same microsecond (a page may end inside a run of equal times).
        connection.execute(
            """insert into messages (conversation_id, user_id, surface, role, content, created_at)
               select %s, %s, 'web', case when n %% 2 = 0 then 'user' else 'assistant' end, 'message ' || n,
                      '2026-01-01 00:00Z'::timestamptz + make_interval(secs => n / 3)
                 from generate_series(0, 5000) n""",
            (conversation, person),
        )
    counted = CountedStore(store)
    pieces = Export(counted, clock).pieces(person)
    assert counted.calls == 1  # the first page is read before the first piece is given out
    found = json.loads("".join(pieces))
    assert counted.calls == 11  # 500 a page: 10 full pages, and the one that says there is no more
    assert found["messages_total"] == 5001
    assert [message["content"] for message in found["messages"]] == [f"message {n}" for n in range(5001)]


def test_an_export_whose_store_fails_between_pages_ends_unclosed_and_says_so(
    own_database: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The database gone after the first page (here its function: a real failure of a real call,
    on a database of the test's own): the pieces end before the closing bracket, so what was
    written is no JSON, never a short export that reads as whole; the log line says how far it
    got, with the error's type and no word of the person's."""
    person, conversation = uuid.uuid4(), uuid.uuid4()
    with psycopg.connect(own_database) as connection:
        connection.execute(
            "insert into conversations (id, user_id, surface, title) values (%s, %s, 'web', 'short')",
            (conversation, person),
        )
        connection.execute(
            """insert into messages (conversation_id, user_id, surface, role, content, created_at)
               select %s, %s, 'web', 'user', 'my pin is ' || n, '2026-01-01 00:00Z'::timestamptz + n * interval '1 s'
                 from generate_series(1, 3) n""",
            (conversation, person),
        )
    store = PostgresStore(own_database)
    try:
        pieces = Export(store, clock, page_size=2).pieces(person)
        written = [next(pieces), next(pieces), next(pieces)]  # the head, then the first page's two
        with psycopg.connect(own_database, autocommit=True) as connection:
            connection.execute("drop function public.export_person")
        with pytest.raises(StoreUnavailable):
            written.extend(pieces)
    finally:
        store.close()
    with pytest.raises(json.JSONDecodeError):
        json.loads("".join(written))
    assert ["my pin is 1" in written[1], "my pin is 2" in written[2], len(written)] == [True, True, 3]
    [line] = [record for record in caplog.records if record.name == "crossmem.export"]
    assert (line.getMessage(), line.__dict__["messages"], line.__dict__["error"]) == (
        "an export stopped partway",
        2,
        "StoreUnavailable",
    )
    assert line.__dict__["user_id"] == str(person) and "pin" not in caplog.text
