"""`crossmem forget` and `crossmem purge`: the operator's erasure of a person, and the purge by age."""

from __future__ import annotations

import argparse
import uuid
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from functions.tools.confirmation import add_yes, confirmed

if TYPE_CHECKING:
    from core.retention import PurgeBatch


def forget(args: argparse.Namespace) -> int:
    from functions import runtime  # the whole server: only for the command that runs

    person = uuid.UUID(args.user)
    if not confirmed(args, f"Erase {person}: every conversation, message, link code and identity?"):
        return 1
    erased = runtime.forgetting().erase_person(person)
    print(
        f"erased {args.user}: {erased.messages} message(s), {erased.conversations} conversation(s), "
        f"{erased.link_codes} link code(s), {erased.identities} identity(ies)"
    )
    return 0


def purge(args: argparse.Namespace) -> int:
    from core.retention import describe_age
    from functions import runtime

    older_than: timedelta | None = args.older_than
    if older_than is None:
        days = runtime.settings().message_retention_days
        if days == 0:
            print("MESSAGE_RETENTION_DAYS is 0: messages are kept forever; nothing purged")
            return 0
        older_than = timedelta(days=days)
    age = describe_age(older_than)
    if not args.dry_run:
        counted = runtime.retention().purge(older_than, dry_run=True)
        question = (
            f"{counted.deleted} message(s) older than {age} (before {counted.cutoff:%Y-%m-%d %H:%M} UTC)"
            " will be deleted. Delete them?"
        )
        print(question.removesuffix(" Delete them?"))
        if counted.deleted == 0:
            return 0
        if not confirmed(args, question):
            return 1
    report = runtime.retention().purge(older_than, dry_run=args.dry_run, on_batch=print_batch)
    before = f"{report.cutoff:%Y-%m-%d %H:%M} UTC"
    if report.dry_run:
        print(f"dry run: {report.deleted} message(s) older than {age} (before {before}) would be deleted")
    else:
        print(f"purged {report.deleted} message(s) older than {age} (before {before}) in {report.batches} batch(es)")
    return 0


def print_batch(batch: PurgeBatch) -> None:
    print(f"batch {batch.number}: {batch.deleted} deleted, {batch.total} so far ({batch.seconds * 1000:.0f} ms)")


def age(text: str) -> timedelta:
    from core.retention import parse_age

    try:
        return parse_age(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_commands(commands: Any) -> None:
    """Register `forget` and `purge` on the `crossmem` parser's subcommands."""
    command = commands.add_parser("forget", help="erase a person: every conversation, message and identity")
    command.add_argument("--user", required=True, help="the person's user id (uuid)")
    add_yes(command)
    command.set_defaults(run=forget)

    command = commands.add_parser("purge", help="delete messages older than an age, in batches of PURGE_BATCH")
    command.add_argument(
        "--older-than", type=age, help="an age like 90d or 36h (default: MESSAGE_RETENTION_DAYS; 0 keeps all)"
    )
    command.add_argument("--dry-run", action="store_true", help="count what would be deleted; delete nothing")
    add_yes(command)
    command.set_defaults(run=purge)
