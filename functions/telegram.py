"""`telegram_webhook`: Telegram's webhook deliveries, `POST /telegram`.

Verify the secret token, parse the update, run the turn (the reply goes out through the
Bot API, or inside this response with TELEGRAM_REPLY_IN_WEBHOOK), answer 200; an edited
message corrects the stored one and is not answered; a tap on a draft's stop button is recorded
for the turn writing it, wherever it runs (core/turn/stopped_generation.py). When the
stored reply could not be sent for a reason that may pass, answer 503: Telegram redelivers
an update whose webhook answered anything but 2xx, and the redelivery sends that reply. So too
when the turn's time ran out before its reply went out (nothing is stored then): the
redelivery, or the scheduled job before it, answers the message once.
"""

from __future__ import annotations

import time

import flask

from core.channels.splitting import split_message
from core.channels.telegram_bot import TELEGRAM_LIMIT, TelegramChannel
from core.channels.telegram_update import (
    CONFIRM_LINK,
    Command,
    Converse,
    Notice,
    StopGeneration,
    TelegramUpdate,
    classify,
)
from core.errors import InputError, OverBudget, StillAnswering
from core.identity.remembered_language import RememberedLanguage
from core.memory.edits import MessageEdit
from core.models import Surface
from core.phrases.catalogue import Phrases
from core.phrases.refusals import input_refused, over_budget
from core.turn.request import TurnRequest
from core.turn.stopped_generation import StoppedGenerations
from functions import runtime
from functions.http import error_response, json_response, read_json, same_secret, serving

SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"  # noqa: S105 (a header name, not a secret)
# Replies must be out before the function's own 60 s timeout (serverless.yml); the turn's own
# time (its answer_by, core/turn/turns.py) ends sooner.
REPLY_DEADLINE_S = 50.0


@serving
def telegram_webhook(request: flask.Request) -> flask.Response:
    config = runtime.settings()
    if not config.is_local and (config.telegram_webhook_secret is None or config.telegram_bot_token is None):
        message = "TELEGRAM_WEBHOOK_SECRET and TELEGRAM_BOT_TOKEN must be set"
        return json_response({"error": "not_configured", "message": message}, 503)
    if config.telegram_webhook_secret is not None and not same_secret(
        request.headers.get(SECRET_HEADER), config.telegram_webhook_secret.get_secret_value()
    ):
        return json_response({"error": "unauthorized", "message": "wrong or missing secret token"}, 401)
    if request.method != "POST":
        return json_response({"error": "method_not_allowed", "message": "POST an Update"}, 405)
    try:
        update = read_json(request, TelegramUpdate)
    except InputError as exc:
        return error_response(exc)
    # Without a bot token (local development) every answer travels in the response.
    inline = config.telegram_reply_in_webhook or config.telegram_bot_token is None
    action = classify(update, config.telegram_bot_id, config.telegram_bot_username)
    catalogue = runtime.catalogue()
    if isinstance(action, Notice):
        # An app that states no language we have: the person's as remembered (a round trip, for this alone).
        remembered = None
        if not catalogue.has(action.language_code):
            remembered = RememberedLanguage(runtime.store(), runtime.identity()).of(
                Surface.TELEGRAM, str(action.chat_id)
            )
        phrases = catalogue.phrases(catalogue.choose(action.language_code, remembered=remembered))
        return _reply(action.chat_id, phrases.say(action.phrase), inline=inline)
    if isinstance(action, StopGeneration):
        # Never a turn, never an answer: the turn writing that draft stops, and sends what was shown.
        stopped = StoppedGenerations(runtime.store()).record(action.chat_id, action.draft_id)
        return json_response({"ok": True, "stopped": stopped})
    if isinstance(action, MessageEdit):
        # No answer: the person corrected what they said; the next turn reads it (core/memory/edits.py).
        return json_response({"ok": True, "edit": runtime.corrections().apply(action).value})
    if isinstance(action, Command):
        answer = runtime.commands().answer(action.request, action.language_code)
        if action.callback_query_id and config.telegram_bot_token is not None:
            runtime.telegram_bot().answer_callback_query(action.callback_query_id)
        button = (
            confirm_button(answer.confirm_code, catalogue.phrases(answer.language)) if answer.confirm_code else None
        )
        return _reply(action.chat_id, answer.text, inline=inline, markup=button)
    if not isinstance(action, Converse):
        return json_response({"ok": True, "ignored": action.reason})
    phrases = catalogue.phrases(catalogue.choose(action.language_code, action.text))
    turn = TurnRequest(
        Surface.TELEGRAM,
        action.text,
        str(action.update_id),
        sender_id=action.sender_id,
        deadline_s=runtime.surfaces()[Surface.TELEGRAM].deadline_s,
        media=action.media,
        platform=action.platform,
        language=action.language_code,
    )
    deadline = time.monotonic() + REPLY_DEADLINE_S
    try:
        channel = None
        if not inline:
            drafts = config.telegram_drafts
            channel = TelegramChannel(
                runtime.telegram_bot(),
                action.chat_id,
                deadline,
                draft_id=action.update_id,
                drafts=drafts,
                stops=StoppedGenerations(runtime.store()),
            )
        result = runtime.turns().run(turn, channel)
    except OverBudget as exc:
        return _reply(action.chat_id, over_budget(phrases, exc), inline=inline)
    except StillAnswering as exc:
        # A redelivery while the first attempt may still answer: Telegram tries again later, and
        # once that attempt can no longer answer, the redelivery answers (the message is owed).
        return json_response({"error": "still_answering", "message": str(exc)}, 503)
    except InputError as exc:
        return _reply(action.chat_id, input_refused(phrases, exc), inline=inline)
    if inline and result.reply:
        return _reply(action.chat_id, result.reply, inline=True)
    if result.reply_owed:
        return json_response({"error": "reply_owed", "message": "the Bot API did not take the reply"}, 503)
    return json_response({"ok": True, "outcome": result.outcome.value})


def _reply(chat_id: int, text: str, *, inline: bool, markup: dict[str, object] | None = None) -> flask.Response:
    """An answer in this response (one outbound call fewer), or through the Bot API when it
    is longer than one message; with no bot token (local development) only its first part.
    `markup`: the buttons under the text."""
    if inline and (len(text) <= TELEGRAM_LIMIT or runtime.settings().telegram_bot_token is None):
        first = split_message(text, TELEGRAM_LIMIT - 2)[0]
        shown = first if first == text.strip() else first + " …"
        answer: dict[str, object] = {"method": "sendMessage", "chat_id": chat_id, "text": shown}
        if markup:
            answer["reply_markup"] = markup
        return json_response(answer)
    runtime.telegram_bot().send_text(chat_id, text, reply_markup=markup)
    return json_response({"ok": True})


def confirm_button(code: str, phrases: Phrases) -> dict[str, object]:
    """The button that confirms linking with `code`."""
    label = phrases.say("telegram.confirm_button")
    return {"inline_keyboard": [[{"text": label, "callback_data": CONFIRM_LINK + code}]]}
