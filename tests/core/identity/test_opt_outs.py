"""Opt-outs recorded for an identity (core/identity/opt_outs.py) on real Postgres: whose identity
an owner's STOP makes, and what a database down leaves recorded."""

from __future__ import annotations

import json
import uuid

import pytest

from core.identity.linking import Linking, LinkStatus
from core.identity.opt_outs import OptOuts
from core.identity.policy import IdentityPolicy
from core.memory.service import Memory
from core.models import Person, Surface
from core.stores.postgres_store import PostgresStore
from tests.helpers import rows


def number() -> str:
    return f"+3466{uuid.uuid4().int % 10**7:07d}"


def test_an_identity_an_owners_stop_makes_is_linked_to_the_owner_and_stays_theirs_under_auto(
    store: PostgresStore, memory: Memory, database_url: str
) -> None:
    """The owner policy keeps no identity for its numbers; a STOP makes one, the owner's (a web
    account). Made like one `auto` makes for an unknown sender (no linked_at), it read as a person
    of its own once the deployment went `auto`: another account linking the number took it, and the
    owner's whole history with it. Made linked, it is the owner's: that link is refused, and the
    owner's messages stay theirs."""
    owner, mine = uuid.uuid4(), number()
    start = memory.begin_turn(Person(user_id=owner), Surface.WEB, "my sister is Carmen", uuid.uuid4().hex)
    assert start.message_id is not None
    memory.finish_turn(owner, start.message_id, "noted")
    policy = IdentityPolicy.build("owner", owner, {Surface.SMS: [mine]})
    assert OptOuts(store, policy).heard(Surface.SMS, mine, opted_out=True) is True
    assert rows(database_url, "select user_id, linked_at is not null from identities where external_id = %s", mine) == [
        (owner, True)
    ]

    other = uuid.uuid4()
    auto = Linking(store, IdentityPolicy.build("auto", None, {}))
    assert auto.link(other, Surface.SMS, mine).status is LinkStatus.LINKED_ELSEWHERE
    assert rows(database_url, "select user_id from messages where user_id in (%s, %s)", owner, other) == [
        (owner,),
        (owner,),
    ]


def test_with_the_database_away_an_opt_out_is_logged_as_not_recorded_and_taken_by_no_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No connection to be had: the STOP is not recorded (False: the webhook still answers, and the
    next send Twilio refuses records it), and the log line says so without the number."""
    away = PostgresStore("postgresql://postgres@127.0.0.1:1/nothing", connect_timeout_s=1)
    mine = number()
    try:
        heard = OptOuts(away, IdentityPolicy.build("auto", None, {})).heard(Surface.SMS, mine, opted_out=True)
    finally:
        away.close()
    assert heard is False
    [line] = [record for record in caplog.records if record.name == "crossmem.opt_outs"]
    assert (line.levelname, line.getMessage(), vars(line)["surface"], vars(line)["error"]) == (
        "ERROR",
        "an opt-out or opt-in could not be recorded",
        "sms",
        "no database connection within the connect timeout",
    )
    assert mine not in json.dumps(vars(line), default=str)
