"""The scheduled job's answer to an owed message within TOKENS_PER_DAY (owed_replies.sql's
claim_owed_replies): its claim checks and reserves as begin_turn does, in the budget's lock, and
its end settles what it reserved. Real Postgres, a database of its own (the claim takes any owed
message it finds)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import psycopg
import pytest

from core.errors import OverBudget
from core.identity.policy import IdentityPolicy
from core.memory.service import Memory, TurnEstimate
from core.model.llm import AnthropicModel
from core.model.offline_model import OfflineModel
from core.models import Person, Surface
from core.stores.postgres_store import PostgresStore
from core.turn.capabilities import DEFAULT_SYSTEM_PROMPT
from core.turn.owed import OwedReplies, OwedRun
from core.turn.request import TurnSettings
from core.turn.turns import Turns
from tests.fakes.anthropic_api import FakeAnthropic
from tests.helpers import RecordingChannel, context_limits, execute, rows, turn_budget

DAY, OUTPUT, INPUT = 5_000, 2_000, 2_000


@pytest.fixture
def memory(own_database: str) -> Iterator[Memory]:
    store = PostgresStore(own_database)
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
    memory: Memory, own_database: str
) -> None:
    """A rev-tools review's repro: the job's claim reserved nothing, so the person's web turn started
    while the job answered was admitted on a full day, and the day ended at 8,004 of 5,000 (past
    it by more than one output). Now the claim reserves the answer's input (2,000, and "hello" in
    its window) and its output: the web turn's input no longer fits, and the day is the job's."""
    person, message_id = owed_hello(memory)
    [owed] = memory.claim_owed_replies([Surface.TELEGRAM], 600, 30, limit=1, estimate=TurnEstimate(INPUT))
    assert (owed.start.message_id, owed.start.reserved_tokens) == (message_id, 4001)
    assert usage(own_database, message_id) == [(4001, 4001)]

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
    assert usage(own_database, message_id) == [(4001, 0)]
    [(day,)] = rows(own_database, "select sum(tokens) from turn_usage where user_id = %s", person)
    assert day == 4001 <= DAY + OUTPUT


def test_a_claim_whose_input_would_reach_the_day_leaves_the_message_owed_and_untried(
    memory: Memory, own_database: str
) -> None:
    """As begin_turn: the day with the answer's input (2,001) reaching TOKENS_PER_DAY exactly is
    refused, and the message stays owed, its try not counted, for a later run; one token under, it
    is claimed."""
    _, message_id = owed_hello(memory)
    execute(own_database, "update turn_usage set tokens = %s where message_id = %s", DAY - 2001, message_id)
    assert memory.claim_owed_replies([Surface.TELEGRAM], 600, 30, limit=1, estimate=TurnEstimate(INPUT)) == []
    assert rows(own_database, "select owed_tries from messages where id = %s", message_id) == [(0,)]
    assert usage(own_database, message_id) == [(DAY - 2001, 0)]
    execute(own_database, "update turn_usage set tokens = %s where message_id = %s", DAY - 2002, message_id)
    [owed] = memory.claim_owed_replies([Surface.TELEGRAM], 600, 30, limit=1, estimate=TurnEstimate(INPUT))
    assert (owed.start.message_id, owed.tries, owed.start.reserved_tokens) == (message_id, 1, 4001)
    assert usage(own_database, message_id) == [(DAY - 2002 + 4001, 4001)]


def test_a_claim_the_job_cannot_answer_gives_its_reservation_back(memory: Memory, own_database: str) -> None:
    """A message whose sender no channel can reach (not a Telegram chat id) is skipped: what its
    claim reserved is given back at once, not counted until the day ends."""
    _, message_id = owed_hello(memory, chat="not-a-chat")

    def unreachable(chat: str) -> object:
        raise ValueError(f"not a chat id: {chat}")

    settings = TurnSettings("Be brief.", "FALLBACK", "NO")
    turns = Turns(memory, OfflineModel, IdentityPolicy("auto"), settings)
    job = OwedReplies(memory, turns, {Surface.TELEGRAM: unreachable}, {Surface.TELEGRAM: 10.0}, 600, 3)  # type: ignore[dict-item]
    assert job.run(120) == OwedRun(0, 1)
    assert rows(own_database, "select owed_tries from messages where id = %s", message_id) == [(1,)]
    assert usage(own_database, message_id) == [(0, 0)]


def test_a_claim_with_tools_must_fit_the_day_with_all_it_may_spend_but_its_last_output(
    memory: Memory, own_database: str
) -> None:
    """Two requests of 2,001 in and 2,000 out: 6,002 but the last output, past the day of 5,000,
    so the claim waits for an empty day (as a turn larger than the whole day does)."""
    _, message_id = owed_hello(memory)
    execute(own_database, "update turn_usage set tokens = 1 where message_id = %s", message_id)
    two = TurnEstimate(INPUT, requests=2)
    assert memory.claim_owed_replies([Surface.TELEGRAM], 600, 30, limit=1, estimate=two) == []
    execute(own_database, "update turn_usage set tokens = 0 where message_id = %s", message_id)
    [owed] = memory.claim_owed_replies([Surface.TELEGRAM], 600, 30, limit=1, estimate=two)
    assert (owed.start.message_id, owed.start.reserved_tokens) == (message_id, 2 * 4001)


def large_memory(store: PostgresStore) -> Memory:
    return Memory(store, context_limits(), turn_budget(tokens_per_day=1_000_000, reply_tokens=321))


def test_the_jobs_last_try_gives_back_its_reservation_once(own_database: str, fake_anthropic: FakeAnthropic) -> None:
    """A try that fails ends its attempt, which gives back what its claim reserved; its give-up
    (the last try) stores the fallback and gives nothing back again, which would have taken the
    dead attempt's 50,000, still counted, off the day (a review's finding)."""
    store = PostgresStore(own_database)
    try:
        memory = large_memory(store)
        dead = memory.begin_turn(
            Person(sender_id="5151"), Surface.TELEGRAM, "hello", "died-1", sender="5151", estimate=TurnEstimate(49_678)
        )
        assert dead.message_id is not None and dead.reserved_tokens == 50_000
        execute(
            own_database, "update messages set answer_by = now() - interval '1 second' where id = %s", dead.message_id
        )
        fake_anthropic.behaviour = "529"
        model = AnthropicModel(
            api_key="sk-ant-test", model="claude-test-1", max_tokens=321, base_url=fake_anthropic.url, max_retries=0
        )
        settings = TurnSettings(system_prompt=DEFAULT_SYSTEM_PROMPT, fallback_reply="FALLBACK", stranger_reply="NO")
        channel = RecordingChannel()
        turns = Turns(memory, lambda: model, IdentityPolicy("auto"), settings)
        job = OwedReplies(memory, turns, {Surface.TELEGRAM: lambda sender: channel}, {Surface.TELEGRAM: 5.0}, 600, 1)
        assert job.run(120) == OwedRun(0, 1)
        assert channel.sent == ["FALLBACK"]
        assert usage(own_database, dead.message_id) == [(50_000, 50_000)]
    finally:
        store.close()


def test_an_attempt_ending_while_the_job_claims_its_message_does_not_deadlock(
    own_database: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The claim takes the message's row, then the budget's lock, then turn_usage's row; end_attempt
    took turn_usage's first: the two deadlocked and the attempt's tokens were never counted (a
    review's finding). A third session holds the budget's lock so that they always meet so."""
    store = PostgresStore(own_database)
    try:
        memory = large_memory(store)
        late = memory.begin_turn(
            Person(sender_id="5252"), Surface.TELEGRAM, "hello", "late-1", sender="5252", estimate=TurnEstimate(1000)
        )
        assert late.message_id is not None and late.user_id is not None and late.reserved_tokens == 1322
        execute(
            own_database, "update messages set answer_by = now() - interval '1 second' where id = %s", late.message_id
        )
        claimed: list[object] = []

        def claim() -> None:
            claimed.extend(memory.claim_owed_replies([Surface.TELEGRAM], 600, 30, limit=1, estimate=TurnEstimate(1000)))

        def end() -> None:
            assert late.user_id is not None and late.message_id is not None
            memory.end_attempt(late.user_id, late.message_id, late.attempt, 500, reserved=late.reserved_tokens)

        def waiting(kind: str) -> int:
            """Sessions of this database waiting on a lock of `kind` (the server's others are other tests')."""
            query = (
                "select count(*) from pg_locks l join pg_stat_activity a on a.pid = l.pid"
                " where not l.granted and l.locktype = %s and a.datname = current_database()"
            )
            return int(rows(own_database, query, kind)[0][0])

        with psycopg.connect(own_database) as holder:
            holder.execute(
                "select pg_advisory_xact_lock(hashtextextended('budget/' || %s::text, 0))", (str(late.user_id),)
            )
            job = threading.Thread(target=claim)
            job.start()
            while waiting("advisory") == 0:  # the claim holds the message's row, and waits for the budget
                time.sleep(0.02)
            ending = threading.Thread(target=end)
            ending.start()
            while waiting("transactionid") == 0:  # end_attempt waits for the message's row
                time.sleep(0.02)
            holder.commit()
        job.join(20)
        ending.join(20)
        assert "end_attempt failed" not in caplog.text and len(claimed) == 1
        # The claim's 1,322 reserved beside the attempt's 500 spent (its reservation given back).
        assert usage(own_database, late.message_id) == [(1322 + 500, 1322)]
    finally:
        store.close()


