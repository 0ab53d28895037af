"""`crossmem doctor` against a live deployment made of fakes: gcloud on PATH (functions, secrets,
the scheduler job), the functions' front door, the Bot API, Twilio's REST API, Anthropic's
models endpoint and Deepgram's key test, each reached as the real tool or SDK reaches it; the
database is the tests' own. Every fix a report carries names a page and heading of docs/ that
exist (tests/functions/test_fix_links.py follows them)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from functions import runtime
from functions.tools import doc_links
from functions.tools.cli import main
from functions.tools.deploy import read_description, secret_id
from tests.database import fresh_database, migrated_database
from tests.fakes.anthropic_api import FakeAnthropic
from tests.fakes.cloud_run import FakeCloudRun
from tests.fakes.deepgram_api import FakeDeepgram
from tests.fakes.gcloud import (
    FUNCTION_NOT_FOUND,
    JOB_NOT_FOUND,
    PERMISSION_DENIED_SECRETS_LIST,
    FakeGcloud,
    described_function,
    described_job,
)
from tests.fakes.telegram_api import FakeTelegram
from tests.fakes.twilio_api import FakeTwilio
from tests.helpers import (
    DEFAULT,
    ENGLISH_MENU,
    PRIVATE,
    SPANISH_MENU,
    TELEGRAM_HEADERS,
    TWILIO_TOKEN,
    app_client,
    free_port,
)

ROOT = Path(__file__).resolve().parents[2]
PROJECT, REGION = "advisor-prod", "us-central1"
ACCOUNT_SID = "AC" + "0" * 32
NUMBER = "+14155550100"
SMS_NUMBER = "+14155550199"
DEEPGRAM_KEY = "deepgram-test-key"
FUNCTIONS = ["telegram_webhook", "whatsapp_webhook", "sms_webhook", "web_chat", "memory_digest"]
# What each function answers a call without credentials (the private one: Cloud Run's IAM).
ANSWERS = {"telegram_webhook": 401, "whatsapp_webhook": 405, "sms_webhook": 405, "web_chat": 401, "memory_digest": 403}
CHECKS = [
    "database",
    "secrets",
    *(f"function {name}" for name in FUNCTIONS),
    "telegram webhook",
    "telegram command menu",
    "twilio inbound url",
    "twilio sms inbound url",
    "model",
    "digest model",
    "deepgram",
    "scheduler job crossmem-memory-digest",
]
# The checks that ask gcloud: skipped, with the reason, when it cannot be asked.
THROUGH_GCLOUD = ["secrets", *(f"function {name}" for name in FUNCTIONS), "scheduler job crossmem-memory-digest"]
DOC_LINKS = {value for name, value in vars(doc_links).items() if name.isupper()}
LINK = re.compile(r"docs/[\w.-]+\.md#[\w-]+")
SECRET_IDS = sorted(
    {secret_id(reference) for spec in read_description().functions for reference in spec.secrets.values()}
)


@pytest.fixture
def fake_twilio() -> Iterator[FakeTwilio]:
    server = FakeTwilio(ACCOUNT_SID, TWILIO_TOKEN)
    yield server
    server.close()


@pytest.fixture
def fake_deepgram() -> Iterator[FakeDeepgram]:
    server = FakeDeepgram(DEEPGRAM_KEY)
    yield server
    server.close()


@pytest.fixture
def cloud_run() -> Iterator[FakeCloudRun]:
    server = FakeCloudRun()
    server.answers = dict(ANSWERS)
    yield server
    server.close()


class Live:
    """The deployment the doctor looks at; a test breaks one part of it."""

    def __init__(
        self, gcloud: FakeGcloud, run: FakeCloudRun, telegram: FakeTelegram, twilio: FakeTwilio, model: FakeAnthropic
    ) -> None:
        self.gcloud, self.run, self.telegram, self.twilio, self.model = gcloud, run, telegram, twilio, model

    def url(self, function: str) -> str:
        return f"{self.run.url}/{function}"

    def describe(self, function: str, **changes: Any) -> None:
        spec = next(spec for spec in read_description().functions if spec.name == function)
        secrets = {key: secret_id(reference) for key, reference in spec.secrets.items()}
        described = json.loads(described_function(PROJECT, REGION, function, self.url(function), secrets))
        self.gcloud.answer(["functions", "describe", function], json.dumps({**described, **changes}))

    def job(self, **fields: Any) -> None:
        uri = self.url("memory_digest")
        self.gcloud.answer(
            ["scheduler", "jobs", "describe"], described_job(PROJECT, REGION, "crossmem-memory-digest", uri, **fields)
        )


@pytest.fixture
def live(
    environment: pytest.MonkeyPatch,
    tmp_path: Path,
    cloud_run: FakeCloudRun,
    fake_telegram: FakeTelegram,
    fake_twilio: FakeTwilio,
    fake_anthropic: FakeAnthropic,
    fake_deepgram: FakeDeepgram,
) -> Live:
    """Everything healthy: deployed and active, secrets present, webhooks pointing at us."""
    gcloud = FakeGcloud(tmp_path / "bin")
    environment.setenv("PATH", str(gcloud.directory))
    environment.setenv("GCP_PROJECT", PROJECT)
    environment.setenv("GCP_REGION", REGION)
    for name in ("GCP_SERVICE_ACCOUNT", "GCP_SCHEDULER_SERVICE_ACCOUNT", "ANTHROPIC_MODEL", "ANTHROPIC_DIGEST_MODEL"):
        environment.delenv(name, raising=False)
    environment.setenv("TWILIO_ACCOUNT_SID", ACCOUNT_SID)
    environment.setenv("TWILIO_AUTH_TOKEN", TWILIO_TOKEN)
    environment.setenv("TWILIO_WHATSAPP_FROM", f"whatsapp:{NUMBER}")
    environment.setenv("TWILIO_SMS_FROM", SMS_NUMBER)
    environment.setenv("TWILIO_API_BASE", fake_twilio.url)
    environment.setenv("DEEPGRAM_API_KEY", DEEPGRAM_KEY)
    environment.setenv("DEEPGRAM_API_BASE", fake_deepgram.url)
    deployed = Live(gcloud, cloud_run, fake_telegram, fake_twilio, fake_anthropic)
    for name in ("WHATSAPP_PUBLIC_BASE_URL", "SMS_PUBLIC_BASE_URL"):  # each function's own URL (gcloud's)
        environment.delenv(name, raising=False)
    for function in FUNCTIONS:
        deployed.describe(function)
    gcloud.answer(["secrets", "list"], "".join(f"{secret}\n" for secret in SECRET_IDS))
    deployed.job()
    fake_telegram.webhook_info = {
        "url": deployed.url("telegram_webhook"),
        "has_custom_certificate": False,
        "pending_update_count": 0,
        "max_connections": 40,
    }
    # The command menus `crossmem telegram set-webhook` sets.
    fake_telegram.menus = {("all_private_chats", ""): ENGLISH_MENU, ("all_private_chats", "es"): SPANISH_MENU}
    fake_twilio.numbers = {NUMBER: deployed.url("whatsapp_webhook"), SMS_NUMBER: deployed.url("sms_webhook")}
    return deployed


def doctor_json(capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    code = main(["doctor", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert_fixes_link_the_docs(report)
    return code, report


def assert_fixes_link_the_docs(report: dict[str, Any]) -> None:
    """Every fix names a page and heading of docs/ (one of doc_links', which a test follows)."""
    for check in report["checks"]:
        if check["fix"] is not None:
            links = LINK.findall(check["fix"])
            assert links and set(links) <= DOC_LINKS, check
        assert (check["status"] == "fail") == (check["fix"] is not None), check
    assert report["ok"] == all(check["status"] != "fail" for check in report["checks"])


def by_check(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {check["check"]: check for check in report["checks"]}


def failed(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: check for name, check in by_check(report).items() if check["status"] == "fail"}


def test_a_healthy_deployment_passes_every_check(live: Live, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":", 1)[0] for line in lines] == [f"ok    {check}" for check in CHECKS]
    assert lines[0] == (
        "ok    database: reachable; all {} migrations applied, "
        "every table, column, index, policy, trigger and SQL function they define present"
    ).format(len(list((ROOT / "infra" / "supabase" / "migrations").glob("*.sql"))))
    assert lines[1] == f"ok    secrets: all {len(SECRET_IDS)} referenced secrets exist in Secret Manager"
    assert lines[2] == (
        f"ok    function telegram_webhook: {live.url('telegram_webhook')} answers 401 without credentials, "
        "as the function does"
    )
    assert lines[6] == (
        f"ok    function memory_digest: {live.url('memory_digest')} refuses a call without a token (403): "
        "private, as it should be"
    )
    assert lines[7] == f"ok    telegram webhook: Telegram calls {live.url('telegram_webhook')}; 0 update(s) waiting"
    assert lines[8] == (
        "ok    telegram command menu: /start, /help, /link, /unlink, /forget listed in private chats "
        "in every language (en, es)"
    )
    assert lines[9] == (
        f"ok    twilio inbound url: Twilio posts {NUMBER}'s messages to {live.url('whatsapp_webhook')}, "
        "which is whatsapp_webhook's PUBLIC_BASE_URL"
    )
    assert lines[10] == (
        f"ok    twilio sms inbound url: Twilio posts {SMS_NUMBER}'s messages to {live.url('sms_webhook')}, "
        "which is sms_webhook's PUBLIC_BASE_URL"
    )
    assert lines[11] == "ok    model: claude-sonnet-5-5 (Claude Sonnet 5.5) is available to the key"
    assert lines[12] == "ok    digest model: claude-haiku-5-5 (Claude Haiku 5.5) is available to the key"
    assert lines[13] == "ok    deepgram: the key is accepted; voice notes are transcribed with nova-3"
    assert lines[14] == (
        "ok    scheduler job crossmem-memory-digest: enabled, * * * * *; its last run, at "
        "2026-12-01T12:00:00.123456Z, succeeded"
    )
    # The URLs were called as Telegram or a stranger would: no credentials.
    assert sorted(live.run.calls) == sorted((f"/{name}", None) for name in FUNCTIONS)


def test_json_lists_every_check_and_a_webhook_that_is_not_ours_fails_with_its_fix(
    live: Live, capsys: pytest.CaptureFixture[str]
) -> None:
    live.telegram.webhook_info = {**live.telegram.webhook_info, "url": "https://bots.elsewhere.example/hook"}
    code, report = doctor_json(capsys)
    assert code == 1 and report["ok"] is False
    assert [check["check"] for check in report["checks"]] == CHECKS
    assert failed(report) == {
        "telegram webhook": {
            "check": "telegram webhook",
            "status": "fail",
            "detail": f"Telegram calls https://bots.elsewhere.example/hook, not ours ({live.url('telegram_webhook')})",
            "fix": f"`crossmem telegram set-webhook --url {live.url('telegram_webhook')}` ({doc_links.WEBHOOKS})",
        }
    }
    assert {check["status"] for name, check in by_check(report).items() if name != "telegram webhook"} == {"ok"}


def test_in_a_process_a_failing_check_exits_1_without_a_traceback(live: Live) -> None:
    live.telegram.webhook_info = {**live.telegram.webhook_info, "url": ""}
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "functions.tools.cli", "doctor"],
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert done.stderr == "crossmem doctor: 1 check(s) failed\n"
    assert "FAIL  telegram webhook: Telegram calls no webhook: the bot gets no message. Fix: " in done.stdout
    # No secret of the shell's reaches the output.
    for secret in (TWILIO_TOKEN, "sk-ant-test", TELEGRAM_HEADERS["X-Telegram-Bot-Api-Secret-Token"]):
        assert secret not in done.stdout + done.stderr
    assert os.environ["TELEGRAM_BOT_TOKEN"] not in done.stdout + done.stderr


