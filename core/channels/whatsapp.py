"""WhatsApp through Twilio: the inbound webhook's signature, TwiML answers, and the Messages API
(SMS's too: Twilio signs, reads and sends both the same way). The inbound form is read in
core/surfaces/whatsapp.py, without the SDK.

Each message is at most the surface's limit (core/surfaces/whatsapp.py's WHATSAPP_LIMIT,
core/surfaces/sms.py's SMS_LIMIT), counted as Twilio counts a body (`twilio_length`): in UTF-16
code units, so an emoji, outside the 16 bits, is two. Twilio refuses a longer body (its error
21617), and that message would never reach the person.

The twilio SDK is imported here only. Signatures: Twilio signs the URL it called plus
the sorted form fields, with HMAC-SHA1 and the account's auth token, or, when the
request carries `X-Twilio-Webhooks-Signature-Settings: ...,algorithm=HMAC_SHA256`, with
HMAC-SHA256 and a webhook shared key. The SDK's RequestValidator checks both.

A refused signature is logged at WARNING once per instance, with the URL it was checked
against (PUBLIC_BASE_URL, without a query string or basic-auth credentials; never the
signature, the token or the body): a PUBLIC_BASE_URL that is not the URL Twilio calls refuses every message, and that
line is how it shows; so does a post signed with a shared key when TWILIO_WEBHOOK_SHARED_KEY
is not set. Once, so a flood of forged posts does not flood the logs.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from twilio.request_validator import HMAC_SHA1, HMAC_SHA256, RequestValidator, get_signature_algorithm
from twilio.twiml.messaging_response import MessagingResponse

from core.channels.splitting import LATER_PART_WAITS_S, packed, split_message
from core.errors import ConfigurationError, DeliveryFailed
from core.models import Delivery, SaidFirst, Sent

log = logging.getLogger("crossmem.whatsapp")
# A template's body is at most 1,024 characters (Meta's limit, its own text and {{1}} together):
# a part past this goes in pieces of it, leaving the template's own text 24.
WHATSAPP_TEMPLATE_LIMIT = 1000
# A try that can end past the moment it must be done by is not started: Twilio's client applies
# its timeout to connecting and again to reading.
TRIES_OF_THE_TIMEOUT = 2
# Twilio's refusal of a send to a number that opted out (STOP), until it opts in (START): 400.
OPTED_OUT = 21610


class TwilioSignatures:
    """Twilio's signatures checked, the first refusal logged: one per instance, which
    functions/runtime.py owns (a new instance, as `runtime.reset()` makes, logs again)."""

    def __init__(self) -> None:
        self._refusal_logged = threading.Event()

    def valid(
        self,
        url: str,
        form: Mapping[str, str],
        signature: str | None,
        *,
        auth_token: str,
        shared_key: str | None,
        settings_header: str | None,
    ) -> bool:
        """True when `signature` is Twilio's for `url` and `form`, by either algorithm."""
        if not signature:
            return False
        algorithm = get_signature_algorithm(settings_header)
        if algorithm not in (HMAC_SHA1, HMAC_SHA256):
            return False  # refused here: the SDK would log a warning naming it, for every forged post
        secret = auth_token if algorithm == HMAC_SHA1 else shared_key
        if not secret:
            # Twilio signs with a Webhooks Rule's shared key this instance was not given: every
            # such post is refused, and this line is how the operator learns why.
            self._log_refusal(
                "Twilio signature refused: signed with HMAC_SHA256 (a Webhooks Rule's shared key), and "
                "TWILIO_WEBHOOK_SHARED_KEY is not set (logged once per instance)",
                {"algorithm": algorithm},
            )
            return False
        valid = bool(RequestValidator(secret).validate(url, form, signature, algorithm=algorithm))
        if not valid:
            self._log_refusal(
                "Twilio signature refused: checked against PUBLIC_BASE_URL, which must be the full URL Twilio "
                "calls (logged once per instance)",
                {"checked_url": shown_url(url), "algorithm": algorithm},
            )
        return valid

    def _log_refusal(self, message: str, extra: dict[str, str]) -> None:
        if not self._refusal_logged.is_set():
            self._refusal_logged.set()
            log.warning(message, extra=extra)


