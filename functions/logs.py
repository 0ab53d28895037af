"""Structured JSON log lines, one object a line, with Cloud Logging's `severity` field.

Fields given as `extra={...}` become top-level keys. Nothing here reads settings: no
secret reaches a log line unless code puts it in `extra`, and none does. httpx and
httpcore are held at WARNING: httpx logs each request's URL at INFO, and the Bot API's
URL holds the bot token, so any handler at INFO on the root logger (a platform's logging
set-up, a debugging session) would print it.

A password in a connection string is masked in every line (`redacted`): psycopg and
psycopg_pool quote a mistyped DATABASE_URL whole in their errors ("missing '=' after
'postgres:S3cret@…'"), and their loggers write through this formatter, not the root's.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

_STANDARD_ATTRIBUTES = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}
# user:password@ (a URI's userinfo, or a mistyped one without its scheme), up to the last @ before a
# host (a mistyped password may hold an unescaped @, /, quote or up to three spaces; `scheme://` is
# never taken for a user), and password=... of a key=value connection string or an environment
# (sslpassword=, PGPASSWORD=), quoted or not. Masking too much of a line is the safe side.
_USERINFO = re.compile(r"([\w.%+-]+):(?!//)(?=\S)\S*?(?:\s+\S*?){0,3}?@(?=[\w\[])(?!\S*@)")
_KEYWORD = re.compile(r"\b(\w*password|passwd|pwd)\s*=\s*('[^']*'|\"[^\"]*\"|\S+)", re.IGNORECASE)
# The libraries that quote a connection string in what they log.
_QUOTE_CONNECTION_STRINGS = ("psycopg",)


def redacted(text: str) -> str:
    """`text` with any password of a connection string in it masked."""
    if "@" not in text and "=" not in text:
        return text
    return _KEYWORD.sub(r"\1=***", _USERINFO.sub(r"\1:***@", text))


class JsonLineFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "severity": record.levelname,
            "message": redacted(record.getMessage()),
            "logger": record.name,
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD_ATTRIBUTES and not key.startswith("_"):
                entry[key] = redacted(value) if isinstance(value, str) else value
        if record.exc_info and record.exc_info[0] is not None:
            entry["exception"] = redacted(f"{record.exc_info[0].__name__}: {record.exc_info[1]}")
        return json.dumps(entry, default=str, ensure_ascii=False)


def configure_json_logging(stream: TextIO | None = None, level: int = logging.INFO) -> None:
    """Send every `crossmem.*` logger, and psycopg's, to `stream` (standard output) as JSON lines
    (idempotent)."""
    handler = logging.StreamHandler(stream or sys.stdout)
    handler.setFormatter(JsonLineFormatter())
    handler._crossmem = True  # type: ignore[attr-defined]
    for name in ("crossmem", *_QUOTE_CONNECTION_STRINGS):
        logger = logging.getLogger(name)
        for old in list(logger.handlers):
            if getattr(old, "_crossmem", False):
                logger.removeHandler(old)
        logger.addHandler(handler)
    logging.getLogger("crossmem").setLevel(level)
    logging.getLogger("crossmem").propagate = True
    # Not on to the root's handlers too, which would print the same line without the mask.
    for name in _QUOTE_CONNECTION_STRINGS:
        logging.getLogger(name).propagate = False
    for talks_about_urls in ("httpx", "httpcore"):
        logging.getLogger(talks_about_urls).setLevel(logging.WARNING)
