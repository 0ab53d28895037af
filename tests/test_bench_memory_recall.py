"""bench/memory_recall.py in its quick mode: the recall bench and the search latency run end to end
in `make test`, so a change that breaks them fails CI (figures are never asserted as timings)."""

from __future__ import annotations

from bench import memory_recall
from tests.database import migrated_database


def test_the_memory_recall_bench_runs_and_writes_its_keys(postgres_server: str) -> None:
    with migrated_database(postgres_server) as url:
        figures = memory_recall.measure(url, quick=True)
    recall = figures["memory_recall"]
    assert set(recall) == {"with_search", "notes_only", "with_search_by_days_before", "configurations", "setup"}
    assert recall["setup"]["questions"] == 8 and recall["setup"]["messages_each"] == 30 * 3 * 8 * 2
    assert 0 <= recall["notes_only"] <= recall["with_search"] <= 1
    assert set(recall["configurations"]) == {"ours_search_memory", *memory_recall.ALTERNATIVES}
    assert figures["search_setup"]["samples"] == 20 and figures["search_setup"]["stored_messages"] >= 20_000 - 2_000
    assert 0 < figures["search_ms_p50"] <= figures["search_ms_p95"]
