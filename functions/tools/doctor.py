"""`crossmem doctor`: a check of the live deployment, one line each, with what to do when it
fails (every fix names its page of docs/); `--json` for scripts, JSON even when it cannot start;
exit 1 when a check fails, and only then (a check skipped is not a failure).

What it asks, and whom: the database (`DATABASE_URL`: reachable, every migration of
infra/supabase/migrations applied); Secret Manager (`gcloud secrets list`: every secret the
deployed functions reference exists); each function (`gcloud functions describe`: deployed and
ACTIVE; its URL, called without credentials, answers as that function does, not Cloud Run's 403
or 404, and the private one refuses); Telegram (`getWebhookInfo`: the URL it calls is
telegram_webhook's, no failing deliveries); Twilio (the IncomingPhoneNumbers resource: the
sender's SmsUrl, "A message comes in", is PUBLIC_BASE_URL); Anthropic (`GET /v1/models/{id}`:
the turn's and the digest's models are available to the key); Deepgram (`GET /v1/auth/token`,
its own test of a key: the voice notes' key is accepted); Cloud Scheduler (`gcloud scheduler
jobs describe`: the job exists, is enabled, and its last run succeeded).

It reads the deploying shell's settings (the environment, then `.env`), as `crossmem deploy`
does: GCP_PROJECT and GCP_REGION, and the keys it checks with. A check whose setting is not
there is skipped, and says which to set; it never prints a secret. Without GCP_PROJECT (or
without gcloud) the checks that ask gcloud are skipped and the others still run: the database,
Telegram, Twilio, Anthropic and Deepgram need no project.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import httpx

from core.errors import ConfigurationError, DeliveryFailed
from core.settings import Settings
from core.stores.embedded import MIGRATIONS
from functions import runtime
from functions.tools.deploy import (
    Description,
    DescriptionError,
    FunctionSpec,
    Target,
    TargetNotSet,
    function_url,
    read_description,
    secret_id,
)
from functions.tools.doc_links import (
    CONFIGURATION,
    DATABASE,
    DOCTOR,
    FUNCTIONS,
    GOOGLE_CLOUD,
    SCHEDULE,
    SECRETS,
    WEBHOOKS,
)
from functions.tools.tool_failures import ToolFailed, run_tool

PROBE_TIMEOUT_S = 10.0
# google.rpc.Code of a Cloud Scheduler job's last attempt, and what usually causes each.
RPC_CODES = {
    4: ("DEADLINE_EXCEEDED", "the run took longer than the job's attempt deadline"),
    5: ("NOT_FOUND", "nothing at the job's URL: `make deploy`"),
    7: ("PERMISSION_DENIED", "the scheduler's account may not invoke the function: `make deploy` grants it"),
    13: ("INTERNAL", "the function answered 5xx: read its logs"),
    14: ("UNAVAILABLE", "the function answered 503: read its logs"),
    16: ("UNAUTHENTICATED", "the job's OIDC token was refused: `make deploy` sets its audience"),
}


@dataclass(frozen=True)
class Check:
    check: str
    status: str  # "ok", "fail" or "skip"
    detail: str
    fix: str | None = None

    def line(self) -> str:
        fix = f". Fix: {self.fix}" if self.fix else ""
        return f"{self.status.upper() if self.status == 'fail' else self.status:<4}  {self.check}: {self.detail}{fix}"


def ok(check: str, detail: str) -> Check:
    return Check(check, "ok", detail)


def fail(check: str, detail: str, fix: str) -> Check:
    return Check(check, "fail", detail, fix)


def skip(check: str, detail: str) -> Check:
    return Check(check, "skip", detail)


# The database.


def check_database(config: Settings) -> Check:
    name = "database"
    if config.database_url is None:
        # Unset here says nothing of the deployed functions' database: skipped, as every check is
        # whose setting this shell lacks.
        using = " (the functions use SUPABASE_URL)" if config.supabase_url else ""
        return skip(
            name,
            f"DATABASE_URL is not set here{using}: set it to the session pooler's URL to check the database "
            f"and its migrations ({DATABASE})",
        )
    wanted = sorted(path.stem.partition("_")[0] for path in MIGRATIONS.glob("*.sql"))
    try:
        applied = applied_migrations(config.database_url.get_secret_value(), config.database_connect_timeout)
    except Exception as exc:  # the driver's error: its first line says what (never the password)
        said = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return fail(
            name,
            f"not reachable: {said}",
            f"check DATABASE_URL, and that the database accepts connections ({DATABASE})",
        )
    pending = [version for version in wanted if version not in applied]
    if pending:
        return fail(
            name,
            f"reachable; {len(pending)} of {len(wanted)} migrations not applied: {', '.join(pending)}",
            f"`make db-push DB_URL=…` (or `crossmem migrate` with DATABASE_URL; {DATABASE})",
        )
    return ok(name, f"reachable; all {len(wanted)} migrations applied")


def applied_migrations(url: str, connect_timeout_s: int) -> set[str]:
    """The versions recorded in Supabase's bookkeeping table (empty when it does not exist)."""
    import psycopg

    with psycopg.connect(url, connect_timeout=connect_timeout_s, autocommit=True) as connection:
        table = connection.execute("select to_regclass('supabase_migrations.schema_migrations')").fetchone()
        if table is None or table[0] is None:
            return set()
        return {row[0] for row in connection.execute("select version from supabase_migrations.schema_migrations")}


