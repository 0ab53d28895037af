"""`crossmem forget` and `crossmem purge`: the operator's erasure of a person, and the purge by age."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import TYPE_CHECKING

import click

from functions.tools.confirmation import confirmed, yes_option
from functions.tools.person_option import user_option

if TYPE_CHECKING:
    from core.memory.retention import PurgeBatch


@click.command(help="erase a person: every conversation, message and identity")
@user_option()
@yes_option
def forget(user: str, yes: bool) -> int:
    from functions import runtime  # the whole server: only for the command that runs

    person = uuid.UUID(user)
    if not confirmed(yes, f"Erase {person}: every conversation, message, link code and identity?"):
        return 1
    erased = runtime.forgetting().erase_person(person)
    print(
        f"erased {user}: {erased.messages} message(s), {erased.conversations} conversation(s), "
        f"{erased.link_codes} link code(s), {erased.identities} identity(ies)"
    )
    return 0


def age(text: str) -> timedelta:
    """--older-than: its ValueError is click's usage error, with the reason."""
    from core.memory.retention import parse_age

    return parse_age(text)


@click.command(
    help="delete messages older than an age, and the memory-note lines about them, in batches of PURGE_BATCH"
)
@click.option(
    "--older-than",
    type=age,
    metavar="AGE",
    help="an age like 90d or 36h (default: MESSAGE_RETENTION_DAYS; 0 keeps all)",
)
@click.option("--dry-run", is_flag=True, help="count what would be deleted; delete nothing")
@yes_option
def purge(older_than: timedelta | None, dry_run: bool, yes: bool) -> int:
    from core.memory.retention import describe_age
    from functions import runtime

    if older_than is None:
        days = runtime.settings().message_retention_days
        if days == 0:
            print("MESSAGE_RETENTION_DAYS is 0: messages are kept forever; nothing purged")
            return 0
        older_than = timedelta(days=days)
    age = describe_age(older_than)
    if not dry_run:
        counted = runtime.retention().purge(older_than, dry_run=True)
        question = (
            f"{counted.deleted} message(s) older than {age} (before {counted.cutoff:%Y-%m-%d %H:%M} UTC)"
            f"{notes_lines(counted.notes)} will be deleted. Delete them?"
        )
        print(question.removesuffix(" Delete them?"))
        if counted.deleted == 0 and counted.notes == 0:
            return 0
        if not confirmed(yes, question):
            return 1
    report = runtime.retention().purge(older_than, dry_run=dry_run, on_batch=print_batch)
    purged = f"{report.deleted} message(s) older than {age} (before {report.cutoff:%Y-%m-%d %H:%M} UTC)"
    purged += notes_lines(report.notes)
    if report.dry_run:
        print(f"dry run: {purged} would be deleted")
    else:
        print(f"purged {purged} in {report.batches} batch(es)")
    return 0


def notes_lines(people: int) -> str:
    """What the purge takes of the memory notes, said only when it takes some."""
    return f", and the older lines of {people} person(s)' memory notes," if people else ""


def print_batch(batch: PurgeBatch) -> None:
    notes = f", {batch.notes} person(s)' notes" if batch.notes else ""
    print(f"batch {batch.number}: {batch.deleted} deleted{notes}, {batch.total} so far ({batch.seconds * 1000:.0f} ms)")
