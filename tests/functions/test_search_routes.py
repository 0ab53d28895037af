"""GET /search on web_chat end to end: real function, real JWTs (PyJWT), real Postgres, fake
Anthropic. The person finds their own messages, from every app, and nobody else's."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlencode

import pytest
from flask.testing import FlaskClient

from core.models import Surface
from core.turn.request import TurnRequest
from functions import runtime
from tests.fakes.anthropic_api import FakeAnthropic
from tests.helpers import app_client, as_owner, bearer


@pytest.fixture(autouse=True)
def noted(fake_anthropic: FakeAnthropic) -> None:
    """The agent's replies say none of the person's words: a hit is what the person said."""
    fake_anthropic.answer = lambda body: "Noted."


def say(web: FlaskClient, person: uuid.UUID, text: str, conversation_id: str | None = None) -> str:
    """A web message of `person` (and its reply); the conversation it went to."""
    response = web.post("/", json={"message": text, "conversation_id": conversation_id}, headers=bearer(person))
    assert response.status_code == 200, response.get_json()
    return str(response.get_json()["conversation_id"])


def search(web: FlaskClient, person: uuid.UUID, **query: Any) -> dict[str, Any]:
    response = web.get(f"/search?{urlencode(query)}", headers=bearer(person))
    assert response.status_code == 200, response.get_json()
    body: dict[str, Any] = response.get_json()
    return body


def contents(found: dict[str, Any]) -> list[str]:
    return [hit["content"] for hit in found["hits"]]


def test_two_people_with_the_same_words_each_find_only_their_own(web: FlaskClient) -> None:
    ana, ben = uuid.uuid4(), uuid.uuid4()
    ana_said = say(web, ana, "The locksmith comes on Tuesday; the door code is 1111")
    ben_said = say(web, ben, "The locksmith comes on Tuesday; the door code is 2222")
    say(web, ben, "Remind me: the locksmith wants cash", ben_said)

    for person, own, conversation in ((ana, "1111", ana_said), (ben, "2222", ben_said)):
        found = search(web, person, q="when does the locksmith come?")
        assert found["hits"], "the person's own message is not found"
        assert all(hit["conversation_id"] == conversation for hit in found["hits"])
        assert any(own in text for text in contents(found))
        assert not any(other in text for text in contents(found) for other in {"1111", "2222"} - {own})
    assert len(search(web, ana, q="locksmith")["hits"]) == 1 and len(search(web, ben, q="locksmith")["hits"]) == 2
    # Someone who said nothing finds nothing.
    assert search(web, uuid.uuid4(), q="locksmith") == {
        "query": "locksmith",
        "hits": [],
        "has_more": False,
        "next_offset": None,
    }


def test_a_hit_from_another_app_comes_with_its_surface_time_and_neighbours(
    web: FlaskClient, environment: pytest.MonkeyPatch, owner: uuid.UUID
) -> None:
    as_owner(environment, owner)
    client = app_client("web_chat")
    told = runtime.turns().run(
        TurnRequest(Surface.TELEGRAM, "My sister lands at Barajas on the 14th", str(uuid.uuid4()), sender_id="4242")
    )
    say(client, owner, "Book a taxi for the airport, please")

    found = search(client, owner, q="when does my sister land?")
    [hit] = found["hits"]
    assert hit["id"] == told.message_id and hit["conversation_id"] == str(told.conversation_id)
    assert (hit["surface"], hit["role"], hit["kind"]) == ("telegram", "user", "text")
    assert hit["content"] == "My sister lands at Barajas on the 14th"
    assert datetime.fromisoformat(hit["created_at"]).utcoffset() == timedelta(0)
    assert (hit["ranker"], hit["rank"]) == ("fulltext", 1) and hit["score"] > 0
    assert hit["before"] is None  # the first message of that conversation
    assert hit["after"]["id"] == told.reply_id
    assert (hit["after"]["role"], hit["after"]["content"]) == ("assistant", "Noted.")
    # The surface filter: the same words, only where they were said.
    assert contents(search(client, owner, q="sister", surface="telegram")) == [hit["content"]]
    assert search(client, owner, q="sister", surface="web")["hits"] == []
    assert contents(search(client, owner, q="airport taxi", surface="web")) == ["Book a taxi for the airport, please"]


def test_since_and_until_bound_the_period_a_day_until_included(web: FlaskClient) -> None:
    person = uuid.uuid4()
    say(web, person, "The plumber fixed the boiler")
    [hit] = search(web, person, q="boiler")["hits"]
    said_at = datetime.fromisoformat(hit["created_at"])
    day = said_at.date()

    def found(**period: str) -> int:
        return len(search(web, person, q="boiler", **period)["hits"])

    assert found(since=day.isoformat()) == 1 and found(until=day.isoformat()) == 1  # that whole day
    assert found(since=(day + timedelta(days=1)).isoformat()) == 0
    assert found(until=(day - timedelta(days=1)).isoformat()) == 0
    assert found(since=day.isoformat(), until=day.isoformat()) == 1
    # The same day in ISO 8601's other spellings (basic, week date) is a day too, until included.
    for spelled in (day.strftime("%Y%m%d"), "{}-W{:02d}-{}".format(*day.isocalendar())):
        assert (found(until=spelled), found(since=spelled)) == (1, 1), spelled
    # A date and time with an offset: the same moment in another zone.
    just_after = (said_at + timedelta(seconds=1)).astimezone(datetime.now().astimezone().tzinfo)
    assert found(until=just_after.isoformat()) == 1 and found(since=just_after.isoformat()) == 0
    assert found(until=said_at.isoformat()) == 0  # `until` is exclusive
    assert found(since=said_at.replace(tzinfo=None).isoformat()) == 1  # without an offset: UTC


def test_a_forgotten_conversation_is_never_found(web: FlaskClient) -> None:
    person = uuid.uuid4()
    forgotten = say(web, person, "My passport number is X1234567")
    kept = say(web, person, "Renew the passport before June")
    assert len(search(web, person, q="passport")["hits"]) == 2

    assert web.delete(f"/conversations/{forgotten}", headers=bearer(person)).status_code == 204
    found = search(web, person, q="passport number")
    assert contents(found) == ["Renew the passport before June"] and found["hits"][0]["conversation_id"] == kept
    assert search(web, person, q="X1234567")["hits"] == []

    assert web.delete("/memory", headers=bearer(person)).status_code == 204
    assert search(web, person, q="passport")["hits"] == []


def test_search_pages_by_offset_and_says_whether_more_are_left(web: FlaskClient) -> None:
    person = uuid.uuid4()
    conversation = None
    for index in range(5):
        conversation = say(web, person, f"Kiwi number {index} for the smoothie", conversation)

    pages = [search(web, person, q="kiwi", limit=2, offset=offset) for offset in (0, 2, 4)]
    assert [len(page["hits"]) for page in pages] == [2, 2, 1]
    assert [(page["has_more"], page["next_offset"]) for page in pages] == [(True, 2), (True, 4), (False, None)]
    ranks = [hit["rank"] for page in pages for hit in page["hits"]]
    assert ranks == [1, 2, 3, 4, 5]
    paged = [hit["content"] for page in pages for hit in page["hits"]]
    assert sorted(paged) == sorted(f"Kiwi number {index} for the smoothie" for index in range(5))
    # The same order as one page of all of them; by default, one page of up to 20.
    whole = search(web, person, q="kiwi")
    assert contents(whole) == paged and (whole["has_more"], whole["next_offset"]) == (False, None)
    assert search(web, person, q="kiwi", limit=5)["has_more"] is False
    assert search(web, person, q="kiwi", offset=5)["hits"] == []


@pytest.mark.parametrize(
    ("query", "reason"),
    [
        ("", "q is missing: say what to search for, as ?q=words"),
        ("q=", "q is empty: say what to search for, as ?q=words"),
        ("q=%20%20", "q is empty: say what to search for, as ?q=words"),
        ("q=%00%20%00", "q is empty: say what to search for, as ?q=words"),  # NUL is no word, nor storable
        ("q=" + "a" * 1001, "q has 1001 characters; the limit is 1000"),
        ("q=kiwi&limit=0", "limit must be a whole number from 1 to 50, not '0'"),
        ("q=kiwi&limit=51", "limit must be a whole number from 1 to 50, not '51'"),
        ("q=kiwi&limit=abc", "limit must be a whole number from 1 to 50, not 'abc'"),
        ("q=kiwi&offset=-1", "offset must be a whole number from 0 to 10000, not '-1'"),
        ("q=kiwi&offset=10001", "offset must be a whole number from 0 to 10000, not '10001'"),
        ("q=kiwi&surface=fax", "surface must be one of web, telegram, whatsapp, sms, not 'fax'"),
        ("q=kiwi&surface=", "surface must be one of web, telegram, whatsapp, sms, not ''"),
        (
            "q=kiwi&since=yesterday",
            "since must be an ISO 8601 date (2026-03-31) or date and time (2026-03-31T18:30:00+02:00), not 'yesterday'",
        ),
        (
            "q=kiwi&until=2026-13-01",
            "until must be an ISO 8601 date (2026-03-31) or date and time (2026-03-31T18:30:00+02:00),"
            " not '2026-13-01'",
        ),
        # a day the date's parser takes, out of range once its end (until) or UTC (an offset) is added
        ("q=kiwi&until=9999-12-31", "until is out of range: a day from 0001-01-02 to 9999-12-30, not '9999-12-31'"),
        (
            "q=kiwi&since=0001-01-01T00:00:00%2B01:00",
            "since is out of range: a day from 0001-01-02 to 9999-12-30, not '0001-01-01T00:00:00+01:00'",
        ),
        ("q=kiwi&since=2026-04-01&until=2026-03-01", "since (2026-04-01) must be before until (2026-03-01)"),
        (  # past 40 characters it is not parsed, and the reason quotes its first 40
            "q=kiwi&since=2026-03-31T18:30:00.000000" + "0" * 40,
            "since must be an ISO 8601 date (2026-03-31) or date and time (2026-03-31T18:30:00+02:00),"
            " not '2026-03-31T18:30:00.00000000000000000000'",
        ),
    ],
)
def test_bad_search_parameters_are_refused_with_the_reason(web: FlaskClient, query: str, reason: str) -> None:
    response = web.get(f"/search?{query}", headers=bearer(uuid.uuid4()))
    assert response.status_code == 400
    assert response.get_json() == {"error": "bad_request", "message": reason}


def test_a_query_of_stopwords_alone_finds_nothing_and_is_no_error(web: FlaskClient) -> None:
    person = uuid.uuid4()
    say(web, person, "what is the name of the thing")
    assert search(web, person, q="what is the")["hits"] == []


def test_search_wants_a_valid_token_and_under_the_owner_policy_the_owner(
    web: FlaskClient, environment: pytest.MonkeyPatch, owner: uuid.UUID
) -> None:
    assert web.get("/search?q=kiwi").status_code == 401
    assert web.post("/search?q=kiwi", headers=bearer(uuid.uuid4())).status_code == 405
    as_owner(environment, owner)
    client = app_client("web_chat")
    refused = client.get("/search?q=kiwi", headers=bearer(uuid.uuid4()))
    assert refused.status_code == 403 and refused.get_json()["error"] == "forbidden"
    assert client.get("/search?q=kiwi", headers=bearer(owner)).status_code == 200


def test_with_the_database_down_search_is_503(web: FlaskClient, environment: pytest.MonkeyPatch) -> None:
    environment.setenv("DATABASE_URL", "postgresql://postgres@127.0.0.1:1/postgres")
    response = app_client("web_chat").get("/search?q=kiwi", headers=bearer(uuid.uuid4()))
    assert response.status_code == 503 and response.get_json()["error"] == "store_unavailable"


def test_the_search_answer_carries_cors_for_the_configured_origin(web: FlaskClient) -> None:
    origin = "https://advisor.example.com"
    response = web.get("/search?q=kiwi", headers={**bearer(uuid.uuid4()), "Origin": origin})
    assert response.status_code == 200 and response.headers["Access-Control-Allow-Origin"] == origin
    refused = web.get("/search", headers={**bearer(uuid.uuid4()), "Origin": origin})
    assert refused.status_code == 400 and refused.headers["Access-Control-Allow-Origin"] == origin


BAD_MOMENT = "must be an ISO 8601 date (2026-03-31) or date and time (2026-03-31T18:30:00+02:00)"


@pytest.mark.parametrize("name", ["since", "until"])
@pytest.mark.parametrize("week", ["2026-W14", "2026W14", "2026-W14T10:00"])
def test_a_week_without_its_day_is_refused_not_read_as_its_monday(web: FlaskClient, name: str, week: str) -> None:
    response = web.get(f"/search?q=kiwi&{name}={week}", headers=bearer(uuid.uuid4()))
    assert (response.status_code, response.get_json()) == (
        400,
        {"error": "bad_request", "message": f"{name} {BAD_MOMENT}, not {week!r}"},
    )


@pytest.mark.parametrize("day", ["2026-W14-2", "2026W142", "20260331", "2026-03-31"])
def test_a_day_in_any_spelling_is_still_taken(web: FlaskClient, day: str) -> None:
    response = web.get(f"/search?q=kiwi&since={day}&until={day}", headers=bearer(uuid.uuid4()))
    assert response.status_code == 200, response.get_json()