def shown_url(url: str) -> str:
    """The URL a log line names: without its query, nor the credentials of Twilio's basic-auth form
    (`https://username:password@host/path`, which Twilio takes as a webhook URL)."""
    bare = url.split("?", 1)[0]
    scheme, found, rest = bare.partition("://")
    host, slash, path = rest.partition("/")
    return f"{scheme}{found}{host.rpartition('@')[2]}{slash}{path}" if found else bare


def sign_form(secret: str, url: str, form: Mapping[str, str], algorithm: str | None = None) -> str:
    """Twilio's signature of a form post (for `crossmem say`)."""
    return str(RequestValidator(secret).compute_signature(url, form, algorithm))


# What XML 1.0 forbids: C0 controls but tab, newline and carriage return, lone surrogates, U+FFFE and
# U+FFFF. MessagingResponse writes them as they are, and Twilio sends nothing of an answer that is
# not XML; Word's line break (U+000B) and a form feed (U+000C) are read as line breaks, the rest go.
_NOT_IN_XML = re.compile("[\x00-\x08\x0e-\x1f\ud800-\udfff\ufffe\uffff]")
_LINE_BREAKS = str.maketrans({"\x0b": "\n", "\x0c": "\n"})


TWIML_MESSAGES = 10  # the most Twilio sends in answer to one message (its error 14109)


def twilio_length(text: str) -> int:
    """A body's length as Twilio counts it against its limit: UTF-16 code units."""
    return len(text.encode("utf-16-le")) // 2


def twiml(text: str | None, limit: int, first: Sequence[SaidFirst] = (), *, sms: bool = False) -> str:
    """A TwiML answer: the text in messages of at most `limit` (`twilio_length`), or no message,
    as SMS carries it when `sms` (`twilio_parts`); `first` (follow-ups held outside the 24-hour
    window, each from its first part not sent) before it, packed into as few messages as they fit
    (`carried_first`: the ones there is room for)."""
    response = MessagingResponse()
    for part in [*packed(_pieces(first, limit), limit, twilio_length), *_reply_parts(text, limit, sms)]:
        if readable := _NOT_IN_XML.sub("", part.translate(_LINE_BREAKS)).strip():  # no empty message
            response.message(readable)
    return str(response)


def carried_first(text: str | None, first: Sequence[SaidFirst], limit: int, *, sms: bool = False) -> list[SaidFirst]:
    """The follow-ups said first that one TwiML answer with `text` has room for, in order: Twilio
    sends at most 10 messages in answer to one, the reply's whole among them."""
    room = TWIML_MESSAGES - len(_reply_parts(text, limit, sms))
    carried: list[SaidFirst] = []
    for said in first:
        if len(packed(_pieces([*carried, said], limit), limit, twilio_length)) > room:
            break
        carried.append(said)
    return carried


def twilio_parts(text: str, limit: int, *, at_paragraphs: bool = True, sms: bool = False) -> list[str]:
    """`text` in messages of at most `limit` as Twilio counts them (core/channels/splitting.py).
    `sms`, as the carriers carry it: its typographic punctuation as GSM-7 has it (`gsm_lookalikes`),
    and, since they deliver separate messages in any order (a long one of many segments often after
    a short one sent later), a text of several messages has each start with its place, `(1/3) `,
    the room for it taken from each."""
    if sms:
        text = gsm_lookalikes(text)
    parts = split_message(text, limit, at_paragraphs=at_paragraphs, length=twilio_length)
    if not sms or len(parts) < 2:
        return parts
    count = len(parts)
    while True:
        parts = split_message(
            text, limit - len(part_label(count, count)), at_paragraphs=at_paragraphs, length=twilio_length
        )
        if len(parts) <= count:  # a label as long as the one made room for
            break
        count = len(parts)  # the labels' room took more parts: cut again with room for their label
    return [f"{part_label(place, len(parts))}{part}" for place, part in enumerate(parts, 1)]


# Characters outside GSM-7 that one of it stands for (most of the list Twilio's Smart Encoding
# uses): a single curly apostrophe or dash, which the model writes often, sends a whole SMS in
# UCS-2, in segments of 67 characters instead of 153 (two or three times the messages billed), and
# an old phone may not show it. Letters are never changed (Spanish á stays á).
_GSM_LOOKALIKES = str.maketrans(
    {
        **dict.fromkeys("«»“”„‟″＂", '"'),
        **dict.fromkeys("‘’‛′´`ʼ＇", "'"),
        **dict.fromkeys("‐‑‒–—―−", "-"),
        **dict.fromkeys(
            "\u00a0\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u202f\u205f\u3000", " "
        ),
        **dict.fromkeys("\u200b\u2060\ufeff", ""),
        "…": "...",
        "‚": ",",
        "‹": "<",
        "›": ">",
        "⁄": "/",
    }
)


