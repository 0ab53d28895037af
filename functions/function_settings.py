"""Which settings each deployed function reads: the list serverless.yml is checked against, and
the settings each function refuses to serve for while one of them does not parse (functions/http.py's
`serving`: another surface's wrong setting refuses no function that does not read it).

`crossmem deploy` refuses to deploy while serverless.yml gives a function less or more than
this, or a secret as a plain value; tests/functions/test_function_settings.py also checks it
against the settings each function really reads while it serves. A new setting goes here
first (the failure messages say so, and where in serverless.yml it goes next), unless it is a
surface's: those are marked where they are declared (functions/settings.py's `setting_of`), and
placed from the mark, as a new surface's function is (`<surface>_webhook`, main.py's name for it).
"""

from __future__ import annotations

import re
import typing
from collections.abc import Mapping

from pydantic import SecretStr

from core.models import Surface
from functions.settings import ReadBy, Settings, SurfaceSetting

# The surfaces' settings, by their mark (functions/settings.py's `setting_of`).
SURFACE_SETTINGS: Mapping[str, SurfaceSetting] = {
    name: mark
    for name, field in Settings.model_fields.items()
    for mark in field.metadata
    if isinstance(mark, SurfaceSetting)
}


def marked(surface: Surface, *read_by: ReadBy) -> frozenset[str]:
    """The settings of `surface` that these readers read."""
    return frozenset(
        name for name, mark in SURFACE_SETTINGS.items() if surface in mark.surfaces and mark.read_by in read_by
    )


# The turn, the store, the model, the identity policy and linking: every function builds them.
EVERY_FUNCTION = frozenset(
    {
        "app_env",
        "database_url",
        "database_prepared_statements",
        "database_connect_timeout",
        "database_pool_size",
        "supabase_url",
        "supabase_service_role_key",
        "supabase_timeout",
        "context_window_hours",
        "context_max_messages",
        "context_window_step",
        "web_prepend_messages",
        "context_annotations",
        "context_timezone",
        "max_message_chars",
        "max_history_chars",
        "memory_notes",
        "turns_per_minute",
        "turns_per_day",
        "tokens_per_day",
        "identity_policy",
        "owner_user_id",
        "link_code_ttl_minutes",
        "link_attempts_per_hour",
        "telegram_bot_username",
        "anthropic_api_key",
        "anthropic_base_url",
        "anthropic_model",
        "anthropic_max_tokens",
        "anthropic_effort",
        "anthropic_thinking",
        "anthropic_timeout",
        "anthropic_max_retries",
        "allow_offline_model",
        "system_prompt",
        "fallback_reply",
        "stranger_reply",
        "default_language",
        # The model's follow-up tools, in every turn.
        "follow_ups_per_person",
        # Memory search (core/memory/search.py), in every turn.
        "memory_search",
        "search_max_tokens",
        "search_max_hits",
        "message_retention_days",  # how far back the prompt says the search reaches
        # The tool loop and the operator's own tools (core/turn/capabilities.py), in every turn.
        "tool_rounds",
        "extra_tools",
    }
) | frozenset().union(*(marked(surface, ReadBy.EVERY_FUNCTION) for surface in Surface))  # the owners' lists

# Photos, PDFs and voice notes (docs/media.md), on every chat surface; the describer is
# ANTHROPIC_DIGEST_MODEL.
MEDIA = frozenset(
    {
        "media_max_items",
        "image_max_bytes",
        "pdf_max_bytes",
        "pdf_max_pages",
        "voice_max_seconds",
        "voice_seconds_per_day",
        "media_fetch_timeout",
        "transcription_timeout",
        "media_descriptions",
        "anthropic_digest_model",
    }
)
# Speech to text (Deepgram): the voice notes of every chat surface (the web's demo page records them).
SPEECH = frozenset({"deepgram_api_key", "deepgram_api_base", "deepgram_model"})

# A surface's own function: its webhook and how this deployment reaches it (its adapter).
OWN = (ReadBy.ITS_FUNCTION, ReadBy.ITS_FUNCTION_AND_THE_JOB)

BY_FUNCTION: Mapping[str, frozenset[str]] = {
    **{
        f"{surface.value}_webhook": MEDIA | SPEECH | marked(surface, *OWN)
        for surface in Surface
        if surface.is_secondary
    },
    "web_chat": MEDIA | SPEECH | marked(Surface.WEB, *OWN),
    "memory_digest": frozenset(
        {
            "digest_secret",
            "anthropic_digest_model",
            "anthropic_digest_effort",
            "memory_notes_max_tokens",
            "digest_batch_size",
            "digest_time_budget",
            "digest_pause_seconds",
            "purge_batch",
            # Owed replies (core/turn/owed.py), through each surface's adapter.
            "owed_reply_max_age",
            "owed_reply_max_tries",
        }
    )
    # Every surface's adapter: owed replies and follow-ups through its channel, and a purge spares
    # the turns still in flight (the longest of the surfaces' deadlines).
    | frozenset().union(*(marked(surface, ReadBy.ITS_FUNCTION_AND_THE_JOB) for surface in Surface)),
}

