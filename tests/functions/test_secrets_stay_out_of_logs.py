"""No log line carries a secret, even with every logger switched on."""

from __future__ import annotations

import logging

import pytest

from tests.fakes.telegram_api import FakeTelegram
from tests.helpers import BOT_TOKEN, SKELETON_PERSON, TELEGRAM_SECRET, app_client, telegram_skeleton


def test_httpx_never_logs_the_bot_api_url_that_holds_the_token(
    environment: pytest.MonkeyPatch, fake_telegram: FakeTelegram, caplog: pytest.LogCaptureFixture
) -> None:
    client = app_client("telegram_webhook")
    update = telegram_skeleton(31337, SKELETON_PERSON, "hello")
    with caplog.at_level(logging.DEBUG):  # the root logger at DEBUG, as a debugging session might set it
        response = client.post("/", json=update, headers={"X-Telegram-Bot-Api-Secret-Token": TELEGRAM_SECRET})
    assert (response.status_code, response.get_json()) == (200, {"ok": True, "outcome": "answered"})
    assert [sent["chat_id"] for sent in fake_telegram.sent()] == [SKELETON_PERSON]
    assert caplog.records, "the turn's own line is still logged"
    assert BOT_TOKEN not in caplog.text
    assert TELEGRAM_SECRET not in caplog.text


@pytest.mark.parametrize(
    ("mistyped", "masked"),
    [
        ("postgres:S3cret@127.0.0.1/x", "postgres:***@127.0.0.1/x"),  # the scheme forgotten: psycopg quotes it
        ("postgresql://postgres:S3cret@127.0.0.1/x", None),  # well formed, a database that is not there
    ],
    ids=["malformed", "uri"],
)
def test_a_mistyped_database_url_never_prints_its_password(
    environment: pytest.MonkeyPatch,
    fake_telegram: FakeTelegram,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    mistyped: str,
    masked: str | None,
) -> None:
    """psycopg quotes a connection string it cannot parse whole; every line and the doctor mask it.
    Every logger at DEBUG, as a debugging session might set them; what reaches the root logger's
    handlers (a platform's, a debugging session's: they print it without our mask) is read too.
    pytest also hears psycopg's loggers, which stop at our handler, so those are read as printed."""
    from functions.tools.cli import main

    environment.setenv("DATABASE_URL", mistyped)
    environment.setenv("DATABASE_CONNECT_TIMEOUT", "1")
    with caplog.at_level(logging.DEBUG):
        client = app_client("telegram_webhook")
        update = telegram_skeleton(31338, SKELETON_PERSON, "hello")
        response = client.post("/", json=update, headers={"X-Telegram-Bot-Api-Secret-Token": TELEGRAM_SECRET})
        assert response.status_code == 200  # answered without history
        assert main(["doctor", "--json"]) == 1
        assert main(["doctor"]) == 1
    printed = "".join(capfd.readouterr())
    logged = [record_text(record) for record in caplog.records if reaches_the_root(record)]
    assert "S3cret" not in printed
    assert not [line for line in logged if "S3cret" in line]
    if masked:  # parsed before use: no pool ever tries it, the function says so once
        assert '"logger": "psycopg.pool"' not in printed
        assert "DATABASE_URL is not a connection string: write it as postgresql://" in printed
    else:
        assert printed.count('"logger": "psycopg.pool"') >= 1  # the pool's lines are printed, through the mask
    said = "DATABASE_URL is not a connection string: " if masked else "not reachable: "
    assert f"FAIL  database: {said}" in printed and f'"detail": "{said}' in printed
    if masked:
        assert masked in printed  # the lines that quoted it are there, masked


def test_a_password_with_an_unescaped_at_never_reaches_a_log_line_as_a_host(
    environment: pytest.MonkeyPatch,
    fake_telegram: FakeTelegram,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """libpq ends the user's part at the first '@': the rest of a password `S3cr@TopSecret` was taken
    for the host, and every pool line and the doctor quoted it ("failed to resolve host
    'TopSecret@127.0.0.1'"), unmasked (no `user:` before it), on every turn."""
    from functions.tools.cli import main

    environment.setenv("DATABASE_URL", "postgresql://postgres:S3cr@TopSecret@127.0.0.1/x")
    environment.setenv("DATABASE_CONNECT_TIMEOUT", "1")
    with caplog.at_level(logging.DEBUG):
        client = app_client("telegram_webhook")
        update = telegram_skeleton(31339, SKELETON_PERSON, "hello")
        response = client.post("/", json=update, headers={"X-Telegram-Bot-Api-Secret-Token": TELEGRAM_SECRET})
        assert response.status_code == 200  # answered without history
        assert main(["doctor"]) == 1
    printed = "".join(capfd.readouterr())
    logged = [record_text(record) for record in caplog.records if reaches_the_root(record)]
    assert "TopSecret" not in printed and not [line for line in logged if "TopSecret" in line]
    assert '"logger": "psycopg.pool"' not in printed  # parsed before use: no pool ever tries it
    said = "DATABASE_URL is not a connection string: an '@' of its password is written %40"
    assert f"FAIL  database: {said}" in printed and said in printed.split("FAIL")[0]


@pytest.mark.parametrize(
    ("password", "said"),
    [
        ("Top Secret", 'unexpected spaces found in "***", use percent-encoded spaces (%20) instead'),
        ("Top%ZZSecret", 'invalid percent-encoded token: "***"'),
        # A '#', '?' or '/' beside the space: urllib split the URL there, and psycopg's quote of the
        # password (or of its start, before a '/') was printed whole.
        ("Top Secret#1", 'unexpected spaces found in "***", use percent-encoded spaces (%20) instead'),
        ("Top Secret?1", 'unexpected spaces found in "***", use percent-encoded spaces (%20) instead'),
        ("Top Secret/1", 'unexpected spaces found in "***", use percent-encoded spaces (%20) instead'),
        ("Top%ZZSecret/1", 'invalid percent-encoded token: "***"'),
    ],
)
def test_the_doctor_never_quotes_a_password_psycopg_cannot_read(
    environment: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str], password: str, said: str
) -> None:
    """psycopg names the token it cannot read, the password alone, with no `user:` before it to
    mask: `crossmem doctor` printed "unexpected spaces found in "Top Secret"" as it was."""
    from functions.tools.cli import main

    environment.setenv("DATABASE_URL", f"postgresql://postgres:{password}@127.0.0.1:5432/postgres")
    assert main(["doctor", "--json"]) == 1
    assert main(["doctor"]) == 1
    printed = "".join(capfd.readouterr())
    assert "Secret" not in printed
    assert f'"detail": "DATABASE_URL is not a connection string: {said}'.replace('"***"', '\\"***\\"') in printed
    assert f"FAIL  database: DATABASE_URL is not a connection string: {said}." in printed


def reaches_the_root(record: logging.LogRecord) -> bool:
    logger: logging.Logger | None = logging.getLogger(record.name)
    while logger is not None and logger.parent is not None:
        if not logger.propagate:
            return False
        logger = logger.parent
    return True


def record_text(record: logging.LogRecord) -> str:
    """Everything a handler could print of `record`: its message, its extras, its exception."""
    parts = [record.getMessage(), *(str(value) for value in vars(record).values())]
    if record.exc_info and record.exc_info[1] is not None:
        parts.append(str(record.exc_info[1]))
    return " ".join(parts)
