"""The memory core's figures beside the seed pattern's, on the same database.

Every figure is measured here: round trips are counted by the TCP proxy, times are
medians of interleaved runs, throughput is turns completed by 8 threads.
"""

from __future__ import annotations

import itertools
import os
import resource
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg

from bench.latency_proxy import LatencyProxy, postgres_target, through_proxy
from bench.seed import SeedPattern
from core.identity.linking import Linking
from core.identity.policy import IdentityPolicy
from core.memory.service import Memory
from core.model.llm import ModelReply, Usage
from core.models import Person, Surface
from core.stores.postgres_store import PostgresStore
from core.turn.capabilities import DEFAULT_SYSTEM_PROMPT
from core.turn.context import ModelMessage
from core.turn.request import TurnRequest, TurnSettings
from core.turn.turns import Turns
from functions.runtime import context_limits
from functions.settings import Settings

PEOPLE_PER_DRIVER = 40
USER_TEXT = "Could you remind me what I said about the budget for the trip, and whether I booked the train?"
REPLY_TEXT = "You set the trip budget at 900 euros on WhatsApp this morning, and yes: the 9:40 train is booked."


class InstantModel:
    """A model that answers at once: the benchmarks time the database, not Claude."""

    name = "instant"

    def reply(self, system: str, messages: Sequence[ModelMessage], timeout_s: float, notes: str = "") -> ModelReply:
        return ModelReply(REPLY_TEXT, Usage())

    def stream(
        self, system: str, messages: Sequence[ModelMessage], timeout_s: float, notes: str = ""
    ) -> Iterator[str | Usage]:
        yield REPLY_TEXT
        yield Usage()


def seed_answer(history: Any, text: str) -> str:
    return REPLY_TEXT


@contextmanager
def counting_proxy(database_url: str) -> Iterator[tuple[LatencyProxy, str]]:
    proxy = LatencyProxy(postgres_target(database_url))
    try:
        yield proxy, through_proxy(database_url, proxy.port)
    finally:
        proxy.close()


def ours_secondary_turn(memory: Memory, person: uuid.UUID) -> None:
    start = memory.begin_turn(Person(user_id=person), Surface.TELEGRAM, USER_TEXT, uuid.uuid4().hex)
    assert start.message_id is not None and not start.degraded
    memory.finish_turn(person, start.message_id, REPLY_TEXT)


def ours_linked_turn(memory: Memory, chat: str, person: uuid.UUID) -> None:
    """A Telegram turn from a chat linked to a web person: who writes is resolved in begin_turn."""
    start = memory.begin_turn(Person(sender_id=chat), Surface.TELEGRAM, USER_TEXT, uuid.uuid4().hex)
    assert start.user_id == person and start.message_id is not None and not start.degraded
    memory.finish_turn(person, start.message_id, REPLY_TEXT)


def ours_web_turn(memory: Memory, person: uuid.UUID, conversation: uuid.UUID) -> None:
    start = memory.begin_turn(Person(user_id=person), Surface.WEB, USER_TEXT, uuid.uuid4().hex, conversation)
    assert start.message_id is not None and not start.degraded
    memory.finish_turn(person, start.message_id, REPLY_TEXT)


