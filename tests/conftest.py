from __future__ import annotations

from collections.abc import Iterator

import pytest

from core.memory.service import Memory
from core.stores.postgres_store import PostgresStore
from tests.database import migrated_database, server_url
from tests.fakes.anthropic_api import FakeAnthropic
from tests.fakes.telegram_api import FakeTelegram
from tests.helpers import BOT_TOKEN, context_limits


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    with server_url() as url:
        yield url


@pytest.fixture(scope="session")
def database_url(postgres_server: str) -> Iterator[str]:
    with migrated_database(postgres_server) as url:
        yield url


@pytest.fixture
def own_database(postgres_server: str) -> Iterator[str]:
    """A database of the test's own, for what reads everyone's rows: the scheduled job's claims and
    digests, a purge, the held follow-ups of everyone due."""
    with migrated_database(postgres_server) as url:
        yield url


@pytest.fixture
def store(database_url: str) -> Iterator[PostgresStore]:
    store = PostgresStore(database_url, max_connections=60)
    yield store
    store.close()


@pytest.fixture
def memory(store: PostgresStore) -> Memory:
    return Memory(store, context_limits())


@pytest.fixture
def fake_anthropic() -> Iterator[FakeAnthropic]:
    """Anthropic's Messages API, local (tests/fakes/anthropic_api.py)."""
    server = FakeAnthropic()
    yield server
    server.close()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """What a test said with `record_property("summary", ...)`, after the run: `pytest -n 2` shows
    no passing test's own output (Schemathesis's number of cases, tests/functions/test_web_openapi.py)."""
    said = [
        value
        for report in terminalreporter.getreports("passed")
        for name, value in report.user_properties
        if name == "summary"
    ]
    for line in said:
        terminalreporter.write_line(str(line))


@pytest.fixture
def fake_telegram() -> Iterator[FakeTelegram]:
    server = FakeTelegram(BOT_TOKEN)
    yield server
    server.close()