@pytest.mark.parametrize("tokens_per_day", [0, 1_000_000])
def test_a_message_whose_chat_no_longer_reaches_its_person_is_claimed_once_a_run(
    own_database: str, tokens_per_day: int
) -> None:
    """Its claim's reservation is given back when the run ends, not at once, which freed the message
    for the same run to claim again (a review's finding)."""
    store = PostgresStore(own_database)
    try:
        memory = Memory(store, context_limits(), turn_budget(tokens_per_day=tokens_per_day, reply_tokens=321))
        first = memory.begin_turn(
            Person(user_id=uuid.uuid4()),
            Surface.TELEGRAM,
            "hello",
            "gone-1",
            sender="5353",
            estimate=TurnEstimate(1000),
        )
        assert first.message_id is not None
        execute(
            own_database, "update messages set answer_by = now() - interval '1 second' where id = %s", first.message_id
        )
        settings = TurnSettings("Be brief.", "FALLBACK", "NO")
        turns = Turns(memory, OfflineModel, IdentityPolicy("auto"), settings)
        channel = RecordingChannel()
        job = OwedReplies(memory, turns, {Surface.TELEGRAM: lambda sender: channel}, {Surface.TELEGRAM: 5.0}, 600, 3)
        assert job.run(120) == OwedRun(0, 1)
        assert rows(own_database, "select owed_tries from messages where id = %s", first.message_id) == [(1,)]
        # What its own attempt reserved still counts (its instance died); the claim's was given back.
        assert usage(own_database, first.message_id) == ([(1322, 1322)] if tokens_per_day else [])
        assert channel.sent == []
    finally:
        store.close()


