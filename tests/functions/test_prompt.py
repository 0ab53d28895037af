"""The system prompt tells the truth: built from the settings that switch a capability, it claims
exactly what is on and denies nothing that is (the fake and offline models never read it)."""

from __future__ import annotations

import itertools
import re
import typing
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from core.follow_ups.capability import TOOLS as FOLLOW_UP_TOOLS
from core.memory.search import TOOL as SEARCH_TOOL
from core.memory.service import Memory
from core.model.prompt import DEFAULT_PERSONA, MECHANICS, MECHANICS_UNTAGGED
from core.models import Role, TurnStart
from core.stores.store import UnavailableStore
from core.surfaces import Surface, rules
from core.surfaces.sms import KEYWORDS
from core.turn.capabilities import DEFAULT_CAPABILITIES, DEFAULT_SYSTEM_PROMPT, TurnState, standing_instructions
from core.turn.context import ContextItem, build_model_messages
from functions.runtime import capabilities
from functions.settings import Settings
from functions.web_models import WebAttachment
from tests.fakes.anthropic_api import FakeAnthropic
from tests.helpers import TELEGRAM_SECRET, app_client, context_limits

# What the prompt of every configuration must never say: the agent does see photos and PDFs.
NEVER = ("see attachments", "you only learn that they sent one", "ask them to tell you in words")
TOOL_NAMES = {tool["name"] for tool in (*FOLLOW_UP_TOOLS, SEARCH_TOOL)}

SWITCHES = list(
    itertools.product(
        ["0", "20"],  # FOLLOW_UPS_PER_PERSON
        ["true", "false"],  # MEMORY_SEARCH
        ["true", "false"],  # MEDIA_DESCRIPTIONS
        [None, "dg-key"],  # DEEPGRAM_API_KEY
    )
)


@pytest.mark.parametrize(("follow_ups", "search", "descriptions", "deepgram"), SWITCHES)
def test_the_prompt_claims_what_is_on_and_denies_nothing_that_is(
    monkeypatch: pytest.MonkeyPatch, follow_ups: str, search: str, descriptions: str, deepgram: str | None
) -> None:
    monkeypatch.setenv("FOLLOW_UPS_PER_PERSON", follow_ups)
    monkeypatch.setenv("MEMORY_SEARCH", search)
    monkeypatch.setenv("MEDIA_DESCRIPTIONS", descriptions)
    if deepgram is None:
        monkeypatch.delenv("DEEPGRAM_API_KEY", raising=False)
    else:
        monkeypatch.setenv("DEEPGRAM_API_KEY", deepgram)
    config = Settings(_env_file=None)  # type: ignore[call-arg]
    able = capabilities(config)
    prompt = standing_instructions(config.system_prompt, able)
    sent = {definition["name"] for capability in able for definition in capability.definitions}
    on_follow_ups, on_search = "schedule_follow_up" in sent, "search_memory" in sent

    assert (on_follow_ups, on_search) == (follow_ups != "0", search == "true")
    for phrase in NEVER:
        assert phrase not in prompt
    assert "You see the photos and PDFs the person sends" in prompt
    assert "A voice note reaches you as its transcript" in prompt
    # Follow-ups: the tools and when to use them, or a plain "cannot".
    assert ("schedule_follow_up" in prompt) is on_follow_ups
    assert ("You cannot set reminders" in prompt) is not on_follow_ups
    # Memory search: search before saying you do not know, or ask to be reminded.
    assert ("search_memory finds it" in prompt) is on_search
    assert ("ask them to remind you" in prompt) is not on_search
    # Every tool the prompt names is one the turn sends, and only those; each tool's group whole.
    named = {word for word in re.findall(r"[a-z]+(?:_[a-z]+)+", prompt) if word in TOOL_NAMES}
    assert named <= sent
    assert ("schedule_follow_up" in named) is on_follow_ups and ("search_memory" in named) is on_search
    assert sent == ({tool["name"] for tool in FOLLOW_UP_TOOLS} if on_follow_ups else set()) | (
        {SEARCH_TOOL["name"]} if on_search else set()
    )


def test_system_prompt_replaces_the_persona_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SYSTEM_PROMPT", "You are Pip, a cheerful gardening helper.")
    config = Settings(_env_file=None)  # type: ignore[call-arg]
    prompt = standing_instructions(config.system_prompt, capabilities(config))
    assert prompt.startswith("You are Pip, a cheerful gardening helper.\n\nHow the conversation reaches you\n")
    assert "schedule_follow_up" in prompt and "search_memory" in prompt
    assert "personal advisor" not in prompt


