"""The turn's speed (`python -m bench.turn_speed`): the turn's database work on loopback and with
1 ms round trips, and whole turns per second, ours beside the seed's. make bench measures them
here; run alone, on a fresh database, they are printed and, with `--save`, written to
bench/results.json under the same keys (and their three ratios), the other figures kept. For
before/after comparisons of the turn's SQL, run back to back."""

from __future__ import annotations

import json
import sys
from typing import Any

from bench.latency_proxy import proxy_process
from bench.memory_core import PEOPLE_PER_DRIVER, turn_overhead_ms_p50, turns_per_s
from bench.results import RESULTS, bench_database, save

RTT = 0.001  # a round trip between a function and its database in one region
# The keys `measure` answers with.
FIGURES = ("turn_overhead_ms_p50", "turn_overhead_ms_p50_rtt1", "turns_per_s")


def measure(
    database_url: str,
    turns: int = 300,
    turns_rtt1: int = 150,
    seconds: float = 3.0,
    rounds: int = 3,
    people_per_driver: int = PEOPLE_PER_DRIVER,
) -> dict[str, Any]:
    print("turn overhead on loopback ...", flush=True)
    results = {"turn_overhead_ms_p50": turn_overhead_ms_p50(database_url, turns, people_per_driver)}
    print("turn overhead with 1 ms a round trip ...", flush=True)
    with proxy_process(database_url, RTT) as slow:
        results["turn_overhead_ms_p50_rtt1"] = turn_overhead_ms_p50(slow, turns_rtt1, people_per_driver)
    print("throughput, 8 threads, 1 ms a round trip ...", flush=True)
    with proxy_process(database_url, RTT) as slow:
        results["turns_per_s"] = turns_per_s(slow, seconds=seconds, rounds=rounds, people_per_driver=people_per_driver)
    return results


def ratios(results: dict[str, Any]) -> dict[str, float]:
    loopback, slow, throughput = (
        results["turn_overhead_ms_p50"],
        results["turn_overhead_ms_p50_rtt1"],
        results["turns_per_s"],
    )
    return {
        "turn_overhead_seed_over_ours": round(loopback["seed"] / loopback["ours"], 2),
        "turn_overhead_rtt1_seed_over_ours": round(slow["seed"] / slow["ours"], 2),
        "turns_per_s_ours_over_seed": round(throughput["ours"] / throughput["seed"], 2),
    }


def main() -> None:
    with bench_database() as database_url:
        results = measure(database_url)
    turn_ratios = ratios(results)
    if "--save" in sys.argv[1:]:
        for key, figures in results.items():
            save(key, figures)
        save("ratios", {**json.loads(RESULTS.read_text()).get("ratios", {}), **turn_ratios})
    print(json.dumps({**results, "ratios": turn_ratios}))


if __name__ == "__main__":
    main()
