"""A person's day of listening (VOICE_SECONDS_PER_DAY) on the real Postgres: reservations made one
at a time and one note at the transcriber at a time, settled at what was heard, forgotten after a
day; a store that is away lets notes through."""

from __future__ import annotations

import threading
import uuid

from core.errors import MediaUnreadable
from core.media.listening import Listening
from core.stores.postgres_store import PostgresStore
from core.stores.store import UnavailableStore
from tests.helpers import execute, rows


def test_two_instances_cannot_both_send_a_note_to_the_transcriber(database_url: str) -> None:
    """Parallel requests of one person: one note goes, the other waits for it to be settled, so
    no two lies are under the day at once."""
    person = uuid.uuid4()
    stores = [PostgresStore(database_url) for _ in range(2)]
    results: list[str | None] = []
    start = threading.Barrier(2)

    def note(store: PostgresStore, message_id: int) -> None:
        Listening(store, uuid.uuid4(), message_id + 1000, 10).reserve(0)  # its connection open before the race
        start.wait()
        results.append(phrase(Listening(store, person, message_id, 100).reserve(6)))

    threads = [threading.Thread(target=note, args=(store, 900_000_000 + index)) for index, store in enumerate(stores)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for store in stores:
        store.close()
    assert sorted(results, key=lambda result: result is not None) == [None, "voice_busy"]
    assert rows(database_url, "select seconds from voice_usage where user_id = %s", person) == [(6,)]


def test_a_reservation_is_settled_at_what_was_heard_and_leaves_after_a_day(database_url: str) -> None:
    person = uuid.uuid4()
    store = PostgresStore(database_url)
    first = Listening(store, person, 910_000_001, 100)
    assert first.reserve(5) is None
    first.settle(5, 60)  # it said 5 seconds and lasted a minute
    assert first.reserve(30) is None  # a second note of the same message adds up
    first.settle(30, 30)
    assert rows(database_url, "select seconds, in_flight_since from voice_usage where user_id = %s", person) == [
        (90, None)
    ]
    second = Listening(store, person, 910_000_002, 100)
    assert phrase(second.reserve(11)) == "voice_used_up"
    execute(database_url, "update voice_usage set at = at - interval '25 hours' where user_id = %s", person)
    assert second.reserve(11) is None
    assert rows(database_url, "select message_id, seconds from voice_usage where user_id = %s", person) == [
        (910_000_002, 11)
    ]
    store.close()


def test_a_note_whose_instance_died_holds_the_others_two_minutes_at_most(database_url: str) -> None:
    person = uuid.uuid4()
    store = PostgresStore(database_url)
    assert Listening(store, person, 930_000_001, 100).reserve(5) is None  # never settled
    waiting = Listening(store, person, 930_000_002, 100)
    assert phrase(waiting.reserve(5)) == "voice_busy"
    execute(
        database_url,
        "update voice_usage set in_flight_since = in_flight_since - interval '3 minutes' where user_id = %s",
        person,
    )
    assert waiting.reserve(5) is None
    store.close()


def test_a_note_behind_another_waits_for_it_to_be_settled(database_url: str) -> None:
    """Voice notes sent in a row, delivered in parallel: the second goes once the first is heard."""
    person = uuid.uuid4()
    store = PostgresStore(database_url)
    first = Listening(store, person, 940_000_001, 100)
    assert first.reserve(5) is None
    settled = threading.Timer(0.6, lambda: first.settle(5, 5))
    settled.start()
    assert Listening(store, person, 940_000_002, 100).reserve(5, wait_s=5) is None  # busy at first
    settled.join()
    store.close()


def test_without_a_limit_or_a_store_every_note_is_heard(database_url: str) -> None:
    person = uuid.uuid4()
    store = PostgresStore(database_url)
    assert Listening(store, person, 920_000_001, 0).reserve(10_000) is None
    assert rows(database_url, "select count(*) from voice_usage where user_id = %s", person) == [(0,)]
    store.close()
    away = Listening(UnavailableStore("the database is away"), person, 920_000_002, 10)
    assert away.reserve(10_000) is None
    away.settle(10_000, 5)  # logged, never raised


def phrase(refused: MediaUnreadable | None) -> str | None:
    """The refusal's phrase (core/phrases/*.toml's media.reason), None for no refusal."""
    return refused.phrase if refused is not None else None
