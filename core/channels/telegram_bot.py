"""The Telegram Bot API: sending replies, the `typing` action, and webhook set-up.

Calls go to `{TELEGRAM_API_BASE}/bot<token>/<method>` with httpx. The token is part of
the URL, so no URL is ever logged: failures name the method only.

A reply that could not be sent is told apart by whether trying again may help: a 400
(chat not found, USER_IS_BLOCKED) or 403 (blocked, cannot initiate) will not, so the
reply is given up; a 429, a 5xx (often without a JSON body), a network failure or a
timeout may pass, so the reply is owed and the webhook asks Telegram to redeliver. A 429
is waited out here when its `retry_after` ends before the reply's deadline; nothing here runs
past that deadline (the moment the turn's attempt must have sent by: core/turn/request.py's
`ReplyChannel`), neither a wait nor an HTTP call, and a reply that cannot go out by then is not
sent at all.
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from core.channels.live_reply import LiveReply
from core.channels.splitting import LATER_PART_WAITS_S, split_message
from core.errors import DeliveryFailed
from core.models import Delivery, Sent
from core.turn.stopped_generation import StoppedGenerations

if TYPE_CHECKING:
    import httpx

log = logging.getLogger("crossmem.telegram")
# sendMessage's "1-4096 characters after entities parsing", counted in code points (Python's
# characters): a message of 4,096 emoji (8,192 UTF-16 units) is taken, one more is "message is too
# long" (measured on the live Bot API, github.com/FerroxLabs/wayland/issues/934, August 2026). Only
# entity offsets count UTF-16 units, and our replies are plain text, with none.
TELEGRAM_LIMIT = 4096
# Statuses after which the same request can never succeed.
_FINAL_STATUSES = frozenset({400, 403})
# Answers from before `parameters` existed carried the wait only here.
_RETRY_AFTER_IN_DESCRIPTION = re.compile(r"retry after (\d+)", re.IGNORECASE)


class TelegramBot:
    def __init__(
        self,
        token: str,
        api_base: str = "https://api.telegram.org",
        timeout_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._token = token
        self._base = api_base.rstrip("/")
        self._timeout_s = timeout_s
        # httpx is imported with the first bot, not with this module: every `crossmem` command
        # imports the runtime, which imports this, and most never call Telegram (0.2 s saved).
        import httpx

        self._http: httpx.Client = httpx.Client(timeout=timeout_s)
        self._clock = clock
        self._sleep = sleep

    @property
    def clock(self) -> Callable[[], float]:
        """The clock deadlines are read on (`time.monotonic`, as the turn's)."""
        return self._clock

    def call(self, method: str, payload: dict[str, Any], timeout_s: float | None = None) -> dict[str, Any]:
        """One Bot API method; raises `DeliveryFailed` unless Telegram answers ok."""
        import httpx

        try:
            response = self._http.post(
                f"{self._base}/bot{self._token}/{method}", json=payload, timeout=timeout_s or self._timeout_s
            )
        except httpx.HTTPError as exc:
            raise DeliveryFailed(f"{method}: {type(exc).__name__}") from None
        try:
            body = response.json()
        except ValueError:
            body = None
        if isinstance(body, dict) and body.get("ok"):
            return body
        if not isinstance(body, dict):
            raise DeliveryFailed(f"{method}: HTTP {response.status_code}")
        description = str(body.get("description", response.status_code))
        raise DeliveryFailed(
            f"{method}: {description}",
            final=response.status_code in _FINAL_STATUSES,
            retry_after_s=_retry_after(body) if response.status_code == 429 else None,
        )

    def send_text(
        self, chat_id: int, text: str, deadline: float | None = None, reply_markup: dict[str, Any] | None = None
    ) -> Delivery:
        """Send a reply as plain text, in parts of at most 4096 characters, before the
        `deadline` (a `clock()` time; default: one HTTP timeout from now); `reply_markup`
        (buttons) goes with the last part."""
        return self.send_parts(chat_id, text, deadline, reply_markup).delivery

    def send_parts(
        self,
        chat_id: int,
        text: str,
        deadline: float | None = None,
        reply_markup: dict[str, Any] | None = None,
        first_part: int = 0,
    ) -> Sent:
        """`send_text` from its part `first_part` (the ones before it went out earlier), and how
        far it got."""
        deadline = deadline if deadline is not None else self._clock() + self._timeout_s
        parts = split_message(text, TELEGRAM_LIMIT)
        for index in range(first_part, len(parts)):
            payload: dict[str, Any] = {"chat_id": chat_id, "text": parts[index]}
            if reply_markup and index == len(parts) - 1:
                payload["reply_markup"] = reply_markup
            # A later part is tried again while time allows (splitting.py's LATER_PART_WAITS_S).
            waits = iter(LATER_PART_WAITS_S if index else ())
            while True:
                try:
                    self._send_part(payload, deadline)
                    break
                except DeliveryFailed as exc:
                    wait = next(waits, None)
                    if exc.final or wait is None or self._clock() + wait >= deadline:
                        log.error("sending a reply failed", extra={"error": str(exc), "final": exc.final})
                        return Sent(Delivery.GIVEN_UP if exc.final else Delivery.OWED, index)
                    log.warning("sending a reply's later part failed; trying again", extra={"part": index + 1})
                    self._sleep(wait)
        return Sent(Delivery.DELIVERED, len(parts))

    def _send_part(self, payload: dict[str, Any], deadline: float) -> None:
        try:
            self.call("sendMessage", payload, timeout_s=self._time_left(deadline))
        except DeliveryFailed as exc:
            wait = exc.retry_after_s
            if wait is None or self._clock() + wait >= deadline:
                raise
            log.warning("sendMessage: waiting out Too Many Requests", extra={"retry_after_s": wait})
            self._sleep(wait)
            self.call("sendMessage", payload, timeout_s=self._time_left(deadline))

    def _time_left(self, deadline: float) -> float:
        """The HTTP timeout of a call that must end by `deadline`: httpx's applies to connecting
        and to reading each, so each gets half of what is left and the two never end past it."""
        left = deadline - self._clock()
        if left <= 0:
            raise DeliveryFailed("sendMessage: no time left before the deadline")
        return min(left / 2, self._timeout_s)

    def answer_callback_query(self, callback_query_id: str) -> None:
        """Stop the tapped button's spinner; the answer itself goes out as a message."""
        try:
            self.call("answerCallbackQuery", {"callback_query_id": callback_query_id})
        except DeliveryFailed as exc:
            log.warning("answering a button failed", extra={"error": str(exc)})

    def close(self) -> None:
        self._http.close()


def _retry_after(body: dict[str, Any]) -> float | None:
    parameters = body.get("parameters")
    if isinstance(parameters, dict) and isinstance(parameters.get("retry_after"), int | float):
        return float(parameters["retry_after"])
    found = _RETRY_AFTER_IN_DESCRIPTION.search(str(body.get("description", "")))
    return float(found.group(1)) if found else None


class TelegramChannel:
    """A `ReplyChannel` for one chat. Replies must be out by the turn's `until`, and by `deadline`
    (the function's own limit), both times on the bot's clock.

    While the model writes, the person sees "typing…" and, with `drafts`, the text as it grows
    (core/channels/live_reply.py, drafts with `draft_id`); the reply itself goes out with sendMessage.
    With `stops` the drafts carry the stop button (a `StopButton`: core/turn/request.py), and a
    tap recorded there ends the model's answer at the draft the person saw."""

    def __init__(
        self,
        bot: TelegramBot,
        chat_id: int,
        deadline: float | None = None,
        *,
        draft_id: int = 0,
        drafts: bool = False,
        stops: StoppedGenerations | None = None,
    ) -> None:
        self._bot = bot
        self._chat_id = chat_id
        self._deadline = deadline if deadline is not None else math.inf
        asked = (lambda: stops.asked(chat_id, draft_id)) if stops is not None and drafts else None
        # Without drafts no stop button is ever shown: nothing to ask about an earlier attempt.
        self._before = (lambda: stops.stopped_before(chat_id, draft_id)) if stops is not None and drafts else None
        self._live = LiveReply(bot.call, chat_id, draft_id, drafts=drafts, clock=bot.clock, stop_asked=asked)

    def show_typing(self, until: float) -> None:
        self._live.start(min(until, self._deadline))

    def draft(self, text: str) -> None:
        self._live.show(text)

    def stopped(self) -> str | None:
        return self._live.stopped()

    @property
    def checks(self) -> int:
        return self._live.checks

    def stopped_before(self) -> bool:
        return self._before is not None and self._before()

    def send(self, text: str, until: float, first_part: int = 0) -> Sent:
        self._live.stop()  # no draft after the message, nor after the attempt's time
        return self._bot.send_parts(self._chat_id, text, min(until, self._deadline), first_part=first_part)


class TelegramAnswerChannel:
    """A `ReplyChannel` for one chat whose webhook answers inside its response
    (TELEGRAM_REPLY_IN_WEBHOOK), a `CarriesShortReplies`: a text of one message is `carried`, for
    the webhook's answer to hold (one Bot API call fewer); a longer one goes out through the Bot
    API part by part, and how far it got is stored as for any pushed reply, so a redelivery or
    the scheduled job sends only its rest. Nobody sees "typing…": that is the call it saves."""

    def __init__(self, bot: TelegramBot, chat_id: int, deadline: float | None = None) -> None:
        self._bot = bot
        self._chat_id = chat_id
        self._deadline = deadline if deadline is not None else math.inf
        self.carried: str | None = None  # the text the webhook's answer is to hold

    def carries(self, text: str) -> bool:
        return len(text.strip()) <= TELEGRAM_LIMIT

    def show_typing(self, until: float) -> None:
        pass

    def draft(self, text: str) -> None:
        pass

    def send(self, text: str, until: float, first_part: int = 0) -> Sent:
        until = min(until, self._deadline)
        if not self.carries(text):
            return self._bot.send_parts(self._chat_id, text, until, first_part=first_part)
        if self._bot.clock() >= until:  # the answer would come after the attempt's time
            return Sent(Delivery.OWED, 0)
        self.carried = text
        return Sent(Delivery.DELIVERED, 1)
