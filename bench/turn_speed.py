"""The turn's speed alone (`python -m bench.turn_speed`): make bench's turn overhead on loopback and
with 1 ms round trips, and its turns per second, on a fresh database; printed, not written to
bench/results.json. For before/after comparisons of the turn's SQL, run back to back."""

from __future__ import annotations

import json

from bench.__main__ import RTT, bench_database
from bench.latency_proxy import proxy_process
from bench.memory_core import turn_overhead_ms_p50, turns_per_s


def main() -> None:
    with bench_database() as url:
        results = {"turn_overhead_ms_p50": turn_overhead_ms_p50(url)}
        with proxy_process(url, RTT) as slow:
            results["turn_overhead_ms_p50_rtt1"] = turn_overhead_ms_p50(slow, turns=150)
        with proxy_process(url, RTT) as slow:
            results["turns_per_s"] = turns_per_s(slow)
    loopback, slow_overhead, throughput = (
        results["turn_overhead_ms_p50"],
        results["turn_overhead_ms_p50_rtt1"],
        results["turns_per_s"],
    )
    results["ratios"] = {
        "turn_overhead_rtt1_seed_over_ours": round(slow_overhead["seed"] / slow_overhead["ours"], 2),
        "turns_per_s_ours_over_seed": round(throughput["ours"] / throughput["seed"], 2),
        "loopback_ours_ms": loopback["ours"],
    }
    print(json.dumps(results))


if __name__ == "__main__":
    main()
