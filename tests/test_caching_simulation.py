"""The caching simulation compares memory designs: the seed is priced with the same tools as ours."""

from __future__ import annotations

from bench import caching
from core.follow_ups.capability import TOOLS


def test_the_seed_and_ours_send_the_same_tools_in_every_request() -> None:
    conversation = caching.Conversation.generate(turns=6, seed=3)
    seed = caching.seed_requests(conversation)
    ours = caching.ours_requests(conversation)
    assert len(TOOLS) == 4
    assert [body["tools"] for body in seed.bodies] == [list(TOOLS)] * 6
    assert [body["tools"] for body in ours.bodies] == [list(TOOLS)] * 6
