"""`make soak`: the three functions under load and faults, then the database checked
against what was sent. Writes `load` and `faults` into bench/results.json.

What runs, all on this machine:

- an embedded Postgres of its own (so it can be restarted), migrated like a Supabase project;
- bench/latency_proxy.py in front of it, in a process of its own, which can refuse and cut
  connections;
- the functions as in production: functions-framework's gunicorn server, one server per
  function, several workers each, for an `auto` deployment and an `owner` one;
- the fake model (tests/fakes/anthropic_api.py) answering at once for the `load` figures,
  then in 300 to 1500 ms through the faults; the fake Bot API (tests/fakes/telegram_api.py);
- locust in a process of its own, running bench/soak_people.py: 200 people.

The timeline: warm-up, `load`, then each fault in its own window (bench/soak_faults.py),
then a drain in which only retries are sent. bench/soak_check.py reads the database.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from bench.latency_proxy import ProxyProcess
from bench.soak_check import check
from bench.soak_faults import FAULTS, Lab
from bench.soak_identities import OWNER_DEVICES, telegram_id, whatsapp_sender
from core.stores.embedded import start_embedded_postgres, stop_embedded_postgres
from tests.database import migrated_database
from tests.fakes.anthropic_api import FakeAnthropic, echo_last_message
from tests.fakes.telegram_api import FakeTelegram

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results.json"
PEOPLE = 200  # the owner (on three devices at once) and 199 `auto` people
OWNER = str(uuid.uuid5(uuid.NAMESPACE_URL, "crossmem-soak-owner"))
BOT_TOKEN = "123456789:SOAK-token"
SECRETS = {"telegram": "soak-telegram-secret", "twilio": "soak-twilio-token", "jwt": "soak-jwt-secret-32-bytes-long-xx"}
PUBLIC_BASE_URL = "https://soak.example.com/whatsapp_webhook"
FALLBACK = "Sorry, I can't answer right now."
DEADLINE_S = "4"  # the model's deadline on every surface; `model_slow` answers in 6 s
WORKERS = "2"
WARM_UP_S, LOAD_S, DRAIN_S = 45.0, 30.0, 25.0
MODEL_LATENCY_S = (0.3, 1.5)


def answer_with_context_size(body: dict[str, Any]) -> str:
    """The fake model's echo, led by how many of the person's messages it was shown: a turn
    answered without memory (the database was away) shows one, the new message."""
    shown = sum(
        block.get("text", "").count(" · ")
        for message in body["messages"]
        if message["role"] == "user"
        for block in (message["content"] if isinstance(message["content"], list) else [{"text": message["content"]}])
    )
    return f"ctx={shown} " + echo_last_message(body)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def function_server(target: str, environment: dict[str, str], log: Path) -> Iterator[str]:
    """One function under functions-framework's gunicorn server, as Cloud Functions runs it."""
    port = free_port()
    command = [str(Path(sys.executable).parent / "functions-framework"), "--target", target, "--source", "main.py"]
    with open(log, "w") as output:
        process = subprocess.Popen(
            [*command, "--host", "127.0.0.1", "--port", str(port)],
            cwd=ROOT,
            env=environment,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/"
    finally:
        process.terminate()
        process.wait(timeout=20)


def deployment_environment(database_url: str, model: FakeAnthropic, bot: FakeTelegram, policy: str) -> dict[str, str]:
    return {
        **os.environ,
        "APP_ENV": "production",
        "DATABASE_URL": database_url,
        "DATABASE_CONNECT_TIMEOUT": "2",
        "ANTHROPIC_API_KEY": "sk-ant-soak",
        "ANTHROPIC_BASE_URL": model.url,
        "ANTHROPIC_MAX_RETRIES": "0",
        "TELEGRAM_BOT_TOKEN": BOT_TOKEN,
        "TELEGRAM_WEBHOOK_SECRET": SECRETS["telegram"],
        "TELEGRAM_API_BASE": bot.url,
        "TWILIO_AUTH_TOKEN": SECRETS["twilio"],
        "PUBLIC_BASE_URL": PUBLIC_BASE_URL,
        "SUPABASE_JWT_SECRET": SECRETS["jwt"],
        "IDENTITY_POLICY": policy,
        "OWNER_USER_ID": OWNER,
        "OWNER_TELEGRAM_IDS": str(telegram_id(0)),
        "OWNER_WHATSAPP_NUMBERS": whatsapp_sender(1),
        "FALLBACK_REPLY": FALLBACK,
        "TELEGRAM_MODEL_DEADLINE": DEADLINE_S,
        "WHATSAPP_MODEL_DEADLINE": DEADLINE_S,
        "WEB_MODEL_DEADLINE": DEADLINE_S,
        "WORKERS": WORKERS,
        "THREADS": "8",
        # The owner writes from three devices at once here, past a person's 12 turns a minute;
        # the soak measures loss under load and faults, the budget has tests of its own.
        "TURNS_PER_MINUTE": "0",
    }


def run(work: Path) -> dict[str, Any]:
    data = work / "pgdata"
    server_url = start_embedded_postgres(data, delete_on_exit=True)
    try:
        with migrated_database(server_url) as database_url, ExitStack() as stack:
            proxy = ProxyProcess(database_url)
            stack.callback(proxy.close)
            model = FakeAnthropic(answer=answer_with_context_size)
            bot = FakeTelegram(BOT_TOKEN)
            stack.callback(model.close)
            stack.callback(bot.close)
            proxied = proxy.url
            urls: dict[str, str] = {}
            for policy in ("auto", "owner"):
                environment = deployment_environment(proxied, model, bot, policy)
                targets = ("telegram_webhook", "whatsapp_webhook", "web_chat") if policy == "auto" else (
                    "telegram_webhook",
                    "whatsapp_webhook",
                )
                for target in targets:
                    log = work / f"{policy}-{target}.log"
                    urls[f"{policy}/{target}"] = stack.enter_context(function_server(target, environment, log))
            lab = Lab(proxy=proxy, model=model, bot=bot, database_url=database_url, pgdata=data)
            records = work / "records.jsonl"
            phases, load_average = drive(lab, urls, records)
            sent = [json.loads(line) for line in records.read_text().splitlines()]
            results = check(database_url, sent, bot, phases, owner=OWNER)
            # The machine is shared: how busy it was says how far the latencies can be trusted.
            results["load_detail"]["machine_load_average_1m"] = round(load_average, 2)
            return results
    finally:
        stop_embedded_postgres(data)


def drive(lab: Lab, urls: dict[str, str], records: Path) -> tuple[dict[str, tuple[float, float]], float]:
    """Start locust, run the timeline, wait for it; the phases' (start, end) epoch times,
    and the machine's load average at the end of the `load` phase."""
    began = time.time()
    fault_time = sum(fault.window_s for fault in FAULTS)
    stop_at = began + WARM_UP_S + LOAD_S + fault_time
    give_up_at = stop_at + DRAIN_S - 5
    environment = {
        **os.environ,
        "SOAK_RECORDS": str(records),
        "SOAK_STOP_AT": str(stop_at),
        "SOAK_GIVE_UP_AT": str(give_up_at),
        "SOAK_TELEGRAM_URL": urls["auto/telegram_webhook"],
        "SOAK_WHATSAPP_URL": urls["auto/whatsapp_webhook"],
        "SOAK_WEB_URL": urls["auto/web_chat"],
        "SOAK_OWNER_TELEGRAM_URL": urls["owner/telegram_webhook"],
        "SOAK_OWNER_WHATSAPP_URL": urls["owner/whatsapp_webhook"],
        "SOAK_OWNER_USER_ID": OWNER,
        "SOAK_TELEGRAM_SECRET": SECRETS["telegram"],
        "SOAK_TWILIO_TOKEN": SECRETS["twilio"],
        "SOAK_JWT_SECRET": SECRETS["jwt"],
        "SOAK_PUBLIC_BASE_URL": PUBLIC_BASE_URL,
    }
    run_time = int(stop_at + DRAIN_S - began)
    locust = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "locust"),
            "-f",
            str(ROOT / "bench" / "soak_people.py"),
            "--headless",
            "--users",
            str(PEOPLE - 1 + OWNER_DEVICES),
            "--spawn-rate",
            "50",
            "--run-time",
            f"{run_time}s",
            "--stop-timeout",
            "30",
            "--only-summary",
            "--loglevel",
            "WARNING",
        ],
        cwd=ROOT,
        env=environment,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    phases: dict[str, tuple[float, float]] = {}
    _sleep_until(began + WARM_UP_S)
    start = time.time()
    print(f"load: {LOAD_S:g} s, the model answering at once", flush=True)
    _sleep_until(start + LOAD_S)
    phases["load"] = (start, time.time())
    load_average = os.getloadavg()[0]
    lab.model.latency_s = MODEL_LATENCY_S
    for fault in FAULTS:
        start = time.time()
        print(f"{fault.name}: {fault.window_s:g} s, the model answering in 0.3-1.5 s", flush=True)
        fault.run(lab, start)
        _sleep_until(start + fault.window_s)
        phases[fault.name] = (start, time.time())
    print(f"drain: {DRAIN_S:g} s, retries only", flush=True)
    locust.wait(timeout=run_time + 120)
    return phases, load_average


