"""`whatsapp_webhook`: Twilio's inbound WhatsApp messages, `POST /whatsapp`, answered in TwiML.

The signature and the TwiML are every Twilio webhook's (functions/twilio.py); what the form asks
for is answered in core (core/surfaces/twilio_inbound.py). WHATSAPP_TYPING_INDICATOR: the person
sees "typing…" while the turn runs.
"""

from __future__ import annotations

import flask

from core.models import Surface
from core.surfaces.whatsapp import WHATSAPP_LIMIT, WhatsAppForm, classify
from functions import runtime
from functions.http import serving
from functions.twilio import twilio_webhook


@serving
def whatsapp_webhook(request: flask.Request) -> flask.Response:
    sender = runtime.whatsapp_sender() if runtime.settings().whatsapp_typing_indicator else None
    typing = sender.show_typing if sender is not None else None
    return twilio_webhook(request, Surface.WHATSAPP, WhatsAppForm.from_form, classify, WHATSAPP_LIMIT, typing)
