"""Photos and voice notes (issue 20): what a photo costs in input tokens, and what it costs the
turns after it (the description, not the image); how long a voice turn takes with a transcriber
that answers in a fixed time, so what is left is our own; and the Telegram cold start beside the
figure before media (the transcription client is imported only by a voice note).

`python -m bench.media` writes `media`, `voice_turn_ms_p50` and `cold_start_ms` into
bench/results.json; `make bench` runs it with the rest.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench import cold_start
from bench.results import bench_database, save
from functions import runtime
from tests.fakes.anthropic_api import FakeAnthropic
from tests.fakes.deepgram_api import FakeDeepgram
from tests.fakes.telegram_api import FakeTelegram
from tests.helpers import BOT_TOKEN, CORPUS, TELEGRAM_HEADERS, app_client, production_settings

ROOT = Path(__file__).resolve().parent.parent
RECEIPT = (CORPUS / "media" / "receipt.jpg").read_bytes()
VOICE = (CORPUS / "media" / "voice_note_es.ogg").read_bytes()
TRANSCRIBER_S = 0.3
VOICE_TURNS = 15
# The commit before media: its cold start, measured in the same run from a clean export.
BEFORE_MEDIA = "5c02655"


def _message(chat: int, **content: Any) -> dict[str, Any]:
    return {
        "update_id": uuid.uuid4().int % 10**9,
        "message": {
            "message_id": 1,
            "date": 1732870000,
            "chat": {"id": chat, "type": "private", "first_name": "Ana"},
            "from": {"id": chat, "is_bot": False, "first_name": "Ana"},
            **content,
        },
    }


def run(database_url: str, voice_turns: int = VOICE_TURNS) -> dict[str, Any]:
    anthropic, telegram, deepgram = FakeAnthropic(), FakeTelegram(BOT_TOKEN), FakeDeepgram("bench-key")
    anthropic.answer = lambda body: (
        "A café receipt from Bar Pepe, 5,50 EUR."
        if body["system"][0]["text"].startswith("You write the memory")
        else "Noted: a coffee and a toast for 5,50 EUR at Bar Pepe this morning."
    )
    deepgram.latency_s = TRANSCRIBER_S
    saved = dict(os.environ)
    os.environ.update(production_settings(database_url, anthropic, telegram))
    os.environ.update({"DEEPGRAM_API_KEY": "bench-key", "DEEPGRAM_API_BASE": deepgram.url, "TELEGRAM_DRAFTS": "false"})
    try:
        client = app_client("telegram_webhook")

        def turn(body: dict[str, Any]) -> int:
            """The input tokens of the answering model's request of this turn."""
            before = len(anthropic.requests)
            assert client.post("/", json=body, headers=TELEGRAM_HEADERS).status_code == 200
            made = [
                tokens
                for request, tokens in zip(anthropic.requests[before:], anthropic.inputs[before:], strict=True)
                if not request["system"][0]["text"].startswith("You write the memory")
            ]
            return made[0]

        caption = "This morning's breakfast"
        follow_up = "How much did I spend on breakfast?"
        photo_chat, text_chat = 910000000 + uuid.uuid4().int % 10**6, 920000000 + uuid.uuid4().int % 10**6
        sizes = [{"file_id": "bench-receipt", "file_size": len(RECEIPT), "width": 480, "height": 640}]
        telegram.files["bench-receipt"] = RECEIPT
        photo_turn = turn(_message(photo_chat, photo=sizes, caption=caption))
        next_turn = turn(_message(photo_chat, text=follow_up))
        text_turn = turn(_message(text_chat, text=caption))
        next_after_text = turn(_message(text_chat, text=follow_up))

        telegram.files["bench-voice"] = VOICE
        voice_ms: list[float] = []
        text_ms: list[float] = []
        for _ in range(voice_turns):
            chat = 930000000 + uuid.uuid4().int % 10**8
            voice = {"file_id": "bench-voice", "file_size": len(VOICE), "duration": 4, "mime_type": "audio/ogg"}
            began = time.perf_counter()
            assert client.post("/", json=_message(chat, voice=voice), headers=TELEGRAM_HEADERS).status_code == 200
            voice_ms.append((time.perf_counter() - began) * 1000)
            began = time.perf_counter()
            body = _message(chat + 1, text="Hola, mañana tengo cita con el dentista a las diez.")
            assert client.post("/", json=body, headers=TELEGRAM_HEADERS).status_code == 200
            text_ms.append((time.perf_counter() - began) * 1000)
        assert len(deepgram.requests) == voice_turns
    finally:
        runtime.reset()
        os.environ.clear()
        os.environ.update(saved)
        anthropic.close()
        telegram.close()
        deepgram.close()
    voice_p50, text_p50 = statistics.median(voice_ms), statistics.median(text_ms)
    return {
        "media": {
            "photo_turn_input_tokens": photo_turn,
            "text_turn_input_tokens": text_turn,
            "next_turn_input_tokens": next_turn,
            "next_after_text_input_tokens": next_after_text,
            "next_turn_over_text_turn": round(next_turn / text_turn, 3),
            "next_turn_over_next_after_text": round(next_turn / next_after_text, 3),
        },
        "voice_turn_ms_p50": round(voice_p50, 1),
        "voice_turn_detail": {
            "transcriber_ms": TRANSCRIBER_S * 1000,
            "text_turn_ms_p50": round(text_p50, 1),
            "ours_ms_p50": round(voice_p50 - TRANSCRIBER_S * 1000 - text_p50, 1),
            "turns": voice_turns,
        },
    }


def cold_start_side_by_side(database_url: str, runs: int = 5, warm: bool = True) -> dict[str, float]:
    """This tree's Telegram cold start and the commit before media's, measured in the same run."""
    now = cold_start.run(database_url, runs, warm=warm)
    with tempfile.TemporaryDirectory(prefix="crossmem-before-media-") as directory:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", BEFORE_MEDIA], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", directory], input=archive.stdout, check=True)
        before = cold_start.run(database_url, runs, main=str(Path(directory) / "main.py"), warm=warm)
    return {
        **now,
        "telegram_before_media": before["telegram"],
        "telegram_over_before_media": round(now["telegram"] / before["telegram"], 3),
    }


def main() -> None:
    with bench_database() as database_url:
        figures = run(database_url)
        figures["cold_start_ms"] = cold_start_side_by_side(database_url)
    for key, value in figures.items():
        save(key, value)
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
