"""Each deployed function gets the settings it reads, no more, and every secret from Secret
Manager: serverless.yml against functions/function_settings.py, and that list against what
each function really reads while it serves a turn."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator

import pytest

from functions.function_settings import (
    BY_FUNCTION,
    EVERY_FUNCTION,
    MEDIA,
    SPEECH,
    SURFACE_SETTINGS,
    settings_of,
    undeclared_settings,
)
from functions.settings import Settings
from functions.tools.deploy import Description, FunctionSpec, read_description
from tests.helpers import (
    BOT_TOKEN,
    JWT_SECRET,
    app_client,
    bearer,
    one_request,
)


def test_every_setting_is_placed_in_a_functions_list() -> None:
    assert undeclared_settings() == []


def test_a_surfaces_settings_reach_its_function_and_the_job_by_their_mark() -> None:
    """SMS's settings are marked with their surface where they are declared (functions/settings.py):
    its function, the scheduled job and every function (the owners' list) get them from the mark."""
    assert BY_FUNCTION["sms_webhook"] - MEDIA - SPEECH == {
        "twilio_auth_token",
        "twilio_webhook_shared_key",
        "public_base_url",
        "sms_model_deadline",
        "twilio_account_sid",
        "twilio_sms_from",
        "twilio_api_base",
    }
    assert BY_FUNCTION["memory_digest"] & set(SURFACE_SETTINGS) == {
        "telegram_bot_token",
        "telegram_api_base",
        "telegram_model_deadline",
        "twilio_account_sid",
        "twilio_auth_token",
        "twilio_api_base",
        "twilio_whatsapp_from",
        "twilio_follow_up_content_sid",
        "whatsapp_model_deadline",
        "twilio_sms_from",
        "sms_model_deadline",
        "web_model_deadline",
    }
    assert EVERY_FUNCTION & set(SURFACE_SETTINGS) == {
        "owner_telegram_ids",
        "owner_whatsapp_numbers",
        "owner_sms_numbers",
    }


def test_serverless_yml_gives_each_function_what_it_reads_and_every_secret_from_secret_manager() -> None:
    assert read_description().problems() == []


def by_name(description: Description) -> dict[str, FunctionSpec]:
    """serverless.yml's functions by name (not by place: a new surface's function moves them)."""
    return {function.name: function for function in description.functions}


def test_the_problems_say_what_to_add_where() -> None:
    description = read_description()
    functions = by_name(description)
    telegram, whatsapp, web = functions["telegram_webhook"], functions["whatsapp_webhook"], functions["web_chat"]
    environment = {name: value for name, value in telegram.environment.items() if name != "TELEGRAM_API_BASE"}
    given = {"DIGEST_BATCH_SIZE": "${env:DIGEST_BATCH_SIZE}", "TWILIO_AUTH_TOKEN": "${env:TWILIO_AUTH_TOKEN}"}
    functions["telegram_webhook"] = dataclasses.replace(telegram, environment={**environment, **given})
    functions["whatsapp_webhook"] = dataclasses.replace(
        whatsapp, secrets={**whatsapp.secrets, "TWILIO_AUTH_TOKEN": "hunter2"}
    )
    functions["web_chat"] = dataclasses.replace(
        web, secrets={name: r for name, r in web.secrets.items() if name != "DATABASE_URL"}
    )
    changed = dataclasses.replace(description, functions=list(functions.values()))
    assert changed.problems() == [
        "serverless.yml: telegram_webhook reads TELEGRAM_API_BASE but is not given it: add "
        "`TELEGRAM_API_BASE: ${env:TELEGRAM_API_BASE}` under functions.telegram_webhook.environment",
        "serverless.yml gives telegram_webhook DIGEST_BATCH_SIZE, which it does not read: remove it there "
        "(or, if it does read it, add 'digest_batch_size' to its list in functions/function_settings.py)",
        # A surface's setting is placed by its mark (a new Twilio surface adds itself to this one's).
        "serverless.yml gives telegram_webhook TWILIO_AUTH_TOKEN, which it does not read: remove it there "
        "(or, if it does read it, add the function's surface to the mark of 'twilio_auth_token' in "
        "functions/settings.py (setting_of))",
        "serverless.yml: web_chat reads DATABASE_URL but is not given it: add "
        "`DATABASE_URL: crossmem-database-url:latest` under provider.secrets",
        "serverless.yml: whatsapp_webhook's secret TWILIO_AUTH_TOKEN is 'hunter2', not a Secret Manager "
        "reference (SECRET:VERSION or projects/PROJECT/secrets/SECRET:VERSION)",
    ]


def test_a_secret_given_as_a_plain_value_is_named() -> None:
    description = read_description()
    functions = by_name(description)
    web = functions["web_chat"]
    functions["web_chat"] = dataclasses.replace(
        web,
        environment={**web.environment, "SUPABASE_JWT_SECRET": "${env:SUPABASE_JWT_SECRET}"},
        secrets={name: ref for name, ref in web.secrets.items() if name != "SUPABASE_JWT_SECRET"},
    )
    problems = dataclasses.replace(description, functions=list(functions.values())).problems()
    assert problems == [
        "serverless.yml: SUPABASE_JWT_SECRET is a secret: move it from environment to secrets, "
        "as `SUPABASE_JWT_SECRET: crossmem-supabase-jwt-secret:latest`"
    ]


@pytest.fixture
def settings_read(monkeypatch: pytest.MonkeyPatch) -> Iterator[set[str]]:
    """The Settings fields read from now on (by the function under test, through runtime)."""
    seen: set[str] = set()
    fields = Settings.model_fields
    read = object.__getattribute__

    def recording(self: Settings, name: str) -> object:
        if name in fields:
            seen.add(name)
        return read(self, name)

    monkeypatch.setattr(Settings, "__getattribute__", recording)
    yield seen


def serve_one_turn(function: str, environment: pytest.MonkeyPatch) -> int:
    if function == "web_chat":  # the web's list of conversations too
        environment.setenv("SUPABASE_JWT_SECRET", JWT_SECRET)
        assert app_client(function).get("/conversations", headers=bearer(uuid.uuid4())).status_code == 200
    return one_request(function, environment).status_code


@pytest.mark.parametrize("function", sorted(BY_FUNCTION))
def test_a_function_reads_only_the_settings_its_list_names(
    function: str, environment: pytest.MonkeyPatch, settings_read: set[str]
) -> None:
    assert BOT_TOKEN  # the environment fixture gives every surface its secrets; each reads only its own
    assert serve_one_turn(function, environment) == 200
    unlisted = sorted(settings_read - settings_of(function))
    assert unlisted == [], (
        f"{function} reads {[name.upper() for name in unlisted]}: add {unlisted} to its list in "
        "functions/function_settings.py (EVERY_FUNCTION when every function does), or mark a surface's "
        "setting with its surface in functions/settings.py (setting_of), then give it to the function in "
        "serverless.yml (the test above says where)"
    )
    assert settings_read & BY_FUNCTION[function]  # the recording saw the function's own settings


def test_the_web_is_given_what_transcribes_the_voice_notes_it_takes(
    environment: pytest.MonkeyPatch, settings_read: set[str]
) -> None:
    """The web takes voice notes (docs/api.md, the demo page's microphone) and the prompt tells the
    model they reach it as transcripts. Seen failing with web_chat's list and serverless.yml without
    DEEPGRAM_API_KEY, and `crossmem deploy` refusing it there as a setting web_chat does not read (a
    review of the prompt's claims): every voice note sent to a deployed web was answered "I can't
    listen to voice notes here yet"."""
    environment.setenv("SUPABASE_JWT_SECRET", JWT_SECRET)
    environment.setenv("DEEPGRAM_API_KEY", "dg-test-key")
    environment.setenv("DEEPGRAM_API_BASE", "http://127.0.0.1:9")  # nothing answers: the turn says so
    voice = {"media_type": "audio/webm", "data": "T2dnUw==", "seconds": 4}
    answered = app_client("web_chat").post(
        "/", json={"message": "", "attachments": [voice]}, headers=bearer(uuid.uuid4())
    )
    assert answered.status_code == 200, answered.text
    assert settings_read >= SPEECH and settings_of("web_chat") >= SPEECH
    [web] = [function for function in read_description().functions if function.name == "web_chat"]
    assert {name.lower() for name in (*web.environment, *web.secrets)} >= SPEECH
