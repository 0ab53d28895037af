"""The person's language in the turn's two round trips (docs/decisions.md, "The person's
language"): begin_turn keeps what the request states and answers what is remembered, the turn's
end keeps what was heard, and neither costs a round trip of its own. Real Postgres, the real
Anthropic SDK against the local fake."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from core.identity.policy import IdentityPolicy
from core.memory.service import Memory
from core.model.llm import AnthropicModel
from core.models import Person, Surface
from core.stores.postgres_store import PostgresStore
from core.turn.capabilities import DEFAULT_SYSTEM_PROMPT
from core.turn.request import Outcome, TurnRequest, TurnSettings
from core.turn.turns import Turns
from tests.fakes.anthropic_api import FakeAnthropic
from tests.helpers import ENGLISH, SPANISH, rows

LANGUAGE_OF = "select language from person_languages where user_id = %s"


@pytest.fixture
def fake() -> Iterator[FakeAnthropic]:
    server = FakeAnthropic()
    yield server
    server.close()


@pytest.fixture
def turns(memory: Memory, fake: FakeAnthropic) -> Turns:
    model = AnthropicModel(api_key="sk-ant-test", model="claude-test-1", max_tokens=321, base_url=fake.url)
    settings = TurnSettings(system_prompt=DEFAULT_SYSTEM_PROMPT, fallback_reply="", stranger_reply="")
    return Turns(memory, lambda: model, IdentityPolicy("auto"), settings)


def test_a_stated_language_is_kept_and_chosen_later_in_the_turns_two_round_trips(
    turns: Turns, fake: FakeAnthropic, database_url: str
) -> None:
    person, other = uuid.uuid4(), uuid.uuid4()
    stated = turns.run(TurnRequest(Surface.WEB, "hello there", "w1", user_id=person, language="es-MX"))
    assert stated.outcome is Outcome.ANSWERED and stated.figures.round_trips == 2
    assert rows(database_url, LANGUAGE_OF, person) == [("es",)]
    fake.behaviour = "500"
    unstated = turns.run(TurnRequest(Surface.WEB, "What did I say yesterday?", "w2", user_id=person))
    assert (unstated.reply, unstated.figures.round_trips) == (SPANISH.say("turn.fallback"), 2)
    theirs = turns.run(TurnRequest(Surface.WEB, "ok", "w3", user_id=other))
    assert (theirs.reply, theirs.figures.round_trips) == (ENGLISH.say("turn.fallback"), 2)
    assert rows(database_url, LANGUAGE_OF, other) == []


def test_begin_turn_answers_the_persons_language_and_a_tag_it_cannot_keep_is_not_kept(
    memory: Memory, database_url: str
) -> None:
    person, other = uuid.uuid4(), uuid.uuid4()
    assert memory.begin_turn(Person(user_id=person), Surface.WEB, "hola", "m1", language="pt-BR").language == "pt"
    assert memory.begin_turn(Person(user_id=person), Surface.WEB, "hola", "m2").language == "pt"
    assert memory.begin_turn(Person(user_id=person), Surface.WEB, "hola", "m3", language="not a tag!").language == "pt"
    assert memory.begin_turn(Person(user_id=other), Surface.WEB, "hola", "m4").language is None
    assert rows(database_url, LANGUAGE_OF, person) == [("pt",)]


def test_a_language_heard_after_the_person_was_merged_is_the_merged_into_persons(
    memory: Memory, store: PostgresStore, database_url: str
) -> None:
    """The turn's end names the person it began as: linked meanwhile, the language goes where the
    person now lives, never to a row nobody reads."""
    chat = str(600_000_000 + uuid.uuid4().int % 10**8)
    start = memory.begin_turn(Person(sender_id=chat), Surface.TELEGRAM, "[voice note, 0:03]", "t1")
    assert start.user_id is not None and start.message_id is not None
    web_person = uuid.uuid4()
    linked = store.call("link_identity", {"p_user_id": str(web_person), "p_surface": "telegram", "p_external_id": chat})
    assert linked["status"] == "linked"
    memory.finish_turn(start.user_id, start.message_id, "Vale.", language="es")
    assert rows(database_url, LANGUAGE_OF, web_person) == [("es",)]
    assert rows(database_url, LANGUAGE_OF, start.user_id) == []
