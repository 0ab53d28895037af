"""`sms_webhook`: Twilio's inbound SMS and MMS, `POST /sms`, answered in TwiML.

Twilio's webhook as WhatsApp's (functions/whatsapp.py: the signature against PUBLIC_BASE_URL,
the form read once within its limits, the turn, the TwiML answer), with the SMS form
(core/channels/sms.py): STOP, START and HELP, which Twilio answers itself, get an empty answer.
"""

from __future__ import annotations

import flask

from core.channels.sms import Keyword, SmsForm, classify
from core.channels.whatsapp import Converse
from core.errors import InputError
from core.identity.linking import LinkRequest, UnlinkRequest
from core.memory.forgetting import ForgetRequest
from core.models import Surface
from core.turn.request import TurnRequest
from functions import runtime
from functions.http import json_response, serving
from functions.whatsapp import TWIML_WITHIN_S, answered_in_twiml, noticed_in, said_in, twilio_form, twiml_response


@serving
def sms_webhook(request: flask.Request) -> flask.Response:
    fields = twilio_form(request, runtime.settings())
    if isinstance(fields, flask.Response):
        return fields
    try:
        form = SmsForm.from_form(fields)
    except InputError as exc:
        return json_response({"error": "bad_request", "message": str(exc)}, 400)
    action = classify(form)
    if isinstance(action, Keyword):
        return twiml_response(None)
    if isinstance(action, LinkRequest | UnlinkRequest | ForgetRequest):
        return twiml_response(runtime.commands().answer(action, None, form.body).text)
    if not isinstance(action, Converse):
        return twiml_response(noticed_in(Surface.SMS, form.identity, form.body).say(action.phrase))
    phrases = said_in(form.body)
    turn = TurnRequest(
        Surface.SMS,
        action.text,
        action.message_sid,
        sender_id=action.sender,
        deadline_s=runtime.surfaces()[Surface.SMS].deadline_s,
        media=action.media,
        platform=action.platform,
        reply_within_s=TWIML_WITHIN_S,
    )
    return answered_in_twiml(turn, phrases)
