"""One default per knob: a setting's default lives in `Settings` (functions/settings.py) only.
The SQL functions take every value as an argument and declare no default of their own; core's
limits that carry a setting declare none either (functions/runtime.py passes each in, and passes
the right setting); the few core defaults left (TurnSettings, the Catalogue) equal the setting's;
the window rule, written in SQL (window_keeps) and in Python (stepped_tail, for a history the web
client sends), gives the same answer in every case."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import psycopg

from core.channels.telegram_bot import TelegramBot
from core.follow_ups.capability import FollowUpRules
from core.identity.linking import Linking
from core.media.kinds import MediaLimits
from core.media.turn_media import MediaReader
from core.memory.digest import DigestLimits
from core.memory.retention import Retention
from core.memory.service import ContextLimits, TurnBudget
from core.model.llm import AnthropicModel
from core.models import Role, Surface
from core.phrases.catalogue import Catalogue
from core.stores.postgres_store import PostgresStore
from core.stores.supabase_store import SupabaseStore
from core.turn.context import ContextItem, stepped_tail
from core.turn.request import TurnSettings
from functions import runtime
from functions.settings import Settings
from tests.database import SCHEMAS

# A field of core that carries a setting -> the setting.
CARRIES = {
    (ContextLimits, "window_hours"): "context_window_hours",
    (ContextLimits, "max_messages"): "context_max_messages",
    (ContextLimits, "window_step"): "context_window_step",
    (ContextLimits, "web_prepend"): "web_prepend_messages",
    (ContextLimits, "max_message_chars"): "max_message_chars",
    (DigestLimits, "max_messages"): "context_max_messages",
    (DigestLimits, "window_step"): "context_window_step",
    (DigestLimits, "window_hours"): "context_window_hours",
    (DigestLimits, "batch_size"): "digest_batch_size",
    (DigestLimits, "time_budget_s"): "digest_time_budget",
    (DigestLimits, "idle_s"): "digest_pause_seconds",
    (MediaLimits, "max_items"): "media_max_items",
    (MediaLimits, "image_max_bytes"): "image_max_bytes",
    (MediaLimits, "pdf_max_bytes"): "pdf_max_bytes",
    (MediaLimits, "pdf_max_pages"): "pdf_max_pages",
    (MediaLimits, "voice_max_seconds"): "voice_max_seconds",
    (MediaLimits, "voice_seconds_per_day"): "voice_seconds_per_day",
    (TurnBudget, "turns_per_minute"): "turns_per_minute",
    (TurnBudget, "turns_per_day"): "turns_per_day",
    (TurnBudget, "tokens_per_day"): "tokens_per_day",
    (TurnBudget, "reply_tokens"): "anthropic_max_tokens",
    (TurnSettings, "annotate"): "context_annotations",
    (TurnSettings, "timezone"): "context_timezone",
    (TurnSettings, "memory_notes"): "memory_notes",
    (TurnSettings, "tool_rounds"): "tool_rounds",
}
# The budget's limits default to 0, off, for a Memory built without a budget (the CLI, a test):
# not the settings' defaults, which the functions always pass.
OFF = {(TurnBudget, "turns_per_minute"), (TurnBudget, "turns_per_day"), (TurnBudget, "tokens_per_day")}
# Defaults that are not a setting's: bounds no setting names.
NOT_SETTINGS = {
    (DigestLimits, "messages_per_digest"),
    (DigestLimits, "first_wait_s"),  # the back-off after a failed digest (design.md, Memory notes)
    (DigestLimits, "longest_wait_s"),
    (MediaLimits, "voice_max_bytes"),  # a download's bound, no setting's
    (TurnSettings, "capabilities"),  # built from several settings by functions/runtime.py
}


# Built by functions/runtime.py from the settings at their defaults.
DEFAULTS = Settings.defaults()
BUILT = {
    ContextLimits: runtime.context_limits(DEFAULTS),
    DigestLimits: runtime.digest_limits(DEFAULTS),
    MediaLimits: runtime.media_limits(DEFAULTS),
    TurnBudget: runtime.turn_budget(DEFAULTS),
}


def setting(name: str) -> Any:
    return Settings.model_fields[name].default


def test_core_declares_no_default_of_a_setting_and_the_runtime_passes_each() -> None:
    for holder in (ContextLimits, DigestLimits, TurnBudget, MediaLimits, TurnSettings):
        for field in dataclasses.fields(holder):
            key, name = (holder, field.name), f"{holder.__name__}.{field.name}"
            if field.default is not dataclasses.MISSING:
                assert key in CARRIES or key in NOT_SETTINGS, f"{name}: which setting is it?"
            if key not in CARRIES:
                continue
            if holder is TurnSettings:  # core/turn/request.py's defaults, kept equal to the settings'
                assert field.default == setting(CARRIES[key]), name
                continue
            assert field.default == (0 if key in OFF else dataclasses.MISSING), f"{name} declares a default"
            assert getattr(BUILT[holder], field.name) == setting(CARRIES[key]), name
    assert BUILT[ContextLimits].max_history_chars == 4 * setting("max_message_chars")  # MAX_HISTORY_CHARS unset
    purge_batch = inspect.signature(Retention.__init__).parameters["batch_size"].default
    assert purge_batch is inspect.Parameter.empty


# Core's constructors whose parameter carries a setting: runtime.py passes each; built without one
# (a test, a benchmark, the CLI) they may default to the setting's default, never to another value.
PARAMETERS: dict[tuple[Any, str], str] = {
    (Linking, "ttl_minutes"): "link_code_ttl_minutes",
    (Linking, "attempts_per_hour"): "link_attempts_per_hour",
    (AnthropicModel, "timeout_s"): "anthropic_timeout",
    (AnthropicModel, "max_retries"): "anthropic_max_retries",
    (PostgresStore, "connect_timeout_s"): "database_connect_timeout",
    (PostgresStore, "max_connections"): "database_pool_size",
    (SupabaseStore, "timeout_s"): "supabase_timeout",
    (TelegramBot, "api_base"): "telegram_api_base",
    (MediaReader, "fetch_timeout_s"): "media_fetch_timeout",
    (MediaReader, "transcription_timeout_s"): "transcription_timeout",
    (FollowUpRules, "max_pending"): "follow_ups_per_person",
    (FollowUpRules, "max_chars"): "max_message_chars",
}


def test_a_core_constructors_default_of_a_setting_is_the_settings() -> None:
    for (owner, parameter), name in PARAMETERS.items():
        default = inspect.signature(owner).parameters[parameter].default
        assert default in (inspect.Parameter.empty, setting(name)), f"{owner.__name__}({parameter}={default!r})"


def test_no_sql_function_declares_a_default(database_url: str) -> None:
    with psycopg.connect(database_url) as connection:
        defaulted = connection.execute(
            "select p.oid::regprocedure::text from pg_proc p"
            " where p.pronamespace::regnamespace::text = any(%s) and p.pronargdefaults > 0",
            (SCHEMAS,),
        ).fetchall()
    assert defaulted == []


def test_the_window_rule_is_the_same_in_sql_and_in_python(database_url: str) -> None:
    """Every total up to 150 messages, window up to 60, step up to 70 (0 and steps longer than the
    window included): how many the SQL keeps is how many stepped_tail keeps."""
    with psycopg.connect(database_url) as connection:
        kept = connection.execute(
            "select t, l, s, public.window_keeps(t, l::integer, s::integer)"
            "  from generate_series(0, 150) t, generate_series(0, 60) l, generate_series(0, 70) s"
        ).fetchall()
    messages = [ContextItem(Role.USER, str(index), Surface.TELEGRAM) for index in range(150)]
    differ = [
        (total, limit, step, sql)
        for total, limit, step, sql in kept
        if sql != len(stepped_tail(messages[:total], limit, step))
    ]
    assert len(kept) == 151 * 61 * 71 and differ == []


def test_the_catalogues_default_language_is_the_settings() -> None:
    """A Catalogue built without DEFAULT_LANGUAGE (a core object made in a test, Linking's own)
    speaks the setting's default."""
    assert inspect.signature(Catalogue.__init__).parameters["default_language"].default == setting("default_language")
    assert Catalogue().default_language == "en"
