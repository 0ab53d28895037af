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

`python -m bench.soak --quick` (and tests/test_soak_quick.py in `make test`) runs all of it at
QUICK's timeline: a few people, each fault in a tenth of its window, in about half a minute. Its
figures mean nothing and are not written.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.latency_proxy import ProxyProcess
from bench.soak_check import check
from bench.soak_faults import FAULTS, Fault, Lab
from bench.soak_identities import OWNER_DEVICES, telegram_id, whatsapp_sender
from core.stores.embedded import start_embedded_postgres, stop_embedded_postgres
from tests.database import migrated_database
from tests.fakes.anthropic_api import FakeAnthropic, echo_last_message
from tests.fakes.telegram_api import FakeTelegram

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results.json"
OWNER = str(uuid.uuid5(uuid.NAMESPACE_URL, "crossmem-soak-owner"))
BOT_TOKEN = "123456789:SOAK-token"
SECRETS = {"telegram": "soak-telegram-secret", "twilio": "soak-twilio-token", "jwt": "soak-jwt-secret-32-bytes-long-xx"}
PUBLIC_BASE_URL = "https://soak.example.com/whatsapp_webhook"
FALLBACK = "Sorry, I can't answer right now."
DEADLINE_S = "4"  # the model's deadline on every surface; `model_slow` answers in 6 s
MODEL_LATENCY_S = (0.3, 1.5)


@dataclass(frozen=True)
class Timeline:
    """Who writes, how long each phase lasts, and how many workers serve each function."""

    people: int = 200  # the owner (on three devices at once) and people - 1 `auto` people
    warm_up_s: float = 45.0
    load_s: float = 30.0
    drain_s: float = 25.0
    pace: float = 1.0  # the faults' windows and the people's pauses, scaled by it
    workers: int = 2

    @property
    def faults(self) -> tuple[Fault, ...]:
        return tuple(fault.paced(self.pace) for fault in FAULTS)


FULL = Timeline()
# Every piece runs (the servers, locust, each fault, the check), too briefly to measure anything.
QUICK = Timeline(people=3, warm_up_s=3.0, load_s=2.0, drain_s=5.0, pace=0.1, workers=1)


# A tag's start, one for each of the person's messages (core/turn/context.py's `tag`).
TAG = re.compile(r"\[[a-z]+ · ")


def answer_with_context_size(body: dict[str, Any]) -> str:
    """The fake model's echo, led by how many of the person's messages it was shown (their tags,
    `[telegram · 09:12]`, `[whatsapp · Sun 6 Dec 2026 · 08:05]`): a turn answered without memory
    (the database was away) shows one, the new message."""
    shown = sum(
        len(TAG.findall(block.get("text", "")))
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
def function_servers(deployed: dict[str, tuple[str, dict[str, str]]], logs: Path) -> Iterator[dict[str, str]]:
    """Each function under functions-framework's gunicorn server, as Cloud Functions runs it:
    `deployed` names each (target, environment); yields each one's URL once all accept
    connections. Started and stopped side by side: a gunicorn takes seconds either way."""
    command = [str(Path(sys.executable).parent / "functions-framework"), "--source", "main.py", "--host", "127.0.0.1"]
    ports: dict[str, int] = {}
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for name, (target, environment) in deployed.items():
            ports[name] = free_port()
            with open(logs / f"{name.replace('/', '-')}.log", "w") as output:
                processes.append(
                    subprocess.Popen(
                        [*command, "--target", target, "--port", str(ports[name])],
                        cwd=ROOT,
                        env=environment,
                        stdout=output,
                        stderr=subprocess.STDOUT,
                    )
                )
        yield {name: listening(port) for name, port in ports.items()}
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(timeout=20)


def listening(port: int) -> str:
    """The server's URL, once it accepts connections (20 s at most)."""
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.1)
    return f"http://127.0.0.1:{port}/"


