"""The entry module Cloud Functions loads: one function per surface, and the memory digest.

Each surface's module is imported on its first request, so a Telegram instance never
imports twilio, and nothing imports anthropic before a model call needs it.
"""

from __future__ import annotations

from time import monotonic

import flask
import functions_framework

from functions import ARRIVED


@functions_framework.http
def telegram_webhook(request: flask.Request) -> flask.Response:
    from functions.telegram import telegram_webhook as handle

    return handle(request)


@functions_framework.http
def whatsapp_webhook(request: flask.Request) -> flask.Response:
    request.environ[ARRIVED] = monotonic()
    from functions.whatsapp import whatsapp_webhook as handle

    return handle(request)


@functions_framework.http
def sms_webhook(request: flask.Request) -> flask.Response:
    # A Twilio surface with nothing of its own at the edge: its form and what it asks for are in
    # core (core/surfaces/sms.py), the signature and the TwiML every Twilio webhook's.
    request.environ[ARRIVED] = monotonic()
    from core.surfaces import sms
    from core.surfaces.adapter import Surface
    from functions.twilio import twilio_function

    return twilio_function(Surface.SMS, sms.SmsForm.from_form, sms.classify, sms.SMS_LIMIT)(request)


@functions_framework.http
def web_chat(request: flask.Request) -> flask.Response:
    from functions.web import web_chat as handle

    return handle(request)


@functions_framework.http
def memory_digest(request: flask.Request) -> flask.Response:
    from functions.digest import memory_digest as handle

    return handle(request)
