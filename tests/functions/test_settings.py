"""functions/settings.py: what a setting's type says of how its environment value is read."""

from __future__ import annotations

import pytest

from core.errors import ConfigurationError
from functions.settings import CommaList, Settings


class WithAnotherSurface(Settings):
    """A new surface's owners' list, declared as SMS's is and listed nowhere else."""

    owner_rcs_numbers: CommaList = []


def test_a_comma_separated_setting_is_split_wherever_it_is_declared(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OWNER_RCS_NUMBERS", " +15550100100, +15550100101 ,")
    monkeypatch.setenv("OWNER_SMS_NUMBERS", "+15550100102")
    read = WithAnotherSurface(_env_file=None)  # type: ignore[call-arg]
    assert (read.owner_rcs_numbers, read.owner_sms_numbers) == (["+15550100100", "+15550100101"], ["+15550100102"])


URL_SETTINGS = [
    "TELEGRAM_API_BASE",
    "TWILIO_API_BASE",
    "DEEPGRAM_API_BASE",
    "ANTHROPIC_BASE_URL",
    "SUPABASE_JWKS_URL",
    "PUBLIC_BASE_URL",
]


@pytest.mark.parametrize("name", URL_SETTINGS)
@pytest.mark.parametrize("value", ["http://localhost:80x81", "http://[::1", "localhost:8081", "ftp://files.example"])
def test_a_url_setting_that_is_no_http_url_is_named(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    """httpx met it at the first call: "invalid literal for int() with base 10: '80x81'", a 500
    on every Telegram delivery, and a traceback from `crossmem telegram info`."""
    monkeypatch.setenv(name, value)
    read = Settings.from_environment()  # held back: said to whoever reads it, and to no one else
    with pytest.raises(ConfigurationError) as refused:
        getattr(read, name.lower())
    assert str(refused.value) == f"invalid configuration: {name}: Value error, not an http(s) URL with a host"


def test_a_setting_that_does_not_parse_is_held_back_and_the_others_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """Never its default in its place: whoever reads it is told what is wrong, never its value."""
    monkeypatch.setenv("TWILIO_API_BASE", "https://AC1:twilio-password@api.twilio.com:443x")
    monkeypatch.setenv("SMS_MODEL_DEADLINE", "soon")
    monkeypatch.setenv("TELEGRAM_API_BASE", "http://127.0.0.1:8081")
    monkeypatch.setenv("DATABASE_POOL_SIZE", "3")
    read = Settings.from_environment()
    assert (read.telegram_api_base, read.database_pool_size, read.whatsapp_model_deadline) == (
        "http://127.0.0.1:8081",
        3,
        12.0,
    )
    read.require_valid(["telegram_api_base", "database_pool_size"])
    with pytest.raises(ConfigurationError) as refused:
        read.require_valid(["database_pool_size", "sms_model_deadline", "twilio_api_base"])
    # in the order the settings are declared, whatever the order asked
    assert str(refused.value) == (
        "invalid configuration: TWILIO_API_BASE: Value error, not an http(s) URL with a host; "
        "SMS_MODEL_DEADLINE: Input should be a valid number, unable to parse string as a number"
    )
    with pytest.raises(ConfigurationError) as everything:
        read.require_valid()
    assert str(everything.value) == str(refused.value)
    with pytest.raises(ConfigurationError) as read_anyway:
        read.sms_model_deadline  # noqa: B018 (reading it is the test)
    assert str(read_anyway.value) == (
        "invalid configuration: SMS_MODEL_DEADLINE: Input should be a valid number, unable to parse string as a number"
    )
    assert "twilio-password" not in repr(read) + str(refused.value)


def test_a_rule_of_several_settings_is_every_readers(monkeypatch: pytest.MonkeyPatch) -> None:
    """CONTEXT_WINDOW_STEP above CONTEXT_MAX_MESSAGES is no one setting's: nothing is read, and the
    settings that do not parse are named with it."""
    monkeypatch.setenv("CONTEXT_MAX_MESSAGES", "16")
    monkeypatch.setenv("CONTEXT_WINDOW_STEP", "20")
    monkeypatch.setenv("SUPABASE_JWKS_URL", "jwks.json")
    with pytest.raises(ConfigurationError) as refused:
        Settings.from_environment()
    assert str(refused.value) == (
        "invalid configuration: SUPABASE_JWKS_URL: Value error, not an http(s) URL with a host; "
        "CONTEXT_WINDOW_STEP must not exceed CONTEXT_MAX_MESSAGES"
    )


@pytest.mark.parametrize("name", URL_SETTINGS)
def test_a_url_setting_may_name_a_port_and_a_path(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setenv(name, "http://127.0.0.1:8081/api")
    assert getattr(Settings.from_environment(), name.lower()) == "http://127.0.0.1:8081/api"


NOT_AN_ORIGIN = (
    "invalid configuration: CORS_ORIGINS: Value error, each is * or an origin as a browser sends it: "
    "https://HOST[:PORT], no path, no trailing /, lowercase, no default port, an ASCII host"
)


@pytest.mark.parametrize(
    "value",
    [
        "https://App.example.com",  # a browser's Origin is lowercase
        "HTTPS://app.example.com",
        "https://app.example.com:443",  # and leaves out the scheme's default port
        "http://localhost:80",
        "https://café.example",  # and names the host in punycode (xn--caf-dma.example)
        "https://app.example.com,https://Other.example.com",
    ],
)
def test_cors_origins_no_browser_sends_are_named(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    """Seen failing: taken, and compared as they are with the Origin a browser sends, which is
    never in this form: every request of the frontend failed CORS, with nothing said here."""
    monkeypatch.setenv("CORS_ORIGINS", value)
    with pytest.raises(ConfigurationError) as refused:
        Settings.from_environment().cors_origins  # noqa: B018 (reading it is the test)
    assert str(refused.value) == NOT_AN_ORIGIN


def test_cors_origins_as_browsers_send_them_are_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    origins = "https://app.example.com,http://localhost:3000,http://[::1]:5173,capacitor://localhost,https://xn--caf-dma.example"
    monkeypatch.setenv("CORS_ORIGINS", origins)
    assert Settings.from_environment().cors_origins == origins.split(",")
    monkeypatch.setenv("CORS_ORIGINS", "*")
    assert Settings.from_environment().cors_origins == ["*"]
