"""A Telegram reply the person can watch: "typing…" at once, then the text as it is written.

Bot API 9.5's `sendMessageDraft` streams a partial message into a private chat: an ephemeral
preview (30 seconds) that drafts with the same `draft_id` animate; the reply itself still goes
out with `sendMessage`. `sendChatAction` `typing` shows for 5 seconds, so it is renewed until
the first text is shown.

Everything here runs on a thread of its own and never holds the turn up: the model's text is
handed over as it grows (`show`), and the thread sends the newest text at most once a
`DRAFT_INTERVAL_S` (Telegram's bot FAQ: about one message a second in a chat). A 429 skips
drafts until its `retry_after` has passed; any other failure ends the drafts (the reply still
goes out). `stop` ends the thread, and waits for a call in flight, before the reply is sent, so
no draft follows the message; nor does the thread outlive the turn's attempt (`start(until)`):
past it, the message may be someone else's to answer.

With `stop_asked` (Bot API 10.3) the drafts carry Telegram's stop button (`can_stop`), and
`keep_on_stop`: the draft stays in the chat when it is tapped, for the reply to keep it. The tap
reaches the webhook, maybe on another instance, which records it in the database
(core/turn/stopped_generation.py); before each draft after the first (the button shows only under
one) the thread asks `stop_asked`, one database round trip each (`checks`), at most one a
`DRAFT_INTERVAL_S`. Once it answers yes the thread ends, and `stopped()` is the text the person
was shown: the turn stops reading the model and sends that text as its reply.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable

from core.errors import DeliveryFailed, StoreUnavailable

log = logging.getLogger("crossmem.telegram")
DRAFT_INTERVAL_S = 1.0
TYPING_RENEW_S = 4.5  # a chat action shows for 5 s
DRAFT_LIMIT = 4096
# A draft is a preview: a slow one is not worth waiting for.
DRAFT_TIMEOUT_S = 2.0

Call = Callable[[str, dict[str, object], float], object]


class LiveReply:
    def __init__(
        self,
        call: Call,
        chat_id: int,
        draft_id: int,
        *,
        drafts: bool = True,
        lasts_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        stop_asked: Callable[[], bool] | None = None,
    ) -> None:
        """`call(method, payload, timeout_s)`: one Bot API call, raising DeliveryFailed.
        `lasts_s`: the thread ends by itself after this, should nobody stop it; `clock`: the
        one `start`'s `until` is read on; `stop_asked`: whether the person tapped the drafts'
        stop button (raising StoreUnavailable); without it the drafts have no button."""
        self._call = call
        self._chat_id = chat_id
        self._draft_id = draft_id or 1  # must be non-zero
        self._drafts = drafts
        self._clock = clock
        self._ends = clock() + lasts_s
        self._text = ""
        self._shown = ""
        self._changed = threading.Condition()
        self._stopped = False
        self._stop_asked = stop_asked
        self._stopped_at: str | None = None  # what the person was shown when they tapped stop
        self.checks = 0  # how often `stop_asked` was asked: a database round trip each
        self._thread = threading.Thread(target=self._run, name="live-reply", daemon=True)

    def start(self, until: float = math.inf) -> None:
        """Typing at once, then the drafts, until `stop` or `until` (a `clock` time), whichever first."""
        self._ends = min(self._ends, until)
        self._thread.start()

    def show(self, text: str) -> None:
        """The reply so far (the whole text, not a piece)."""
        if not self._drafts:
            return
        with self._changed:
            self._text = text
            self._changed.notify()

    def stopped(self) -> str | None:
        """The draft the person stopped the reply at (its text, as they saw it); None while they
        have not."""
        with self._changed:
            return self._stopped_at

    def stop(self) -> None:
        """No more drafts or typing; waits for a call in flight (its connecting and its reading
        each take at most half of DRAFT_TIMEOUT_S), so none reaches Telegram after what follows."""
        with self._changed:
            self._stopped = True
            self._changed.notify()
        if self._thread.is_alive():
            self._thread.join(2 * DRAFT_TIMEOUT_S)

    def _run(self) -> None:
        if self._clock() >= self._ends:
            return
        self._send_typing()  # first, whatever the model has written by now
        typing_at, draft_at = self._clock() + TYPING_RENEW_S, self._clock()
        while True:
            with self._changed:
                while not self._stopped and self._clock() < self._ends:
                    now = self._clock()
                    wants_draft = self._drafts and self._text != self._shown and now >= draft_at
                    wants_typing = not self._shown and now >= typing_at
                    if wants_draft or wants_typing:
                        break
                    wake = min(typing_at if not self._shown else self._ends, draft_at, self._ends)
                    self._changed.wait(max(wake - now, 0.01))
                if self._stopped or self._clock() >= self._ends:
                    return
                text = self._text if self._drafts and self._text != self._shown and self._clock() >= draft_at else ""
            if text:
                if self._shown.strip() and self._person_stopped():
                    return
                draft_at = self._send_draft(text)
            else:
                self._send_typing()
                typing_at = self._clock() + TYPING_RENEW_S

    def _person_stopped(self) -> bool:
        """Whether the person tapped stop under the draft shown (or `stop` came while asking):
        then no draft or typing follows, and `stopped()` says what they were shown. A check
        that fails ends the checks: the reply is then written whole, as without the button."""
        if self._stop_asked is None:
            return False
        self.checks += 1
        try:
            asked = self._stop_asked()
        except StoreUnavailable as exc:
            log.warning("stop checks ended", extra={"error": str(exc)})
            self._stop_asked = None
            return False
        with self._changed:
            if asked:
                self._stopped_at = self._shown[:DRAFT_LIMIT].rstrip()  # as sendMessage sends it
            return asked or self._stopped

    def _send_draft(self, text: str) -> float:
        """Send one draft; when the next may go."""
        shown = text[:DRAFT_LIMIT]
        payload: dict[str, object] = {"chat_id": self._chat_id, "draft_id": self._draft_id, "text": shown}
        if self._stop_asked is not None:
            # The stop button, and the draft kept in the chat when it is tapped: the reply then
            # sends that text as a message (a draft alone disappears after a short time).
            payload |= {"can_stop": True, "keep_on_stop": True}
        try:
            self._call("sendMessageDraft", payload, self._timeout_s())
        except DeliveryFailed as exc:
            if exc.retry_after_s is not None:
                resumes_at = self._clock() + exc.retry_after_s
                log.warning("drafts paused: Too Many Requests", extra={"retry_after_s": exc.retry_after_s})
                return resumes_at
            log.warning("drafts stopped", extra={"error": str(exc)})
            self._drafts = False
            return float("inf")
        with self._changed:
            self._shown = text
        return self._clock() + DRAFT_INTERVAL_S

    def _send_typing(self) -> None:
        try:
            self._call("sendChatAction", {"chat_id": self._chat_id, "action": "typing"}, self._timeout_s())
        except DeliveryFailed as exc:
            log.warning("typing action failed", extra={"error": str(exc)})

    def _timeout_s(self) -> float:
        """A call's HTTP timeout: connecting and reading each get half, so that a call started
        before the thread's end is over by then."""
        return max(min(DRAFT_TIMEOUT_S, self._ends - self._clock()) / 2, 0.01)
