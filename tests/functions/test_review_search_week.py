"""Review of ac7da5c: a day in any of ISO 8601's spellings is a day, but a week without its day is
no day: `until=2026-W14` read only that week's Monday (until the Tuesday's midnight) and left
the other six days out, a wrong answer with a 200."""

from __future__ import annotations

import uuid

import pytest
from flask.testing import FlaskClient

from tests.helpers import bearer

EXPECTED = "must be an ISO 8601 date (2026-03-31) or date and time (2026-03-31T18:30:00+02:00)"


@pytest.mark.parametrize("name", ["since", "until"])
@pytest.mark.parametrize("week", ["2026-W14", "2026W14", "2026-W14T10:00"])
def test_a_week_without_its_day_is_refused_not_read_as_its_monday(web: FlaskClient, name: str, week: str) -> None:
    response = web.get(f"/search?q=kiwi&{name}={week}", headers=bearer(uuid.uuid4()))
    assert (response.status_code, response.get_json()) == (
        400,
        {"error": "bad_request", "message": f"{name} {EXPECTED}, not {week!r}"},
    )


@pytest.mark.parametrize("day", ["2026-W14-2", "2026W142", "20260331", "2026-03-31"])
def test_a_day_in_any_spelling_is_still_taken(web: FlaskClient, day: str) -> None:
    response = web.get(f"/search?q=kiwi&since={day}&until={day}", headers=bearer(uuid.uuid4()))
    assert response.status_code == 200, response.get_json()
