"""After the soak: the database against what the people sent, phase by phase.

For each message sent (a JSON line of bench/soak_people.py):

- answered: some delivery of it got a 2xx answer (after the platform's retries);
- answered without memory: its answer shows the model saw only the new message although
  the person's thread already held messages (the database was away: the failure policy
  answers without history, and such a message cannot be stored);
- lost: answered, not answered without memory, and not stored;
- duplicated: stored more than once;
- misplaced: stored in another person's thread, or out of the order it was sent in.

A Telegram reply is also counted at the fake Bot API: a stored reply must reach the person
exactly once, and be marked delivered.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from typing import Any

import psycopg

from bench.soak_identities import web_user
from tests.fakes.telegram_api import FakeTelegram

TOKEN = re.compile(r"message (p\d+-m\d+):")
CONTEXT_SIZE = re.compile(r"ctx=(\d+) ")


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    return round(ordered[min(len(ordered) - 1, int(share * len(ordered)))], 1)


def check(
    database_url: str,
    sent: list[dict[str, Any]],
    bot: FakeTelegram,
    phases: dict[str, tuple[float, float]],
    *,
    owner: str,
) -> dict[str, Any]:
    with psycopg.connect(database_url) as connection:
        rows = connection.execute(
            "select id, user_id::text, surface, role, content, in_reply_to, delivered_at is not null"
            " from messages order by created_at, id"
        ).fetchall()
    stored: dict[str, list[tuple[Any, ...]]] = defaultdict(list)
    replies: dict[int, tuple[Any, ...]] = {}
    for row in rows:
        if row[3] == "user" and (found := TOKEN.search(row[4])):
            stored[found[1]].append(row)
        elif row[3] == "assistant":
            replies[row[5]] = row
    # A reply answers the last message it quotes (after a fallback, two questions are merged).
    answered_tokens = [
        (found[-1], str(payload["text"])) for payload in bot.sent() if (found := TOKEN.findall(str(payload["text"])))
    ]
    deliveries = Counter(token for token, _ in answered_tokens)
    telegram_answers = dict(answered_tokens)

    verdicts = judge(sent, stored, telegram_answers, owner)
    results: dict[str, Any] = {"faults": {}, "faults_detail": {}}
    for name, (start, end) in phases.items():
        mine = [record for record in sent if start <= record["sent_at"] < end]
        figures = summarise(mine, verdicts, stored, replies, deliveries)
        if name == "load":
            latencies = [record["latency_ms"] for record in mine if record.get("answered")]
            results["load"] = {
                "rps": round(figures["answered"] / (end - start), 1),
                "p50_ms": percentile(latencies, 0.50),
                "p95_ms": percentile(latencies, 0.95),
                "p99_ms": percentile(latencies, 0.99),
                "errors": figures["failed_attempts"],
                "lost": figures["lost"],
                "duplicated": figures["duplicated"],
                "misplaced": figures["misplaced"],
            }
            results["load_detail"] = {
                "sent": figures["sent"],
                "offered_per_s": round(figures["sent"] / (end - start), 1),
                "failed_statuses": failed_statuses(mine),
            }
            continue
        results["faults"][name] = {key: figures[key] for key in ("answered", "lost", "duplicated")}
        results["faults_detail"][name] = {"failed_statuses": failed_statuses(mine)} | {
            key: figures[key]
            for key in (
                "sent",
                "answered_without_memory",
                "message_without_reply",
                "retried",
                "failed_attempts",
                "misplaced",
                "telegram_replies_stored",
                "telegram_replies_delivered_once",
                "telegram_replies_undelivered",
                "telegram_replies_delivered_twice",
            )
        }
    whole = summarise(sent, verdicts, stored, replies, deliveries)
    results["soak_totals"] = {key: whole[key] for key in ("sent", "answered", "lost", "duplicated", "misplaced")}
    return results


def failed_statuses(records: list[dict[str, Any]]) -> dict[str, int]:
    """The answers that made a platform deliver again: HTTP statuses, 0 for a timeout."""
    failed = Counter(str(status) for record in records for status in record["statuses"] if not (200 <= status < 300))
    return dict(sorted(failed.items()))


def judge(
    sent: list[dict[str, Any]],
    stored: dict[str, list[tuple[Any, ...]]],
    telegram_answers: dict[str, str],
    owner: str,
) -> dict[str, dict[str, bool]]:
    """Per message: answered without memory, misplaced."""
    verdicts: dict[str, dict[str, bool]] = {}
    thread_has_messages: set[Any] = set()
    users_of_thread: dict[Any, set[str]] = defaultdict(set)
    for record in sorted(sent, key=lambda r: r["sent_at"]):
        token = record["token"]
        thread = "owner" if record["owner"] else (record["person"], record["surface"])
        answer = record.get("answer") or telegram_answers.get(token) or ""
        shown = CONTEXT_SIZE.search(answer)
        first = thread not in thread_has_messages or record.get("new_conversation", False)
        without_memory = bool(shown and shown[1] == "1" and not first)
        rows = stored.get(token, [])
        if rows:
            thread_has_messages.add(thread)
        expected = owner if record["owner"] else web_user(record["person"]) if record["surface"] == "web" else None
        misplaced = any(expected is not None and row[1] != expected for row in rows)
        users_of_thread[thread].update(row[1] for row in rows)
        verdicts[token] = {"without_memory": without_memory, "misplaced": misplaced}
    # Each `auto` thread is one person, and no two threads share one.
    owners_of_user: dict[str, set[Any]] = defaultdict(set)
    for thread, users in users_of_thread.items():
        for user in users:
            owners_of_user[user].add(thread)
    for record in sent:
        thread = "owner" if record["owner"] else (record["person"], record["surface"])
        rows = stored.get(record["token"], [])
        if len(users_of_thread[thread]) > 1 or any(len(owners_of_user[row[1]]) > 1 for row in rows):
            verdicts[record["token"]]["misplaced"] = True
    # Out of order: a thread's stored messages, in the database's order, against the order sent.
    by_thread: dict[Any, list[tuple[int, int]]] = defaultdict(list)
    for record in sent:
        key = (record["person"], record["surface"])
        for row in stored.get(record["token"], []):
            by_thread[key].append((row[0], record["sequence"]))
    for (person, _surface), pairs in by_thread.items():
        sequences = [sequence for _, sequence in sorted(pairs)]
        for earlier, later in zip(sequences, sequences[1:], strict=False):
            if later < earlier:
                verdicts[f"p{person}-m{later}"]["misplaced"] = True
    return verdicts


def summarise(
    records: list[dict[str, Any]],
    verdicts: dict[str, dict[str, bool]],
    stored: dict[str, list[tuple[Any, ...]]],
    replies: dict[int, tuple[Any, ...]],
    deliveries: Counter[str],
) -> Counter[str]:
    """A phase's counts; 0 for what none of its messages did (the quick soak's phases may be empty)."""
    figures: Counter[str] = Counter()
    for record in records:
        token = record["token"]
        rows = stored.get(token, [])
        verdict = verdicts[token]
        answered = bool(record.get("answered"))
        figures["sent"] += 1
        figures["answered"] += answered
        figures["retried"] += len(record["statuses"]) > 1
        figures["failed_attempts"] += sum(not 200 <= status < 300 for status in record["statuses"])
        figures["answered_without_memory"] += answered and verdict["without_memory"]
        figures["lost"] += answered and not verdict["without_memory"] and not rows
        figures["duplicated"] += len(rows) > 1
        figures["misplaced"] += verdict["misplaced"]
        reply = replies.get(rows[0][0]) if rows else None
        figures["message_without_reply"] += bool(rows) and reply is None and answered
        if record["surface"] == "telegram" and reply is not None:
            figures["telegram_replies_stored"] += 1
            count = deliveries[token]
            figures["telegram_replies_delivered_once"] += count == 1 and bool(reply[6])
            figures["telegram_replies_undelivered"] += count == 0
            figures["telegram_replies_delivered_twice"] += count > 1
    return figures