def test_the_default_prompt_is_the_one_with_everything_on() -> None:
    assert standing_instructions(DEFAULT_PERSONA, DEFAULT_CAPABILITIES) == DEFAULT_SYSTEM_PROMPT
    assert standing_instructions(DEFAULT_PERSONA, capabilities(Settings(_env_file=None))) == DEFAULT_SYSTEM_PROMPT  # type: ignore[call-arg]


EMAIL_TOOL = '''
def send_email(arguments: dict) -> str:
    """Send an email for the person: to and body."""
    return "sent"


send_email.input_schema = {"type": "object", "properties": {"to": {"type": "string"}}, "required": ["to"]}
send_email.instructions = "Email\\n- send_email sends an email on the person's behalf.\\n"
'''


def test_an_operators_tool_is_not_denied_by_what_the_agent_cannot_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An EXTRA_TOOLS tool that sends email: its instructions are in the prompt, and the closing
    "cannot" denies only what no tool does."""
    (tmp_path / "prompt_mail_tool.py").write_text(EMAIL_TOOL)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("EXTRA_TOOLS", "prompt_mail_tool:send_email")
    config = Settings(_env_file=None)  # type: ignore[call-arg]
    prompt = standing_instructions(config.system_prompt, capabilities(config))
    assert "Email\n- send_email sends an email on the person's behalf.\n" in prompt
    assert prompt.endswith(
        "What you cannot do\n- Do not claim to have done anything none of your tools did: without a tool for"
        " it, you cannot send emails, make calls or browse the web.\n"
    )


def test_with_a_retention_neither_the_prompt_nor_the_search_tool_promises_all_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """MESSAGE_RETENTION_DAYS=30: the scheduled job deletes what is older, so the agent can find only
    the last 30 days. Seen failing with the prompt saying "Everything older ... is still stored" and
    the tool "on every app and all time" (a review of the prompt's claims): asked how far back it
    remembers, the agent said forever, and a purged message's search "found nothing"."""
    monkeypatch.setenv("MESSAGE_RETENTION_DAYS", "30")
    config = Settings(_env_file=None)  # type: ignore[call-arg]
    able = capabilities(config)
    prompt = standing_instructions(config.system_prompt, able)
    [search] = [tool for capability in able for tool in capability.definitions if tool["name"] == "search_memory"]
    assert "all time" not in search["description"] and "the last 30 days" in search["description"]
    assert "Everything older" not in prompt
    assert "in the last 30 days" in prompt and "older ones are deleted" in prompt
    # The turn sends the capability's definition: the toolset's is the same.
    [searching] = [capability for capability in able if search in capability.definitions]
    start = TurnStart(uuid.uuid4(), uuid.uuid4(), 1, duplicate=False, reply=None)
    memory = Memory(UnavailableStore("no database"), context_limits())
    turn = TurnState(memory, uuid.uuid4(), start, ZoneInfo("UTC"), datetime.now(UTC))
    toolset = searching.toolset(turn)
    assert toolset is not None and toolset.definitions == (search,)


@pytest.mark.parametrize("retention", ["0", "30"])
def test_without_memory_notes_the_prompt_does_not_say_the_agent_sees_its_notes(
    monkeypatch: pytest.MonkeyPatch, retention: str
) -> None:
    """MEMORY_NOTES=false sends no notes: the search's part of the prompt said "What you see is the
    recent part of the thread, and your notes" all the same (a review of the prompt's claims)."""
    monkeypatch.setenv("MESSAGE_RETENTION_DAYS", retention)
    monkeypatch.setenv("MEMORY_NOTES", "false")
    prompt = standing_instructions(DEFAULT_PERSONA, capabilities(Settings(_env_file=None)))  # type: ignore[call-arg]
    assert "your notes" not in prompt
    assert "- What you see is the recent part of the thread. " in prompt
    monkeypatch.setenv("MEMORY_NOTES", "true")
    prompt = standing_instructions(DEFAULT_PERSONA, capabilities(Settings(_env_file=None)))  # type: ignore[call-arg]
    assert "- What you see is the recent part of the thread, and your notes. " in prompt


def telegram_update(update_id: int, text: str) -> dict[str, Any]:
    chat = {"id": 4242, "type": "private"}
    sender = {"id": 4242, "is_bot": False, "first_name": "Ana"}
    return {
        "update_id": update_id,
        "message": {"message_id": 1, "date": 1796547600, "chat": chat, "from": sender, "text": text},
    }


def test_without_the_tags_the_prompt_does_not_say_every_message_carries_one(
    environment: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic
) -> None:
    """CONTEXT_ANNOTATIONS=false: the model reads the person's words without `[telegram · 09:12]`.
    Seen failing with the prompt still saying that every message starts with such a tag (a review
    of the prompt's claims): the model is told where and when each message was written, and is not."""
    environment.setenv("CONTEXT_ANNOTATIONS", "false")
    headers = {"X-Telegram-Bot-Api-Secret-Token": TELEGRAM_SECRET}
    response = app_client("telegram_webhook").post("/", json=telegram_update(99101, "hello"), headers=headers)
    assert response.status_code == 200
    (sent,) = fake_anthropic.requests
    assert sent["messages"][-1]["content"][-1]["text"] == "hello"  # no tag
    system = sent["system"][0]["text"]
    assert "starts with a short tag" not in system and "[telegram · 09:12]" not in system
    assert "do not say on which app or when they were written" in system


def test_the_prompt_does_not_invite_a_pdf_where_the_web_refuses_one() -> None:
    """The web takes photos and voice notes, no PDF (400; the demo page offers photos only), and the
    prompt is one for every app. Seen failing with it saying only "You see the photos and PDFs the
    person sends" (a review of the prompt's claims): asked on the web whether they can upload the
    contract, the agent said yes, and the upload was refused."""
    web_types = typing.get_args(WebAttachment.model_fields["media_type"].annotation)
    assert "application/pdf" not in web_types and "image/jpeg" in web_types
    prompt = standing_instructions(DEFAULT_PERSONA, capabilities(Settings(_env_file=None)))  # type: ignore[call-arg]
    assert "The web chat takes photos, not PDFs" in prompt


def test_the_prompt_and_the_tool_say_a_follow_up_is_said_once_so_every_monday_is_not_promised() -> None:
    """ "Remind me every Monday to water the plants": a follow-up is said once, and nothing says
    the next. Seen failing: neither the prompt nor the tool said so, so the agent could schedule one
    and say "I'll remind you every Monday" (a review of the follow-ups as people use them)."""
    [schedule] = [tool for tool in FOLLOW_UP_TOOLS if tool["name"] == "schedule_follow_up"]
    assert "said once" in schedule["description"]
    assert (
        '- Each follow-up is said once: nothing repeats it. For something that repeats ("every Monday"), schedule'
        " the next one, or the next few if they want, say when the last one is, and never say you will keep"
        " reminding them on your own.\n"
    ) in DEFAULT_SYSTEM_PROMPT


def test_the_prompt_says_a_follow_up_asked_on_the_web_is_pushed_on_their_app_and_the_tool_says_which() -> None:
    """ "Remind me at 9 to call the bank" in the web chat: the web pushes nothing itself, so it goes
    to the app linked to their account they last wrote from, and with none it stays in that web
    conversation (core/follow_ups/moves.py). Seen failing: the prompt said it comes "on the app they
    use" and nothing more, so the agent promised a reminder at 9 that a person who closed the tab
    never saw; then that nothing is pushed from the web, untrue for a person with a linked app. The
    tool's result says which, per person (tests/core/follow_ups, tests/functions/test_follow_ups)."""
    [schedule] = [tool for tool in FOLLOW_UP_TOOLS if tool["name"] == "schedule_follow_up"]
    assert "asked on the web, on the app they last wrote from (the result says which)" in schedule["description"]
    assert (
        "- The web pushes nothing: a follow-up asked there is pushed to the app linked to their account that they"
        " last wrote from (Telegram, WhatsApp or SMS), and schedule_follow_up's result names it. When they have"
        " none, its result says so: it then appears only in that web conversation, for them to see when they open"
        " it.\n"
    ) in DEFAULT_SYSTEM_PROMPT


@pytest.mark.parametrize(
    ("tagged", "marked", "line"),
    [
        (True, "[telegram · answered separately] x", 'A message whose tag ends with "answered separately"'),
        (False, "[answered separately] x", 'A message that starts with "[answered separately]"'),
    ],
)
def test_the_prompt_says_what_the_answered_separately_mark_means(tagged: bool, marked: str, line: str) -> None:
    """The context marks a burst's message another turn is answering (core/turn/context.py's
    ANSWERED_SEPARATELY): the prompt names the mark as the context writes it, tagged or not."""
    burst = [
        ContextItem(Role.USER, "x", Surface.TELEGRAM, None, 1),
        ContextItem(Role.USER, "y", Surface.TELEGRAM, None, 2),
    ]
    written = build_model_messages(burst, annotate=tagged, elsewhere=frozenset({1}))
    assert written[0].content.split("\n\n")[0] == marked
    mechanics = " ".join((MECHANICS if tagged else MECHANICS_UNTAGGED).split())
    said = " has a reply of its own, being written or sent apart from this one: read it for what it tells you, and"
    assert f"- {line}{said} answer only what the person wrote after it." in mechanics


def test_the_prompt_names_every_word_twilio_answers_by_sms_itself() -> None:
    """A word in core/surfaces/sms.py's KEYWORDS said alone never reaches the advisor: the prompt
    names each, so the model asks no question one of them would answer (it named five of twelve:
    "want help?" answered "Help" reached Twilio's canned help, never the advisor)."""
    named = set(re.findall(r"\b[A-Z]{3,}\b", rules(Surface.SMS).instructions))
    assert KEYWORDS - named == set()


@pytest.mark.parametrize("tagged", [True, False])
def test_what_the_model_must_know_of_a_surface_is_its_rules_part_of_the_prompt(tagged: bool) -> None:
    """Each surface's lines (`SurfaceRules.instructions`) follow "How the conversation reaches you",
    and the prompt's own parts name no surface's. Seen failing: SMS's keywords were
    core/model/prompt.py's SMS_KEYWORDS, shared code a new surface with words of its own had to
    edit, which docs/extending.md's table of what a surface adds did not count."""
    prompt = standing_instructions(DEFAULT_PERSONA, DEFAULT_CAPABILITIES, tagged=tagged)
    mechanics = MECHANICS if tagged else MECHANICS_UNTAGGED
    sms = rules(Surface.SMS).instructions
    assert sms.startswith("- By SMS, a reply of only STOP, STOPALL, CANCEL, END, QUIT, UNSUBSCRIBE")
    assert mechanics + sms in prompt
    assert [surface for surface in Surface if rules(surface).instructions] == [Surface.SMS]
    assert "SMS" not in mechanics and "STOP" not in mechanics


def test_without_the_tags_the_personas_examples_show_none_either() -> None:
    """CONTEXT_ANNOTATIONS=false: the mechanics say the messages carry no app or time, and the
    persona's style examples still showed them tagged, `"[telegram · 08:05] Remind me..."` (a review
    of the prompt's claims): a model shown tags it never reads may write them, or take the app and
    time of a message for known. The examples are shown as the messages come, untagged."""
    prompt = standing_instructions(DEFAULT_PERSONA, DEFAULT_CAPABILITIES, tagged=False)
    assert re.findall(r"\[[a-z]+ · [^\]]*\]", prompt) == []
    assert 'Person: "Remind me what I wanted to ask my landlord" (and earlier, on the web,' in prompt
    assert 'Person: "ok booked it" after discussing train times on Telegram.' in prompt
    tagged = standing_instructions(DEFAULT_PERSONA, DEFAULT_CAPABILITIES)
    assert 'Person: "[telegram · 08:05] Remind me what I wanted to ask my landlord"' in tagged


def test_without_the_tags_a_personas_own_brackets_are_kept() -> None:
    """SYSTEM_PROMPT's persona may bracket its own words alike: `[note · keep it short]` is no
    message's tag (an app's name and a time). Seen failing with it taken out, its words with it."""
    persona = "You are Ana's advisor. [note · keep it short] Answer in Spanish.\n"
    prompt = standing_instructions(persona + DEFAULT_PERSONA, DEFAULT_CAPABILITIES, tagged=False)
    assert prompt.startswith("You are Ana's advisor. [note · keep it short] Answer in Spanish.\n")
    assert re.findall(r"\[[a-z]+ · [^\]]*\]", prompt) == ["[note · keep it short]"]
