"""`make bench`: every figure of the README, measured now, into bench/results.json.

The database: BENCH_DATABASE_URL (or TEST_DATABASE_URL) when set, else the embedded
wheel; either way a fresh, migrated database that is dropped afterwards. The soak
(bench/soak.py, also `make soak`) always runs on an embedded server of its own, which it
restarts on purpose.
"""

from __future__ import annotations

import json
import os
import platform
from typing import Any

from bench import (
    caching,
    follow_ups,
    fuzz,
    fuzz_budget,
    media,
    memory_recall,
    purge,
    recall,
    soak,
    telegram_live,
    turn_speed,
)
from bench.memory_core import context_load_ms_p50, round_trips_per_turn
from bench.results import RESULTS, ROOT, bench_database

CHART = ROOT / "docs" / "caching.png"


def measure(database_url: str) -> dict[str, Any]:
    results: dict[str, Any] = {}
    print("round trips ...", flush=True)
    results["round_trips_per_turn"] = round_trips_per_turn(database_url)
    results.update(turn_speed.measure(database_url))
    print("prompt caching over 60 turns ...", flush=True)
    results.update(caching.run(CHART))
    # Memory notes (issue 14): the recall of planted facts after three days.
    print("recall after three days ...", flush=True)
    results.update(recall.run())
    print("cold start, beside the commit before media ...", flush=True)
    results["cold_start_ms"] = media.cold_start_side_by_side(database_url)
    print("photos and voice notes ...", flush=True)
    results.update(media.run(database_url))
    print("context load at 10,000 and 1,000,000 stored messages ...", flush=True)
    load = context_load_ms_p50(database_url)
    sizes = ("10000", "1000000")
    results["context_load_ms_p50"] = {size: load[f"load_{size}"] for size in sizes}
    results["begin_turn_ms_p50"] = {size: load[f"turn_{size}"] for size in sizes}
    results["context_load_plan"] = {size: load[f"plan_{size}"] for size in sizes}
    print("crossmem purge on 1,000,000 messages ...", flush=True)
    results.update(purge.run(database_url))
    print(f"fuzzing, {fuzz.CASES} hostile and fuzzed requests ...", flush=True)
    results["fuzz"] = fuzz.run(database_url)
    print(f"Telegram replies you can watch, {telegram_live.TURNS} turns ...", flush=True)
    results["telegram_live"] = telegram_live.run(database_url)
    print(f"fuzzing over budget, {fuzz_budget.CASES} cases ...", flush=True)
    results["fuzz_budget_on"] = fuzz_budget.run(database_url)
    # Last: it seeds 100,000 follow-ups that no part after it should meet.
    print(f"follow-ups: {follow_ups.DUE} due, the job every minute, {follow_ups.BACKGROUND:,} pending ...", flush=True)
    results["follow_ups"] = follow_ups.run(database_url)
    results["ratios"] = {
        **turn_speed.ratios(results),
        "context_load_1m_over_10k": round(
            results["context_load_ms_p50"]["1000000"] / results["context_load_ms_p50"]["10000"], 2
        ),
        "begin_turn_1m_over_10k": round(
            results["begin_turn_ms_p50"]["1000000"] / results["begin_turn_ms_p50"]["10000"], 2
        ),
    }
    results["machine"] = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "database": describe(database_url),
    }
    return results


def describe(database_url: str) -> str:
    return "embedded Postgres (unix socket)" if "host=/" in database_url else "Postgres over TCP loopback"