def gsm_lookalikes(text: str) -> str:
    """`text` with the punctuation and spaces outside GSM-7 that GSM-7 has a look-alike for replaced by it."""
    return text.translate(_GSM_LOOKALIKES)


def part_label(place: int, count: int) -> str:
    return f"({place}/{count}) "


def _reply_parts(text: str | None, limit: int, sms: bool = False) -> list[str]:
    """A reply's messages in a TwiML answer: cut at paragraphs, or, when that fills what one answer
    holds (paragraphs of 900 characters take a message each), at sentence ends if that takes fewer."""
    parts = twilio_parts(text or "", limit, sms=sms)
    if len(parts) < TWIML_MESSAGES:
        return parts
    return min(parts, twilio_parts(text or "", limit, at_paragraphs=False, sms=sms), key=len)


def _pieces(first: Sequence[SaidFirst], limit: int) -> list[str]:
    return [piece for said in first for piece in twilio_parts(said.content, limit)[said.from_part :]]


def template_variable(text: str) -> str:
    """`text` as a template's variable WhatsApp takes: on one line, its line breaks, tabs and runs
    of spaces each one space. WhatsApp refuses a variable with a line break, a tab or more than four
    spaces in a row (Twilio's error 63013, reported after the send was accepted: it never arrives)."""
    return " ".join(text.split())


