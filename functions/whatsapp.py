"""`whatsapp_webhook`: Twilio's inbound WhatsApp messages, `POST /whatsapp`, answered in TwiML.

Validate X-Twilio-Signature against the public URL Twilio called (PUBLIC_BASE_URL plus
this request's path and query, never request.url, which is internal behind a proxy),
parse the form, run the turn within the deadline, answer with TwiML. A request without
a signature is refused before its body is read; one with a signature has its body read
once, within the byte and field limits, before the signature is checked.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import flask

from core.channels.whatsapp import Converse, WhatsAppForm, classify, twiml
from core.errors import InputError, OverBudget, StillAnswering
from core.identity.linking import LinkRequest, UnlinkRequest
from core.identity.remembered_language import RememberedLanguage
from core.memory.forgetting import ForgetRequest
from core.models import Surface
from core.phrases.catalogue import Phrases
from core.phrases.refusals import input_refused, over_budget
from core.turn.request import TurnRequest
from functions import runtime
from functions.http import error_response, json_response, read_form, serving
from functions.settings import Settings

# Twilio's inbound message has about 20 fields, plus two for each of at most 10 media.
MAX_FORM_FIELDS = 100
# Twilio waits 15 s for the TwiML answer; a second of it is the way here and back.
TWIML_WITHIN_S = 14.0


@serving
def whatsapp_webhook(request: flask.Request) -> flask.Response:
    config = runtime.settings()
    fields = twilio_form(request, config)
    if isinstance(fields, flask.Response):
        return fields
    try:
        form = WhatsAppForm.from_form(fields)
    except InputError as exc:
        return json_response({"error": "bad_request", "message": str(exc)}, 400)
    action = classify(form)
    if isinstance(action, LinkRequest | UnlinkRequest | ForgetRequest):
        return twiml_response(runtime.commands().answer(action, None, form.body).text)
    if not isinstance(action, Converse):
        return twiml_response(noticed_in(Surface.WHATSAPP, form.identity, form.body).say(action.phrase))
    phrases = said_in(form.body)
    turn = TurnRequest(
        Surface.WHATSAPP,
        action.text,
        action.message_sid,
        sender_id=action.sender,
        sender_alias=action.also_known_as,
        deadline_s=runtime.surfaces()[Surface.WHATSAPP].deadline_s,
        media=action.media,
        platform=action.platform,
        reply_within_s=TWIML_WITHIN_S,
    )
    if config.whatsapp_typing_indicator and (sender := runtime.whatsapp_sender()) is not None:
        sender.show_typing(action.message_sid)
    return answered_in_twiml(turn, phrases)


def said_in(body: str) -> Phrases:
    """The phrases to refuse a Twilio message in before its turn (too long, empty), by its words.
    Twilio says nothing of the person's language: a turn's fixed answers go by the person's
    remembered language first (core/turn/turns.py), a command's too (core/surfaces/commands.py)."""
    catalogue = runtime.catalogue()
    return catalogue.phrases(catalogue.choose(None, body))


def noticed_in(surface: Surface, sender: str, body: str) -> Phrases:
    """The phrases of a notice (an empty message, a file we cannot read): the person's remembered
    language (a round trip, for these alone), else the words, else DEFAULT_LANGUAGE."""
    catalogue = runtime.catalogue()
    remembered = RememberedLanguage(runtime.store(), runtime.identity()).of(surface, sender)
    return catalogue.phrases(catalogue.choose(None, body, remembered=remembered))


def answered_in_twiml(turn: TurnRequest, phrases: Phrases) -> flask.Response:
    """The turn's reply as Twilio's webhook answer (WhatsApp's or SMS's)."""
    try:
        result = runtime.turns().run(turn)
        return twiml_response(result.reply, result.follow_ups_first)
    except OverBudget as exc:
        return twiml_response(over_budget(phrases, exc))
    except StillAnswering:
        return twiml_response(None)  # the first attempt, or the scheduled job once it cannot, answers
    except InputError as exc:
        return twiml_response(input_refused(phrases, exc))


def twilio_form(request: flask.Request, config: Settings) -> Mapping[str, str] | flask.Response:
    """The form of a Twilio webhook (WhatsApp's or SMS's) whose signature is valid, or the answer
    refusing it."""
    if config.twilio_auth_token is None or not config.public_base_url:
        return json_response({"error": "not_configured", "message": "set TWILIO_AUTH_TOKEN and PUBLIC_BASE_URL"}, 503)
    if request.method != "POST":
        return json_response({"error": "method_not_allowed", "message": "POST Twilio's form"}, 405)
    if request.mimetype != "application/x-www-form-urlencoded":
        return json_response({"error": "bad_request", "message": "expected Twilio's form post"}, 415)
    signature = request.headers.get("X-Twilio-Signature")
    if not signature:
        return json_response({"error": "forbidden", "message": "invalid Twilio signature"}, 403)
    try:
        fields = read_form(request, MAX_FORM_FIELDS)
    except InputError as exc:
        return error_response(exc)
    shared_key = config.twilio_webhook_shared_key
    if not runtime.twilio_signatures().valid(
        public_url(config.public_base_url, request),
        fields,
        signature,
        auth_token=config.twilio_auth_token.get_secret_value(),
        shared_key=shared_key.get_secret_value() if shared_key else None,
        settings_header=request.headers.get("X-Twilio-Webhooks-Signature-Settings"),
    ):
        return json_response({"error": "forbidden", "message": "invalid Twilio signature"}, 403)
    return fields


def public_url(base: str, request: flask.Request) -> str:
    """The URL Twilio called: the configured public base, then this function's path and query."""
    path = request.script_root + (request.path if request.path != "/" else "")
    query = request.query_string.decode()
    return base.rstrip("/") + path + (f"?{query}" if query else "")


def twiml_response(text: str | None, first: Sequence[str] = ()) -> flask.Response:
    return flask.Response(twiml(text, first), 200, mimetype="application/xml")
