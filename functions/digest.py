"""`memory_digest`: the memory digest, for Cloud Scheduler (`POST`, any path).

Verify `X-Digest-Secret` in constant time, answer owed Telegram and WhatsApp messages (the
ones no platform will redeliver, core/owed.py), then digest the due people in batches within
DIGEST_TIME_BUDGET (the function's timeout is above it), purge the messages older than
MESSAGE_RETENTION_DAYS when it is set (the one scheduled job of the deployment), and answer
what was done.
"""

from __future__ import annotations

from datetime import timedelta

import flask

from core.digest import DigestRun
from functions import runtime
from functions.http import json_response, same_secret, serving

SECRET_HEADER = "X-Digest-Secret"  # noqa: S105 (a header name, not a secret)


@serving
def memory_digest(request: flask.Request) -> flask.Response:
    config = runtime.settings()
    if config.digest_secret is None:
        return json_response({"error": "not_configured", "message": "DIGEST_SECRET must be set"}, 503)
    if not same_secret(request.headers.get(SECRET_HEADER), config.digest_secret.get_secret_value()):
        return json_response({"error": "unauthorized", "message": f"wrong or missing {SECRET_HEADER}"}, 401)
    if request.method != "POST":
        return json_response({"error": "method_not_allowed", "message": "POST to run the digest"}, 405)
    # Owed replies first: someone may be waiting for them; the notes can wait a minute.
    owed = runtime.owed_replies().run(config.digest_time_budget / 2)
    run = runtime.digest_job().run() if config.memory_notes else DigestRun(0, 0)
    purged = 0
    if config.message_retention_days:
        purged = runtime.retention().purge(timedelta(days=config.message_retention_days)).deleted
    done = {
        "owed_answered": owed.answered,
        "owed_failed": owed.failed,
        "updated": run.updated,
        "failed": run.failed,
        "memory_notes": config.memory_notes,
        "purged": purged,
    }
    return json_response(done)