def deployment_environment(
    database_url: str, model: FakeAnthropic, bot: FakeTelegram, policy: str, workers: int
) -> dict[str, str]:
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
        # What whatsapp_webhook needs outside APP_ENV=local, something to send later from; the soak
        # sends nothing later (no scheduled job runs), and nothing listens at this base.
        "TWILIO_ACCOUNT_SID": "AC" + "5" * 32,
        "TWILIO_WHATSAPP_FROM": "whatsapp:+14155238886",
        "TWILIO_API_BASE": "http://127.0.0.1:9",
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
        "WORKERS": str(workers),
        "THREADS": "8",
        # The owner writes from three devices at once here, past a person's 12 turns a minute;
        # the soak measures loss under load and faults, the budget has tests of its own.
        "TURNS_PER_MINUTE": "0",
    }


def run(work: Path, timeline: Timeline = FULL) -> dict[str, Any]:
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
            deployed: dict[str, tuple[str, dict[str, str]]] = {}
            for policy in ("auto", "owner"):
                environment = deployment_environment(proxied, model, bot, policy, timeline.workers)
                targets = (
                    ("telegram_webhook", "whatsapp_webhook", "web_chat")
                    if policy == "auto"
                    else (
                        "telegram_webhook",
                        "whatsapp_webhook",
                    )
                )
                for target in targets:
                    deployed[f"{policy}/{target}"] = (target, environment)
            urls = stack.enter_context(function_servers(deployed, work))
            lab = Lab(proxy=proxy, model=model, bot=bot, database_url=database_url, pgdata=data)
            records = work / "records.jsonl"
            phases, load_average = drive(lab, urls, records, timeline)
            assert not lab.failed_actions, f"faults not done as planned: {lab.failed_actions}"
            sent = [json.loads(line) for line in records.read_text().splitlines()]
            results = check(database_url, sent, bot, phases, owner=OWNER)
            # The machine is shared: how busy it was says how far the latencies can be trusted.
            results["load_detail"]["machine_load_average_1m"] = round(load_average, 2)
            return results
    finally:
        stop_embedded_postgres(data)


def drive(
    lab: Lab, urls: dict[str, str], records: Path, timeline: Timeline
) -> tuple[dict[str, tuple[float, float]], float]:
    """Start locust, run the timeline, wait for it; the phases' (start, end) epoch times,
    and the machine's load average at the end of the `load` phase."""
    began = time.time()
    faults = timeline.faults
    stop_at = began + timeline.warm_up_s + timeline.load_s + sum(fault.window_s for fault in faults)
    give_up_at = stop_at + timeline.drain_s - 5
    environment = {
        **os.environ,
        "SOAK_PACE": str(timeline.pace),
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
    run_time = int(stop_at + timeline.drain_s - began)
    locust = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "locust"),
            "-f",
            str(ROOT / "bench" / "soak_people.py"),
            "--headless",
            "--users",
            str(timeline.people - 1 + OWNER_DEVICES),
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
    _sleep_until(began + timeline.warm_up_s)
    start = time.time()
    print(f"load: {timeline.load_s:g} s, the model answering at once", flush=True)
    _sleep_until(start + timeline.load_s)
    phases["load"] = (start, time.time())
    load_average = os.getloadavg()[0]
    lab.model.latency_s = MODEL_LATENCY_S
    for fault in faults:
        start = time.time()
        print(f"{fault.name}: {fault.window_s:g} s, the model answering in 0.3-1.5 s", flush=True)
        fault.run(lab, start)
        _sleep_until(start + fault.window_s)
        phases[fault.name] = (start, time.time())
    print(f"drain: {timeline.drain_s:g} s, retries only", flush=True)
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


def measure(keep: Path | None = None, timeline: Timeline = FULL) -> dict[str, Any]:
    """The whole soak: `load`, `load_detail`, `faults`, `faults_detail`, `soak_totals`. Its
    records and the functions' logs go to a scratch directory, or to `keep`."""
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        return run(keep, timeline)
    with tempfile.TemporaryDirectory(prefix="crossmem-soak-") as directory:
        return run(Path(directory), timeline)


def main() -> None:
    if sys.argv[1:2] == ["--quick"]:
        print(table(measure(timeline=QUICK)))
        print("\nquick run: every piece ran, too briefly for its figures to mean anything (nothing written)")
        return
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
