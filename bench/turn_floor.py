"""The floor under the turn's speed (`python -m bench.turn_floor`): bench/turn_speed.py's three
figures, ours beside the seed's, on two fresh databases of one server, one after the other:

- `schema`: the real schema, as `python -m bench.turn_speed` measures it;
- `floor`: the same schema, but `begin_turn` and `finish_turn` replaced by one durable one-row
  insert each, with the same arguments and an answer of the same shape (no person, no delivery
  key, no context: an empty history).

The floor is what no SQL of ours can beat on the machine it runs on: the turn's two durable
round trips and our Python turn around them, the seed's eight statements measured beside it in
the same window. A ratio target above the floor's ratio cannot be met by any change to the SQL.
With `--save`, the figures go to bench/results.json under `turn_floor`.

`make bench` measures the floor too, right after bench/turn_speed.py's figures on its own
database (`measure_floor`, on a fresh database of the same server): `turn_floor` then holds both,
and `ratios` the turn over its floor (`floor_ratios`), so the two are compared in one run.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import psycopg

from bench import turn_speed
from bench.results import bench_server, save
from core.errors import ConfigurationError
from tests.database import SCRATCH_PREFIX, migrated_database, with_database

# The turn's two functions as the least a turn could do in their place: one row each, committed.
FLOOR_TABLE = """
create table public.floor_turn_rows (
    id bigint generated always as identity primary key,
    at timestamptz not null default clock_timestamp()
)
"""
FLOOR_BODIES = {
    "begin_turn": """
    with stored as (insert into public.floor_turn_rows default values returning id)
    select json_build_object('user_id', p_user_id, 'conversation_id', p_user_id, 'message_id', s.id,
                             'duplicate', false, 'reply', null, 'history', '[]'::json, 'prepend', '[]'::json)
      from stored s
    """,
    "finish_turn": """
    with stored as (insert into public.floor_turn_rows default values returning id)
    select jsonb_build_object('reply_id', s.id) from stored s
    """,
}


def lay_floor(database_url: str) -> None:
    """Replace begin_turn and finish_turn with the floor's, keeping each one's arguments and result
    type as the catalog has them (so the schema's next argument reaches the floor too). Only in a
    database the benchmarks made (tests/database.py's fresh_database names them)."""
    with psycopg.connect(database_url, autocommit=True) as connection:
        row = connection.execute("select current_database()").fetchone()
        if row is None or not str(row[0]).startswith(SCRATCH_PREFIX):
            raise ConfigurationError(f"the floor replaces the turn's functions: not in {row and row[0]!r}")
        connection.execute(FLOOR_TABLE)
        for name, body in FLOOR_BODIES.items():
            row = connection.execute(
                "select pg_get_function_arguments(p.oid), pg_get_function_result(p.oid)"
                " from pg_proc p where p.oid = %s::regproc",
                (f"public.{name}",),
            ).fetchone()
            assert row is not None, name
            arguments, result = row
            connection.execute(
                f"create or replace function public.{name}({arguments}) returns {result}"
                f" language sql set search_path = '' as $floor${body}$floor$"
            )


def measure_floor(database_url: str, **sizes: Any) -> dict[str, Any]:
    """turn_speed's figures on the floor: a fresh database of `database_url`'s server, dropped after."""
    with migrated_database(with_database(database_url, "postgres")) as floor_url:
        lay_floor(floor_url)
        results = turn_speed.measure(floor_url, **sizes)
    return {**results, "ratios": turn_speed.ratios(results)}


def floor_ratios(schema: dict[str, Any], floor: dict[str, Any]) -> dict[str, float]:
    """The turn against its floor, measured in one run: at 1 ms a round trip (target at most 1.2)
    and in turns a second (target at least 0.75)."""
    return {
        "turn_over_floor_rtt1": round(
            schema["turn_overhead_ms_p50_rtt1"]["ours"] / floor["turn_overhead_ms_p50_rtt1"]["ours"], 2
        ),
        "turns_per_s_over_floor": round(schema["turns_per_s"]["ours"] / floor["turns_per_s"]["ours"], 2),
    }


def measure() -> dict[str, Any]:
    figures: dict[str, Any] = {}
    with bench_server() as server:
        for name in ("schema", "floor"):
            print(f"{name}:", flush=True)
            with migrated_database(server) as database_url:
                if name == "floor":
                    lay_floor(database_url)
                results = turn_speed.measure(database_url)
            figures[name] = {**results, "ratios": turn_speed.ratios(results)}
    return figures


def main() -> None:
    figures = measure()
    if "--save" in sys.argv[1:]:
        save("turn_floor", figures)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