def test_failing_deliveries_say_what_telegram_said(live: Live, capsys: pytest.CaptureFixture[str]) -> None:
    live.telegram.webhook_info = {
        **live.telegram.webhook_info,
        "pending_update_count": 7,
        "last_error_date": 1764590400,
        "last_error_message": "Wrong response from the webhook: 401 Unauthorized",
    }
    code, report = doctor_json(capsys)
    assert code == 1
    check = failed(report)["telegram webhook"]
    assert (
        check["detail"] == "deliveries fail: 'Wrong response from the webhook: 401 Unauthorized', 7 update(s) waiting"
    )
    assert check["fix"].startswith("a 401 means TELEGRAM_WEBHOOK_SECRET is not the secret_token set")


def test_a_command_menu_not_set_or_short_of_a_command_is_named_with_its_fix(
    live: Live, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bot whose webhook was set before the menu was (or by another tool): "/" shows nothing."""
    live.telegram.menus = {("all_private_chats", "es"): SPANISH_MENU[:3], ("default", ""): ENGLISH_MENU}
    code, report = doctor_json(capsys)
    assert code == 1
    assert failed(report) == {
        "telegram command menu": {
            "check": "telegram command menu",
            "status": "fail",
            "detail": "the default menu (en) is not set, is listed in groups too; "
            "the es menu lacks /unlink, lacks /forget",
            "fix": f"`crossmem telegram set-webhook --url {live.url('telegram_webhook')}` sets every menu, "
            f"in private chats only ({doc_links.WEBHOOKS})",
        }
    }
    assert live.telegram.calls[1:] == [
        ("getMyCommands", {"scope": PRIVATE}),
        ("getMyCommands", {"scope": DEFAULT}),
        ("getMyCommands", {"scope": PRIVATE, "language_code": "es"}),
        ("getMyCommands", {"scope": DEFAULT, "language_code": "es"}),
    ]
    live.telegram.down = True
    code, report = doctor_json(capsys)
    assert failed(report)["telegram command menu"]["detail"] == (
        "the Bot API refused or did not answer (getMyCommands: HTTP 502)"
    )


def test_migrations_not_applied_and_a_database_that_does_not_answer(
    live: Live, environment: pytest.MonkeyPatch, postgres_server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    count = len(list((ROOT / "infra" / "supabase" / "migrations").glob("*.sql")))
    with fresh_database(postgres_server) as empty:
        environment.setenv("DATABASE_URL", empty)
        runtime.reset()
        code, report = doctor_json(capsys)
    assert code == 1 and list(failed(report)) == ["database"]
    assert failed(report)["database"]["detail"].startswith(f"reachable; {count} of {count} migrations not applied: ")
    assert failed(report)["database"]["fix"] == (
        f"`make db-push DB_URL=…` (or `crossmem migrate` with DATABASE_URL; {doc_links.DATABASE})"
    )
    environment.setenv("DATABASE_URL", f"postgresql://postgres:hunter2-password@127.0.0.1:{free_port()}/postgres")
    runtime.reset()
    code, report = doctor_json(capsys)
    check = failed(report)["database"]
    assert check["detail"].startswith("not reachable: ") and "hunter2" not in json.dumps(report)
    assert check["fix"] == f"check DATABASE_URL, and that the database accepts connections ({doc_links.DATABASE})"


def test_a_partly_migrated_database_names_what_is_missing_and_where_it_is_defined(
    live: Live, environment: pytest.MonkeyPatch, postgres_server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every migration recorded as applied, but one SQL function and one table gone (a hand-run
    drop, a migration recorded by `migration repair` without running it): the doctor says which."""
    migrations = sorted((ROOT / "infra" / "supabase" / "migrations").glob("*.sql"))
    with migrated_database(postgres_server) as url:
        environment.setenv("DATABASE_URL", url)
        runtime.reset()
        code, report = doctor_json(capsys)
        assert code == 0 and by_check(report)["database"]["status"] == "ok"
        with psycopg.connect(url, autocommit=True) as connection:
            connection.execute("drop function public.finish_turn")
            code, report = doctor_json(capsys)
            assert code == 1 and list(failed(report)) == ["database"]
            assert failed(report)["database"] == {
                "check": "database",
                "status": "fail",
                "detail": f"partly migrated: all {len(migrations)} migrations are recorded as applied, but 1 of "
                "what they define is missing: function public.finish_turn (turn.sql)",
                "fix": "create each again from its definition in infra/supabase/schemas/ "
                f"({doc_links.PARTLY_MIGRATED})",
            }
            connection.execute("drop table public.link_attempts")
            _, report = doctor_json(capsys)
            assert failed(report)["database"]["detail"].endswith(
                "but 2 of what they define is missing: table public.link_attempts (links.sql), "
                "function public.finish_turn (turn.sql)"
            )
            # A migration not recorded (its objects are not looked for: it is the one to push).
            connection.execute("delete from supabase_migrations.schema_migrations where name = 'baseline_turn'")
            _, report = doctor_json(capsys)
            turn_version = next(path.stem.partition("_")[0] for path in migrations if path.stem.endswith("_turn"))
            assert failed(report)["database"]["detail"] == (
                f"reachable; 1 of {len(migrations)} migrations not applied: {turn_version}"
            )


def test_a_column_an_index_a_policy_or_a_trigger_missing_is_named_with_where_it_is_defined(
    live: Live, environment: pytest.MonkeyPatch, postgres_server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A database brought across by hand (docs/deploy.md, a database made from older definitions)
    with its functions' statements run and a column, an index, a policy or a trigger of the new
    definitions forgotten: the doctor said ok. A column gone fails every call of a function that
    reads it (a turn answered without memory); a policy gone hides a person's rows from a frontend
    that reads them with their token; an index gone, the turn's plan; a trigger gone, a merge's notes."""
    migrations = sorted((ROOT / "infra" / "supabase" / "migrations").glob("*.sql"))
    with migrated_database(postgres_server) as url:
        environment.setenv("DATABASE_URL", url)
        runtime.reset()
        with psycopg.connect(url, autocommit=True) as connection:
            connection.execute("drop index public.follow_ups_reserved")
            connection.execute("drop policy messages_owner_reads on public.messages")
            connection.execute("drop trigger identities_merge_memory_notes on public.identities")
            connection.execute("alter table public.messages drop column reply_id")
            connection.execute("alter table public.link_attempts drop column surface")  # its table's indexes go
        code, report = doctor_json(capsys)
    assert code == 1 and list(failed(report)) == ["database"]
    assert failed(report)["database"]["detail"] == (
        f"partly migrated: all {len(migrations)} migrations are recorded as applied, but 7 of what they define "
        "is missing: column public.messages.reply_id (messages.sql), column public.link_attempts.surface (links.sql), "
        "index public.link_attempts_by_identity (links.sql), index public.link_attempts_once (links.sql), "
        "trigger identities_merge_memory_notes on public.identities (memory_notes.sql), "
        "index public.follow_ups_reserved (follow_ups.sql), policy messages_owner_reads on public.messages (access.sql)"
    )


def test_a_database_made_from_older_definitions_names_each_function_that_differs(
    live: Live, environment: pytest.MonkeyPatch, postgres_server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Pushed from an earlier checkout, then `make db-push` from this one: every baseline migration
    is recorded as applied, so the push ("Remote database is up to date.") changed no function. The
    doctor said ok, and a changed function failed each call (a new argument: UndefinedFunction, a
    reply that went out unstored); a new one was "partly migrated", with a fix that left the others."""
    with migrated_database(postgres_server) as url:
        environment.setenv("DATABASE_URL", url)
        runtime.reset()
        with psycopg.connect(url, autocommit=True) as connection:
            # An earlier body (same arguments), and an earlier signature in place of today's.
            connection.execute(
                """create or replace function public.window_keeps(p_total bigint, p_limit integer, p_step integer)
                   returns integer language sql immutable set search_path = '' as $$ select 0 $$"""
            )
            connection.execute("drop function public.finish_turn")
            connection.execute(
                """create function public.finish_turn(p_user_id uuid, p_user_message_id bigint)
                   returns jsonb language sql set search_path = '' as $$ select null::jsonb $$"""
            )
            connection.execute("drop function public.record_delivery")
            code, report = doctor_json(capsys)
    migrations = sorted((ROOT / "infra" / "supabase" / "migrations").glob("*.sql"))
    assert code == 1 and list(failed(report)) == ["database"]
    assert failed(report)["database"] == {
        "check": "database",
        "status": "fail",
        "detail": f"made from other definitions than these: all {len(migrations)} migrations are recorded as "
        "applied, but 2 SQL function(s) differ from their definition in infra/supabase/schemas/: "
        "function public.window_keeps (context.sql), function public.finish_turn (turn.sql); "
        "1 missing: function public.record_delivery (turn.sql)",
        "fix": "a push runs no migration recorded as applied: bring the database across "
        f"({doc_links.OLDER_DEFINITIONS})",
    }


def test_a_function_pushed_from_a_checkout_with_crlf_line_ends_is_as_defined(
    live: Live, environment: pytest.MonkeyPatch, postgres_server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A checkout with Windows line ends (git's autocrlf) pushes each body with them: the same text."""
    definitions = (ROOT / "infra" / "supabase" / "schemas" / "context.sql").read_text()
    start = definitions.index("create or replace function public.window_keeps(")
    statement = definitions[start : definitions.index("$$;", start) + 3]
    with migrated_database(postgres_server) as url:
        environment.setenv("DATABASE_URL", url)
        runtime.reset()
        with psycopg.connect(url, autocommit=True) as connection:
            connection.execute(statement.replace("\n", "\r\n").encode())
        code, report = doctor_json(capsys)
    assert code == 0 and by_check(report)["database"]["status"] == "ok"


def test_a_referenced_secret_missing_from_secret_manager(live: Live, capsys: pytest.CaptureFixture[str]) -> None:
    live.gcloud.answer(["secrets", "list"], "".join(f"{s}\n" for s in SECRET_IDS if s != "crossmem-database-url"))
    code, report = doctor_json(capsys)
    assert code == 1
    assert failed(report)["secrets"] == {
        "check": "secrets",
        "status": "fail",
        "detail": "referenced but not in Secret Manager: crossmem-database-url (by telegram_webhook, "
        "whatsapp_webhook, sms_webhook, web_chat, memory_digest); a new instance cannot start",
        "fix": "`printf %s VALUE | gcloud secrets create crossmem-database-url --data-file=-` "
        f"({doc_links.SECRETS}), or `make deploy` to drop the reference",
    }


def test_secrets_list_refused_names_the_role(live: Live, capsys: pytest.CaptureFixture[str]) -> None:
    live.gcloud.fail(["secrets", "list"], PERMISSION_DENIED_SECRETS_LIST)
    code, report = doctor_json(capsys)
    assert code == 1
    assert failed(report)["secrets"]["fix"] == (
        "the permission secretmanager.secrets.list is missing: grant whoever deploys roles/secretmanager.viewer "
        f"(the deployer's roles: {doc_links.GOOGLE_CLOUD})"
    )


def test_functions_not_deployed_refused_by_cloud_run_or_public_when_private(
    live: Live, capsys: pytest.CaptureFixture[str]
) -> None:
    live.gcloud.fail(["functions", "describe", "web_chat"], FUNCTION_NOT_FOUND.format(name="web_chat"))
    live.run.answers["telegram_webhook"] = 403
    live.run.answers["memory_digest"] = 405
    live.run.answers["whatsapp_webhook"] = 503
    code, report = doctor_json(capsys)
    assert code == 1
    problems = failed(report)
    assert sorted(problems) == [
        "function memory_digest",
        "function telegram_webhook",
        "function web_chat",
        "function whatsapp_webhook",
    ]
    assert problems["function web_chat"]["detail"] == "not deployed"
    assert problems["function web_chat"]["fix"] == f"`make deploy` ({doc_links.FUNCTIONS})"
    assert problems["function telegram_webhook"]["detail"] == (
        f"{live.url('telegram_webhook')} answers 403: Cloud Run refuses callers without a Google identity"
    )
    assert problems["function memory_digest"]["detail"] == (
        f"{live.url('memory_digest')} answers 405 to a call without a token: it is public"
    )
    assert problems["function memory_digest"]["fix"] == (
        f"`make deploy` (it deploys memory_digest with --no-allow-unauthenticated: {doc_links.SCHEDULE})"
    )
    assert problems["function whatsapp_webhook"]["detail"] == (
        f"{live.url('whatsapp_webhook')} answers 503: not_configured: the function's 503"
    )


def test_a_whatsapp_only_deployment_passes_without_the_sms_function_it_does_not_deploy(
    live: Live, environment: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without TWILIO_SMS_FROM `make deploy` leaves sms_webhook out (serverless.yml's `needs`): the
    doctor skips it, even where an earlier deploy of it answers 503, and the deployment passes."""
    live.run.answers["sms_webhook"] = 503
    code, report = doctor_json(capsys)
    assert code == 1 and list(failed(report)) == ["function sms_webhook"]
    environment.delenv("TWILIO_SMS_FROM")
    runtime.reset()
    code, report = doctor_json(capsys)
    assert code == 0
    assert by_check(report)["function sms_webhook"] == {
        "check": "function sms_webhook",
        "status": "skip",
        "detail": "`make deploy` leaves it out: it needs TWILIO_ACCOUNT_SID and TWILIO_SMS_FROM, not set here",
        "fix": None,
    }
    assert by_check(report)["function whatsapp_webhook"]["status"] == "ok"


def test_a_url_with_nothing_behind_it(live: Live, capsys: pytest.CaptureFixture[str]) -> None:
    live.run.answers.pop("web_chat")
    code, report = doctor_json(capsys)
    assert failed(report)["function web_chat"]["detail"] == f"{live.url('web_chat')} answers 404: no function there"


def test_the_twilio_number_posting_elsewhere_fails(live: Live, capsys: pytest.CaptureFixture[str]) -> None:
    live.twilio.numbers[NUMBER] = "https://us-central1-advisor-prod.cloudfunctions.net/whatsapp_webhook/"
    code, report = doctor_json(capsys)
    assert code == 1
    check = failed(report)["twilio inbound url"]
    assert check["detail"] == (
        f"Twilio posts {NUMBER}'s messages to https://us-central1-advisor-prod.cloudfunctions.net/whatsapp_webhook/, "
        f"not whatsapp_webhook's PUBLIC_BASE_URL {live.url('whatsapp_webhook')}; every signature is checked "
        "against it, so each message is refused 403"
    )
    assert check["fix"].startswith(f"set the number's 'A message comes in' to {live.url('whatsapp_webhook')}")
    assert list(failed(report)) == ["twilio inbound url"]


def test_the_sms_number_posting_to_another_url_than_sms_webhooks_fails(
    live: Live, environment: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The SMS number checked as the WhatsApp sender is, against sms_webhook's own URL or the
    shell's SMS_PUBLIC_BASE_URL (the one the deploy gives it), never WhatsApp's."""
    environment.setenv("WHATSAPP_PUBLIC_BASE_URL", "https://hooks.advisor.example.com/whatsapp")
    live.twilio.numbers = {NUMBER: "https://hooks.advisor.example.com/whatsapp", SMS_NUMBER: live.url("sms_webhook")}
    code, report = doctor_json(capsys)
    assert code == 0 and by_check(report)["twilio sms inbound url"]["status"] == "ok"
    live.twilio.numbers[SMS_NUMBER] = "https://hooks.advisor.example.com/whatsapp"
    code, report = doctor_json(capsys)
    assert code == 1 and list(failed(report)) == ["twilio sms inbound url"]
    assert failed(report)["twilio sms inbound url"] == {
        "check": "twilio sms inbound url",
        "status": "fail",
        "detail": f"Twilio posts {SMS_NUMBER}'s messages to https://hooks.advisor.example.com/whatsapp, not "
        f"sms_webhook's PUBLIC_BASE_URL {live.url('sms_webhook')}; every signature is checked against it, so each "
        "message is refused 403",
        "fix": f"set the number's 'A message comes in' to {live.url('sms_webhook')}, method POST (Twilio console), "
        f"or SMS_PUBLIC_BASE_URL to the URL Twilio calls, then `make deploy` ({doc_links.WEBHOOKS})",
    }
    environment.delenv("TWILIO_SMS_FROM")
    runtime.reset()
    code, report = doctor_json(capsys)
    assert by_check(report)["twilio sms inbound url"] == {
        "check": "twilio sms inbound url",
        "status": "skip",
        "detail": "set TWILIO_ACCOUNT_SID, TWILIO_AUTH_TOKEN and TWILIO_SMS_FROM here to ask Twilio",
        "fix": None,
    }


def test_a_sender_that_is_not_an_account_number_is_skipped_with_what_to_check(
    live: Live, capsys: pytest.CaptureFixture[str]
) -> None:
    live.twilio.numbers = {}
    code, report = doctor_json(capsys)
    assert code == 0
    assert by_check(report)["twilio inbound url"]["status"] == "skip"


def test_a_model_the_key_cannot_use(
    live: Live, environment: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    environment.setenv("ANTHROPIC_MODEL", "claude-sonnet-4-0-retired")
    runtime.reset()
    code, report = doctor_json(capsys)
    assert code == 1
    assert failed(report) == {
        "model": {
            "check": "model",
            "status": "fail",
            "detail": "claude-sonnet-4-0-retired is not available to this key",
            "fix": "set ANTHROPIC_MODEL to a model `GET /v1/models` lists for the key, then `make deploy` "
            f"({doc_links.CONFIGURATION})",
        }
    }


def test_a_model_that_does_not_take_the_thinking_the_turns_send(
    live: Live, environment: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """ANTHROPIC_THINKING=between_tools (the default) with a model whose capabilities lack it (Haiku
    5.5, as the Models API lists it): every turn would answer 400. Adaptive thinking is taken."""
    environment.setenv("ANTHROPIC_MODEL", "claude-haiku-5-5")
    runtime.reset()
    code, report = doctor_json(capsys)
    assert code == 1
    assert failed(report)["model"] == {
        "check": "model",
        "status": "fail",
        "detail": "claude-haiku-5-5 does not take thinking between_tools: every turn would be refused",
        "fix": "set ANTHROPIC_THINKING=adaptive, or ANTHROPIC_MODEL to a model that takes it; `make deploy` "
        f"({doc_links.CONFIGURATION})",
    }
    environment.setenv("ANTHROPIC_THINKING", "adaptive")
    runtime.reset()
    _, report = doctor_json(capsys)
    assert by_check(report)["model"]["detail"] == "claude-haiku-5-5 (Claude Haiku 5.5) is available to the key"


def test_the_scheduler_job_missing_paused_or_failing(live: Live, capsys: pytest.CaptureFixture[str]) -> None:
    name = "scheduler job crossmem-memory-digest"
    live.job(status={"code": 7, "message": "The caller does not have permission"})
    _, report = doctor_json(capsys)
    assert failed(report)[name]["detail"] == (
        "its last run, at 2026-12-01T12:00:00.123456Z, failed: PERMISSION_DENIED (The caller does not have permission)"
    )
    assert failed(report)[name]["fix"] == (
        "the scheduler's account may not invoke the function: `make deploy` grants it; "
        f"`gcloud functions logs read memory_digest --region=us-central1` ({doc_links.SCHEDULE})"
    )
    live.job(state="PAUSED")
    code, report = doctor_json(capsys)
    assert code == 1
    assert failed(report)[name] == {
        "check": name,
        "status": "fail",
        "detail": "paused: it calls memory_digest no more, so owed replies, due follow-ups and memory notes wait",
        "fix": f"`gcloud scheduler jobs resume crossmem-memory-digest --location=us-central1` ({doc_links.SCHEDULE})",
    }
    live.job(state="UPDATE_FAILED")
    _, report = doctor_json(capsys)
    assert failed(report)[name]["detail"].startswith(
        "not enabled (state UPDATE_FAILED): it calls memory_digest no more"
    )
    live.gcloud.fail(["scheduler", "jobs", "describe"], JOB_NOT_FOUND)
    code, report = doctor_json(capsys)
    assert code == 1
    assert failed(report)[name] == {
        "check": name,
        "status": "fail",
        "detail": "does not exist",
        "fix": f"`make deploy` (it creates the job: {doc_links.SCHEDULE})",
    }


def test_the_fake_front_door_answers_as_the_real_functions_do(environment: pytest.MonkeyPatch) -> None:
    """ANSWERS, for the public functions, is what each real function says to the doctor's call."""
    environment.setenv("TWILIO_AUTH_TOKEN", TWILIO_TOKEN)
    environment.setenv("PUBLIC_BASE_URL", "https://advisor.example.com/whatsapp")
    environment.setenv("SUPABASE_JWT_SECRET", "web-jwt-secret-for-tests-32-bytes-long")
    for function in ("telegram_webhook", "whatsapp_webhook", "web_chat"):
        assert app_client(function).get("/").status_code == ANSWERS[function], function


# Without a project, without gcloud, without settings that parse: the rest still runs.


def test_without_a_project_every_check_that_needs_none_runs_and_the_cloud_ones_are_skipped(
    live: Live, environment: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    environment.delenv("GCP_PROJECT")
    environment.setenv("WHATSAPP_PUBLIC_BASE_URL", live.url("whatsapp_webhook"))
    environment.setenv("SMS_PUBLIC_BASE_URL", live.url("sms_webhook"))
    code, report = doctor_json(capsys)
    assert code == 0 and report["ok"] is True
    checks = by_check(report)
    assert [check["check"] for check in report["checks"]] == CHECKS
    for name in THROUGH_GCLOUD:
        assert checks[name] == {
            "check": name,
            "status": "skip",
            "detail": f"GCP_PROJECT is not set here: set it to ask gcloud ({doc_links.FUNCTIONS})",
            "fix": None,
        }
    assert {name: check["status"] for name, check in checks.items() if name not in THROUGH_GCLOUD} == {
        "database": "ok",
        "telegram webhook": "ok",
        "telegram command menu": "ok",
        "twilio inbound url": "ok",  # WHATSAPP_PUBLIC_BASE_URL says which URL is ours
        "twilio sms inbound url": "ok",
        "model": "ok",
        "digest model": "ok",
        "deepgram": "ok",
    }
    assert checks["telegram webhook"]["detail"] == (
        f"Telegram calls {live.url('telegram_webhook')}; 0 update(s) waiting; "
        "not compared with telegram_webhook's URL, which only gcloud can tell"
    )
    assert live.gcloud.calls == [] and live.run.calls == []
    # Nor does Twilio's check guess our URL when nothing says it.
    environment.delenv("WHATSAPP_PUBLIC_BASE_URL")
    runtime.reset()
    code, report = doctor_json(capsys)
    assert code == 0
    assert by_check(report)["twilio inbound url"] == {
        "check": "twilio inbound url",
        "status": "skip",
        "detail": f"Twilio posts {NUMBER}'s messages to {live.url('whatsapp_webhook')}; set WHATSAPP_PUBLIC_BASE_URL "
        "(or let gcloud be asked) to compare it with the URL whatsapp_webhook checks signatures against",
        "fix": None,
    }


def test_without_gcloud_the_cloud_checks_say_to_install_it(
    live: Live, environment: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    environment.setenv("PATH", str(tmp_path / "empty"))
    code, report = doctor_json(capsys)
    assert code == 0, failed(report)
    for name in THROUGH_GCLOUD:
        assert by_check(report)[name]["detail"] == (
            f"gcloud is not on PATH: install the Google Cloud CLI to ask it ({doc_links.GOOGLE_CLOUD})"
        )
    assert by_check(report)["telegram webhook"]["status"] == "ok"


def doctor_process(environment: dict[str, str], tmp_path: Path, pythonpath: str = str(ROOT)) -> tuple[int, Any]:
    """`crossmem doctor --json` in a shell with only `environment`, no gcloud, no .env: its exit
    code and its stdout read as JSON."""
    shell = {"PATH": str(tmp_path / "no-tools"), "HOME": str(tmp_path), "PYTHONPATH": pythonpath, **environment}
    done = subprocess.run(
        [sys.executable, "-m", "functions.tools.cli", "doctor", "--json"],
        env=shell,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "Traceback" not in done.stderr, done.stderr
    report = json.loads(done.stdout)
    assert_fixes_link_the_docs(report)
    return done.returncode, report


def test_json_from_a_bare_shell_skips_everything_and_exits_0_and_1_only_for_a_failed_check(tmp_path: Path) -> None:
    code, report = doctor_process({}, tmp_path)
    assert code == 0 and report["ok"] is True
    assert [check["check"] for check in report["checks"]] == CHECKS
    assert {check["status"] for check in report["checks"]} == {"skip"}
    assert by_check(report)["database"]["detail"] == (
        "DATABASE_URL is not set here: set it to the session pooler's URL to check the database and its "
        f"migrations ({doc_links.DATABASE})"
    )
    code, report = doctor_process({"DATABASE_URL": f"postgresql://postgres@127.0.0.1:{free_port()}/postgres"}, tmp_path)
    assert code == 1 and report["ok"] is False
    assert list(failed(report)) == ["database"]


def test_json_even_when_a_setting_does_not_parse(tmp_path: Path) -> None:
    code, report = doctor_process({"PORT": "eighty"}, tmp_path)
    assert code == 1
    ((check),) = report["checks"]
    assert check == {
        "check": "settings",
        "status": "fail",
        "detail": "invalid configuration: PORT: Input should be a valid integer, unable to parse string as an integer",
        "fix": f"correct the setting it names ({doc_links.CONFIGURATION})",
    }


def test_every_wrong_setting_is_named_whichever_function_reads_it(tmp_path: Path) -> None:
    """A function refuses only for its own wrong settings; the doctor names all of them, never a value."""
    wrong = {"TWILIO_API_BASE": "https://AC1:hunter2@api.twilio.com:443x", "SUPABASE_JWKS_URL": "jwks.json"}
    code, report = doctor_process({**wrong, "DATABASE_POOL_SIZE": "0"}, tmp_path)
    assert code == 1
    ((check),) = report["checks"]
    assert check["detail"] == (
        "invalid configuration: DATABASE_POOL_SIZE: Input should be greater than or equal to 1; "
        "TWILIO_API_BASE: Value error, not an http(s) URL with a host; "
        "SUPABASE_JWKS_URL: Value error, not an http(s) URL with a host"
    )
    assert "hunter2" not in json.dumps(report)


def test_json_even_without_pyyaml_and_every_check_that_needs_no_serverless_yml_runs(tmp_path: Path) -> None:
    # An environment without PyYAML: importing it fails as it would when it is not installed.
    blocker = tmp_path / "no-pyyaml"
    blocker.mkdir()
    (blocker / "yaml.py").write_text("raise ImportError(\"No module named 'yaml'\")\n")
    code, report = doctor_process({}, tmp_path, pythonpath=f"{blocker}{os.pathsep}{ROOT}")
    assert code == 1
    unreadable = report["checks"][0]
    assert unreadable["check"] == "serverless.yml" and unreadable["status"] == "fail"
    assert unreadable["detail"].startswith("reading serverless.yml needs PyYAML, which ")
    assert "-m pip install 'pyyaml>=6'" in unreadable["detail"] and "crossmem[deploy]" not in unreadable["detail"]
    # The functions are unknown, so none is listed; every check that needs none still answers.
    assert [check["check"] for check in report["checks"][1:]] == [
        name for name in CHECKS if not name.startswith(("function ", "scheduler job "))
    ]


def test_a_deepgram_key_that_is_refused(
    live: Live, environment: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    environment.setenv("DEEPGRAM_API_KEY", "a-key-deepgram-never-made")
    runtime.reset()
    code, report = doctor_json(capsys)
    assert code == 1
    assert failed(report) == {
        "deepgram": {
            "check": "deepgram",
            "status": "fail",
            "detail": "the key is refused (401)",
            "fix": f"check DEEPGRAM_API_KEY (crossmem-deepgram-api-key; {doc_links.SECRETS})",
        }
    }
    assert "a-key-deepgram-never-made" not in json.dumps(report)


def test_a_check_that_breaks_is_one_failed_line_and_the_others_still_answer(
    live: Live, capsys: pytest.CaptureFixture[str]
) -> None:
    live.telegram.webhook_info = ["not", "an", "object"]  # type: ignore[assignment]  # Telegram answering nonsense
    code, report = doctor_json(capsys)
    assert code == 1 and list(failed(report)) == ["telegram webhook"]
    assert failed(report)["telegram webhook"]["detail"].startswith("the check itself failed: AttributeError")
    assert [check["check"] for check in report["checks"]] == CHECKS


def test_the_doctor_checks_the_inbound_url_of_every_twilio_surface() -> None:
    """TWILIO_WEBHOOKS is written by hand: each surface TWILIO_AUTH_TOKEN's mark names (a Twilio
    surface, docs/extending.md) has its entry, with its function, its number's setting, and the
    deploying shell's variable serverless.yml gives that function's PUBLIC_BASE_URL from. Without
    one, a fifth Twilio surface added by docs/extending.md's table alone was never checked: its
    number's 'A message comes in' could point elsewhere, every message refused 403."""
    from core.surfaces.adapter import Surface
    from functions.settings import Settings, SurfaceSetting
    from functions.tools.doctor import TWILIO_WEBHOOKS

    [mark] = [m for m in Settings.model_fields["twilio_auth_token"].metadata if isinstance(m, SurfaceSetting)]
    twilio = [surface for surface in Surface if surface in mark.surfaces]
    assert [hook.function for hook in TWILIO_WEBHOOKS] == [f"{surface.value}_webhook" for surface in twilio]
    described = {function.name: function for function in read_description().functions}
    for hook, surface in zip(TWILIO_WEBHOOKS, twilio, strict=True):
        assert hook.number_setting == f"TWILIO_{surface.name}_FROM"
        assert hook.number_setting.lower() in Settings.model_fields
        assert described[hook.function].environment["PUBLIC_BASE_URL"].startswith(f"${{env:{hook.url_variable},")


def test_secrets_unknown_when_gcloud_could_describe_no_function(live: Live, capsys: pytest.CaptureFixture[str]) -> None:
    """Seen failing: logged out of gcloud, each function's line failed saying so, and the secrets'
    said "no function is deployed", which nothing had found out."""
    logged_out = "ERROR: (gcloud.functions.describe) You do not currently have an active account selected.\n"
    live.gcloud.fail(["functions", "describe"], logged_out)
    code, report = doctor_json(capsys)
    assert code == 1
    assert by_check(report)["secrets"] == {
        "check": "secrets",
        "status": "skip",
        "detail": "gcloud described no function (each function's line says why), so the secrets they reference "
        "are not known",
        "fix": None,
    }


def test_secrets_skipped_when_no_function_is_deployed(live: Live, capsys: pytest.CaptureFixture[str]) -> None:
    for function in ("telegram_webhook", "whatsapp_webhook", "sms_webhook", "web_chat", "memory_digest"):
        live.gcloud.fail(["functions", "describe", function], FUNCTION_NOT_FOUND.format(name=function))
    code, report = doctor_json(capsys)
    assert code == 1
    assert by_check(report)["secrets"]["detail"] == "no function is deployed, so none references a secret yet"