# The functions, as gcloud describes them.


@dataclass(frozen=True)
class Deployed:
    spec: FunctionSpec
    described: Mapping[str, Any] | None  # None: describe failed
    failure: ToolFailed | None = None

    def urls(self, target: Target) -> list[str]:
        """Its URLs: the one gcloud gives first, then the run.app one and the documented one."""
        found = []
        if self.described is not None:
            found += [self.described.get("url"), self.described.get("serviceConfig", {}).get("uri")]
        found.append(function_url(target.region, target.project, self.spec.name))
        return list(dict.fromkeys(url for url in found if url))


def describe(spec: FunctionSpec, target: Target) -> Deployed:
    command = [
        "gcloud",
        "functions",
        "describe",
        spec.name,
        "--gen2",
        f"--project={target.project}",
        f"--region={target.region}",
        "--format=json",
    ]
    try:
        return Deployed(spec, json.loads(run_tool(command, project=target.project).stdout))
    except ToolFailed as exc:
        return Deployed(spec, None, exc)


def check_secrets(deployed: list[Deployed], target: Target) -> Check:
    name = "secrets"
    referenced: dict[str, list[str]] = {}
    for function in deployed:
        for variable in (function.described or {}).get("serviceConfig", {}).get("secretEnvironmentVariables", []):
            referenced.setdefault(secret_id(str(variable["secret"])), []).append(function.spec.name)
    if not any(function.described for function in deployed):
        return skip(name, "no function is deployed, so none references a secret yet")
    try:
        listed = run_tool(
            ["gcloud", "secrets", "list", f"--project={target.project}", "--format=value(name.basename())"],
            project=target.project,
        )
    except ToolFailed as exc:
        return fail(name, f"`gcloud secrets list` failed: {exc.said}", exc.fix)
    existing = set(listed.stdout.split())
    missing = sorted(set(referenced) - existing)
    if missing:
        users = "; ".join(f"{secret} (by {', '.join(referenced[secret])})" for secret in missing)
        return fail(
            name,
            f"referenced but not in Secret Manager: {users}; a new instance cannot start",
            f"`printf %s VALUE | gcloud secrets create {missing[0]} --data-file=-` ({SECRETS}), "
            "or `make deploy` to drop the reference",
        )
    return ok(name, f"all {len(referenced)} referenced secrets exist in Secret Manager")


