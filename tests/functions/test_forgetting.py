"""Forgetting through the real functions: /forget on Telegram, forget on WhatsApp, DELETE /memory and
DELETE /conversations/<id> on the web; the operator's crossmem forget and crossmem purge."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

import psycopg
import pytest

from functions.tools.cli import main
from tests.database import migrated_database
from tests.fakes.anthropic_api import FakeAnthropic
from tests.fakes.telegram_api import FakeTelegram
from tests.helpers import (
    ENGLISH,
    TELEGRAM_HEADERS,
    Apps,
    app_client,
    as_owner,
    bearer,
    count,
    forgotten,
    new_code,
    sent_texts,
    telegram,
    update,
    whatsapp,
    will_delete,
)

MESSAGES = "select count(*) from messages where user_id = %s"
CONVERSATIONS = "select count(*) from conversations where user_id = %s"


def counts_of(database_url: str, person: uuid.UUID) -> tuple[int, int]:
    return count(database_url, MESSAGES, person), count(database_url, CONVERSATIONS, person)


def someone_else(apps: Apps) -> uuid.UUID:
    other = uuid.uuid4()
    assert apps.web.post("/", json={"message": "someone else's words"}, headers=bearer(other)).status_code == 200
    return other


def linked_person_with_a_thread(apps: Apps) -> uuid.UUID:
    """A web person whose Telegram chat and WhatsApp number are linked, with a turn on each app: 6 messages."""
    person = uuid.uuid4()
    telegram(apps, f"/start {new_code(apps, person)['code']}")
    whatsapp(apps, f"link {new_code(apps, person)['code']}")
    telegram(apps, "My locker code is 4417", update_id=990000 + uuid.uuid4().int % 10**4)
    whatsapp(apps, "My budget is 900 euros")
    assert apps.web.post("/", json={"message": "My bank is Northwind"}, headers=bearer(person)).status_code == 200
    return person


def test_forget_then_confirm_on_telegram_deletes_the_whole_thread_and_nothing_else(
    apps: Apps, fake_anthropic: FakeAnthropic, fake_telegram: FakeTelegram, database_url: str
) -> None:
    person = linked_person_with_a_thread(apps)
    other = someone_else(apps)
    old_update = 880000 + uuid.uuid4().int % 10**4
    telegram(apps, "Remember the spare key is under the mat", update_id=old_update)
    assert counts_of(database_url, person) == (8, 3) and counts_of(database_url, other) == (2, 1)

    telegram(apps, "/forget")
    expected = will_delete(ENGLISH, 8, 3, "/forget confirm")
    assert fake_telegram.sent()[-1] == {"chat_id": apps.chat, "text": expected}
    assert counts_of(database_url, person) == (8, 3)  # asking deletes nothing, and is not in the thread
    said_forget = "select count(*) from messages where user_id = %s and content ilike '%%forget%%'"
    assert count(database_url, said_forget, person) == 0

    telegram(apps, "/forget confirm")
    assert fake_telegram.sent()[-1] == {"chat_id": apps.chat, "text": forgotten(ENGLISH, 8)}
    assert counts_of(database_url, person) == (0, 0)
    assert counts_of(database_url, other) == (2, 1)

    # A redelivery of an update from before the forget brings nothing back and asks no model.
    asked, sent = len(fake_anthropic.requests), len(fake_telegram.sent())
    telegram(apps, "Remember the spare key is under the mat", update_id=old_update)
    assert (len(fake_anthropic.requests), len(fake_telegram.sent())) == (asked, sent)
    assert counts_of(database_url, person) == (0, 0)

    # The next turn, on any app, starts from nothing; the apps are still linked.
    whatsapp(apps, "What do you know about me?")
    texts = sent_texts(fake_anthropic.requests[-1])
    assert len(texts) == 1 and texts[0].endswith("What do you know about me?")
    assert [item["surface"] for item in apps.web.get("/links", headers=bearer(person)).get_json()["links"]] == [
        "telegram",
        "whatsapp",
    ]


def test_forget_then_confirm_on_whatsapp_in_any_case(
    apps: Apps, fake_anthropic: FakeAnthropic, database_url: str
) -> None:
    person = linked_person_with_a_thread(apps)
    other = someone_else(apps)
    expected = will_delete(ENGLISH, 6, 3, "forget confirm")
    assert whatsapp(apps, "Forget") == [expected]
    assert counts_of(database_url, person) == (6, 3)
    assert whatsapp(apps, " FORGET Confirm ") == [forgotten(ENGLISH, 6)]
    assert counts_of(database_url, person) == (0, 0) and counts_of(database_url, other) == (2, 1)
    telegram(apps, "What do you know about me?")
    texts = sent_texts(fake_anthropic.requests[-1])
    assert len(texts) == 1 and texts[0].endswith("What do you know about me?")


def test_delete_memory_on_the_web_deletes_every_surface(
    apps: Apps, fake_anthropic: FakeAnthropic, database_url: str
) -> None:
    person = linked_person_with_a_thread(apps)
    other = someone_else(apps)
    response = apps.web.delete("/memory", headers=bearer(person))
    assert (response.status_code, response.data) == (204, b"")
    assert counts_of(database_url, person) == (0, 0) and counts_of(database_url, other) == (2, 1)
    assert apps.web.get("/conversations", headers=bearer(person)).get_json() == {
        "conversations": [],
        "has_more": False,
        "next": None,
    }
    assert apps.web.post("/", json={"message": "Do you remember me?"}, headers=bearer(person)).status_code == 200
    texts = sent_texts(fake_anthropic.requests[-1])
    assert len(texts) == 1 and texts[0].endswith("Do you remember me?")


def test_forget_without_confirming_or_confirmed_too_late_deletes_nothing(
    apps: Apps, fake_telegram: FakeTelegram, database_url: str
) -> None:
    person = linked_person_with_a_thread(apps)
    telegram(apps, "/forget")
    telegram(apps, "What was my locker code?")  # a turn in between is no confirmation
    assert counts_of(database_url, person) == (8, 3)
    with psycopg.connect(database_url) as connection:
        connection.execute(
            "update forget_requests set requested_at = now() - interval '5 minutes 1 second' where user_id = %s",
            (person,),
        )
    telegram(apps, "/forget confirm")
    assert fake_telegram.sent()[-1]["text"] == ENGLISH.say("forget.expired", request="/forget", minutes=5)
    assert counts_of(database_url, person) == (8, 3)


def test_deleting_a_conversation_on_the_web_is_204_and_someone_elses_is_404(apps: Apps, database_url: str) -> None:
    person, other = uuid.uuid4(), uuid.uuid4()
    mine = apps.web.post("/", json={"message": "first"}, headers=bearer(person)).get_json()["conversation_id"]
    apps.web.post("/", json={"message": "second"}, headers=bearer(person))
    theirs = apps.web.post("/", json={"message": "theirs"}, headers=bearer(other)).get_json()["conversation_id"]

    for missing in (theirs, str(uuid.uuid4())):
        response = apps.web.delete(f"/conversations/{missing}", headers=bearer(person))
        assert (response.status_code, response.get_json()["error"]) == (404, "not_found")
    assert counts_of(database_url, person) == (4, 2) and counts_of(database_url, other) == (2, 1)

    response = apps.web.delete(f"/conversations/{mine}", headers=bearer(person))
    assert (response.status_code, response.data) == (204, b"")
    assert counts_of(database_url, person) == (2, 1) and counts_of(database_url, other) == (2, 1)
    assert apps.web.get(f"/conversations/{mine}/messages", headers=bearer(person)).status_code == 404


def test_under_the_owner_policy_a_stranger_deletes_nothing(
    apps: Apps, environment: pytest.MonkeyPatch, owner: uuid.UUID, fake_telegram: FakeTelegram, database_url: str
) -> None:
    as_owner(environment, owner)
    environment.setenv("STRANGER_REPLY", "This is a private assistant.")
    bot = app_client("telegram_webhook")
    assert bot.post("/", json=update("The owner's words", user_id=4242), headers=TELEGRAM_HEADERS).status_code == 200
    assert bot.post("/", json=update("/forget", user_id=4242), headers=TELEGRAM_HEADERS).status_code == 200
    for text in ("/forget", "/forget confirm"):
        assert bot.post("/", json=update(text, user_id=31337), headers=TELEGRAM_HEADERS).status_code == 200
        assert fake_telegram.sent()[-1] == {"chat_id": 31337, "text": "This is a private assistant."}
    assert count(database_url, MESSAGES, owner) == 2
    web = app_client("web_chat")
    assert web.delete("/memory", headers=bearer(uuid.uuid4())).status_code == 403
    assert count(database_url, MESSAGES, owner) == 2
    assert bot.post("/", json=update("/forget confirm", user_id=4242), headers=TELEGRAM_HEADERS).status_code == 200
    assert fake_telegram.sent()[-1] == {"chat_id": 4242, "text": forgotten(ENGLISH, 2)}
    assert count(database_url, MESSAGES, owner) == 0


def test_crossmem_forget_erases_the_person_identities_included(
    apps: Apps, capsys: pytest.CaptureFixture[str], database_url: str
) -> None:
    person = linked_person_with_a_thread(apps)
    assert main(["forget", "--user", str(person), "--yes"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"erased {person}: 6 message(s), 3 conversation(s), 2 link code(s), 2 identity(ies)"  # both codes were used
    )
    assert counts_of(database_url, person) == (0, 0)
    assert count(database_url, "select count(*) from identities where user_id = %s", person) == 0


@pytest.fixture
def purge_database(environment: pytest.MonkeyPatch, postgres_server: str) -> Iterator[str]:
    """A database of its own: a purge spans every person."""
    with migrated_database(postgres_server) as url:
        environment.setenv("DATABASE_URL", url)
        with psycopg.connect(url, autocommit=True) as connection:
            connection.execute(
                """with c as (insert into conversations (user_id, surface)
                              select gen_random_uuid(), 'web' returning id, user_id)
                   insert into messages (conversation_id, user_id, surface, role, content, created_at)
                   select c.id, c.user_id, 'web', 'user', 'said ' || age || ' days ago',
                          now() - (age - 0.5) * interval '1 day'  -- 0.5 to 99.5 days: none on a boundary
                     from c cross join generate_series(1, 100) age"""
            )
        yield url


def messages_left(database_url: str) -> int:
    return count(database_url, "select count(*) from messages")


def test_crossmem_purge_by_age_in_batches_and_dry_run(
    purge_database: str, environment: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    environment.setenv("PURGE_BATCH", "4")
    assert main(["purge", "--older-than", "90d", "--dry-run"]) == 0
    output = capsys.readouterr().out.splitlines()
    assert len(output) == 1 and output[0].startswith("dry run: 10 message(s) older than 90d (before ")
    assert messages_left(purge_database) == 100

    assert main(["purge", "--older-than", "2160h", "--yes"]) == 0
    output = capsys.readouterr().out.splitlines()
    # What it will delete, said before it deletes.
    assert output[0].startswith("10 message(s) older than 90d (before ") and output[0].endswith(" will be deleted.")
    assert [line.split(" (")[0] for line in output[1:-1]] == [
        "batch 1: 4 deleted, 4 so far",
        "batch 2: 4 deleted, 8 so far",
        "batch 3: 2 deleted, 10 so far",
    ]
    assert output[-1].startswith("purged 10 message(s) older than 90d (before ") and output[-1].endswith(
        " in 3 batch(es)"
    )
    assert messages_left(purge_database) == 90


def test_crossmem_purge_without_an_age_uses_message_retention_days(
    purge_database: str, environment: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["purge", "--yes"]) == 0
    assert capsys.readouterr().out == "MESSAGE_RETENTION_DAYS is 0: messages are kept forever; nothing purged\n"
    assert messages_left(purge_database) == 100
    environment.setenv("MESSAGE_RETENTION_DAYS", "30")
    assert main(["purge", "--yes"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("purged 70 message(s) older than 30d")
    assert messages_left(purge_database) == 30


def test_crossmem_purge_takes_the_note_lines_about_what_is_gone_with_no_message_left_to_delete(
    purge_database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A person whose old messages an earlier purge took, before it reached the notes: the lines it
    left go, it says so before and after, and every other line stays as it was."""
    person, today = uuid.uuid4(), f"{datetime.now(UTC):%Y-%m-%d}"
    with psycopg.connect(purge_database, autocommit=True) as connection:
        connection.execute("delete from messages where created_at < now() - interval '90 days'")
        connection.execute(
            "insert into memory_notes (user_id, content, revision) values (%s, %s, 1)",
            (person, f"- [web · 2020-01-01] the old flat's code\n- [web · {today}] the new one"),
        )
    assert main(["purge", "--older-than", "90d", "--yes"]) == 0
    output = capsys.readouterr().out.splitlines()
    notes = ", and the older lines of 1 person(s)' memory notes,"
    assert output[0].startswith("0 message(s) older than 90d (before ")
    assert output[0].endswith(f" UTC){notes} will be deleted.")
    assert [line.split(" (")[0] for line in output[1:-1]] == ["batch 1: 0 deleted, 1 person(s)' notes, 0 so far"]
    assert output[-1].startswith("purged 0 message(s) older than 90d (before ")
    assert output[-1].endswith(f" UTC){notes} in 1 batch(es)")
    with psycopg.connect(purge_database) as connection:
        row = connection.execute("select content from memory_notes where user_id = %s", (person,)).fetchone()
    assert row == (f"- [web · {today}] the new one",)


