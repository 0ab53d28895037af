"""The database under test: TEST_DATABASE_URL's server, or the embedded wheel.

Each test run gets a database of its own, made like a Supabase project (stand-ins, then
migrations) and dropped at the end, so runs never see each other's rows.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlparse, urlunparse

import psycopg

from core.embedded import prepare_database, start_embedded_postgres, stop_embedded_postgres


def with_database(conninfo: str, database: str) -> str:
    parsed = urlparse(conninfo)
    return urlunparse(parsed._replace(path=f"/{database}"))


@contextmanager
def server_url() -> Iterator[str]:
    configured = os.environ.get("TEST_DATABASE_URL")
    if configured:
        yield configured
        return
    with tempfile.TemporaryDirectory(prefix="crossmem-pg-") as directory:
        data = Path(directory) / "data"
        try:
            yield start_embedded_postgres(data, delete_on_exit=True)
        finally:
            stop_embedded_postgres(data)


@contextmanager
def fresh_database(server: str) -> Iterator[str]:
    name = f"crossmem_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f'create database "{name}"')
    url = with_database(server, name)
    try:
        yield url
    finally:
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(f'drop database if exists "{name}" with (force)')


@contextmanager
def migrated_database(server: str) -> Iterator[str]:
    with fresh_database(server) as url:
        prepare_database(url)
        yield url
