"""functions/settings.py: what a setting's type says of how its environment value is read."""

from __future__ import annotations

import pytest

from functions.settings import CommaList, Settings


class WithAnotherSurface(Settings):
    """A new surface's owners' list, declared as SMS's is and listed nowhere else."""

    owner_rcs_numbers: CommaList = []


def test_a_comma_separated_setting_is_split_wherever_it_is_declared(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OWNER_RCS_NUMBERS", " +15550100100, +15550100101 ,")
    monkeypatch.setenv("OWNER_SMS_NUMBERS", "+15550100102")
    read = WithAnotherSurface(_env_file=None)  # type: ignore[call-arg]
    assert (read.owner_rcs_numbers, read.owner_sms_numbers) == (["+15550100100", "+15550100101"], ["+15550100102"])