def check_function(function: Deployed, target: Target) -> Check:
    name = f"function {function.spec.name}"
    if function.described is None:
        assert function.failure is not None
        if "NOT_FOUND" in function.failure.said:
            return fail(name, "not deployed", f"`make deploy` ({FUNCTIONS})")
        return fail(name, f"`gcloud functions describe` failed: {function.failure.said}", function.failure.fix)
    state = function.described.get("state")
    if state != "ACTIVE":
        return fail(name, f"state {state}", f"`make deploy` again; `gcloud functions describe` says why ({FUNCTIONS})")
    url = function.urls(target)[0]
    try:
        answer = httpx.get(url, timeout=PROBE_TIMEOUT_S)
    except httpx.HTTPError as exc:
        return fail(name, f"{url} does not answer: {type(exc).__name__}", f"check the URL; `make deploy` ({FUNCTIONS})")
    status = answer.status_code
    if status == 404:
        return fail(
            name,
            f"{url} answers 404: no function there",
            f"`make deploy` (a function's URL ends in its name: {FUNCTIONS})",
        )
    if not function.spec.public:
        if status in (401, 403):
            return ok(name, f"{url} refuses a call without a token ({status}): private, as it should be")
        return fail(
            name,
            f"{url} answers {status} to a call without a token: it is public",
            f"`make deploy` (it deploys {function.spec.name} with --no-allow-unauthenticated: {SCHEDULE})",
        )
    if status == 403:
        return fail(
            name,
            f"{url} answers 403: Cloud Run refuses callers without a Google identity",
            "`make deploy` (it deploys the webhooks with --allow-unauthenticated; an organization policy "
            f"restricting allUsers forbids that: {FUNCTIONS})",
        )
    if status >= 500:
        said = error_message(answer)
        return fail(
            name,
            f"{url} answers {status}{said}",
            f"give it what it names (serverless.yml), then `make deploy` ({FUNCTIONS})",
        )
    return ok(name, f"{url} answers {status} without credentials, as the function does")


def error_message(answer: httpx.Response) -> str:
    """Our functions' JSON error (`not_configured: ...`), when the answer is one."""
    try:
        body = answer.json()
    except ValueError:
        return ""
    if isinstance(body, dict) and "error" in body:
        return f": {body['error']}: {body.get('message', '')}"
    return ""


# Telegram and Twilio: no project needed, though only a project says which URLs are ours.


def check_telegram(config: Settings, ours: list[str], region: str | None) -> Check:
    """`ours`: telegram_webhook's URLs (empty when no project is known)."""
    name = "telegram webhook"
    if config.telegram_bot_token is None:
        return skip(name, "TELEGRAM_BOT_TOKEN is not set here: set it to ask Telegram")
    try:
        info = runtime.telegram_bot().call("getWebhookInfo", {})["result"]
    except DeliveryFailed as exc:
        return fail(
            name,
            f"the Bot API refused or did not answer ({exc})",
            f"check TELEGRAM_BOT_TOKEN (crossmem-telegram-bot-token; {SECRETS}) and the network",
        )
    url, pending = info.get("url", ""), int(info.get("pending_update_count", 0))
    set_webhook = f"`crossmem telegram set-webhook --url {ours[0] if ours else 'URL'}` ({WEBHOOKS})"
    if not url:
        return fail(name, "Telegram calls no webhook: the bot gets no message", set_webhook)
    if ours and url not in ours:
        return fail(name, f"Telegram calls {url}, not ours ({ours[0]})", set_webhook)
    last_error = info.get("last_error_message")
    if last_error and pending:
        return fail(
            name,
            f"deliveries fail: {last_error!r}, {pending} update(s) waiting",
            "a 401 means TELEGRAM_WEBHOOK_SECRET is not the secret_token set: run `crossmem telegram set-webhook` "
            f"again; else read the logs: `gcloud functions logs read telegram_webhook --region={region or 'REGION'}` "
            f"({WEBHOOKS})",
        )
    earlier = f"; an earlier error: {last_error!r}" if last_error else ""
    unchecked = "" if ours else "; not compared with telegram_webhook's URL, which only gcloud can tell"
    return ok(name, f"Telegram calls {url}; {pending} update(s) waiting{earlier}{unchecked}")


