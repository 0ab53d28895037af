"""`make bench` cannot rot: every part of it runs here at its quick size (bench/__main__.py's QUICK:
seconds each), in the order and on the one database `make bench` uses, and the tables are built
from what the parts answered. A change that breaks a part fails `make test`, not the next bench run.

No figure is asserted (the sizes are too small, and the machine is shared); only what holds at
any size: the turn's two round trips, no 5xx, nothing stored without credentials or past the
budget, every follow-up sent (the part asserts it), the purge deleting (idem).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import turn_sql
from bench.__main__ import PARTS, QUICK, measure, notes_table, table
from tests.database import migrated_database


@pytest.mark.timeout(300)  # about 30 s; a loaded machine's minutes are not a failure
def test_every_part_of_make_bench_runs_at_its_quick_size(postgres_server: str, tmp_path: Path) -> None:
    assert set(QUICK) == set(PARTS)  # a new part gets a quick size, or it would not run here
    chart = tmp_path / "caching.png"
    with migrated_database(postgres_server) as database_url:
        results = measure(database_url, QUICK, chart=chart)

    assert chart.read_bytes().startswith(b"\x89PNG")
    assert "| follow-ups: lag p95 s / longest claim ms |" in table(results)
    assert "| planted facts in the request after 3 days |" in notes_table(results)
    assert results["round_trips_per_turn"]["ours_secondary"] == 2
    # every part of the turn's SQL could be taken out (bench/turn_sql.py), the floor laid beside them
    assert list(results["turn_sql"]["us_per_turn"]) == ["schema", *turn_sql.WITHOUT, turn_sql.EVERY_PART, "floor"]
    assert list(results["turn_sql"]["whole_turns"]["over_floor"]) == ["schema", turn_sql.EVERY_PART, "floor"]
    assert results["round_trips_per_turn"]["ours_web"] == 2
    assert list(results["web_turn_ms_p50"]) == ["10", "400"]  # a web conversation of each length, ours and the seed's
    assert "| web turn p50 ms, a conversation of 10 / 400 messages |" in table(results)
    assert (results["fuzz"]["status_500"], results["fuzz"]["stored_unauthenticated"]) == (0, 0)
    assert results["fuzz"]["cases"] == QUICK["fuzz"]["cases"]
    over_budget = results["fuzz_budget_on"]
    assert (over_budget["over_budget_reached_model"], over_budget["stored"], over_budget["status_500"]) == (0, 0, 0)
    assert results["follow_ups"]["setup"]["due"] == QUICK["follow_ups"]["due"]
    assert results["purge_setup"]["deleted"] > 0
    assert results["media"]["photo_turn_input_tokens"] > results["media"]["text_turn_input_tokens"]
