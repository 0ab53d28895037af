"""A digest run goes on past one person whose notes cannot be written."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from core.errors import StoreUnavailable
from core.memory.digest import DigestJob, ExtractiveDigester, read_notes
from core.memory.service import Memory
from core.models import Person, Surface
from core.stores.postgres_store import PostgresStore
from core.stores.store import JsonScalar
from tests.database import migrated_database
from tests.helpers import context_limits, digest_limits


class FailsOneWrite:
    """The real store, except that writing `person`'s notes fails as a lost connection would."""

    def __init__(self, store: PostgresStore, person: uuid.UUID) -> None:
        self._store = store
        self._person = str(person)

    def call(self, function: str, arguments: Mapping[str, JsonScalar]) -> Any:
        if function == "write_memory_notes" and arguments["p_user_id"] == self._person:
            raise StoreUnavailable("write_memory_notes failed: OperationalError")
        return self._store.call(function, arguments)

    def close(self) -> None:
        pass


def test_one_person_whose_notes_cannot_be_written_does_not_stop_the_others(postgres_server: str) -> None:
    with migrated_database(postgres_server) as url:  # its own: the run takes every due person
        store = PostgresStore(url)
        memory = Memory(store, context_limits(max_messages=4, window_step=2))
        people = [uuid.uuid4(), uuid.uuid4()]
        for person in people:
            for index in range(8):  # past the window of 4: messages have left it, the person is due
                start = memory.begin_turn(Person(user_id=person), Surface.TELEGRAM, f"fact {index}", uuid.uuid4().hex)
                assert start.message_id is not None
                memory.finish_turn(person, start.message_id, f"noted {index}")
        limits = digest_limits(max_messages=4, window_step=2, window_hours=24, idle_s=0)
        job = DigestJob(FailsOneWrite(store, people[0]), ExtractiveDigester(800), limits)
        run = job.run()
        assert (run.updated, run.failed) == (1, 1)
        assert read_notes(store, people[1]).written_at is not None
        assert read_notes(store, people[0]).written_at is None
        store.close()
