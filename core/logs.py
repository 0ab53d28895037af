"""Structured JSON log lines, one object a line, with Cloud Logging's `severity` field.

Fields given as `extra={...}` become top-level keys. Nothing here reads settings: no
secret reaches a log line unless code puts it in `extra`, and none does. httpx and
httpcore are held at WARNING: httpx logs each request's URL at INFO, and the Bot API's
URL holds the bot token, so any handler at INFO on the root logger (a platform's logging
set-up, a debugging session) would print it.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

_STANDARD_ATTRIBUTES = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


class JsonLineFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "severity": record.levelname,
            "message": record.getMessage(),
            "logger": record.name,
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD_ATTRIBUTES and not key.startswith("_"):
                entry[key] = value
        if record.exc_info and record.exc_info[0] is not None:
            entry["exception"] = f"{record.exc_info[0].__name__}: {record.exc_info[1]}"
        return json.dumps(entry, default=str, ensure_ascii=False)


def configure_json_logging(stream: TextIO | None = None, level: int = logging.INFO) -> None:
    """Send every `crossmem.*` logger to `stream` (standard output) as JSON lines (idempotent)."""
    logger = logging.getLogger("crossmem")
    for handler in list(logger.handlers):
        if getattr(handler, "_crossmem", False):
            logger.removeHandler(handler)
    handler = logging.StreamHandler(stream or sys.stdout)
    handler.setFormatter(JsonLineFormatter())
    handler._crossmem = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = True
    for talks_about_urls in ("httpx", "httpcore"):
        logging.getLogger(talks_about_urls).setLevel(logging.WARNING)
