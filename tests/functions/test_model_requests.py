"""Every request the project sends Anthropic has a shape the current models accept: the
Sonnet 5 generation answers 400 to sampling parameters, a thinking budget, `thinking:
disabled`, an assistant prefill and a forced tool choice (Anthropic's Claude Sonnet 5.5
migration guide), and takes `thinking: between_tools` alone, at effort low to high (the turn's,
ANTHROPIC_THINKING); the digest's Haiku 5.5 thinks adaptively, at `low` effort."""

from __future__ import annotations

from typing import Any

import pytest

from core.model.llm import messages_request
from core.models import Role
from core.turn.context import ModelMessage
from functions.settings import Settings
from tests.fakes.anthropic_api import FakeAnthropic
from tests.helpers import TELEGRAM_SECRET, app_client

REFUSED_KEYS = {"temperature", "top_p", "top_k", "tool_choice"}
EFFORTS = {"low", "medium", "high", "xhigh", "max"}


def refusals(body: dict[str, Any]) -> list[str]:
    """What a current model would refuse in `body`, by the migration guide's list."""
    found = [f"{key} is set" for key in sorted(REFUSED_KEYS & set(body))]
    thinking = body.get("thinking", {"type": "adaptive"})
    between_tools = thinking == {"type": "between_tools"} and body["model"] == "claude-sonnet-5-5"
    if thinking != {"type": "adaptive"} and not between_tools:
        found.append(f"thinking {thinking} for {body['model']}")
    if body["messages"][-1]["role"] != "user":
        found.append("the last message is an assistant prefill")
    effort = body.get("output_config", {}).get("effort")
    if effort is not None and (effort not in EFFORTS or body["model"].startswith("claude-haiku-4-5")):
        found.append(f"effort {effort!r} for {body['model']}")
    if between_tools and effort in ("xhigh", "max"):
        found.append(f"effort {effort!r} without up-front thinking")
    # Haiku 4.5 thinks only when asked; between_tools thinks before no reply.
    adaptive = not body["model"].startswith("claude-haiku-4-5") and not between_tools
    if adaptive and body["max_tokens"] < 2048:
        found.append("max_tokens leaves adaptive thinking too little room before the reply")
    return found


def test_the_default_model_is_the_current_sonnet_at_low_effort() -> None:
    fields = Settings.model_fields
    assert fields["anthropic_model"].default == "claude-sonnet-5-5"
    assert fields["anthropic_effort"].default == "low" and fields["anthropic_max_tokens"].default == 4096
    assert fields["anthropic_digest_model"].default == "claude-haiku-5-5"
    assert fields["anthropic_digest_effort"].default == "low"


def test_a_turn_sends_a_request_the_current_models_accept(
    environment: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic
) -> None:
    update = {
        "update_id": 99001,
        "message": {
            "message_id": 1,
            "date": 1767225600,
            "chat": {"id": 4242, "type": "private"},
            "from": {"id": 4242, "is_bot": False, "first_name": "Ana"},
            "text": "hello",
        },
    }
    headers = {"X-Telegram-Bot-Api-Secret-Token": TELEGRAM_SECRET}
    assert app_client("telegram_webhook").post("/", json=update, headers=headers).status_code == 200
    (sent,) = fake_anthropic.requests
    assert sent["model"] == "claude-sonnet-5-5" and sent["output_config"] == {"effort": "low"}
    assert sent["thinking"] == {"type": "between_tools"}
    assert refusals(sent) == []


def test_the_digests_request_is_one_the_current_haiku_accepts_without_a_cache_marker(
    environment: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic
) -> None:
    from functions import runtime

    writer = runtime.digest_job()._digester._model  # type: ignore[attr-defined]
    writer.reply("write notes", [ModelMessage(Role.USER, "the conversation to condense", ())], 5.0)
    (body,) = fake_anthropic.requests
    assert body["model"] == "claude-haiku-5-5" and body["output_config"] == {"effort": "low"}
    assert body["max_tokens"] == 800 + 2048
    assert refusals(body) == []
    assert all("cache_control" not in block for block in body["system"])


def test_the_media_describers_request_leaves_haiku_room_to_think_before_it_describes(
    environment: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic
) -> None:
    from functions import runtime

    describer = runtime.describer()
    assert describer is not None
    describer.reply("describe", [ModelMessage(Role.USER, "a photo of a receipt", ())], 5.0)
    (body,) = fake_anthropic.requests
    assert body["model"] == "claude-haiku-5-5" and body["output_config"] == {"effort": "low"}
    assert body["max_tokens"] == 300 + 2048
    assert refusals(body) == []


def test_the_rules_catch_what_a_current_model_refuses() -> None:
    messages = [ModelMessage(Role.USER, "hi", ()), ModelMessage(Role.ASSISTANT, "Sure,", ())]
    body = messages_request("claude-sonnet-5-5", 1024, "s", messages, effort="lowest")
    body["temperature"] = 0.7
    assert refusals(body) == [
        "temperature is set",
        "the last message is an assistant prefill",
        "effort 'lowest' for claude-sonnet-5-5",
        "max_tokens leaves adaptive thinking too little room before the reply",
    ]
    asked = [ModelMessage(Role.USER, "hi", ())]
    assert refusals(
        messages_request("claude-sonnet-5-5", 1024, "s", asked, effort="xhigh", thinking="between_tools")
    ) == ["effort 'xhigh' without up-front thinking"]
    assert refusals(messages_request("claude-haiku-5-5", 4096, "s", asked, thinking="between_tools")) == [
        "thinking {'type': 'between_tools'} for claude-haiku-5-5"
    ]


def test_the_caching_figures_carry_a_row_for_the_default_model() -> None:
    import json
    from pathlib import Path

    results = json.loads((Path(__file__).resolve().parents[2] / "bench" / "results.json").read_text())
    default = Settings.model_fields["anthropic_model"].default
    assert set(results["input_cost_by_model"][default]) == {
        "ours",
        "seed",
        "automatic",
        "ours_vs_seed",
        "automatic_vs_seed",
    }
    # Both 5.5 models cache from 512 tokens (docs/research/model-changes-2026.md).
    assert results["caching_setup"]["min_cacheable_by_model"][default] == 512