# Only `crossmem dev` and its embedded database read these.
NEVER_DEPLOYED = frozenset({"port", "embedded_data_dir"})

# Read by a function, but never given by serverless.yml: the platform does their job there.
# DIGEST_SECRET guards a memory_digest served without Cloud Run's IAM (`crossmem dev`, another
# host); deployed, the function is private and Cloud Scheduler's OIDC token is the check.
LEFT_TO_THE_PLATFORM = frozenset({"digest_secret"})

SECRET_REFERENCE = re.compile(r"^(projects/[^/]+/secrets/)?[A-Za-z0-9_-]+:(latest|[0-9]+)$")
DECLARED_IN = "functions/function_settings.py"


def settings_of(function: str) -> frozenset[str]:
    """The settings `function` reads, as Settings field names."""
    return EVERY_FUNCTION | BY_FUNCTION[function]


def is_secret(field: str) -> bool:
    annotation = Settings.model_fields[field].annotation
    return SecretStr in (annotation, *typing.get_args(annotation))


def undeclared_settings() -> list[str]:
    """Settings fields that no list here places, each with what to do about it."""
    placed = EVERY_FUNCTION | NEVER_DEPLOYED | frozenset().union(*BY_FUNCTION.values())
    return [
        f"{field.upper()} (Settings.{field}) is in no list of {DECLARED_IN}: add {field!r} to EVERY_FUNCTION, "
        f"to BY_FUNCTION of each function that reads it, or to NEVER_DEPLOYED; or, a surface's, mark it in "
        f"functions/settings.py with setting_of(Surface...)"
        for field in Settings.model_fields
        if field not in placed
    ]


def how_to_place(field: str) -> str:
    """What makes a function read `field`: a surface's setting is placed by its mark, any other by
    the lists here."""
    if field in SURFACE_SETTINGS:
        return f"add the function's surface to the mark of {field!r} in functions/settings.py (setting_of)"
    return f"add {field!r} to its list in {DECLARED_IN}"


def secret_name(field: str) -> str:
    """The Secret Manager name the README and serverless.yml use for a secret setting."""
    return "crossmem-" + field.replace("_", "-")


def deployment_problems(environment: Mapping[str, set[str]], secrets: Mapping[str, Mapping[str, str]]) -> list[str]:
    """What serverless.yml gets wrong: `environment[fn]` holds the names it gives `fn` as plain
    values, `secrets[fn]` the names it gives as secrets, with their Secret Manager references."""
    problems = undeclared_settings()
    unknown_functions = set(environment) ^ set(BY_FUNCTION)
    if unknown_functions:
        problems.append(f"serverless.yml and {DECLARED_IN} name different functions: {sorted(unknown_functions)}")
    for function in sorted(set(environment) & set(BY_FUNCTION)):
        wanted = {field.upper() for field in settings_of(function) - LEFT_TO_THE_PLATFORM}
        plain, secret = environment[function], secrets[function]
        for name in sorted(wanted - plain - set(secret)):
            field = name.lower()
            place = "provider" if field in EVERY_FUNCTION else f"functions.{function}"
            if is_secret(field):
                problems.append(
                    f"serverless.yml: {function} reads {name} but is not given it: add "
                    f"`{name}: {secret_name(field)}:latest` under {place}.secrets"
                )
            else:
                problems.append(
                    f"serverless.yml: {function} reads {name} but is not given it: add "
                    f"`{name}: ${{env:{name}}}` under {place}.environment"
                )
        for name in sorted((plain | set(secret)) - wanted):
            problems.append(
                f"serverless.yml gives {function} {name}, which it does not read: remove it there "
                f"(or, if it does read it, {how_to_place(name.lower())})"
            )
        for name in sorted(plain & wanted):
            if is_secret(name.lower()):
                problems.append(
                    f"serverless.yml: {name} is a secret: move it from environment to secrets, "
                    f"as `{name}: {secret_name(name.lower())}:latest`"
                )
        for name, reference in sorted(secret.items()):
            if name.lower() in Settings.model_fields and not is_secret(name.lower()):
                problems.append(f"serverless.yml: {name} is not a secret: move it from secrets to environment")
            if not SECRET_REFERENCE.match(reference):
                problems.append(
                    f"serverless.yml: {function}'s secret {name} is {reference!r}, not a Secret Manager "
                    "reference (SECRET:VERSION or projects/PROJECT/secrets/SECRET:VERSION)"
                )
    return problems
