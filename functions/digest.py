"""`memory_digest`: the memory digest, for Cloud Scheduler (`POST`, any path).

Deployed, it is private: Cloud Run lets through only Cloud Scheduler's OIDC token of the
account given roles/run.invoker on it (`crossmem deploy` sets both up), so no secret travels in
the job. Served anywhere else (`crossmem dev`, a host without that IAM), DIGEST_SECRET makes it
require `X-Digest-Secret`, compared in constant time. It answers owed Telegram and WhatsApp
messages first (the ones no platform will redeliver, core/turn/owed.py), then delivers the follow-ups
due (core/follow_ups/delivery.py: this job already runs every minute, privately, with the Bot API
and Twilio at hand; a job of their own would cost a second function and scheduler job for a
lag no shorter), then digests the due people
in batches within
DIGEST_TIME_BUDGET (the function's timeout is above it), purge the messages older than
MESSAGE_RETENTION_DAYS when it is set (the one scheduled job of the deployment), drop the
budget's counts older than a day (everyone's: a person's own turn drops only theirs), and answer
what was done.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from time import monotonic

import flask

from core.errors import ConfigurationError
from core.memory.digest import DigestRun
from functions import runtime
from functions.http import json_response, same_secret, serving

SECRET_HEADER = "X-Digest-Secret"  # noqa: S105 (a header name, not a secret)

log = logging.getLogger("crossmem.digest")


@serving
def memory_digest(request: flask.Request) -> flask.Response:
    config = runtime.settings()
    secret = config.digest_secret
    if secret is not None and not same_secret(request.headers.get(SECRET_HEADER), secret.get_secret_value()):
        return json_response({"error": "unauthorized", "message": f"wrong or missing {SECRET_HEADER}"}, 401)
    if request.method != "POST":
        return json_response({"error": "method_not_allowed", "message": "POST to run the digest"}, 405)
    began = monotonic()
    # Owed replies first: someone may be waiting for them; the notes can wait a minute.
    owed_answered, owed_failed = owed_replies(config.digest_time_budget / 2)
    # Then the follow-ups due: said on time matters more than the notes (whose run may be long).
    follow_ups = runtime.follow_up_delivery().run(config.digest_time_budget / 4)
    # The notes have what is left of the budget, so the purge after them runs within the timeout.
    left = config.digest_time_budget - (monotonic() - began)
    run = runtime.digest_job().run(time_budget_s=left) if config.memory_notes else DigestRun(0, 0)
    done = {
        "owed_answered": owed_answered,
        "owed_failed": owed_failed,
        **follow_ups.as_json(),
        "updated": run.updated,
        "failed": run.failed,
        "memory_notes": config.memory_notes,
        # the purge (and the notes' lines about it), the budget's old counts: null for a step that failed
        **runtime.retention().housekeeping(timedelta(days=config.message_retention_days)),
    }
    return json_response(done)


def owed_replies(time_budget_s: float) -> tuple[int, int]:
    """The owed messages answered and failed, unless the turn cannot be built (an EXTRA_TOOLS entry
    that does not load, say): then none is tried, they stay owed, the error is logged, and the
    job's other steps still run (the follow-ups, the digest and the purge need no tool)."""
    try:
        owed = runtime.owed_replies().run(time_budget_s)
    except ConfigurationError as exc:
        log.error("owed messages not answered: the turn is misconfigured", extra={"error": str(exc)})
        return 0, 0
    return owed.answered, owed.failed