def check_twilio(config: Settings, expected: str | None) -> Check:
    """`expected`: the URL signatures are checked against (PUBLIC_BASE_URL, else whatsapp_webhook's
    own; None when neither is known)."""
    name = "twilio inbound url"
    if not (config.twilio_account_sid and config.twilio_auth_token and config.twilio_whatsapp_from):
        return skip(name, "set TWILIO_ACCOUNT_SID, TWILIO_AUTH_TOKEN and TWILIO_WHATSAPP_FROM here to ask Twilio")
    number = config.twilio_whatsapp_from.removeprefix("whatsapp:")
    from twilio.base.exceptions import TwilioException, TwilioRestException
    from twilio.http.http_client import TwilioHttpClient
    from twilio.rest import Client

    client = Client(
        config.twilio_account_sid,
        config.twilio_auth_token.get_secret_value(),
        http_client=TwilioHttpClient(timeout=PROBE_TIMEOUT_S),
    )
    if config.twilio_api_base:
        client.api.base_url = config.twilio_api_base.rstrip("/")
    try:
        numbers = client.api.v2010.account.incoming_phone_numbers.list(phone_number=number, limit=1)
    except TwilioRestException as exc:
        return fail(
            name,
            f"Twilio refused: {exc.status} {exc.code}",
            f"check TWILIO_ACCOUNT_SID and TWILIO_AUTH_TOKEN ({WEBHOOKS})",
        )
    except (TwilioException, OSError) as exc:
        return fail(name, f"Twilio did not answer: {type(exc).__name__}", f"try again; check the network ({DOCTOR})")
    compare = f"is {expected}" if expected else "is whatsapp_webhook's URL"
    if not numbers:
        return skip(
            name,
            f"{number} is not one of this account's phone numbers (the WhatsApp Sandbox, or a sender whose "
            f"webhook is set on the sender): check its 'When a message comes in' in the console {compare}",
        )
    sms_url = numbers[0].sms_url or ""
    if expected is None:
        return skip(
            name,
            f"Twilio posts {number}'s messages to {sms_url or '(nothing)'}; set PUBLIC_BASE_URL (or let gcloud be "
            "asked) to compare it with the URL the function checks signatures against",
        )
    if sms_url != expected:
        return fail(
            name,
            f"Twilio posts {number}'s messages to {sms_url or '(nothing)'}, not PUBLIC_BASE_URL {expected}; "
            "every signature is checked against PUBLIC_BASE_URL, so each message is refused 403",
            f"set the number's 'A message comes in' to {expected}, method POST (Twilio console), "
            f"or PUBLIC_BASE_URL to the URL Twilio calls, then `make deploy` ({WEBHOOKS})",
        )
    return ok(name, f"Twilio posts {number}'s messages to {sms_url}, which is PUBLIC_BASE_URL")


# The model and speech to text: no project needed.


def check_model(config: Settings, name: str, model: str, setting: str) -> Check:
    if config.anthropic_api_key is None:
        return skip(name, "ANTHROPIC_API_KEY is not set here: set it to ask Anthropic")
    import anthropic

    client = anthropic.Anthropic(
        api_key=config.anthropic_api_key.get_secret_value(),
        base_url=config.anthropic_base_url,
        max_retries=0,
        timeout=PROBE_TIMEOUT_S,
    )
    try:
        found = client.models.retrieve(model)
    except anthropic.NotFoundError:
        return fail(
            name,
            f"{model} is not available to this key",
            f"set {setting} to a model `GET /v1/models` lists for the key, then `make deploy` ({CONFIGURATION})",
        )
    except (anthropic.AuthenticationError, anthropic.PermissionDeniedError) as exc:
        return fail(
            name,
            f"the key is refused ({exc.status_code})",
            f"check ANTHROPIC_API_KEY (crossmem-anthropic-api-key; {SECRETS})",
        )
    except anthropic.APIError as exc:
        return fail(
            name, f"Anthropic did not answer: {type(exc).__name__}", f"try again; status.anthropic.com ({DOCTOR})"
        )
    finally:
        client.close()
    return ok(name, f"{model} ({found.display_name}) is available to the key")


