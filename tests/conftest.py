from __future__ import annotations

from collections.abc import Iterator

import pytest

from core.memory import ContextLimits, Memory
from core.stores.postgres_store import PostgresStore
from tests.database import migrated_database, server_url


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    with server_url() as url:
        yield url


@pytest.fixture(scope="session")
def database_url(postgres_server: str) -> Iterator[str]:
    with migrated_database(postgres_server) as url:
        yield url


@pytest.fixture
def store(database_url: str) -> Iterator[PostgresStore]:
    store = PostgresStore(database_url, max_connections=60)
    yield store
    store.close()


@pytest.fixture
def memory(store: PostgresStore) -> Memory:
    return Memory(store, ContextLimits())