class WhatsAppSender:
    """Twilio's Messages API from one sender (a WhatsApp or an SMS number): what the agent says
    outside a webhook's answer (an owed reply, a follow-up), in messages of at most `limit` (its
    surface's). Free-form messages reach a person only inside WhatsApp's 24-hour window after their
    last message; an owed reply is minutes old, well inside it. The REST client (`twilio.rest`, a
    heavier import than the validator) is built on the first send."""

    def __init__(
        self,
        account_sid: str,
        auth_token: str,
        sender: str,
        limit: int,
        api_base: str | None = None,
        timeout_s: float = 10.0,
        sleep: Callable[[float], None] = time.sleep,
        sms: bool = False,
        opted_out: Callable[[str], object] | None = None,
    ) -> None:
        self._sms = sms  # its texts as SMS carries them (`twilio_parts`)
        self._opted_out = opted_out  # told of a number Twilio refused as opted out (OPTED_OUT)
        self._failed = "sending an SMS failed" if sms else "sending a WhatsApp message failed"
        self._sleep = sleep
        self._account_sid = account_sid
        self._auth_token = auth_token
        self._sender = sender
        self._limit = limit
        self._api_base = api_base
        self._timeout_s = timeout_s
        self._client: Any = None

    def channel(self, to: str) -> WhatsAppChannel:
        """The channel to a sender as stored (a BSUID or a number; Twilio takes either)."""
        return WhatsAppChannel(self, to if to.startswith("whatsapp:") else f"whatsapp:{to}")

    def send_parts(
        self, to: str, text: str, until: float | None = None, first_part: int = 0, content_sid: str | None = None
    ) -> Sent:
        """`text` in parts Twilio takes, from its part `first_part` (the ones before it went out
        earlier), and how far it got; a part started, or tried again (splitting.py), only while
        its try can end before `until` (a `time.monotonic()` time: the attempt's; None: no bound,
        and never again). With `content_sid`, each part as approved templates (Twilio's Content
        API: `ContentSid`, `ContentVariables`, a piece of the part its one variable, on one
        line): what reaches a person outside the 24-hour window."""
        parts = twilio_parts(text, self._limit, sms=self._sms and content_sid is None)
        longest_try = TRIES_OF_THE_TIMEOUT * self._timeout_s
        for index in range(first_part, len(parts)):
            pieces = [parts[index]] if content_sid is None else twilio_parts(parts[index], WHATSAPP_TEMPLATE_LIMIT)
            for piece in pieces:
                message = {"body": piece}
                if content_sid is not None:
                    variables = {"1": template_variable(piece)}
                    message = {"content_sid": content_sid, "content_variables": json.dumps(variables)}
                if until is not None and time.monotonic() + longest_try >= until:
                    # Its try could end past the attempt's time, when another may hold the message:
                    # the rest is owed from this part (the reply's unsent_from).
                    return Sent(Delivery.OWED, index)
                waits = iter(LATER_PART_WAITS_S if index else ())  # the parts before it are out
                delivery, opted_out = self._create(to=to, **message)
                while delivery is Delivery.OWED and (wait := next(waits, None)) is not None:
                    if until is None or time.monotonic() + wait + longest_try >= until:
                        break
                    log.warning("sending a message's later part failed; trying again", extra={"part": index + 1})
                    self._sleep(wait)
                    delivery, opted_out = self._create(to=to, **message)
                if delivery is not Delivery.DELIVERED:
                    return Sent(delivery, index, opted_out)
        return Sent(Delivery.DELIVERED, len(parts))

    def _create(self, **message: str) -> tuple[Delivery, bool]:
        """One message through Twilio's Messages API, from this sender; what became of it, and
        whether it was refused as sent to a number that opted out (OPTED_OUT)."""
        from twilio.base.exceptions import TwilioException, TwilioRestException

        try:
            self._rest().messages.create(from_=self._sender, **message)
        except TwilioRestException as exc:
            # 4xx but 429: the request itself is refused (an unknown number, outside the window).
            final = 400 <= exc.status < 500 and exc.status != 429
            log.error(self._failed, extra={"status": exc.status, "code": exc.code})
            opted_out = exc.code == OPTED_OUT
            if opted_out and self._opted_out is not None:
                self._opted_out(message["to"])
            return (Delivery.GIVEN_UP if final else Delivery.OWED), opted_out
        except (TwilioException, OSError) as exc:
            log.error(self._failed, extra={"error": type(exc).__name__})
            return Delivery.OWED, False
        return Delivery.DELIVERED, False

    def inbound_url(self, number: str) -> str | None:
        """The URL Twilio posts `number`'s messages to (its SmsUrl, "A message comes in"; "" when
        none), None when the number is not this account's (`crossmem doctor`). Raises
        ConfigurationError ("status code": our credentials, no caller's fault) when Twilio refuses,
        DeliveryFailed (the error's type) when it does not answer."""
        from twilio.base.exceptions import TwilioException, TwilioRestException

        try:
            numbers = self._rest().api.v2010.account.incoming_phone_numbers.list(phone_number=number, limit=1)
        except TwilioRestException as exc:
            raise ConfigurationError(f"{exc.status} {exc.code}") from None
        except (TwilioException, OSError) as exc:
            raise DeliveryFailed(type(exc).__name__) from None
        return str(numbers[0].sms_url or "") if numbers else None

    def show_typing(self, message_sid: str) -> None:
        """WhatsApp's "typing…" for the person's message (Twilio's typing indicators, public beta),
        which also marks it read; it lasts until the reply or 25 seconds. On a thread of its own:
        it never delays the turn, and a failure is only logged."""
        threading.Thread(target=self._typing, args=(message_sid,), name="whatsapp-typing", daemon=True).start()

    def _typing(self, message_sid: str) -> None:
        from twilio.base.exceptions import TwilioException

        try:
            self._rest().messaging.v2.typing_indicator.create(channel="whatsapp", message_id=message_sid)
        except (TwilioException, OSError) as exc:
            log.warning("the typing indicator failed", extra={"error": type(exc).__name__})

    def _rest(self) -> Any:
        if self._client is None:
            from twilio.http.http_client import TwilioHttpClient
            from twilio.rest import Client

            client = Client(self._account_sid, self._auth_token, http_client=TwilioHttpClient(timeout=self._timeout_s))
            if self._api_base:  # the tests' fake answers both of Twilio's hosts
                client.api.base_url = client.messaging.base_url = self._api_base.rstrip("/")
            self._client = client
        return self._client


class WhatsAppChannel:
    """A `ReplyChannel` for one WhatsApp sender (a `whatsapp:` address)."""

    def __init__(self, sender: WhatsAppSender, to: str) -> None:
        self._sender = sender
        self._to = to

    def show_typing(self, until: float) -> None:
        pass  # an owed reply: nobody is watching the chat for it

    def draft(self, text: str) -> None:
        pass  # WhatsApp has no drafts

    def send(self, text: str, until: float, first_part: int = 0) -> Sent:
        # No part whose try could end past the attempt's time (core/turn/request.py).
        return self._sender.send_parts(self._to, text, until, first_part)
