"""One default per knob: a setting's default lives in `Settings` only. The SQL functions take
every value as an argument and declare no default of their own; core's dataclasses that carry a
setting take its default from `Settings`; the window rule, written in SQL (window_keeps) and in
Python (stepped_tail, for a history the web client sends), gives the same answer in every case."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import psycopg

from core.media.kinds import MediaLimits
from core.memory.digest import DigestLimits
from core.memory.retention import Retention
from core.memory.service import ContextLimits, TurnBudget
from core.models import Role, Surface
from core.phrases.catalogue import Catalogue
from core.settings import Settings
from core.turn.context import ContextItem, stepped_tail
from core.turn.request import TurnSettings
from tests.database import SCHEMAS

# A field of core that carries a setting -> the setting.
CARRIES = {
    (ContextLimits, "window_hours"): "context_window_hours",
    (ContextLimits, "max_messages"): "context_max_messages",
    (ContextLimits, "window_step"): "context_window_step",
    (ContextLimits, "web_prepend"): "web_prepend_messages",
    (ContextLimits, "max_message_chars"): "max_message_chars",
    (DigestLimits, "batch_size"): "digest_batch_size",
    (DigestLimits, "time_budget_s"): "digest_time_budget",
    (DigestLimits, "idle_s"): "digest_pause_seconds",
    (MediaLimits, "max_items"): "media_max_items",
    (MediaLimits, "image_max_bytes"): "image_max_bytes",
    (MediaLimits, "pdf_max_bytes"): "pdf_max_bytes",
    (MediaLimits, "pdf_max_pages"): "pdf_max_pages",
    (MediaLimits, "voice_max_seconds"): "voice_max_seconds",
    (MediaLimits, "voice_seconds_per_day"): "voice_seconds_per_day",
    (TurnBudget, "reply_tokens"): "anthropic_max_tokens",
    (TurnSettings, "annotate"): "context_annotations",
    (TurnSettings, "timezone"): "context_timezone",
    (TurnSettings, "memory_notes"): "memory_notes",
    (TurnSettings, "tool_rounds"): "tool_rounds",
}
# Defaults that are not a setting's: the zeros of a Memory built without a budget (the functions
# always pass TURNS_PER_MINUTE, TURNS_PER_DAY and TOKENS_PER_DAY), and bounds no setting names.
NOT_SETTINGS = {
    (TurnBudget, "turns_per_minute"),
    (TurnBudget, "turns_per_day"),
    (TurnBudget, "tokens_per_day"),
    (DigestLimits, "messages_per_digest"),
    (ContextLimits, "max_history_chars"),  # MAX_HISTORY_CHARS: unset means 4 x MAX_MESSAGE_CHARS
    (MediaLimits, "voice_max_bytes"),  # a download's bound, no setting's
    (TurnSettings, "capabilities"),  # built from several settings by functions/runtime.py
}


def setting(name: str) -> Any:
    return Settings.model_fields[name].default


def test_every_default_of_core_that_carries_a_setting_is_the_settings() -> None:
    for holder in (ContextLimits, DigestLimits, TurnBudget, MediaLimits, TurnSettings):
        for field in dataclasses.fields(holder):
            if field.default is dataclasses.MISSING:
                continue
            key = (holder, field.name)
            assert key in CARRIES or key in NOT_SETTINGS, f"{holder.__name__}.{field.name}: which setting is it?"
            if key in CARRIES:
                assert field.default == setting(CARRIES[key]), f"{holder.__name__}.{field.name}"
    assert ContextLimits().max_history_chars == Settings.model_construct().history_chars_limit
    purge_batch = inspect.signature(Retention.__init__).parameters["batch_size"].default
    assert purge_batch == setting("purge_batch")


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
