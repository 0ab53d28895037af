"""Over budget, no combination of conversation ids, client ids, surfaces or streaming reaches
the model: bench/fuzz_budget.py's property, here on fewer cases (`make bench` runs 2,000)."""

from __future__ import annotations

from bench.fuzz_budget import run


def test_over_budget_nothing_reaches_the_model_whatever_the_ids(database_url: str) -> None:
    assert run(database_url, cases=150) == {
        "cases": 150,
        "over_budget_reached_model": 0,
        "stored": 0,
        "status_500": 0,
    }
