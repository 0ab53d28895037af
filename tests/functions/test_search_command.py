"""`crossmem search`, parsed by its own click command and run against the real database."""

from __future__ import annotations

import json
import uuid

import pytest

from core.errors import InputError
from core.models import Person, Surface
from functions import runtime
from functions.tools.cli import main
from functions.tools.search_command import search
from tests.helpers import rows

MARCH_2 = "2026-03-02 09:12:00+00"  # 10:12 in Madrid, 22:12 in Auckland


def crossmem(*argv: str) -> int:
    """`crossmem search ARGS` (argv without `search`): the command alone, so its errors reach the test."""
    code: int = search.main(list(argv), prog_name="crossmem search", standalone_mode=False)
    return code


def said(person: uuid.UUID, surface: Surface, text: str) -> int:
    """A message of `person` on `surface`, answered "Noted."; its id."""
    memory = runtime.memory()
    start = memory.begin_turn(Person(user_id=person), surface, text, uuid.uuid4().hex)
    assert start.message_id is not None
    memory.finish_turn(person, start.message_id, "Noted.")
    return start.message_id


@pytest.fixture
def person(environment: pytest.MonkeyPatch, database_url: str) -> uuid.UUID:
    """Someone who said on WhatsApp, on 2 March, when their sister lands; and on the web, today,
    something else. Someone else said the same words."""
    person = uuid.uuid4()
    message = said(person, Surface.WHATSAPP, "My sister lands at Barajas on the 14th")
    rows(database_url, "update messages set created_at = %s where id = %s returning id", MARCH_2, message)
    said(person, Surface.WEB, "Book a taxi for the airport")
    said(uuid.uuid4(), Surface.WHATSAPP, "My sister lands at Barajas on the 14th, said someone else")
    return person


def test_search_prints_the_persons_hits_in_their_local_time(
    person: uuid.UUID, capsys: pytest.CaptureFixture[str]
) -> None:
    question = ["when", "does", "my", "sister", "land?"]
    assert crossmem("--user", str(person), "--timezone", "Europe/Madrid", *question) == 0
    assert capsys.readouterr().out.splitlines() == [
        "1 hit(s) for 'when does my sister land?', best first, times in Europe/Madrid:",
        "2026-03-02 10:12 [whatsapp] user: My sister lands at Barajas on the 14th",
    ]
    # Without --timezone, in CONTEXT_TIMEZONE (UTC here); the question in one argument works as well.
    assert crossmem("--user", str(person), "when does my sister land?") == 0
    hit = capsys.readouterr().out.splitlines()[1]
    assert hit == "2026-03-02 09:12 [whatsapp] user: My sister lands at Barajas on the 14th"


def test_search_filters_by_surface_and_period(person: uuid.UUID, capsys: pytest.CaptureFixture[str]) -> None:
    assert crossmem("--user", str(person), "--surface", "web", "sister") == 0
    assert capsys.readouterr().out == f"no message of {person} matches 'sister'\n"
    assert crossmem("--user", str(person), "--since", "2026-03-03", "sister") == 0
    assert capsys.readouterr().out.startswith("no message")
    assert crossmem("--user", str(person), "--since", "2026-03-02", "--until", "2026-03-02", "sister") == 0
    assert capsys.readouterr().out.startswith("1 hit(s)")
    assert crossmem("--user", str(person), "--limit", "1", "sister", "taxi") == 0
    assert len(capsys.readouterr().out.splitlines()) == 2


def test_search_json_gives_each_hit_as_the_web_does(person: uuid.UUID, capsys: pytest.CaptureFixture[str]) -> None:
    assert crossmem("--user", str(person), "--json", "airport") == 0
    [hit] = json.loads(capsys.readouterr().out)
    assert (hit["surface"], hit["role"], hit["kind"]) == ("web", "user", "text")
    assert hit["content"] == "Book a taxi for the airport"
    assert hit["after"]["content"] == "Noted." and hit["before"] is None


@pytest.mark.parametrize(
    ("option", "value", "complaint"),
    [
        ("--since", "yesterday", "Invalid value for '--since': must be an ISO 8601 date"),
        ("--until", "2026-02-30", "Invalid value for '--until': must be an ISO 8601 date"),
        ("--timezone", "Mars/Olympus", "Invalid value for '--timezone': 'Mars/Olympus' is not an IANA timezone"),
        ("--limit", "0", "Invalid value for '--limit': must be a whole number from 1 to 50, not '0'"),
        ("--surface", "fax", "Invalid value for '--surface': invalid choice: 'fax' (choose from web, telegram,"),
    ],
)
def test_bad_options_are_refused_as_usage_errors_with_the_reason(
    environment: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], option: str, value: str, complaint: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["search", "--user", str(uuid.uuid4()), option, value, "sister"])
    said = capsys.readouterr()
    assert exited.value.code == 2 and said.out == ""
    assert said.err.startswith("Usage: crossmem search [OPTIONS] QUERY...\n")
    assert said.err.splitlines()[-1].startswith(f"Error: {complaint}")


def test_an_empty_query_or_a_period_that_ends_before_it_starts_is_an_input_error(
    environment: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(InputError, match="say what to search for"):
        crossmem("--user", str(uuid.uuid4()), "  ")
    with pytest.raises(InputError, match="--since must be before --until"):
        crossmem("--user", str(uuid.uuid4()), "--since", "2026-03-02", "--until", "2026-03-01", "sister")
    with pytest.raises(InputError, match="the query has 1001 characters; the limit is 1000"):
        crossmem("--user", str(uuid.uuid4()), "a" * 1001)
