"""`sms_webhook`: Twilio's inbound SMS and MMS, `POST /sms`, answered in TwiML.

The signature and the TwiML are every Twilio webhook's (functions/twilio.py); what the form asks
for is answered in core (core/surfaces/twilio_inbound.py), with the SMS form (core/surfaces/sms.py):
STOP, START and HELP, which Twilio answers itself, get an empty answer.
"""

from __future__ import annotations

import flask

from core.models import Surface
from core.surfaces.sms import SmsForm, classify
from functions.http import serving
from functions.twilio import twilio_webhook


@serving
def sms_webhook(request: flask.Request) -> flask.Response:
    return twilio_webhook(request, Surface.SMS, SmsForm.from_form, classify)