def table(results: dict[str, Any]) -> str:
    rt, ov, slow, tps = (
        results[k] for k in ("round_trips_per_turn", "turn_overhead_ms_p50", "turn_overhead_ms_p50_rtt1", "turns_per_s")
    )
    first = results["begin_turn_ms_p50"]
    cache, cost, cold, load, ratios = (
        results[k] for k in ("cache_read_share", "input_cost_ratio", "cold_start_ms", "context_load_ms_p50", "ratios")
    )
    rows = [
        ("round trips, Telegram/WhatsApp turn", rt["ours_secondary"], rt["seed_secondary"], ""),
        ("round trips, web turn", rt["ours_web"], rt["seed_web"], ""),
        (
            "turn's database work, p50 ms, loopback",
            ov["ours"],
            ov["seed"],
            f"seed/ours {ratios['turn_overhead_seed_over_ours']}",
        ),
        (
            "same, +1 ms a round trip, p50 ms",
            slow["ours"],
            slow["seed"],
            f"seed/ours {ratios['turn_overhead_rtt1_seed_over_ours']}",
        ),
        (
            "turns/s, 8 threads, +1 ms a round trip",
            tps["ours"],
            tps["seed"],
            f"ours/seed {ratios['turns_per_s_ours_over_seed']}",
        ),
        ("input tokens read from cache, 60 turns", cache["ours"], cache["seed"], "share"),
        ("input cost vs. no caching, 60 turns", cost["ours"], cost["seed"], "ratio"),
        (
            "context load p50 ms, 10k / 1M messages",
            f"{load['10000']} / {load['1000000']}",
            "",
            f"1M/10k {ratios['context_load_1m_over_10k']}",
        ),
        (
            "whole begin_turn p50 ms, 10k / 1M messages",
            f"{first['10000']} / {first['1000000']}",
            "",
            f"1M/10k {ratios['begin_turn_1m_over_10k']}",
        ),
        (
            "cold start to first Telegram answer, ms",
            cold["telegram"],
            "",
            f"`import anthropic` alone: {cold['anthropic_import']}",
        ),
        (
            "purge of 1M messages: longest statement ms / rows/s",
            f"{results['purge_max_statement_ms']} / {results['purge_rows_per_s']}",
            "",
            f"batches of {results['purge_setup']['batch']}",
        ),
    ]
    if "fuzz" in results:
        fuzzed = results["fuzz"]
        rows.append(
            (
                "fuzzing: 5xx / stored unauthenticated / reached a turn",
                f"{fuzzed['status_500']} / {fuzzed['stored_unauthenticated']} / {fuzzed['reached_turn']}",
                "",
                f"of {fuzzed['cases']} cases, {fuzzed['authenticated']} authenticated",
            )
        )
    if "telegram_live" in results:
        live = results["telegram_live"]
        rows.append(
            (
                "Telegram: first text / whole reply, ms p50",
                f"{live['first_text_ms_p50']} / {live['reply_ms_p50']}",
                "",
                f"{live['bot_api_calls_per_turn']} Bot API calls a turn (`telegram_live`)",
            )
        )
    if "fuzz_budget_on" in results:
        over = results["fuzz_budget_on"]
        rows.append(
            (
                "fuzzing over budget: reached the model / stored",
                f"{over['over_budget_reached_model']} / {over['stored']}",
                "",
                f"of {over['cases']} cases (`fuzz_budget_on`)",
            )
        )
    if "follow_ups" in results:
        due = results["follow_ups"]
        rows.append(
            (
                "follow-ups: lag p95 s / longest claim ms",
                f"{due['delivery_lag_s_p95']} / {due['claim_ms_max']}",
                "",
                f"job every minute, {due['setup']['pending']:,} pending (`follow_ups`)",
            )
        )
    lines = ["| figure | ours | seed | note |", "|---|---:|---:|---|"]
    lines += [f"| {name} | {ours} | {seed} | {note} |" for name, ours, seed, note in rows]
    return "\n".join(lines)


def notes_table(results: dict[str, Any]) -> str:
    """Memory notes: the window's size and cost beside the seed's, and what is recalled."""
    shown, recalled = results["context_messages_mean"], results["fact_recall_after_3_days"]
    cost, small = results["input_cost_by_model"], caching.SMALL_CACHE_MODEL
    more = round(shown["ours"] / shown["seed"], 2)
    rows = [
        ("messages in the context, mean", shown["ours"], shown["seed"], f"ours/seed {more}"),
        ("input cost vs. the seed's, absolute", results["input_cost_vs_seed"], 1, "notes included"),
        ("same, with automatic caching", cost[caching.MODEL]["automatic_vs_seed"], 1, "one top-level cache_control"),
        (f"same, {small}", cost[small]["ours_vs_seed"], 1, "4,096-token minimum"),
        ("planted facts in the request after 3 days", recalled["ours"], recalled["seed"], "share, offline digest"),
    ]
    lines = ["| figure | ours | seed | note |", "|---|---:|---:|---|"]
    lines += [f"| {name} | {ours} | {seed} | {note} |" for name, ours, seed, note in rows]
    lines += [
        "",
        "| window / step / web prepend | messages, mean | input cost ratio | vs. seed | vs. seed, 4,096-token model |",
        "|---|---:|---:|---:|---:|",
    ]
    for size in results["caching_by_window"]:
        default, small = size[caching.MODEL], size[caching.SMALL_CACHE_MODEL]
        lines.append(
            f"| {size['max_messages']} / {size['step']} / {size['web_prepend']} | {size['context_messages_mean']}"
            f" | {default['ours']} | {default['ours_vs_seed']} | {small['ours_vs_seed']} |"
        )
    return "\n".join(lines)


def main() -> None:
    with bench_database() as database_url:
        results = measure(database_url)
    # On a database of its own: its 1,000,000 messages are the only ones there.
    print("memory search: recall over four months, and latency at 1,000,000 messages ...", flush=True)
    with bench_database() as database_url:
        results.update(memory_recall.measure(database_url))
    print("load and faults (make soak) ...", flush=True)
    results.update(soak.measure())
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print()
    print(table(results))
    print()
    print(soak.table(results))
    print()
    print(notes_table(results))
    print(f"\nwritten to {RESULTS.relative_to(ROOT)} and {CHART.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
