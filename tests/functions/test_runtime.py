"""The per-instance cache (functions/runtime.py) under the requests an instance serves at once."""

from __future__ import annotations

import threading

import pytest

from core.stores.store import MemoryStore
from core.turn.turns import Turns
from functions import runtime

AT_ONCE = 8  # serverless.yml's concurrency: functions-framework's THREADS


def first_request(arrived: threading.Barrier, built: list[tuple[Turns, MemoryStore]]) -> None:
    arrived.wait()
    built.append((runtime.turns(), runtime.store()))


def test_the_requests_that_start_an_instance_together_share_one_of_each_client(
    environment: pytest.MonkeyPatch,
) -> None:
    """A new instance is sent up to AT_ONCE requests at once (a burst scales out): each client is
    built by one of them, and the others wait for it. Seen failing with a store (a pool of up to
    DATABASE_POOL_SIZE connections, none of the others ever closed) and a Turns built by each."""
    for _ in range(5):
        runtime.reset()
        arrived = threading.Barrier(AT_ONCE)
        built: list[tuple[Turns, MemoryStore]] = []

        requests = [threading.Thread(target=first_request, args=(arrived, built)) for _ in range(AT_ONCE)]
        for request in requests:
            request.start()
        for request in requests:
            request.join()
        assert len({id(turns) for turns, _ in built}) == 1
        assert len({id(store) for _, store in built}) == 1
        turns, store = built[0]
        assert turns.memory.store is store
