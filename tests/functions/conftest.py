"""Each surface's real function, loaded by functions_framework from main.py, with the
real SDKs aimed at local fakes through their base-URL settings."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from flask.testing import FlaskClient

from functions import runtime
from tests.fakes.anthropic_api import FakeAnthropic
from tests.fakes.jwks import FakeJwks
from tests.fakes.telegram_api import FakeTelegram
from tests.helpers import (
    CORS_ORIGIN,
    JWT_SECRET,
    Apps,
    app_client,
    production_settings,
    three_apps,
)


@pytest.fixture
def jwks() -> Iterator[FakeJwks]:
    server = FakeJwks()
    yield server
    server.close()


@pytest.fixture
def owner() -> uuid.UUID:
    return uuid.uuid4()


@pytest.fixture
def environment(
    monkeypatch: pytest.MonkeyPatch,
    database_url: str,
    fake_anthropic: FakeAnthropic,
    fake_telegram: FakeTelegram,
    tmp_path: Path,
) -> Iterator[pytest.MonkeyPatch]:
    """A production-like configuration; tests adjust it, then build an app."""
    for name, value in production_settings(database_url, fake_anthropic, fake_telegram).items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)  # no developer's .env is read
    runtime.reset()
    yield monkeypatch
    runtime.reset()


@pytest.fixture
def web_settings() -> dict[str, str]:
    """What a test module adds to the web function's settings: it overrides this fixture."""
    return {}


@pytest.fixture
def web(environment: pytest.MonkeyPatch, web_settings: dict[str, str]) -> FlaskClient:
    """The web function, verifying the tests' HS256 tokens."""
    environment.setenv("SUPABASE_JWT_SECRET", JWT_SECRET)
    environment.setenv("CORS_ORIGINS", CORS_ORIGIN)
    for name, value in web_settings.items():
        environment.setenv(name, value)
    return app_client("web_chat")


@pytest.fixture
def apps(environment: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic) -> Apps:
    return three_apps(environment, fake_anthropic)
