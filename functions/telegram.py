"""`telegram_webhook`: Telegram's webhook deliveries, `POST /telegram`.

Verify the secret token, parse the update, hand it to core (core/surfaces/telegram_inbound.py:
commands, edits, the stop button, the turn), render its answer: 200 with what was done or the
Bot API method Telegram runs, or 503 where Telegram must redeliver (a reply owed, a message still
being answered).
"""

from __future__ import annotations

import flask

from core.errors import AuthError, ConfigurationError
from core.models import Surface
from core.surfaces.telegram import TelegramUpdate
from core.surfaces.telegram_inbound import Redeliver, TelegramBotOptions, TelegramInbound
from core.turn.stopped_generation import StoppedGenerations
from functions import runtime
from functions.http import json_response, read_json, same_secret, serving

SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"  # noqa: S105 (a header name, not a secret)
# Replies must be out before the function's own 60 s timeout (serverless.yml); the turn's own
# time (its answer_by, core/turn/turns.py) ends sooner.
REPLY_DEADLINE_S = 50.0


@serving
def telegram_webhook(request: flask.Request) -> flask.Response:
    config = runtime.settings()
    secret, token = config.telegram_webhook_secret, config.telegram_bot_token
    if not config.is_local and (secret is None or token is None):
        raise ConfigurationError("TELEGRAM_WEBHOOK_SECRET and TELEGRAM_BOT_TOKEN must be set")
    if secret is not None and not same_secret(request.headers.get(SECRET_HEADER), secret.get_secret_value()):
        raise AuthError("wrong or missing secret token")
    if request.method != "POST":
        return json_response({"error": "method_not_allowed", "message": "POST an Update"}, 405)
    update = read_json(request, TelegramUpdate)
    # Without a bot token (local development) every answer travels in the response.
    bot = runtime.telegram_bot if token is not None else None
    options = TelegramBotOptions(
        bot, config.telegram_reply_in_webhook or bot is None, config.telegram_drafts, config.telegram_bot_id,
        config.telegram_bot_username,
    )  # fmt: skip
    deadline_s = runtime.surfaces()[Surface.TELEGRAM].deadline_s
    language = runtime.remembered_language()
    services = runtime.turns(), runtime.commands(), runtime.catalogue(), language, runtime.corrections()
    stops = StoppedGenerations(runtime.store(), runtime.identity())
    inbound = TelegramInbound(options, *services, stops, deadline_s, REPLY_DEADLINE_S)
    answer = inbound.answer(update)
    if isinstance(answer, Redeliver):
        return json_response({"error": answer.error, "message": answer.message}, 503)
    return json_response(answer)
