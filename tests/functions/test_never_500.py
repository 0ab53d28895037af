"""Whatever arrives, no function answers 5xx, nothing unauthenticated is stored, and the
fuzzed deliveries built on valid skeletons reach the turn (tests/helpers.py).
`make bench` runs the same cases by the ten thousand and records the figures."""

from __future__ import annotations

import pytest
from flask.testing import FlaskClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fakes.anthropic_api import FakeAnthropic
from tests.fakes.jwks import FakeJwks
from tests.helpers import STRATEGIES, TARGETS, Case, app_client, count, send, settings_for_fuzzing

RUNS = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None)

ALL_MESSAGES = "select count(*) from messages"


@pytest.fixture
def clients(environment: pytest.MonkeyPatch, jwks: FakeJwks) -> dict[str, FlaskClient]:
    for name, value in settings_for_fuzzing(jwks.url).items():
        environment.setenv(name, value)
    return {target: app_client(target) for target in TARGETS}


def check(client: FlaskClient, case: Case, fake_anthropic: FakeAnthropic, database_url: str) -> None:
    asked, stored = len(fake_anthropic.requests), count(database_url, ALL_MESSAGES)
    response = send(client, case)
    assert response.status_code in case.expected, (case, response.get_data(as_text=True)[:300])
    reached = len(fake_anthropic.requests) > asked
    if not case.authenticated:
        assert (reached, count(database_url, ALL_MESSAGES)) == (False, stored), case
    if case.expect_turn:
        assert reached, (case, response.get_data(as_text=True)[:300])


@given(data=st.data())
@RUNS
@pytest.mark.parametrize("target", TARGETS)
def test_every_function_under_fuzzing(
    clients: dict[str, FlaskClient],
    jwks: FakeJwks,
    fake_anthropic: FakeAnthropic,
    database_url: str,
    target: str,
    data: st.DataObject,
) -> None:
    case = data.draw(STRATEGIES[target](jwks))
    check(clients[target], case, fake_anthropic, database_url)
