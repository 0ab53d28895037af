"""The Telegram Bot API: sending replies, the `typing` action, and webhook set-up.

Calls go to `{TELEGRAM_API_BASE}/bot<token>/<method>` with httpx. The token is part of
the URL, so no URL is ever logged: failures name the method only.
"""

from __future__ import annotations

import logging
from typing import Any

import httpx

from core.errors import DeliveryFailed
from core.splitting import split_message

log = logging.getLogger("crossmem.telegram")
TELEGRAM_LIMIT = 4096


class TelegramBot:
    def __init__(self, token: str, api_base: str = "https://api.telegram.org", timeout_s: float = 10.0) -> None:
        self._token = token
        self._base = api_base.rstrip("/")
        self._http = httpx.Client(timeout=timeout_s)

    def call(self, method: str, payload: dict[str, Any]) -> dict[str, Any]:
        """One Bot API method; raises `DeliveryFailed` unless Telegram answers ok."""
        try:
            response = self._http.post(f"{self._base}/bot{self._token}/{method}", json=payload)
            body = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise DeliveryFailed(f"{method}: {type(exc).__name__}") from None
        if not isinstance(body, dict) or not body.get("ok"):
            description = body.get("description", response.status_code) if isinstance(body, dict) else "?"
            raise DeliveryFailed(f"{method}: {description}")
        return body

    def send_text(self, chat_id: int, text: str) -> bool:
        """Send a reply as plain text, in parts of at most 4096 characters; True if all arrived."""
        for part in split_message(text, TELEGRAM_LIMIT):
            try:
                self.call("sendMessage", {"chat_id": chat_id, "text": part})
            except DeliveryFailed as exc:
                log.error("sending a reply failed", extra={"error": str(exc)})
                return False
        return True

    def show_typing(self, chat_id: int) -> None:
        try:
            self.call("sendChatAction", {"chat_id": chat_id, "action": "typing"})
        except DeliveryFailed as exc:
            log.warning("typing action failed", extra={"error": str(exc)})

    def close(self) -> None:
        self._http.close()


class TelegramChannel:
    """A `ReplyChannel` for one chat."""

    def __init__(self, bot: TelegramBot, chat_id: int) -> None:
        self._bot = bot
        self._chat_id = chat_id

    def show_typing(self) -> None:
        self._bot.show_typing(self._chat_id)

    def send(self, text: str) -> bool:
        return self._bot.send_text(self._chat_id, text)
