"""Where a turn's database time goes (`python -m bench.turn_sql`): the turn's two functions run in
the database itself, the schema's and then copies of it with one part taken out, side by side.

Each variant is a fresh database of one server with the same history (`history` turns a person, 40
people); a plpgsql loop there calls begin_turn and finish_turn `turns` times with the arguments a
Telegram turn sends, inside a transaction that is rolled back, so every batch meets the same rows.
The variants' batches alternate, `rounds` of each; the figure is the median µs a turn, measured by
the database's own clock: no client, no protocol, no commit (each variant would pay the same).

A part taken out is what the turn would save without it, not a proposal: each keeps a promise
(docs/benchmarks.md, Where the turn's database time goes). `floor` is bench/turn_floor.py's,
the least the two calls could do.
"""

from __future__ import annotations

import itertools
import json
import re
import statistics
import sys
import uuid
from contextlib import ExitStack
from typing import Any

import psycopg

from bench.latency_proxy import proxy_process
from bench.memory_core import CPU_PARTS, REPLY_TEXT, USER_TEXT, ours_secondary_turn, throughput, whole_turn_driver
from bench.results import bench_server, save
from bench.turn_floor import lay_floor
from bench.turn_speed import RTT
from core.errors import ConfigurationError
from core.memory.service import Memory
from core.stores.postgres_store import PostgresStore
from functions.runtime import context_limits
from functions.settings import Settings
from tests.database import migrated_database, with_database

PEOPLE = 40

# The turn as bench/memory_core.py's ours_secondary_turn makes it, `p_n` times, over `p_people`.
LIMITS = context_limits(Settings.defaults())
LOOP = f"""
create function public.bench_turns(p_people uuid[], p_n integer) returns double precision
    language plpgsql set search_path = '' as $loop$
declare
    v_began timestamptz := clock_timestamp();
    v_person uuid;
    v_start json;
begin
    for i in 1..p_n loop
        v_person := p_people[1 + i % array_length(p_people, 1)];
        v_start := public.begin_turn(
            p_surface => 'telegram', p_content => {USER_TEXT!r}, p_external_id => md5(random()::text),
            p_user_id => v_person, p_sender_id => null, p_conversation_id => null,
            p_window_hours => {LIMITS.window_hours}, p_max_messages => {LIMITS.max_messages},
            p_window_step => {LIMITS.window_step}, p_web_prepend => {LIMITS.web_prepend},
            p_attempt => gen_random_uuid(), p_turns_per_minute => 0, p_turns_per_day => 0, p_tokens_per_day => 0,
            p_answer_within_seconds => 60,
            p_sender => null, p_sender_alias => null, p_opts_out => false, p_platform_ref => null, p_reply_ref => null,
            p_quoted => null, p_input_tokens => 0, p_output_tokens => 0, p_requests => 0, p_language => null);
        perform public.finish_turn(
            p_user_id => v_person, p_user_message_id => (v_start ->> 'message_id')::bigint,
            p_content => {REPLY_TEXT!r}, p_delivered => true, p_unsent_from => null, p_attempt => null, p_tokens => 0,
            p_user_content => null, p_reserved => 0, p_reply_id => (v_start ->> 'reply_id')::bigint,
            p_language => null, p_declined => null, p_merged => null);
    end loop;
    return extract(epoch from clock_timestamp() - v_began) * 1000000 / p_n;
end;
$loop$
"""

# Each part, taken out: what replaces it in the variant's database.
WITHOUT: dict[str, str | None] = {
    "the window (no message read)": """
        create or replace function public.context_window(
            p_user_id uuid, p_conversation_id uuid, p_since timestamptz, p_until_at timestamptz,
            p_until_id bigint, p_limit integer, p_step integer, p_total bigint
        ) returns json language plpgsql stable set search_path = '' as $$ begin return '[]'::json; end; $$""",
    "the search words (column and index)": """
        drop index public.messages_by_user_words;
        alter table public.messages drop column search_text""",
    "the messages' foreign keys": """
        alter table public.messages drop constraint messages_conversation_id_fkey,
            drop constraint messages_in_reply_to_fkey, drop constraint messages_replied_to_fkey""",
    "the person's language": """
        create or replace function crossmem_private.remember_language(
            p_user_id uuid, p_language text, p_message_id bigint
        ) returns text language plpgsql set search_path = '' as $$ begin return null; end; $$""",
    "the follow-ups read": """
        create or replace function crossmem_private.turn_follow_ups(
            p_user_id uuid, p_surface text, p_message_id bigint, out pending json, out timezone text,
            out timezone_stated boolean, out delivered_first json, out apps json
        ) language plpgsql set search_path = '' as $$ begin pending := '[]'::json; end; $$""",
    "the forgotten deliveries' check": """
        create or replace function crossmem_private.delivery_forgotten(p_surface text, p_external_id text,
            p_user_id uuid) returns boolean language plpgsql stable set search_path = '' as $$
        begin return false; end; $$""",
    "the conversation's updated_at": None,  # finish_turn as it is, less that part (`untouched`)
}
# Every part above taken out of one database: what the turn would save with all those promises gone.
EVERY_PART = "every part above at once"
# The conversation's `updated_at`, set by finish_turn in one part of its statement.
TOUCHED = re.compile(r"\), touched as \(\s*update public\.conversations c.*?\n\s*\)\n", re.DOTALL)