def check_deepgram(config: Settings) -> Check:
    """The voice notes' key, by Deepgram's own test of a key: `GET /v1/auth/token` answers the
    key's details when it is valid, 401 when it is not (and costs nothing)."""
    name = "deepgram"
    if config.deepgram_api_key is None:
        return skip(name, "DEEPGRAM_API_KEY is not set here (voice notes get a polite answer): set it to ask Deepgram")
    try:
        answer = httpx.get(
            f"{config.deepgram_api_base.rstrip('/')}/v1/auth/token",
            headers={"Authorization": f"Token {config.deepgram_api_key.get_secret_value()}"},
            timeout=PROBE_TIMEOUT_S,
        )
    except httpx.HTTPError as exc:
        return fail(
            name, f"Deepgram did not answer: {type(exc).__name__}", f"try again; status.deepgram.com ({DOCTOR})"
        )
    if answer.status_code in (401, 403):
        return fail(
            name,
            f"the key is refused ({answer.status_code})",
            f"check DEEPGRAM_API_KEY (crossmem-deepgram-api-key; {SECRETS})",
        )
    if answer.status_code != 200:
        return fail(name, f"Deepgram answered {answer.status_code}", f"try again; status.deepgram.com ({DOCTOR})")
    return ok(name, f"the key is accepted; voice notes are transcribed with {config.deepgram_model}")


# The scheduled job.


def check_schedule(spec: FunctionSpec, deployed: Deployed | None, target: Target) -> Check:
    assert spec.schedule is not None
    job = spec.schedule.job
    name = f"scheduler job {job}"
    command = [
        "gcloud",
        "scheduler",
        "jobs",
        "describe",
        job,
        f"--project={target.project}",
        f"--location={target.region}",
        "--format=json",
    ]
    try:
        described = json.loads(run_tool(command, project=target.project).stdout)
    except ToolFailed as exc:
        if "NOT_FOUND" in exc.said:
            return fail(name, "does not exist", f"`make deploy` (it creates the job: {SCHEDULE})")
        return fail(name, f"`gcloud scheduler jobs describe` failed: {exc.said}", exc.fix)
    state = described.get("state")
    if state != "ENABLED":
        return fail(name, f"{state}", f"`gcloud scheduler jobs resume {job} --location={target.region}` ({SCHEDULE})")
    uri = described.get("httpTarget", {}).get("uri")
    ours = deployed.urls(target) if deployed else [function_url(target.region, target.project, spec.name)]
    if uri not in ours:
        return fail(
            name, f"calls {uri}, not {spec.name} ({ours[0]})", f"`make deploy` (it updates the job: {SCHEDULE})"
        )
    last = described.get("lastAttemptTime")
    if last is None:
        return ok(name, f"enabled, {described.get('schedule')}; not run yet")
    code = int(described.get("status", {}).get("code", 0))
    if code:
        kind, cause = RPC_CODES.get(code, (f"code {code}", "read the function's logs"))
        said = described["status"].get("message", "")
        return fail(
            name,
            f"its last run, at {last}, failed: {kind}{f' ({said})' if said else ''}",
            f"{cause}; `gcloud functions logs read {spec.name} --region={target.region}` ({SCHEDULE})",
        )
    return ok(name, f"enabled, {described.get('schedule')}; its last run, at {last}, succeeded")


# All of them.


@dataclass(frozen=True)
class Cloud:
    """serverless.yml's functions and the project they are deployed in; `not_asked`: why gcloud
    is not asked about them (None: it is)."""

    functions: list[FunctionSpec]
    target: Target | None
    not_asked: str | None

    @classmethod
    def of(cls, description: Description, shell: Mapping[str, str]) -> Cloud:
        try:
            target = Target.of(description, shell)
        except TargetNotSet as exc:
            unset = " and ".join(exc.unset) or "the project"
            return cls(description.functions, None, f"{unset} is not set here: set it to ask gcloud ({FUNCTIONS})")
        if shutil.which("gcloud") is None:
            return cls(
                description.functions,
                target,
                f"gcloud is not on PATH: install the Google Cloud CLI to ask it ({GOOGLE_CLOUD})",
            )
        return cls(description.functions, target, None)

    def url_of(self, function: str, deployed: Mapping[str, Deployed]) -> list[str]:
        """The function's URLs as gcloud describes it; none when gcloud is not asked (the project
        alone gives only one of its two URLs, and a webhook may rightly use the other)."""
        if self.not_asked is not None or self.target is None:
            return []
        if function in deployed:
            return deployed[function].urls(self.target)
        return [function_url(self.target.region, self.target.project, function)]