@pytest.mark.parametrize("days", ["36501", "1000000", "1000000000"])
def test_a_retention_past_a_century_is_refused_as_a_setting(
    days: str, environment: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # It was a traceback (OverflowError) past 999,999,999 days, and below that a cutoff in BC
    # that the purge could not read, at every run of the scheduled job.
    environment.setenv("MESSAGE_RETENTION_DAYS", days)
    assert main(["purge", "--yes"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("crossmem purge: invalid configuration: MESSAGE_RETENTION_DAYS")
    assert "36500" in err and err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("age", ["90", "90m", "0d", "99999999999d", "999999d", "99999999h"])
def test_crossmem_purge_refuses_an_age_that_is_not_days_or_hours(
    age: str, environment: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["purge", "--older-than", age])
    assert exited.value.code == 2
    assert "is not an age like 90d or 36h" in capsys.readouterr().err


def test_deleting_commands_ask_first_and_without_a_terminal_do_nothing_without_yes(
    purge_database: str, environment: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import io

    environment.setattr("sys.stdin", io.StringIO(""))  # a script, a pipe: no terminal to ask
    assert main(["purge", "--older-than", "90d"]) == 1
    captured = capsys.readouterr()
    assert captured.out.startswith("10 message(s) older than 90d (before ")
    assert "Not done: run it again with --yes" in captured.err
    person = uuid.uuid4()
    assert main(["forget", "--user", str(person)]) == 1
    assert main(["link", "--user", str(person), "--surface", "telegram", "--external-id", "7373"]) == 1
    assert capsys.readouterr().err.count("Not done: run it again with --yes") == 2
    assert messages_left(purge_database) == 100

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    environment.setattr("sys.stdin", Terminal("n\n"))
    assert main(["purge", "--older-than", "90d"]) == 1
    assert messages_left(purge_database) == 100
    environment.setattr("sys.stdin", Terminal("y\n"))
    assert main(["purge", "--older-than", "90d"]) == 0
    assert messages_left(purge_database) == 90


def test_with_the_database_down_forgetting_answers_and_never_fails(
    apps: Apps, environment: pytest.MonkeyPatch, fake_telegram: FakeTelegram
) -> None:
    """A /forget or a forget confirm that cannot reach the memory deletes nothing, is told to try
    again in a minute (a 200 the platform does not redeliver), and the web's is 503."""
    environment.setenv("DATABASE_URL", "postgresql://postgres@127.0.0.1:1/postgres")
    down = Apps(
        app_client("telegram_webhook"), app_client("whatsapp_webhook"), app_client("web_chat"), apps.chat, apps.number
    )
    telegram(down, "/forget")
    assert fake_telegram.sent()[-1] == {"chat_id": apps.chat, "text": ENGLISH.say("link.unavailable")}
    assert whatsapp(down, "forget confirm") == [ENGLISH.say("link.unavailable")]
    response = down.web.delete("/memory", headers=bearer(uuid.uuid4()))
    assert (response.status_code, response.get_json()["error"]) == (503, "store_unavailable")