def round_trips_per_turn(database_url: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    with counting_proxy(database_url) as (proxy, url):
        memory = Memory(PostgresStore(url), context_limits(Settings.defaults()))
        seed = SeedPattern(url)
        person = uuid.uuid4()
        web = memory.create_conversation(person)
        # The person is linked, as one on every app is: their Telegram chat resolves to them.
        chat = f"bench-{uuid.uuid4().hex[:10]}"
        Linking(memory.store, IdentityPolicy.build("auto", None, {})).link(person, Surface.TELEGRAM, chat)
        measured: dict[str, Callable[[], Any]] = {
            "ours_secondary": lambda: ours_linked_turn(memory, chat, person),
            "ours_web": lambda: ours_web_turn(memory, person, web.id),
            "seed_secondary": lambda: seed.telegram_turn(person, USER_TEXT, seed_answer),
            "seed_web": lambda: seed.web_turn(person, web.id, USER_TEXT, seed_answer),
        }
        for turn in measured.values():
            for _ in range(6):  # warm: connections open, singletons exist, statements prepared
                turn()
        for name, turn in measured.items():
            proxy.reset()
            turn()
            counts[name] = proxy.round_trips
        memory.store.close()
        seed.close()
    return counts


def people(count: int = PEOPLE_PER_DRIVER) -> Iterator[uuid.UUID]:
    """The people a driver speaks for, in turn: a day holds dozens of a person's messages, not thousands."""
    return itertools.cycle([uuid.uuid4() for _ in range(count)])


def turn_overhead_ms_p50(
    database_url: str, turns: int = 300, people_per_driver: int = PEOPLE_PER_DRIVER
) -> dict[str, float]:
    """One Telegram turn's database work, ours and the seed's interleaved."""
    memory = Memory(PostgresStore(database_url), context_limits(Settings.defaults()))
    seed = SeedPattern(database_url)
    speakers = people(people_per_driver)
    for person in itertools.islice(speakers, people_per_driver):  # warm: singletons exist, statements prepared
        ours_secondary_turn(memory, person)
        seed.telegram_turn(person, USER_TEXT, seed_answer)
    ours_times, seed_times = [], []
    for person in itertools.islice(speakers, turns):
        began = time.perf_counter()
        ours_secondary_turn(memory, person)
        ours_times.append(time.perf_counter() - began)
        began = time.perf_counter()
        seed.telegram_turn(person, USER_TEXT, seed_answer)
        seed_times.append(time.perf_counter() - began)
    memory.store.close()
    seed.close()
    return {"ours": ms(statistics.median(ours_times)), "seed": ms(statistics.median(seed_times))}


def turns_per_s(
    database_url: str,
    threads: int = 8,
    seconds: float = 3.0,
    rounds: int = 3,
    people_per_driver: int = PEOPLE_PER_DRIVER,
) -> dict[str, Any]:
    """Whole turns (zero-latency model) completed per second by `threads` threads; and
    ours without the turn around it (begin_turn and finish_turn only), for comparison. Under
    `cpu_us_per_turn`, each one's CPU a turn while it ran, by who spent it (`cpu_split`)."""
    memory = Memory(PostgresStore(database_url, max_connections=threads), context_limits(Settings.defaults()))
    ours = whole_turn_driver(memory, people_per_driver)

    def seed(worker: int) -> Callable[[], None]:
        pattern, speakers = SeedPattern(database_url), people(people_per_driver)
        return lambda: pattern.telegram_turn(next(speakers), USER_TEXT, seed_answer)

    def ours_memory_only(worker: int) -> Callable[[], None]:
        speakers = people(people_per_driver)
        return lambda: ours_secondary_turn(memory, next(speakers))

    done: dict[str, list[float]] = {"ours": [], "seed": [], "ours_database_work_only": []}
    spent: dict[str, list[dict[str, float]]] = {name: [] for name in done}
    drivers = {"ours": ours, "seed": seed, "ours_database_work_only": ours_memory_only}
    for _ in range(rounds):  # alternating rounds, the median of each: this machine's noise is large
        for name, driver in drivers.items():
            rate, cpu = throughput(driver, threads, seconds, people_per_driver)
            done[name].append(rate)
            spent[name].append(cpu)
    memory.store.close()
    return {
        **{name: statistics.median(values) for name, values in done.items()},
        "cpu_us_per_turn": {
            name: {part: round(statistics.median(cpu[part] for cpu in runs)) for part in CPU_PARTS}
            for name, runs in spent.items()
        },
    }


def whole_turn_driver(
    memory: Memory, people_per_driver: int = PEOPLE_PER_DRIVER
) -> Callable[[int], Callable[[], None]]:
    """`throughput`'s driver of whole Telegram turns (a zero-latency model), each worker speaking
    for its own `people_per_driver` people in turn."""
    turns = Turns(memory, InstantModel, IdentityPolicy("auto"), TurnSettings(DEFAULT_SYSTEM_PROMPT, "fallback", "no"))

    def driver(worker: int) -> Callable[[], None]:
        speakers = people(people_per_driver)
        return lambda: _run(turns, next(speakers))

    return driver


def _run(turns: Turns, person: uuid.UUID) -> None:
    turns.run(TurnRequest(Surface.TELEGRAM, USER_TEXT, uuid.uuid4().hex, user_id=person, deadline_s=30))


def throughput(
    make_worker: Callable[[int], Callable[[], None]], threads: int, seconds: float, people_per_driver: int
) -> tuple[float, dict[str, float]]:
    """Turns a second, and the CPU µs a turn each part of the machine spent meanwhile."""
    workers = [make_worker(index) for index in range(threads)]
    for work in workers:
        for _ in range(people_per_driver):
            work()  # warm: every person's singleton exists
    done = [0] * threads
    stop = time.perf_counter() + seconds

    def loop(index: int) -> None:
        while time.perf_counter() < stop:
            workers[index]()
            done[index] += 1

    before = cpu_seconds()
    began = time.perf_counter()
    pool = [threading.Thread(target=loop, args=(index,)) for index in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    elapsed, after, turns = time.perf_counter() - began, cpu_seconds(), max(sum(done), 1)
    return round(turns / elapsed, 1), cpu_split(before, after, turns)


# Who spends a turn's CPU (`cpu_split`): this process (the functions' Python), the machine's
# Postgres processes, and the rest of the machine (the latency proxy's process, the kernel's own).
CPU_PARTS = ("client", "postgres", "other", "total")


def cpu_seconds() -> dict[str, float]:
    """CPU seconds spent so far by this process, by every `postgres` process and by the whole
    machine (busy time over all its CPUs), as Linux's /proc counts them; {} elsewhere."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(value) for value in stat.readline().split()[1:]]
        tick = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError):
        return {}
    idle = fields[3] + fields[4]  # idle, iowait
    own = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "client": own.ru_utime + own.ru_stime,
        "postgres": sum(postgres_cpu_seconds().values()),
        "machine": (sum(fields[:8]) - idle) / tick,
    }


def postgres_cpu_seconds() -> dict[int, float]:
    """CPU seconds spent so far by each running `postgres` process, by pid (an ended one's are gone)."""
    tick = os.sysconf("SC_CLK_TCK")
    spent = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as stat:
                name, _, rest = stat.read().rpartition(")")
            if name.endswith("(postgres"):
                utime, stime = rest.split()[11:13]
                spent[int(pid)] = (int(utime) + int(stime)) / tick
        except (OSError, ValueError):
            continue  # gone meanwhile
    return spent


def cpu_split(before: dict[str, float], after: dict[str, float], turns: int) -> dict[str, float]:
    """CPU µs a turn between two `cpu_seconds`, by CPU_PARTS; zeros where /proc is not there."""
    if not before or not after:
        return dict.fromkeys(CPU_PARTS, 0.0)
    spent = {part: (after[part] - before[part]) * 1e6 / turns for part in before}
    return {
        "client": spent["client"],
        "postgres": spent["postgres"],
        "other": max(spent["machine"] - spent["client"] - spent["postgres"], 0.0),
        "total": max(spent["machine"], spent["client"] + spent["postgres"]),
    }


FILL = """
with people as (
    select gen_random_uuid() as user_id from generate_series(1, %(people)s)
), singletons as (
    insert into conversations (user_id, surface, title)
    select user_id, 'telegram', '[Telegram]' from people
    returning id, user_id
)
insert into messages (conversation_id, user_id, surface, role, content, created_at)
select s.id, s.user_id, 'telegram',
       case when n %% 2 = 0 then 'user' else 'assistant' end,
       'stored message number ' || n || ' of a person, long enough to look like a real one',
       now() - (n * interval '40 minutes')
  from singletons s cross join generate_series(1, %(per_person)s) n
"""

HOT_QUERY = """
explain select id from messages
 where user_id = %s and created_at >= now() - interval '24 hours' and (created_at, id) <= (now(), 9223372036854775807)
 order by created_at desc, id desc limit 16
"""


def fill(database_url: str, messages: int, per_person: int = 50) -> None:
    with psycopg.connect(database_url, autocommit=True) as connection:
        connection.execute(FILL, {"people": messages // per_person, "per_person": per_person})
        connection.execute("vacuum (analyze) conversations")  # as autovacuum would after a bulk load
        connection.execute("vacuum (analyze) messages")


CONTEXT_QUERY = (
    "select public.context_window(%s, null, now() - interval '24 hours', now(), 9223372036854775807, 16, 8, null)"
)


# The table sizes the context load is measured at (the README's "10k / 1M messages").
CONTEXT_SIZES = (10_000, 1_000_000)


def context_load_ms_p50(database_url: str, sizes: Sequence[int] = CONTEXT_SIZES, samples: int = 300) -> dict[str, Any]:
    """As the table grows: the context query alone (the hot query), the whole begin_turn
    (which also stores the message), and the plan of the hot query."""
    figures: dict[str, Any] = {}
    stored = 0
    memory = Memory(PostgresStore(database_url), context_limits(Settings.defaults()))
    for size in sizes:
        fill(database_url, size - stored)
        stored = size
        with psycopg.connect(database_url, autocommit=True) as connection:
            people = [
                row[0]
                for row in connection.execute(
                    "select user_id from conversations order by random() limit %s", (samples,)
                )
            ]
            plan = "\n".join(row[0] for row in connection.execute(HOT_QUERY, (people[0],)))
            loads = []
            for person in people:
                began = time.perf_counter()
                window = connection.execute(CONTEXT_QUERY, (person,), prepare=True).fetchone()
                loads.append(time.perf_counter() - began)
                assert window is not None and len(window[0]) >= 1
        turns = []
        for person in people:
            began = time.perf_counter()
            start = memory.begin_turn(Person(user_id=person), Surface.TELEGRAM, USER_TEXT, uuid.uuid4().hex)
            turns.append(time.perf_counter() - began)
            assert not start.degraded and len(start.history) >= 2
        figures[f"load_{size}"] = ms(statistics.median(loads))
        figures[f"turn_{size}"] = ms(statistics.median(turns))
        figures[f"plan_{size}"] = "messages_by_user_recent" if "messages_by_user_recent" in plan else plan
    memory.store.close()
    return figures


def ms(seconds: float) -> float:
    return round(seconds * 1000, 3)
