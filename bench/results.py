"""Where the figures go (bench/results.json) and the database they are measured on.

A part of the bench run alone (`python -m bench.fuzz`, ...) updates only its own key.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.database import migrated_database, server_url

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results.json"


@contextmanager
def bench_server() -> Iterator[str]:
    """The server of BENCH_DATABASE_URL (else TEST_DATABASE_URL's, else the embedded wheel's)."""
    configured = os.environ.get("BENCH_DATABASE_URL")
    if configured:
        os.environ["TEST_DATABASE_URL"] = configured
    with server_url() as server:
        yield server


@contextmanager
def bench_database() -> Iterator[str]:
    """A fresh, migrated database on bench_server(), dropped afterwards."""
    with bench_server() as server, migrated_database(server) as database_url:
        yield database_url


def save(key: str, figures: Any) -> None:
    """Put one part's figures under `key`, keeping the others'."""
    results: dict[str, Any] = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    results[key] = figures
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")


def run_alone(key: str, run: Callable[[str], Any]) -> None:
    """`python -m bench.<part>`: that part alone, on a fresh database, its figures under `key`."""
    with bench_database() as database_url:
        figures = run(database_url)
    save(key, figures)
    print(json.dumps(figures))