def test_a_second_attempt_with_the_same_words_as_the_stored_reply_still_counts_what_it_spent(
    memory: Memory, own_database: str
) -> None:
    """Both attempts at one message now name one reply id (messages.reply_id): the one that ends
    second with the same words (a short question, a deterministic answer) is not a retried
    finish_turn of the first: what it spent counts, and its reservation is given back."""
    person = uuid.uuid4()
    chat = memory.create_conversation(person).id
    first = memory.begin_turn(
        Person(user_id=person),
        Surface.WEB,
        "hello",
        "same-words-1",
        chat,
        answer_within_s=0,
        estimate=TurnEstimate(100),
    )
    second = memory.begin_turn(
        Person(user_id=person), Surface.WEB, "hello", "same-words-1", chat, estimate=TurnEstimate(100)
    )
    assert second.owed and first.message_id is not None and second.reply_id == first.reply_id
    both_reserved = first.reserved_tokens + second.reserved_tokens
    assert usage(own_database, first.message_id) == [(both_reserved, both_reserved)]
    assert (
        memory.finish_turn(
            person,
            first.message_id,
            "hi",
            attempt=first.attempt,
            tokens=100,
            reserved=first.reserved_tokens,
            reply_id=first.reply_id,
        )
        == first.reply_id
    )
    # The second attempt's words are the stored reply's: it stored nothing, and spent 100 all the same.
    memory.finish_turn(
        person,
        first.message_id,
        "hi",
        attempt=second.attempt,
        tokens=100,
        reserved=second.reserved_tokens,
        reply_id=second.reply_id,
    )
    assert usage(own_database, first.message_id) == [(200, 0)]
