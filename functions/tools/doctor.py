"""`crossmem doctor`: a check of the live deployment, one line each, with what to do when it
fails; `--json` for scripts; exit 1 when any check fails.

What it asks, and whom: the database (`DATABASE_URL`: reachable, every migration of
infra/supabase/migrations applied); Secret Manager (`gcloud secrets list`: every secret the
deployed functions reference exists); each function (`gcloud functions describe`: deployed and
ACTIVE; its URL, called without credentials, answers as that function does, not Cloud Run's 403
or 404, and the private one refuses); Telegram (`getWebhookInfo`: the URL it calls is
telegram_webhook's, no failing deliveries); Twilio (the IncomingPhoneNumbers resource: the
sender's SmsUrl, "A message comes in", is PUBLIC_BASE_URL); Anthropic (`GET /v1/models/{id}`:
the turn's and the digest's models are available to the key); Cloud Scheduler (`gcloud
scheduler jobs describe`: the job exists, is enabled, and its last run succeeded).

It reads the deploying shell's settings (the environment, then `.env`), as `crossmem deploy`
does: GCP_PROJECT and GCP_REGION, and the keys it checks with. A check whose setting is not
there is skipped, and says which to set; it never prints a secret.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import httpx

from core.errors import DeliveryFailed
from core.settings import Settings
from core.stores.embedded import MIGRATIONS
from functions import runtime
from functions.tools.deploy import Description, FunctionSpec, Target, function_url, read_description, secret_id
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
        if config.supabase_url:
            return skip(
                name, "DATABASE_URL is not set here (the functions use SUPABASE_URL): set it to check migrations"
            )
        return fail(name, "neither DATABASE_URL nor SUPABASE_URL is set here", "set DATABASE_URL (README, Deploy, 1)")
    wanted = sorted(path.stem.partition("_")[0] for path in MIGRATIONS.glob("*.sql"))
    try:
        applied = applied_migrations(config.database_url.get_secret_value(), config.database_connect_timeout)
    except Exception as exc:  # the driver's error: its first line says what (never the password)
        said = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return fail(name, f"not reachable: {said}", "check DATABASE_URL, and that the database accepts connections")
    pending = [version for version in wanted if version not in applied]
    if pending:
        return fail(
            name,
            f"reachable; {len(pending)} of {len(wanted)} migrations not applied: {', '.join(pending)}",
            "`make db-push DB_URL=…` (or `crossmem migrate` with DATABASE_URL)",
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
            f"`printf %s VALUE | gcloud secrets create {missing[0]} --data-file=-` (README, Deploy, 3), "
            "or `make deploy` to drop the reference",
        )
    return ok(name, f"all {len(referenced)} referenced secrets exist in Secret Manager")


def check_function(function: Deployed, target: Target) -> Check:
    name = f"function {function.spec.name}"
    if function.described is None:
        assert function.failure is not None
        if "NOT_FOUND" in function.failure.said:
            return fail(name, "not deployed", "`make deploy`")
        return fail(name, f"`gcloud functions describe` failed: {function.failure.said}", function.failure.fix)
    state = function.described.get("state")
    if state != "ACTIVE":
        return fail(name, f"state {state}", "`make deploy` again; `gcloud functions describe` says why")
    url = function.urls(target)[0]
    try:
        answer = httpx.get(url, timeout=PROBE_TIMEOUT_S)
    except httpx.HTTPError as exc:
        return fail(name, f"{url} does not answer: {type(exc).__name__}", "check the URL; `make deploy`")
    status = answer.status_code
    if status == 404:
        return fail(name, f"{url} answers 404: no function there", "`make deploy` (a function's URL ends in its name)")
    if not function.spec.public:
        if status in (401, 403):
            return ok(name, f"{url} refuses a call without a token ({status}): private, as it should be")
        return fail(
            name,
            f"{url} answers {status} to a call without a token: it is public",
            f"`make deploy` (it deploys {function.spec.name} with --no-allow-unauthenticated)",
        )
    if status == 403:
        return fail(
            name,
            f"{url} answers 403: Cloud Run refuses callers without a Google identity",
            "`make deploy` (it deploys the webhooks with --allow-unauthenticated; an organization policy "
            "restricting allUsers forbids that)",
        )
    if status >= 500:
        said = error_message(answer)
        return fail(name, f"{url} answers {status}{said}", "give it what it names (serverless.yml), then `make deploy`")
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


# Telegram and Twilio.


def check_telegram(config: Settings, telegram: Deployed | None, target: Target) -> Check:
    name = "telegram webhook"
    if config.telegram_bot_token is None:
        return skip(name, "TELEGRAM_BOT_TOKEN is not set here: set it to ask Telegram")
    ours = telegram.urls(target) if telegram else []
    try:
        info = runtime.telegram_bot().call("getWebhookInfo", {})["result"]
    except DeliveryFailed as exc:
        return fail(name, f"the Bot API refused: {exc}", "check TELEGRAM_BOT_TOKEN (crossmem-telegram-bot-token)")
    url, pending = info.get("url", ""), int(info.get("pending_update_count", 0))
    if url not in ours:
        return fail(
            name,
            f"Telegram calls {url or '(no webhook)'}, not ours ({ours[0] if ours else 'telegram_webhook'})",
            f"`crossmem telegram set-webhook --url {ours[0] if ours else 'URL'}`",
        )
    last_error = info.get("last_error_message")
    if last_error and pending:
        return fail(
            name,
            f"deliveries fail: {last_error!r}, {pending} update(s) waiting",
            "a 401 means TELEGRAM_WEBHOOK_SECRET is not the secret_token set: run `crossmem telegram set-webhook` "
            f"again; else read the logs: `gcloud functions logs read telegram_webhook --region={target.region}`",
        )
    earlier = f"; an earlier error: {last_error!r}" if last_error else ""
    return ok(name, f"Telegram calls {url}; {pending} update(s) waiting{earlier}")


def check_twilio(config: Settings, whatsapp: Deployed | None, target: Target) -> Check:
    name = "twilio inbound url"
    if not (config.twilio_account_sid and config.twilio_auth_token and config.twilio_whatsapp_from):
        return skip(name, "set TWILIO_ACCOUNT_SID, TWILIO_AUTH_TOKEN and TWILIO_WHATSAPP_FROM here to ask Twilio")
    expected = config.public_base_url or (whatsapp.urls(target)[0] if whatsapp else None)
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
        return fail(name, f"Twilio refused: {exc.status} {exc.code}", "check TWILIO_ACCOUNT_SID and TWILIO_AUTH_TOKEN")
    except (TwilioException, OSError) as exc:
        return fail(name, f"Twilio did not answer: {type(exc).__name__}", "try again; check the network")
    if not numbers:
        return skip(
            name,
            f"{number} is not one of this account's phone numbers (the WhatsApp Sandbox, or a sender whose "
            f"webhook is set on the sender): check its 'When a message comes in' in the console is {expected}",
        )
    sms_url = numbers[0].sms_url or ""
    if sms_url != expected:
        return fail(
            name,
            f"Twilio posts {number}'s messages to {sms_url or '(nothing)'}, not PUBLIC_BASE_URL {expected}; "
            "every signature is checked against PUBLIC_BASE_URL, so each message is refused 403",
            f"set the number's 'A message comes in' to {expected}, method POST (Twilio console), "
            "or PUBLIC_BASE_URL to the URL Twilio calls, then `make deploy`",
        )
    return ok(name, f"Twilio posts {number}'s messages to {sms_url}, which is PUBLIC_BASE_URL")


# The model, and the scheduled job.


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
            f"set {setting} to a model `GET /v1/models` lists for the key, then `make deploy`",
        )
    except (anthropic.AuthenticationError, anthropic.PermissionDeniedError) as exc:
        return fail(
            name, f"the key is refused ({exc.status_code})", "check ANTHROPIC_API_KEY (crossmem-anthropic-api-key)"
        )
    except anthropic.APIError as exc:
        return fail(name, f"Anthropic did not answer: {type(exc).__name__}", "try again; status.anthropic.com")
    finally:
        client.close()
    return ok(name, f"{model} ({found.display_name}) is available to the key")


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
            return fail(name, "does not exist", "`make deploy` (it creates the job)")
        return fail(name, f"`gcloud scheduler jobs describe` failed: {exc.said}", exc.fix)
    state = described.get("state")
    if state != "ENABLED":
        return fail(name, f"{state}", f"`gcloud scheduler jobs resume {job} --location={target.region}`")
    uri = described.get("httpTarget", {}).get("uri")
    ours = deployed.urls(target) if deployed else [function_url(target.region, target.project, spec.name)]
    if uri not in ours:
        return fail(name, f"calls {uri}, not {spec.name} ({ours[0]})", "`make deploy` (it updates the job)")
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
            f"{cause}; `gcloud functions logs read {spec.name} --region={target.region}`",
        )
    return ok(name, f"enabled, {described.get('schedule')}; its last run, at {last}, succeeded")


def run_checks(description: Description, target: Target, config: Settings) -> list[Check]:
    deployed = [describe(spec, target) for spec in description.functions]
    by_name = {function.spec.name: function for function in deployed}
    checks = [check_database(config), check_secrets(deployed, target)]
    checks += [check_function(function, target) for function in deployed]
    checks += [
        check_telegram(config, by_name.get("telegram_webhook"), target),
        check_twilio(config, by_name.get("whatsapp_webhook"), target),
        check_model(config, "model", config.anthropic_model, "ANTHROPIC_MODEL"),
        check_model(config, "digest model", config.anthropic_digest_model, "ANTHROPIC_DIGEST_MODEL"),
    ]
    checks += [check_schedule(spec, by_name.get(spec.name), target) for spec in description.functions if spec.schedule]
    return checks


def doctor(args: argparse.Namespace, shell: Mapping[str, str]) -> int:
    description = read_description()
    target = Target.of(description, shell)
    checks = run_checks(description, target, runtime.settings())
    failed = any(check.status == "fail" for check in checks)
    if args.json:
        print(json.dumps({"ok": not failed, "checks": [asdict(check) for check in checks]}, indent=2))
    else:
        for check in checks:
            print(check.line())
    if failed:
        print(f"crossmem doctor: {sum(c.status == 'fail' for c in checks)} check(s) failed", file=sys.stderr)
    return 1 if failed else 0
