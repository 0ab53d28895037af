"""Every model call of a turn counts in the person's day, in place of what the turn reserved:
its tool rounds and its media description, also when the web client leaves (issue 30, findings 3,
8 and 9). Through `Turns`, the real Anthropic SDK against the local fake, and real Postgres."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import replace

import pytest

from core.channels.media_fetch import InlineMedia
from core.follow_ups.capability import FollowUpRules, FollowUps
from core.identity.policy import IdentityPolicy
from core.media.kinds import MediaKind, MediaRef
from core.media.turn_media import MediaReader
from core.memory.service import Memory
from core.model.llm import AnthropicModel
from core.models import Surface
from core.stores.postgres_store import PostgresStore
from core.turn.capabilities import DEFAULT_SYSTEM_PROMPT
from core.turn.estimate import IMAGE_TOKENS, turn_estimate
from core.turn.request import Outcome, TurnRequest, TurnSettings
from core.turn.turns import Turns
from tests.fakes.anthropic_api import FakeAnthropic, tool_results, tool_use
from tests.helpers import CORPUS, context_limits, media_limits, rows, turn_budget

SETTINGS = TurnSettings(system_prompt=DEFAULT_SYSTEM_PROMPT, fallback_reply="FALLBACK", stranger_reply="NO")
RECEIPT = (CORPUS / "media" / "receipt.jpg").read_bytes()
READ = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")


@pytest.fixture
def fake() -> Iterator[FakeAnthropic]:
    server = FakeAnthropic()
    yield server
    server.close()


def claude(fake: FakeAnthropic, name: str = "claude-test-1") -> AnthropicModel:
    return AnthropicModel(api_key="sk-ant-test", model=name, max_tokens=321, base_url=fake.url, max_retries=0)


def budgeted(store: PostgresStore) -> Memory:
    return Memory(store, context_limits(), turn_budget(tokens_per_day=1_000_000, reply_tokens=321))


def usage_of(database_url: str, external_id: str) -> list[tuple[int, int]]:
    return rows(
        database_url,
        "select u.tokens, u.reserved from turn_usage u join messages m on m.id = u.message_id where m.external_id = %s",
        external_id,
    )


def test_a_two_request_tool_turn_charges_both_requests(
    store: PostgresStore, fake: FakeAnthropic, database_url: str
) -> None:
    """Issue 30, finding 9: the model lists the follow-ups, then answers; what both requests read
    and wrote is the turn's, in place of its reservation (TOOL_ROUNDS requests and the answer after
    them, each of its input and output). Seen failing with the tool loop reporting only the
    latest request's usage."""
    model = claude(fake)
    tools_on = replace(SETTINGS, capabilities=(FollowUps(FollowUpRules()),))
    turns = Turns(budgeted(store), lambda: model, IdentityPolicy("auto"), tools_on)
    answer = "Nothing is planned for you yet."
    fake.answer = lambda body: answer if tool_results(body) else [tool_use("list_follow_ups", {})]
    result = turns.run(TurnRequest(Surface.TELEGRAM, "what is planned?", "tools-2", user_id=uuid.uuid4()))
    assert result.outcome is Outcome.ANSWERED and result.figures.model_requests == 2
    assert len(fake.usages) == 2
    read = sum(usage[key] for usage in fake.usages for key in READ)
    written = 1 + len(answer) // 4  # the first request wrote only its call: the fake's one token
    assert usage_of(database_url, "tools-2") == [(read + written, 0)]
    assert result.figures.reserved_tokens > (SETTINGS.tool_rounds + 1) * 321


def test_an_abandoned_stream_with_a_photo_counts_the_descriptions_tokens(
    store: PostgresStore, fake: FakeAnthropic, database_url: str
) -> None:
    """Issue 30, finding 8: the web client leaves while the answer streams; the photo's description,
    asked beside the answer, counts with what the answer read and the text the client was sent."""
    describing = FakeAnthropic()  # a server of its own: its usage is the description's alone
    try:
        describing.answer = lambda body: "A shop receipt for 42 euros, dated in March."
        describer = claude(describing, "claude-describe-1")
        reader = MediaReader({Surface.WEB: InlineMedia}, lambda: None, lambda: describer, media_limits())
        model = claude(fake)
        memory = budgeted(store)
        turns = Turns(memory, lambda: model, IdentityPolicy("auto"), SETTINGS, media=lambda: reader)
        fake.answer = lambda body: "alpha bravo charlie delta echo foxtrot golf hotel india juliet"
        person = uuid.uuid4()
        web = memory.create_conversation(person)
        photo = MediaRef(MediaKind.IMAGE, "image/jpeg", data=RECEIPT)
        asked = TurnRequest(
            Surface.WEB, "what is this?", "left-photo", user_id=person, conversation_id=web.id, media=(photo,)
        )
        stream = turns.stream(asked)
        assert [next(stream), next(stream)] == ["alpha ", "bravo "]
        stream.close()  # the tab is closed
        [description] = describing.usages
    finally:
        describing.close()
    [answer] = fake.usages  # message_start's: its input, and 1 output token so far
    described = sum(description[key] for key in (*READ, "output_tokens"))
    assert described > 0 and description["output_tokens"] == len("A shop receipt for 42 euros, dated in March.") // 4
    counted = sum(answer[key] for key in READ) + 1 + len("alpha bravo ") // 4 + described
    assert usage_of(database_url, "left-photo") == [(counted, 0)]
    stored = rows(database_url, "select content from messages where external_id = 'left-photo'")
    assert stored == [("[photo: A shop receipt for 42 euros, dated in March.] what is this?",)]


def test_the_estimate_reads_the_prompt_the_tools_the_client_history_and_the_media_at_their_largest() -> None:
    """Each request reads the system prompt, the tools' definitions, the web client's history and the
    attachments; tool rounds and the description are requests of their own."""
    plain = turn_estimate(SETTINGS, TurnRequest(Surface.TELEGRAM, "hi", "e-1"), None)
    assert (plain.input_tokens, plain.requests) == (len(DEFAULT_SYSTEM_PROMPT) // 4, 1)
    tools = turn_estimate(
        replace(SETTINGS, capabilities=(FollowUps(FollowUpRules()),)), TurnRequest(Surface.TELEGRAM, "hi", "e-2"), None
    )
    assert tools.requests == SETTINGS.tool_rounds + 1 and tools.input_tokens > plain.input_tokens
    photo = MediaRef(MediaKind.IMAGE, "image/jpeg", data=RECEIPT)
    pdf = MediaRef(MediaKind.PDF, "application/pdf", data=b"%PDF-1.7")
    media = turn_estimate(
        SETTINGS, TurnRequest(Surface.WEB, "", "e-3", media=(photo, pdf)), media_limits(pdf_max_pages=3)
    )
    assert (media.input_tokens, media.requests) == (plain.input_tokens + IMAGE_TOKENS + 3 * (3_000 + IMAGE_TOKENS), 2)