def guarded(name: str, check: Callable[..., Check], *args: Any) -> Check:
    """The check's answer; a check that breaks is one failed line, not a traceback that would
    hide the other checks' answers (and turn `--json` into something else than JSON)."""
    try:
        return check(*args)
    except Exception as exc:
        said = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return fail(
            name,
            f"the check itself failed: {type(exc).__name__}{f': {said}' if said else ''}",
            f"run it again; if it fails the same way, it is a bug of crossmem doctor ({DOCTOR})",
        )


def run_checks(config: Settings, cloud: Cloud) -> list[Check]:
    """Every check, in the order they print: database, secrets, functions, webhooks, models,
    speech, schedule. Those that need gcloud are skipped, with the reason, when it cannot be asked."""
    target = cloud.target
    deployed: dict[str, Deployed] = {}
    if cloud.not_asked is None:
        assert target is not None
        deployed = {spec.name: describe(spec, target) for spec in cloud.functions}

    def through_gcloud(name: str, check: Callable[..., Check], *args: Any) -> Check:
        return skip(name, cloud.not_asked) if cloud.not_asked else guarded(name, check, *args)

    whatsapp = cloud.url_of("whatsapp_webhook", deployed)
    checks = [
        guarded("database", check_database, config),
        through_gcloud("secrets", check_secrets, list(deployed.values()), target),
    ]
    checks += [
        through_gcloud(f"function {spec.name}", check_function, deployed.get(spec.name), target)
        for spec in cloud.functions
    ]
    checks += [
        guarded(
            "telegram webhook",
            check_telegram,
            config,
            cloud.url_of("telegram_webhook", deployed),
            target.region if target else None,
        ),
        guarded("twilio inbound url", check_twilio, config, config.public_base_url or next(iter(whatsapp), None)),
        guarded("model", check_model, config, "model", config.anthropic_model, "ANTHROPIC_MODEL"),
        guarded(
            "digest model", check_model, config, "digest model", config.anthropic_digest_model, "ANTHROPIC_DIGEST_MODEL"
        ),
        guarded("deepgram", check_deepgram, config),
    ]
    checks += [
        through_gcloud(f"scheduler job {spec.schedule.job}", check_schedule, spec, deployed.get(spec.name), target)
        for spec in cloud.functions
        if spec.schedule
    ]
    return checks


def every_check(shell: Mapping[str, str]) -> list[Check]:
    """The checks, even when the settings or serverless.yml cannot be read: that is one failed
    check, and every check that does not need what is missing still runs."""
    try:
        config = runtime.settings()
    except ConfigurationError as exc:  # a setting here does not parse: it names which, never the value
        return [fail("settings", str(exc), f"correct the setting it names ({CONFIGURATION})")]
    try:
        description = read_description()
    except DescriptionError as exc:
        unreadable = fail("serverless.yml", str(exc), f"as it says; what the file holds: {FUNCTIONS}")
        return [unreadable, *run_checks(config, Cloud([], None, "serverless.yml could not be read"))]
    return run_checks(config, Cloud.of(description, shell))


def doctor(args: argparse.Namespace, shell: Mapping[str, str]) -> int:
    checks = every_check(shell)
    failed = [check for check in checks if check.status == "fail"]
    if args.json:
        print(json.dumps({"ok": not failed, "checks": [asdict(check) for check in checks]}, indent=2))
    else:
        for check in checks:
            print(check.line())
    if failed:
        print(f"crossmem doctor: {len(failed)} check(s) failed", file=sys.stderr)
    return 1 if failed else 0
