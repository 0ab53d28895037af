"""One adapter per surface (core/surfaces/): every registry, settings group and docs table names
every member of `Surface`, and a surface left out of the registry fails where it is built, never
silently later (a follow-up recorded as sent unsaid, a sender checked against another surface's
owners, a conversation titled after another surface)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest

from core.errors import ConfigurationError
from core.follow_ups.delivery import FollowUpDelivery
from core.identity.policy import IdentityPolicy
from core.memory.service import Memory
from core.models import Person
from core.stores.postgres_store import PostgresStore
from core.surfaces import RULES, Surface, registry, rules
from functions import runtime
from functions.settings import Settings
from functions.tools.local_dev import build_dev_mounts
from tests.helpers import context_limits

REPOSITORY = Path(__file__).resolve().parents[2]
API = (REPOSITORY / "docs" / "api.md").read_text()
CONFIGURATION = (REPOSITORY / "docs" / "configuration.md").read_text()


def test_every_surface_has_its_rules_and_its_adapter_in_the_deployments_registry(
    environment: pytest.MonkeyPatch,
) -> None:
    # A deadline of its own on each surface, so that one given another surface's setting shows.
    deadlines = [float(10 + index) for index, _ in enumerate(Surface)]
    for surface, deadline in zip(Surface, deadlines, strict=True):
        environment.setenv(f"{surface.value.upper()}_MODEL_DEADLINE", str(deadline))
    runtime.reset()
    assert set(RULES) == set(Surface)
    assert all(rules.surface is surface for surface, rules in RULES.items())
    adapters = runtime.surfaces()
    assert list(adapters) == list(Surface)  # registry() orders them as the enum does
    assert all(adapter.surface is surface for surface, adapter in adapters.items())
    assert set(runtime.identity().owners) == set(Surface)
    assert [adapter.deadline_s for adapter in adapters.values()] == deadlines


def test_every_surface_has_its_setting_and_its_rows_in_the_docs_tables() -> None:
    listed = re.search(r"`surface` one of ([^;]+);", API)
    assert listed is not None
    searchable = set(re.findall(r"`(\w+)`", listed[1]))
    conversations = next(line for line in API.splitlines() if line.startswith("| `GET /conversations?"))
    for surface in Surface:
        assert f"{surface.value}_model_deadline" in Settings.model_fields, surface
        assert f"| `{surface.value.upper()}_MODEL_DEADLINE` |" in CONFIGURATION, surface
        assert surface.value in searchable, surface
        if surface.is_secondary:
            assert f"`{rules(surface).title()}`" in conversations, surface


def test_make_dev_serves_a_function_of_main_py_at_every_chat_surfaces_path() -> None:
    """The dev server's routes come from `Surface` by a naming rule (`/sms` serves `sms_webhook`):
    each names a function main.py has (seen failing with SMS missing from `make dev`)."""
    main = ast.parse((REPOSITORY / "main.py").read_text())
    functions = {node.name for node in main.body if isinstance(node, ast.FunctionDef)}
    mounts = build_dev_mounts()
    assert sorted(mounts) == sorted(["/chat", *(f"/{surface.value}" for surface in Surface if surface.is_secondary)])
    assert set(mounts.values()) <= functions


def test_a_registry_without_a_surface_is_refused_where_it_is_built(environment: pytest.MonkeyPatch) -> None:
    adapters = runtime.surfaces()
    without = {surface: adapter for surface, adapter in adapters.items() if surface is not Surface.WHATSAPP}
    with pytest.raises(ConfigurationError, match="the surface registry has no entry for: whatsapp"):
        registry({surface: lambda adapter=adapter: adapter for surface, adapter in without.items()})
    with pytest.raises(ConfigurationError, match="the surface registry has no entry for: whatsapp"):
        FollowUpDelivery(runtime.store(), without, runtime.identity())


# A fresh interpreter in which core/surfaces/sms.py is not to be found (a `None` in sys.modules is
# what the import system reads as "no such module"), or holds another surface's rules.
WITHOUT_SMS_MODULE = "import sys; sys.modules['core.surfaces.sms'] = None; import core.models"
WRONG_RULES = """import sys, types
from core.surfaces import telegram
sys.modules['core.surfaces.sms'] = types.SimpleNamespace(Rules=telegram.Rules)
from core.models import Surface
from core.surfaces import rules
rules(Surface.SMS)"""


@pytest.mark.parametrize(
    ("code", "refusal"),
    [
        (WITHOUT_SMS_MODULE, "the surfaces' rules (core/surfaces/<surface>.py) has no entry for: sms"),
        (WRONG_RULES, "core.surfaces.sms.Rules is not the sms surface's SurfaceRules"),
    ],
    ids=["no-module", "another-surfaces-rules"],
)
def test_a_surface_without_its_rules_module_or_with_anothers_is_refused(code: str, refusal: str) -> None:
    done = subprocess.run([sys.executable, "-c", code], cwd=REPOSITORY, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == f"core.errors.ConfigurationError: {refusal}"


def test_a_sender_is_the_owners_only_on_the_surface_that_lists_them() -> None:
    owner = uuid.uuid4()
    policy = IdentityPolicy.build("owner", owner, {Surface.WHATSAPP: ["+34 600 111 222"]})
    assert policy.resolve(Surface.WHATSAPP, "whatsapp:+34600111222") == Person(user_id=owner)
    assert policy.resolve(Surface.TELEGRAM, "+34600111222") is None  # never another surface's list
    assert policy.resolve(Surface.TELEGRAM, "34600111222") is None


def test_each_secondary_conversation_is_titled_by_its_surfaces_rules(store: PostgresStore) -> None:
    memory = Memory(store, context_limits())
    for surface in Surface:
        if not surface.is_secondary:
            continue
        sender = f"+346001{len(surface.value):05d}"
        start = memory.begin_turn(Person(sender_id=sender), surface, "hi", uuid.uuid4().hex)
        assert start.user_id is not None and start.message_id is not None
        memory.finish_turn(start.user_id, start.message_id, "hello")
        other = memory.begin_turn(Person(sender_id="+34600999999"), surface, "hi", uuid.uuid4().hex)
        assert other.user_id is not None and other.user_id != start.user_id
        [conversation] = memory.list_conversations(start.user_id).conversations
        assert (conversation.surface, conversation.title) == (surface, rules(surface).title())
        assert conversation.as_json()["title"] == f"[{rules(surface).label}]"


def test_the_webs_untitled_conversation_is_titled_by_its_rules() -> None:
    from core.models import Conversation

    now = datetime.now(UTC)
    assert Conversation(uuid.uuid4(), Surface.WEB, "", now, now).as_json()["title"] == "[Web]"
