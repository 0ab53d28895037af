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
    with pytest.raises(ConfigurationError) as refused:
        Settings.from_environment()
    assert str(refused.value) == f"invalid configuration: {name}: Value error, not an http(s) URL with a host"


@pytest.mark.parametrize("name", URL_SETTINGS)
def test_a_url_setting_may_name_a_port_and_a_path(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setenv(name, "http://127.0.0.1:8081/api")
    assert getattr(Settings.from_environment(), name.lower()) == "http://127.0.0.1:8081/api"
