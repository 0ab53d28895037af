"""`make bench`: every figure of the README, measured now, into bench/results.json.

The database: BENCH_DATABASE_URL (or TEST_DATABASE_URL) when set, else the embedded
wheel; either way a fresh, migrated database that is dropped afterwards. The soak
(bench/soak.py, also `make soak`) always runs on an embedded server of its own, which it
restarts on purpose.

`python -m bench --quick` runs every part (not the soak: `python -m bench.soak --quick`) at
QUICK's sizes, in well under a minute, and prints the tables; it writes nothing. `make test` runs
the same (tests/test_bench_quick.py), so a part that breaks fails CI. A new part takes its sizes
as parameters, joins PARTS and gets a QUICK entry.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
from pathlib import Path
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
    turn_cpu,
    turn_floor,
    turn_speed,
    turn_sql,
    web_window,
)
from bench.memory_core import CONTEXT_SIZES, context_load_ms_p50, round_trips_per_turn
from bench.results import RESULTS, ROOT, bench_database
from tests.database import over_tcp

CHART = ROOT / "docs" / "caching.png"
# The parts of `make bench`, each measured by `measure` in this order (the soak after them).
PARTS = (
    "round_trips",
    "turn_speed",
    "turn_floor",
    "turn_cpu",
    "turn_sql",
    "caching",
    "recall",
    "cold_start",
    "media",
    "context_load",
    "web_window",
    "purge",
    "fuzz",
    "telegram_live",
    "fuzz_budget",
    "follow_ups",
)


# Every part at the size that makes its figures (each part's own defaults).
FULL: dict[str, dict[str, Any]] = {part: {} for part in PARTS}
# `python -m bench --quick`, and tests/test_bench_quick.py in `make test`: every part at a size that
# runs in seconds, so a change that breaks a part fails CI. Its figures mean nothing: none is kept.
QUICK: dict[str, dict[str, Any]] = {
    "round_trips": {},
    "turn_speed": {"turns": 6, "turns_rtt1": 3, "seconds": 0.2, "rounds": 1, "people_per_driver": 2},
    "turn_floor": {"turns": 6, "turns_rtt1": 3, "seconds": 0.2, "rounds": 1, "people_per_driver": 2},
    "turn_cpu": {"turns": 5, "rounds": 1, "people_per_driver": 2},
    "turn_sql": {"history": 1, "turns": 2, "rounds": 1, "whole_turn_rounds": 1, "seconds": 0.2},
    "caching": {"people": 1, "windows": caching.WINDOWS[:1]},
    "recall": {},
    "cold_start": {"runs": 1, "warm": False},
    "media": {"voice_turns": 1},
    "context_load": {"sizes": (1_000, 4_000), "samples": 4},
    "web_window": {"lengths": (10, 400), "turns": 3},
    "purge": {"messages": 2_000, "people": 20, "batch": 300},
    "fuzz": {"cases": 2 * len(fuzz.TARGETS)},
    "telegram_live": {"turns": 1, "words": 6},
    "fuzz_budget": {"cases": 6},
    "follow_ups": {"people": 20, "background": 200, "due": 10, "window_min": 3, "burst_claims": 2},
}


def measure(database_url: str, sizes: dict[str, dict[str, Any]] = FULL, chart: Path = CHART) -> dict[str, Any]:
    results: dict[str, Any] = {}
    print("round trips ...", flush=True)
    results["round_trips_per_turn"] = round_trips_per_turn(database_url, **sizes["round_trips"])
    results.update(turn_speed.measure(database_url, **sizes["turn_speed"]))
    # The floor right after, on the same server: the turn is compared with it in this run (issue 33).
    print("the floor: the turn's two functions as one insert each ...", flush=True)
    schema = {key: results[key] for key in turn_speed.FIGURES}
    floor = turn_floor.measure_floor(database_url, **sizes["turn_floor"])
    results["turn_floor"] = {"schema": {**schema, "ratios": turn_speed.ratios(schema)}, "floor": floor}
    print("the turn's CPU around its two calls, part by part ...", flush=True)
    results["turn_cpu"] = turn_cpu.measure(database_url, **sizes["turn_cpu"])
    print("the turn's database time, each part taken out ...", flush=True)
    results["turn_sql"] = turn_sql.measure(database_url, **sizes["turn_sql"])
    print("prompt caching over 60 turns ...", flush=True)
    results.update(caching.run(chart, **sizes["caching"]))
    # Memory notes (issue 14): the recall of planted facts after three days.
    print("recall after three days ...", flush=True)
    results.update(recall.run(**sizes["recall"]))
    print("cold start, beside the commit before media ...", flush=True)
    results["cold_start_ms"] = media.cold_start_side_by_side(database_url, **sizes["cold_start"])
    print("photos and voice notes ...", flush=True)
    results.update(media.run(database_url, **sizes["media"]))
    load_sizes = sizes["context_load"].get("sizes", CONTEXT_SIZES)
    print(f"context load at {' and '.join(f'{size:,}' for size in load_sizes)} stored messages ...", flush=True)
    load = context_load_ms_p50(database_url, **sizes["context_load"])
    results["context_load_ms_p50"] = {str(size): load[f"load_{size}"] for size in load_sizes}
    results["begin_turn_ms_p50"] = {str(size): load[f"turn_{size}"] for size in load_sizes}
    results["context_load_plan"] = {str(size): load[f"plan_{size}"] for size in load_sizes}
    lengths = sizes["web_window"].get("lengths", web_window.LENGTHS)
    print(f"a web turn in conversations of {' and '.join(f'{n:,}' for n in lengths)} messages ...", flush=True)
    results["web_turn_ms_p50"] = web_window.measure(database_url, **sizes["web_window"])
    print("crossmem purge ...", flush=True)
    results.update(purge.run(database_url, **sizes["purge"]))
    print("fuzzing, hostile and fuzzed requests ...", flush=True)
    results["fuzz"] = fuzz.run(database_url, **sizes["fuzz"])
    print("Telegram replies you can watch ...", flush=True)
    results["telegram_live"] = telegram_live.run(database_url, **sizes["telegram_live"])
    print("fuzzing over budget ...", flush=True)
    results["fuzz_budget_on"] = fuzz_budget.run(database_url, **sizes["fuzz_budget"])
    # Last: it seeds 100,000 follow-ups that no part after it should meet.
    print("follow-ups: the job every minute of a moved clock ...", flush=True)
    results["follow_ups"] = follow_ups.run(database_url, **sizes["follow_ups"])
    results["ratios"] = {
        **turn_speed.ratios(results),
        **turn_floor.floor_ratios(results, floor),
        "context_load_1m_over_10k": largest_over_smallest(results["context_load_ms_p50"]),
        "begin_turn_1m_over_10k": largest_over_smallest(results["begin_turn_ms_p50"]),
        "web_turn_5k_over_50": web_window.ratio(results["web_turn_ms_p50"]),
    }
    results["machine"] = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "database": describe(database_url),
    }
    return results


def largest_over_smallest(by_size: dict[str, float]) -> float:
    """The figure at the largest table over the one at the smallest (sizes in the order measured)."""
    figures = list(by_size.values())
    return round(figures[-1] / figures[0], 2)


def cpu_parts(split: dict[str, float]) -> str:
    return " / ".join(str(split[part]) for part in ("client", "postgres", "other"))


def describe(database_url: str) -> str:
    return "Postgres over TCP loopback" if over_tcp(database_url) else "embedded Postgres (unix socket)"


def table(results: dict[str, Any]) -> str:
    rt, ov, slow, tps = (
        results[k] for k in ("round_trips_per_turn", "turn_overhead_ms_p50", "turn_overhead_ms_p50_rtt1", "turns_per_s")
    )
    cache, cost, cold, ratios = (
        results[k] for k in ("cache_read_share", "input_cost_ratio", "cold_start_ms", "ratios")
    )
    floor = results["turn_floor"]["floor"]
    load = " / ".join(str(ms) for ms in results["context_load_ms_p50"].values())
    first = " / ".join(str(ms) for ms in results["begin_turn_ms_p50"].values())
    web = results["web_turn_ms_p50"]
    whole = results["turn_sql"]["whole_turns"]
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
        (
            "the floor (two one-row inserts): +1 ms p50 ms / turns/s",
            f"{floor['turn_overhead_ms_p50_rtt1']['ours']} / {floor['turns_per_s']['ours']}",
            "",
            f"turn/floor {ratios['turn_over_floor_rtt1']} at 1 ms, {ratios['turns_per_s_over_floor']} in turns/s",
        ),
        (
            "CPU µs a whole turn in turns/s: Python / Postgres / the rest",
            cpu_parts(tps["cpu_us_per_turn"]["ours"]),
            cpu_parts(tps["cpu_us_per_turn"]["seed"]),
            f"the floor's {cpu_parts(floor['turns_per_s']['cpu_us_per_turn']['ours'])}",
        ),
        (
            "client CPU µs a turn around its two calls",
            results["turn_cpu"]["around_calls"],
            "",
            f"whole turn {results['turn_cpu']['whole_turn']}, the calls alone {results['turn_cpu']['bare_calls']}",
        ),
        (
            "turns/s over the floor, every part of `turn_sql` taken out at once",
            whole["over_floor"][turn_sql.EVERY_PART],
            "",
            f"the schema's {whole['over_floor']['schema']} in the same rounds (`turn_sql.whole_turns`)",
        ),
        ("input tokens read from cache, 60 turns", cache["ours"], cache["seed"], "share"),
        ("input cost vs. no caching, 60 turns", cost["ours"], cost["seed"], "ratio"),
        (
            "context load p50 ms, 10k / 1M messages",
            load,
            "",
            f"1M/10k {ratios['context_load_1m_over_10k']}",
        ),
        (
            "whole begin_turn p50 ms, 10k / 1M messages",
            first,
            "",
            f"1M/10k {ratios['begin_turn_1m_over_10k']}",
        ),
        (
            f"web turn p50 ms, a conversation of {' / '.join(f'{int(n):,}' for n in web)} messages",
            " / ".join(str(by_length["ours"]) for by_length in web.values()),
            " / ".join(str(by_length["seed"]) for by_length in web.values()),
            f"longest/shortest {ratios['web_turn_5k_over_50']}",
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
    if "--quick" in sys.argv[1:]:
        quick()
        return
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


def quick() -> dict[str, Any]:
    """`python -m bench --quick`: every part at QUICK's sizes and the tables built from them;
    nothing written (the chart goes to a scratch directory)."""
    with bench_database() as database_url, tempfile.TemporaryDirectory(prefix="crossmem-bench-quick-") as scratch:
        results = measure(database_url, QUICK, chart=Path(scratch) / "caching.png")
        results.update(memory_recall.measure(database_url, quick=True))
        printed = "\n\n".join((table(results), notes_table(results)))
    print(f"\n{printed}\n\nquick run: every part ran, at sizes too small for its figures to mean anything")
    return results


if __name__ == "__main__":
    main()