def untouched(connection: psycopg.Connection[Any]) -> str:
    """finish_turn's definition without its touch of the conversation."""
    row = connection.execute("select pg_get_functiondef('public.finish_turn'::regproc)").fetchone()
    assert row is not None
    body, found = TOUCHED.subn(")\n", str(row[0]))
    if found != 1:
        raise ConfigurationError("finish_turn no longer touches the conversation as bench/turn_sql.py reads it")
    return body


def take_out(database_url: str, part: str) -> None:
    """`part` taken out of the schema in `database_url`; `floor`: the floor laid instead."""
    if part == "floor":
        lay_floor(database_url)
        return
    with psycopg.connect(database_url, autocommit=True) as connection:
        for each in WITHOUT if part == EVERY_PART else (part,):
            connection.execute(WITHOUT[each] or untouched(connection))


def measure(
    database_url: str,
    history: int = 24,
    turns: int = 200,
    rounds: int = 20,
    parts: tuple[str, ...] = (*WITHOUT, EVERY_PART),
    whole_turn_rounds: int = 4,
    seconds: float = 3.0,
) -> dict[str, Any]:
    """The turn's database µs, the schema's and each variant's (`parts`, then the floor), on
    `database_url`'s server, and each as a share of the schema's; then `whole_turns`."""
    people = [uuid.uuid4() for _ in range(PEOPLE)]
    variants = ("schema", *parts, "floor")
    with ExitStack() as stack:
        connections: dict[str, psycopg.Connection[Any]] = {}
        for variant in variants:
            url = stack.enter_context(migrated_database(with_database(database_url, "postgres")))
            memory = Memory(PostgresStore(url), LIMITS)
            for person in itertools.islice(itertools.cycle(people), history * PEOPLE):
                ours_secondary_turn(memory, person)
            memory.store.close()
            if variant != "schema":
                take_out(url, variant)
            connection = stack.enter_context(psycopg.connect(url))
            connection.execute(LOOP)
            connection.commit()
            connections[variant] = connection
        times: dict[str, list[float]] = {variant: [] for variant in variants}
        for round_ in range(rounds + 1):
            for variant, connection in connections.items():
                row = connection.execute("select public.bench_turns(%s, %s)", (people, turns)).fetchone()
                connection.rollback()  # the next batch meets the same rows
                if round_ > 0 and row is not None:  # the first round warms the plans
                    times[variant].append(row[0])
    medians = {variant: statistics.median(values) for variant, values in times.items()}
    return {
        "us_per_turn": {variant: round(value, 1) for variant, value in medians.items()},
        "share_of_schema": {variant: round(value / medians["schema"], 3) for variant, value in medians.items()},
        "setup": {"history_turns_a_person": history, "people": PEOPLE, "turns": turns, "rounds": rounds},
        "whole_turns": whole_turns(database_url, whole_turn_rounds, seconds),
    }


def whole_turns(database_url: str, rounds: int = 4, seconds: float = 3.0, threads: int = 8) -> dict[str, Any]:
    """Whole turns a second (turn_speed's throughput: `threads` threads, 1 ms a round trip, a
    zero-latency model) of the schema, of the schema with every part taken out at once and of the
    floor, each on a fresh database of `database_url`'s server behind its own proxy, their rounds
    of `seconds` alternating; each one's median, over the floor's, and its CPU a turn by who spent it."""
    variants = ("schema", EVERY_PART, "floor")
    with ExitStack() as stack:
        drivers = {}
        for variant in variants:
            url = stack.enter_context(migrated_database(with_database(database_url, "postgres")))
            if variant != "schema":
                take_out(url, variant)
            slow = stack.enter_context(proxy_process(url, RTT))
            memory = Memory(PostgresStore(slow, max_connections=threads), LIMITS)
            stack.callback(memory.store.close)
            drivers[variant] = whole_turn_driver(memory)
            throughput(drivers[variant], threads, seconds, PEOPLE)  # warm: the people's history begins
        rates: dict[str, list[float]] = {variant: [] for variant in variants}
        spent: dict[str, list[dict[str, float]]] = {variant: [] for variant in variants}
        for _ in range(rounds):
            for variant, driver in drivers.items():
                rate, cpu = throughput(driver, threads, seconds, PEOPLE)
                rates[variant].append(rate)
                spent[variant].append(cpu)
    medians = {variant: statistics.median(values) for variant, values in rates.items()}
    return {
        "turns_per_s": {variant: round(value, 1) for variant, value in medians.items()},
        "over_floor": {variant: round(value / medians["floor"], 3) for variant, value in medians.items()},
        "cpu_us_per_turn": {
            variant: {part: round(statistics.median(cpu[part] for cpu in runs)) for part in CPU_PARTS}
            for variant, runs in spent.items()
        },
        "setup": {"threads": threads, "rounds": rounds, "seconds": seconds, "rtt_s": RTT},
    }


def main() -> None:
    with bench_server() as server:
        figures = measure(server)
    if "--save" in sys.argv[1:]:
        save("turn_sql", figures)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
