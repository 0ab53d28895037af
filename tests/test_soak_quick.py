"""`make soak` cannot rot either: the whole soak runs here at bench/soak.py's QUICK timeline (an
embedded Postgres of its own, the latency proxy, the functions under gunicorn, locust's people,
each fault in a tenth of its window, the check against the database), in about half a minute,
mostly waiting. No figure is asserted: a few people for seconds measure nothing; the run must
finish, and every phase be checked and shown."""

from __future__ import annotations

import pytest

from bench import soak
from bench.soak_faults import FAULTS


@pytest.mark.timeout(300)  # about 35 s; a loaded machine's minutes are not a failure
def test_the_whole_soak_runs_at_its_quick_timeline() -> None:
    results = soak.measure(timeline=soak.QUICK)
    assert list(results["faults"]) == [fault.name for fault in FAULTS]
    assert results["soak_totals"]["sent"] > 0 and results["soak_totals"]["answered"] > 0
    shown = soak.table(results)
    assert all(f"| `{fault.name}` |" in shown for fault in FAULTS)
