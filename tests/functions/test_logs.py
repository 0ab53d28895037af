"""The log lines' mask: a connection string's password never printed, however it was mistyped."""

from __future__ import annotations

import io
import json
import logging

import pytest

from functions.logs import JsonLineFormatter, redacted


@pytest.mark.parametrize(
    ("said", "shown"),
    [
        ("postgresql://postgres:S3cret@127.0.0.1/x", "postgresql://postgres:***@127.0.0.1/x"),
        ('missing "=" after "postgres:S3cret@127.0.0.1/x"', 'missing "=" after "postgres:***@127.0.0.1/x"'),
        ("postgres://ana:S3/cret@db.example.com:5432/x", "postgres://ana:***@db.example.com:5432/x"),
        ("postgres://ana:S3@cret@db.example.com/x", "postgres://ana:***@db.example.com/x"),
        ("host=db user=ana password=S3cret dbname=x", "host=db user=ana password=*** dbname=x"),
        ("host=db password='S3 cret' dbname=x", "host=db password=*** dbname=x"),
        ("connection to server at 127.0.0.1, port 5432 failed", "connection to server at 127.0.0.1, port 5432 failed"),
        ("postgresql://ana:S3 cret@db.example.com/x", "postgresql://ana:***@db.example.com/x"),
        ("postgres:S3'cret@db.example.com/x", "postgres:***@db.example.com/x"),
        ('postgres:S3"cret@db.example.com/x', "postgres:***@db.example.com/x"),
        ("sslpassword=S3cret host=db", "sslpassword=*** host=db"),
        ("PGPASSWORD=S3cret psql", "PGPASSWORD=*** psql"),
        ('password="S3 cret" host=db', "password=*** host=db"),
    ],
    ids=[
        "uri",
        "no-scheme",
        "slash",
        "at-sign",
        "keywords",
        "quoted",
        "nothing-to-mask",
        "space",
        "quote",
        "double-quote",
        "sslpassword",
        "environment",
        "double-quoted",
    ],
)
def test_a_connection_strings_password_is_masked_however_it_was_typed(said: str, shown: str) -> None:
    assert redacted(said) == shown
    assert "S3" not in redacted(said)


def test_a_json_line_masks_its_message_its_extras_and_its_exception() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonLineFormatter())
    logger = logging.getLogger("crossmem.test_logs")
    logger.addHandler(handler)
    try:
        try:
            raise ValueError("cannot parse postgres:S3cret@127.0.0.1/x")
        except ValueError:
            logger.error("set-up failed for %s", "postgres:S3cret@h/x", extra={"error": "at u:S3cret@h"}, exc_info=True)
    finally:
        logger.removeHandler(handler)
    line = json.loads(stream.getvalue())
    assert (line["message"], line["error"], line["exception"]) == (
        "set-up failed for postgres:***@h/x",
        "at u:***@h",
        "ValueError: cannot parse postgres:***@127.0.0.1/x",
    )
