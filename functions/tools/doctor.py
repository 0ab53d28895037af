"""`crossmem doctor`: a check of the live deployment, one line each, with what to do when it
fails (every fix names its page of docs/); `--json` for scripts, JSON even when it cannot start;
exit 1 when a check fails, and only then (a check skipped is not a failure).

What it asks, and whom: the database (`DATABASE_URL`: reachable, every migration of
infra/supabase/migrations applied, and every table, column, index, policy, trigger and SQL function
they define there, each function as defined: functions/tools/schema_objects.py); Secret Manager
(`gcloud secrets list`: every secret the deployed functions reference exists); each function
(`gcloud functions describe`: deployed and ACTIVE; its URL, called without credentials, answers as
that function does, not Cloud Run's 403 or 404, and the private one refuses); Telegram
(`getWebhookInfo`: the URL it calls is telegram_webhook's, no failing deliveries, every update kind
the webhook acts on asked for; `getMyCommands`: the command menu, in each language of core/phrases/,
lists the bot's commands); Twilio (the IncomingPhoneNumbers resource: the SmsUrl, "A message comes
in", of the WhatsApp sender and of the SMS number is whatsapp_webhook's and sms_webhook's
PUBLIC_BASE_URL); Anthropic (`GET /v1/models/{id}`: the turn's and the digest's models are available
to the key); Deepgram (`GET /v1/auth/token`, its own test of a key: the voice notes' key is
accepted); Cloud Scheduler (`gcloud scheduler jobs describe`: the job exists, is enabled, and its
last run succeeded).

It reads the deploying shell's settings (the environment, then `.env`), as `crossmem deploy`
does: GCP_PROJECT and GCP_REGION, and the keys it checks with. A check whose setting is not
there is skipped, and says which to set; it never prints a secret. Without GCP_PROJECT (or
without gcloud) the checks that ask gcloud are skipped and the others still run: the database,
Telegram, Twilio, Anthropic and Deepgram need no project. The checks that ask gcloud are in
functions/tools/gcloud_checks.py, a check's answer in functions/tools/check_results.py.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from core.errors import ConfigurationError, DeliveryFailed, MediaUnreadable, ModelUnavailable
from core.model.llm import Thinking
from core.stores.embedded import MIGRATIONS
from core.surfaces.telegram import WEBHOOK_UPDATES
from core.surfaces.whatsapp import WHATSAPP_LIMIT
from functions import runtime
from functions.settings import Settings
from functions.tools.check_results import Check, fail, guarded, ok, skip
from functions.tools.deploy import DescriptionError, read_description
from functions.tools.doc_links import (
    CONFIGURATION,
    DATABASE,
    DOCTOR,
    FUNCTIONS,
    SECRETS,
    WEBHOOKS,
)
from functions.tools.gcloud_checks import (
    PROBE_TIMEOUT_S,
    Cloud,
    Deployed,
    check_function,
    check_schedule,
    check_secrets,
    describe,
)
from functions.tools.schema_objects import (
    BRING_ACROSS,
    CREATE_AGAIN,
    SchemaObject,
    defined_bodies,
    defined_objects,
    differing_functions,
    differing_said,
    missing_objects,
)

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
    from core.stores.postgres_store import conninfo_problem

    url = config.database_url.get_secret_value()
    # Parsed before use: a mistyped URL is named as such, not as a database that does not answer.
    if (problem := conninfo_problem(url)) is not None:  # psycopg quotes the string, password and all: Check masks it
        return fail(
            name,
            f"DATABASE_URL is not a connection string: {problem}",
            f"write it as postgresql://USER:PASSWORD@HOST:PORT/DATABASE ({DATABASE})",
        )
    migrations = sorted(MIGRATIONS.glob("*.sql"))
    wanted = [path.stem.partition("_")[0] for path in migrations]
    try:
        applied, missing, differing = read_schema(url, config.database_connect_timeout, migrations)
    except Exception as exc:  # the driver's error: its first line says what (Check masks a password in it)
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
    if differing:
        lacking = f"; {len(missing)} missing: {', '.join(map(str, missing))}" if missing else ""
        return fail(
            name,
            f"made from other definitions than these: all {len(wanted)} migrations are recorded as applied, but "
            f"{differing_said(differing)}{lacking}",
            BRING_ACROSS,
        )
    if missing:
        return fail(
            name,
            f"partly migrated: all {len(wanted)} migrations are recorded as applied, but {len(missing)} of what "
            f"they define is missing: {', '.join(str(thing) for thing in missing)}",
            CREATE_AGAIN,
        )
    present = "every table, column, index, policy, trigger and SQL function they define present"
    return ok(name, f"reachable; all {len(wanted)} migrations applied, {present}")


def read_schema(
    url: str, connect_timeout_s: int, migrations: list[Path]
) -> tuple[set[str], list[SchemaObject], list[SchemaObject]]:
    """The versions recorded in Supabase's bookkeeping table (empty when it does not exist), the
    tables and functions the applied ones define that the database lacks, and the functions it
    has otherwise than they define them."""
    from core.stores.postgres_store import connect

    with connect(url, connect_timeout_s) as connection:
        table = connection.execute("select to_regclass('supabase_migrations.schema_migrations')").fetchone()
        if table is None or table[0] is None:
            return set(), [], []
        applied = {row[0] for row in connection.execute("select version from supabase_migrations.schema_migrations")}
        ran = [path for path in migrations if path.stem.partition("_")[0] in applied]
        return (
            applied,
            missing_objects(connection, defined_objects(ran)),
            differing_functions(connection, defined_bodies(ran)),
        )


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
    # Absent, Telegram sends its default kinds; a list that lacks one of ours (a webhook set before
    # the stop button, or by another tool) never brings it.
    asked = info.get("allowed_updates")
    missing = [kind for kind in WEBHOOK_UPDATES if isinstance(asked, list) and kind not in asked]
    if missing:
        return fail(name, f"Telegram sends no {', '.join(missing)} update (allowed_updates)", set_webhook)
    earlier = f"; an earlier error: {last_error!r}" if last_error else ""
    unchecked = "" if ours else "; not compared with telegram_webhook's URL, which only gcloud can tell"
    return ok(name, f"Telegram calls {url}; {pending} update(s) waiting{earlier}{unchecked}")


def check_telegram_menu(config: Settings, ours: list[str]) -> Check:
    """The command menu "/" shows, in each language of core/phrases/ (`getMyCommands`)."""
    name = "telegram command menu"
    if config.telegram_bot_token is None:
        return skip(name, "TELEGRAM_BOT_TOKEN is not set here: set it to ask Telegram")
    from core.channels.telegram_menu import MENU_COMMANDS, menu_differences

    catalogue = runtime.catalogue()
    try:
        differences = menu_differences(runtime.telegram_bot().call, catalogue)
    except DeliveryFailed as exc:
        return fail(name, f"the Bot API refused or did not answer ({exc})", f"try again; check the network ({DOCTOR})")
    if differences:
        return fail(
            name,
            "; ".join(differences),
            f"`crossmem telegram set-webhook --url {ours[0] if ours else 'URL'}` sets every menu, "
            f"in private chats only ({WEBHOOKS})",
        )
    languages = ", ".join(sorted(catalogue.languages))
    return ok(name, f"/{', /'.join(MENU_COMMANDS)} listed in private chats in every language ({languages})")


@dataclass(frozen=True)
class TwilioWebhook:
    """A Twilio function as the doctor checks it: the setting naming its number, and the deploying
    shell's variable that gives it another URL than its own (serverless.yml's PUBLIC_BASE_URL)."""

    check: str
    function: str
    number_setting: str
    url_variable: str


TWILIO_WEBHOOKS = (
    TwilioWebhook("twilio inbound url", "whatsapp_webhook", "TWILIO_WHATSAPP_FROM", "WHATSAPP_PUBLIC_BASE_URL"),
    TwilioWebhook("twilio sms inbound url", "sms_webhook", "TWILIO_SMS_FROM", "SMS_PUBLIC_BASE_URL"),
)


def check_twilio(config: Settings, webhook: TwilioWebhook, expected: str | None) -> Check:
    """`expected`: the URL the function checks signatures against (the shell's `url_variable`,
    else the function's own; None when neither is known)."""
    name, function, variable = webhook.check, webhook.function, webhook.url_variable
    sender = getattr(config, webhook.number_setting.lower())
    if not (config.twilio_account_sid and config.twilio_auth_token and sender):
        return skip(name, f"set TWILIO_ACCOUNT_SID, TWILIO_AUTH_TOKEN and {webhook.number_setting} here to ask Twilio")
    number = sender.removeprefix("whatsapp:")
    from core.channels.whatsapp import WhatsAppSender

    token = config.twilio_auth_token.get_secret_value()
    twilio = WhatsAppSender(
        config.twilio_account_sid, token, sender, WHATSAPP_LIMIT, config.twilio_api_base, PROBE_TIMEOUT_S
    )
    try:
        sms_url = twilio.inbound_url(number)
    except ConfigurationError as exc:
        return fail(name, f"Twilio refused: {exc}", f"check TWILIO_ACCOUNT_SID and TWILIO_AUTH_TOKEN ({WEBHOOKS})")
    except DeliveryFailed as exc:
        return fail(name, f"Twilio did not answer: {exc}", f"try again; check the network ({DOCTOR})")
    compare = f"is {expected}" if expected else f"is {function}'s URL"
    if sms_url is None:
        return skip(
            name,
            f"{number} is not one of this account's phone numbers (the WhatsApp Sandbox, or a sender whose "
            f"webhook is set on the sender): check its 'When a message comes in' in the console {compare}",
        )
    if expected is None:
        return skip(
            name,
            f"Twilio posts {number}'s messages to {sms_url or '(nothing)'}; set {variable} (or let gcloud be "
            f"asked) to compare it with the URL {function} checks signatures against",
        )
    if sms_url != expected:
        return fail(
            name,
            f"Twilio posts {number}'s messages to {sms_url or '(nothing)'}, not {function}'s PUBLIC_BASE_URL "
            f"{expected}; every signature is checked against it, so each message is refused 403",
            f"set the number's 'A message comes in' to {expected}, method POST (Twilio console), "
            f"or {variable} to the URL Twilio calls, then `make deploy` ({WEBHOOKS})",
        )
    return ok(name, f"Twilio posts {number}'s messages to {sms_url}, which is {function}'s PUBLIC_BASE_URL")


# The model and speech to text: no project needed.


def check_model(config: Settings, name: str, model: str, setting: str, thinking: Thinking = "adaptive") -> Check:
    """The model is available to the key, and takes the `thinking` its requests send (the Models
    API's capabilities: ANTHROPIC_THINKING=between_tools is refused with a 400 by a model that lacks it)."""
    if config.anthropic_api_key is None:
        return skip(name, "ANTHROPIC_API_KEY is not set here: set it to ask Anthropic")
    from core.model.llm import AnthropicModel

    claude = AnthropicModel(
        api_key=config.anthropic_api_key.get_secret_value(),
        model=model,
        max_tokens=1,
        base_url=config.anthropic_base_url,
        timeout_s=PROBE_TIMEOUT_S,
        max_retries=0,
    )
    try:
        listed = claude.listed()
    except ConfigurationError as exc:
        return fail(
            name, f"the key is refused ({exc})", f"check ANTHROPIC_API_KEY (crossmem-anthropic-api-key; {SECRETS})"
        )
    except ModelUnavailable as exc:
        return fail(name, f"Anthropic did not answer: {exc}", f"try again; status.anthropic.com ({DOCTOR})")
    finally:
        claude.close()
    if listed is None:
        return fail(
            name,
            f"{model} is not available to this key",
            f"set {setting} to a model `GET /v1/models` lists for the key, then `make deploy` ({CONFIGURATION})",
        )
    if thinking != "adaptive" and listed.thinking is not None and thinking not in listed.thinking:
        return fail(
            name,
            f"{model} does not take thinking {thinking}: every turn would be refused",
            f"set ANTHROPIC_THINKING=adaptive, or {setting} to a model that takes it; `make deploy` ({CONFIGURATION})",
        )
    return ok(name, f"{model} ({listed.display_name}) is available to the key")


def check_deepgram(config: Settings) -> Check:
    """The voice notes' key, by Deepgram's own test of a key: `GET /v1/auth/token` answers the
    key's details when it is valid, 401 when it is not (and costs nothing)."""
    name = "deepgram"
    if config.deepgram_api_key is None:
        return skip(name, "DEEPGRAM_API_KEY is not set here (voice notes get a polite answer): set it to ask Deepgram")
    from core.model.transcription import DeepgramTranscriber

    deepgram = DeepgramTranscriber(config.deepgram_api_key.get_secret_value(), api_base=config.deepgram_api_base)
    try:
        status = deepgram.key_status(PROBE_TIMEOUT_S)
    except MediaUnreadable as exc:
        return fail(name, f"Deepgram did not answer: {exc}", f"try again; status.deepgram.com ({DOCTOR})")
    finally:
        deepgram.close()
    if status in (401, 403):
        return fail(
            name, f"the key is refused ({status})", f"check DEEPGRAM_API_KEY (crossmem-deepgram-api-key; {SECRETS})"
        )
    if status != 200:
        return fail(name, f"Deepgram answered {status}", f"try again; status.deepgram.com ({DOCTOR})")
    return ok(name, f"the key is accepted; voice notes are transcribed with {config.deepgram_model}")


# All of them.


def run_checks(config: Settings, cloud: Cloud, shell: Mapping[str, str]) -> list[Check]:
    """Every check, in the order they print: database, secrets, functions, webhooks, models,
    speech, schedule. Those that need gcloud are skipped, with the reason, when it cannot be asked."""
    target = cloud.target
    deployed: dict[str, Deployed] = {}
    if cloud.not_asked is None:
        assert target is not None
        deployed = {spec.name: describe(spec, target) for spec in cloud.functions}

    def through_gcloud(name: str, check: Callable[..., Check], *args: Any) -> Check:
        return skip(name, cloud.not_asked) if cloud.not_asked else guarded(name, check, *args)

    def own_url(function: str) -> str | None:
        return next(iter(cloud.url_of(function, deployed)), None)

    checks = [
        guarded("database", check_database, config),
        through_gcloud("secrets", check_secrets, list(deployed.values()), target),
    ]
    checks += [
        skip(f"function {spec.name}", f"`make deploy` leaves it out: it needs {' and '.join(spec.needs)}, not set here")
        if spec.unmet(shell)
        else through_gcloud(f"function {spec.name}", check_function, deployed.get(spec.name), target)
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
        guarded("telegram command menu", check_telegram_menu, config, cloud.url_of("telegram_webhook", deployed)),
        *(
            guarded(hook.check, check_twilio, config, hook, shell.get(hook.url_variable) or own_url(hook.function))
            for hook in TWILIO_WEBHOOKS
        ),
        guarded(
            "model", check_model, config, "model", config.anthropic_model, "ANTHROPIC_MODEL", config.anthropic_thinking
        ),
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
        config.require_valid()  # every function's, each named
    except ConfigurationError as exc:  # a setting here does not parse: it names which, never the value
        return [fail("settings", str(exc), f"correct the setting it names ({CONFIGURATION})")]
    try:
        description = read_description()
    except DescriptionError as exc:
        unreadable = fail("serverless.yml", str(exc), f"as it says; what the file holds: {FUNCTIONS}")
        return [unreadable, *run_checks(config, Cloud([], None, "serverless.yml could not be read"), shell)]
    return run_checks(config, Cloud.of(description, shell), shell)


def doctor(as_json: bool, shell: Mapping[str, str]) -> int:
    checks = every_check(shell)
    failed = [check for check in checks if check.status == "fail"]
    if as_json:
        print(json.dumps({"ok": not failed, "checks": [asdict(check) for check in checks]}, indent=2))
    else:
        for check in checks:
            print(check.line())
    if failed:
        print(f"crossmem doctor: {len(failed)} check(s) failed", file=sys.stderr)
    return 1 if failed else 0
