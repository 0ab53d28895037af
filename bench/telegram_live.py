"""Replies you can watch (issue #22): how soon a Telegram person sees text, against the whole reply.

Turns through the real `telegram_webhook` with the fake Bot API (which notes when each call
arrives) and a fake model streaming at a realistic pace: its first text after
`FIRST_TOKEN_S` (0.6 s: what a Sonnet-class model takes to start on a chat-sized prompt), then
a word every `WORD_S` (25 ms: about 50 tokens a second), `WORDS` words in all.

- `first_text_ms_p50`: from the delivery to the first `sendMessageDraft` with text.
- `reply_ms_p50`: from the delivery to the final `sendMessage`.
- `bot_api_calls_per_turn`: `sendChatAction`, drafts and `sendMessage` of one turn.

`python -m bench.telegram_live` runs this part alone and updates `telegram_live` in
bench/results.json.
"""

from __future__ import annotations

import os
import statistics
import time
import uuid

from bench.results import run_alone
from functions import runtime
from tests.fakes.anthropic_api import FakeAnthropic
from tests.fakes.telegram_api import FakeTelegram
from tests.helpers import BOT_TOKEN, TELEGRAM_HEADERS, app_client, production_settings, update

TURNS = 20
FIRST_TOKEN_S = 0.6
WORD_S = 0.025
WORDS = 120


def run(database_url: str, turns: int = TURNS, words: int = WORDS) -> dict[str, float]:
    anthropic, telegram = FakeAnthropic(), FakeTelegram(BOT_TOKEN)
    anthropic.answer = lambda body: " ".join(f"word{index}" for index in range(words))
    anthropic.first_token_s, anthropic.delta_pause_s = FIRST_TOKEN_S, WORD_S
    saved = dict(os.environ)
    os.environ.update(production_settings(database_url, anthropic, telegram))
    first_text: list[float] = []
    reply: list[float] = []
    calls = 0
    try:
        client = app_client("telegram_webhook")
        for _ in range(turns):
            chat = 800000000 + uuid.uuid4().int % 10**8
            before = len(telegram.calls)
            began = time.monotonic()
            response = client.post("/", json=update("How does my week look?", user_id=chat), headers=TELEGRAM_HEADERS)
            assert response.status_code == 200
            made = list(zip(telegram.calls[before:], telegram.times[before:], strict=True))
            calls += len(made)
            drafts = [at for (method, payload), at in made if method == "sendMessageDraft" and payload.get("text")]
            sent = [at for (method, _), at in made if method == "sendMessage"]
            first_text.append((drafts[0] if drafts else sent[-1]) - began)
            reply.append(sent[-1] - began)
    finally:
        runtime.reset()
        os.environ.clear()
        os.environ.update(saved)
        anthropic.close()
        telegram.close()
    return {
        "first_text_ms_p50": round(statistics.median(first_text) * 1000, 1),
        "reply_ms_p50": round(statistics.median(reply) * 1000, 1),
        "bot_api_calls_per_turn": round(calls / turns, 2),
        "model_first_token_ms": FIRST_TOKEN_S * 1000,
        "model_ms_per_word": WORD_S * 1000,
        "words": words,
    }


def main() -> None:
    run_alone("telegram_live", run)


if __name__ == "__main__":
    main()
