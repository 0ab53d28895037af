"""The scheduled job's answer to an owed message within TOKENS_PER_DAY (owed_replies.sql's
claim_owed_replies): its claim checks and reserves as begin_turn does, in the budget's lock, and
its end settles what it reserved. Real Postgres, a database of its own (the claim takes any owed
message it finds)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from core.errors import OverBudget
from core.identity.policy import IdentityPolicy
from core.memory.service import Memory, TurnEstimate
from core.model.offline_model import OfflineModel
from core.models import Person, Surface
from core.stores.postgres_store import PostgresStore
from core.turn.owed import OwedReplies, OwedRun
from core.turn.request import TurnSettings
from core.turn.turns import Turns
from tests.database import migrated_database
from tests.helpers import context_limits, execute, rows, turn_budget

DAY, OUTPUT, INPUT = 5_000, 2_000, 2_000


@pytest.fixture
def job_database(postgres_server: str) -> Iterator[str]:
    with migrated_database(postgres_server) as url:
        yield url


@pytest.fixture
def memory(job_database: str) -> Iterator[Memory]:
    store = PostgresStore(job_database)
    yield Memory(store, context_limits(), turn_budget(tokens_per_day=DAY, reply_tokens=OUTPUT))
    store.close()


def owed_hello(memory: Memory, key: str = "owed-budget-1", chat: str = "7777") -> tuple[uuid.UUID, int]:
    """A person's Telegram turn that reserved, then failed with nothing spent: its message is owed."""
    person = uuid.uuid4()
    first = memory.begin_turn(
        Person(user_id=person), Surface.TELEGRAM, "hello", key, sender=chat, estimate=TurnEstimate(INPUT)
    )
    assert first.message_id is not None and first.reserved_tokens == INPUT + 5 // 4 + OUTPUT
    memory.end_attempt(person, first.message_id, first.attempt, 0, reserved=first.reserved_tokens)
    return person, first.message_id


def usage(database_url: str, message_id: int) -> list[tuple[int, int]]:
    return rows(database_url, "select tokens, reserved from turn_usage where message_id = %s", message_id)


def test_the_jobs_answer_reserves_as_a_turn_does_and_the_day_stays_within_one_output(
    memory: Memory, job_database: str
) -> None:
    """A rev-tools review's repro: the job's claim reserved nothing, so the person's web turn started
    while the job answered was admitted on a full day, and the day ended at 8,004 of 5,000 (past
    it by more than one output). Now the claim reserves the answer's input (2,000, and "hello" in
    its window) and its output: the web turn's input no longer fits, and the day is the job's."""
    person, message_id = owed_hello(memory)
    [owed] = memory.claim_owed_replies([Surface.TELEGRAM], 600, 30, limit=1, estimate=TurnEstimate(INPUT))
    assert (owed.start.message_id, owed.start.reserved_tokens) == (message_id, 4001)
    assert usage(job_database, message_id) == [(4001, 4001)]

    web = memory.create_conversation(person).id
    with pytest.raises(OverBudget):
        memory.begin_turn(
            Person(user_id=person), Surface.WEB, "and here", "owed-budget-2", web, estimate=TurnEstimate(INPUT)
        )
    memory.finish_turn(
        person,
        message_id,
        "the job's answer",
        attempt=owed.start.attempt,
        tokens=4001,
        reserved=owed.start.reserved_tokens,
    )
    assert usage(job_database, message_id) == [(4001, 0)]
    [(day,)] = rows(job_database, "select sum(tokens) from turn_usage where user_id = %s", person)
    assert day == 4001 <= DAY + OUTPUT


def test_a_claim_whose_input_would_reach_the_day_leaves_the_message_owed_and_untried(
    memory: Memory, job_database: str
) -> None:
    """As begin_turn: the day with the answer's input (2,001) reaching TOKENS_PER_DAY exactly is
    refused, and the message stays owed, its try not counted, for a later run; one token under, it
    is claimed."""
    _, message_id = owed_hello(memory)
    execute(job_database, "update turn_usage set tokens = %s where message_id = %s", DAY - 2001, message_id)
    assert memory.claim_owed_replies([Surface.TELEGRAM], 600, 30, limit=1, estimate=TurnEstimate(INPUT)) == []
    assert rows(job_database, "select owed_tries from messages where id = %s", message_id) == [(0,)]
    assert usage(job_database, message_id) == [(DAY - 2001, 0)]
    execute(job_database, "update turn_usage set tokens = %s where message_id = %s", DAY - 2002, message_id)
    [owed] = memory.claim_owed_replies([Surface.TELEGRAM], 600, 30, limit=1, estimate=TurnEstimate(INPUT))
    assert (owed.start.message_id, owed.tries, owed.start.reserved_tokens) == (message_id, 1, 4001)
    assert usage(job_database, message_id) == [(DAY - 2002 + 4001, 4001)]


def test_a_claim_the_job_cannot_answer_gives_its_reservation_back(memory: Memory, job_database: str) -> None:
    """A message whose sender no channel can reach (not a Telegram chat id) is skipped: what its
    claim reserved is given back at once, not counted until the day ends."""
    _, message_id = owed_hello(memory, chat="not-a-chat")

    def unreachable(chat: str) -> object:
        raise ValueError(f"not a chat id: {chat}")

    settings = TurnSettings("Be brief.", "FALLBACK", "NO")
    turns = Turns(memory, OfflineModel, IdentityPolicy("auto"), settings)
    job = OwedReplies(memory, turns, {Surface.TELEGRAM: unreachable}, {Surface.TELEGRAM: 10.0}, 600, 3)  # type: ignore[dict-item]
    assert job.run(120) == OwedRun(0, 1)
    assert rows(job_database, "select owed_tries from messages where id = %s", message_id) == [(1,)]
    assert usage(job_database, message_id) == [(0, 0)]


def test_a_claim_with_tools_must_fit_the_day_with_all_it_may_spend_but_its_last_output(
    memory: Memory, job_database: str
) -> None:
    """Two requests of 2,001 in and 2,000 out: 6,002 but the last output, past the day of 5,000,
    so the claim waits for an empty day (as a turn larger than the whole day does)."""
    _, message_id = owed_hello(memory)
    execute(job_database, "update turn_usage set tokens = 1 where message_id = %s", message_id)
    two = TurnEstimate(INPUT, requests=2)
    assert memory.claim_owed_replies([Surface.TELEGRAM], 600, 30, limit=1, estimate=two) == []
    execute(job_database, "update turn_usage set tokens = 0 where message_id = %s", message_id)
    [owed] = memory.claim_owed_replies([Surface.TELEGRAM], 600, 30, limit=1, estimate=two)
    assert (owed.start.message_id, owed.start.reserved_tokens) == (message_id, 2 * 4001)