def _sleep_until(moment: float) -> None:
    time.sleep(max(0.0, moment - time.time()))


def table(results: dict[str, Any]) -> str:
    load = results["load"]
    lines = [
        "| load | rps | p50 ms | p95 ms | p99 ms | errors | lost | duplicated | misplaced |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| 200 people | {load['rps']} | {load['p50_ms']} | {load['p95_ms']} | {load['p99_ms']} | {load['errors']} "
        f"| {load['lost']} | {load['duplicated']} | {load['misplaced']} |",
        "",
        "| fault | sent | answered | lost | duplicated | answered without memory | retried deliveries |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, figures in results["faults"].items():
        detail = results["faults_detail"][name]
        lines.append(
            f"| `{name}` | {detail['sent']} | {figures['answered']} | {figures['lost']} | {figures['duplicated']} "
            f"| {detail['answered_without_memory']} | {detail['retried']} |"
        )
    return "\n".join(lines)


def measure(keep: Path | None = None) -> dict[str, Any]:
    """The whole soak: `load`, `load_detail`, `faults`, `faults_detail`, `soak_totals`. Its
    records and the functions' logs go to a scratch directory, or to `keep`."""
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        return run(keep)
    with tempfile.TemporaryDirectory(prefix="crossmem-soak-") as directory:
        return run(Path(directory))


def main() -> None:
    keep = Path(sys.argv[2]) if sys.argv[1:2] == ["--keep"] and len(sys.argv) > 2 else None
    results = measure(keep)
    stored = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    stored.update(results)
    RESULTS.write_text(json.dumps(stored, indent=2) + "\n")
    print()
    print(table(results))
    print(f"\nwritten to {RESULTS.relative_to(ROOT)} (load, load_detail, faults, faults_detail, soak_totals)")


if __name__ == "__main__":
    main()
