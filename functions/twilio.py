"""What every Twilio webhook (`whatsapp_webhook`, `sms_webhook`) does at the HTTP edge.

Validate X-Twilio-Signature against the public URL Twilio called (PUBLIC_BASE_URL plus this
request's path and query, never request.url, which is internal behind a proxy), hand the form to
the surface's core (core/surfaces/twilio_inbound.py), answer with its TwiML. A request without a
signature is refused before its body is read; one with a signature has its body read once, within
the byte and field limits, before the signature is checked.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping

import flask

from core.errors import ConfigurationError, Forbidden, UnsupportedBodyType
from core.models import Surface
from core.surfaces.twilio_inbound import Form, TwilioAction, TwilioInbound
from functions import ARRIVED, runtime
from functions.http import json_response, public_url, read_form, serving

# Twilio's inbound message has about 20 fields, plus two for each of at most 10 media.
MAX_FORM_FIELDS = 100


def twilio_webhook(
    request: flask.Request,
    surface: Surface,
    parse: Callable[[Mapping[str, str]], Form],
    classify: Callable[[Form, bool], TwilioAction],
    limit: int,
    typing: Callable[[str], None] | None = None,
) -> flask.Response:
    """Twilio's form, verified, then answered in TwiML by the surface's core (`parse`, `classify`,
    `limit`: core/surfaces/twilio_inbound.py's `TwilioInbound`)."""
    config = runtime.settings()
    if config.twilio_auth_token is None or not config.public_base_url:
        raise ConfigurationError("set TWILIO_AUTH_TOKEN and PUBLIC_BASE_URL")
    adapter = runtime.webhook_surface(surface)
    if request.method != "POST":
        return json_response({"error": "method_not_allowed", "message": "POST Twilio's form"}, 405)
    if request.mimetype != "application/x-www-form-urlencoded":
        raise UnsupportedBodyType("Twilio's form post (application/x-www-form-urlencoded)")
    if not (signature := request.headers.get("X-Twilio-Signature")):
        raise Forbidden("invalid Twilio signature")
    fields = read_form(request, MAX_FORM_FIELDS)
    if not runtime.twilio_signatures().valid(
        public_url(config.public_base_url, request),
        fields,
        signature,
        auth_token=config.twilio_auth_token.get_secret_value(),
        shared_key=config.twilio_webhook_shared_key.get_secret_value() if config.twilio_webhook_shared_key else None,
        settings_header=request.headers.get("X-Twilio-Webhooks-Signature-Settings"),
    ):
        raise Forbidden("invalid Twilio signature")
    needs = runtime.turns(), runtime.commands(), runtime.catalogue(), runtime.remembered_language(), runtime.opt_outs()
    # adapter.off_thread: where the surface has a window (WhatsApp), core/follow_ups/outside_thread.py
    inbound = TwilioInbound(surface, parse, classify, limit, *needs, adapter.deadline_s, typing, adapter.off_thread)
    return flask.Response(inbound.answer(fields, request.environ.get(ARRIVED)), 200, mimetype="application/xml")


def twilio_function(
    surface: Surface,
    parse: Callable[[Mapping[str, str]], Form],
    classify: Callable[[Form, bool], TwilioAction],
    limit: int,
) -> Callable[[flask.Request], flask.Response]:
    """The function of a Twilio surface that has nothing of its own at the edge (main.py's
    `sms_webhook`): `twilio_webhook` with its form and its messages' limit, served as every function is."""
    webhook = functools.partial(twilio_webhook, surface=surface, parse=parse, classify=classify, limit=limit)
    return serving(webhook, f"{surface.value}_webhook")
