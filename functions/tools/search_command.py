"""`crossmem search --user ID QUERY`: a person's memory as memory search finds it (the same SQL
function as `GET /search` on the web), for the operator who wants to see what the agent could find.

Only the standard library, click and the list of surfaces at import: `crossmem --help` builds this
command, and stays fast (tests/functions/test_cli_imports.py); the rest is imported by the command when it runs. An
option's converter raises ValueError, which click turns into its usage error with the reason."""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import TYPE_CHECKING

import click

from core.surfaces.adapter import Surface
from functions.tools.person_option import user_option

if TYPE_CHECKING:
    from zoneinfo import ZoneInfo

    from core.models import MemoryHit


def since_option(text: str) -> datetime:
    return moment_option("since", text)


def until_option(text: str) -> datetime:
    return moment_option("until", text)


def moment_option(name: str, text: str) -> datetime:
    """--since or --until as GET /search reads them."""
    from core.errors import InputError
    from functions.search_query import parse_moment

    try:
        return parse_moment(name, text)
    except InputError as exc:
        raise ValueError(str(exc).removeprefix(f"{name} ")) from None


def timezone_option(text: str) -> ZoneInfo:
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        return ZoneInfo(text)
    except (ZoneInfoNotFoundError, ValueError, OSError):  # OSError: a folder of zones ("America")
        raise ValueError(f"{text!r} is not an IANA timezone (Europe/Madrid, UTC)") from None


def surface_option(text: str) -> Surface:
    """A surface by name."""
    try:
        return Surface(text)
    except ValueError:
        names = ", ".join(surface.value for surface in Surface)
        raise ValueError(f"invalid choice: {text!r} (choose from {names})") from None


def limit_option(text: str) -> int:
    from functions.search_query import MAX_LIMIT

    if not text.isdigit() or not 1 <= int(text) <= MAX_LIMIT:
        raise ValueError(f"must be a whole number from 1 to {MAX_LIMIT}, not {text!r}")
    return int(text)


@click.command(
    help="search a person's messages on every surface, as the agent can\n\n"
    "QUERY: the words to search for, or a question as the person would ask it"
)
@user_option()
@click.option("--surface", type=surface_option, metavar="SURFACE", help=f"only this surface's ({', '.join(Surface)})")
@click.option("--since", type=since_option, metavar="DATE", help="from this ISO date or date and time (UTC)")
@click.option("--until", type=until_option, metavar="DATE", help="before this ISO date and time; a date: included")
@click.option("--limit", type=limit_option, metavar="N", help="how many hits, as GET /search's limit")
@click.option(
    "--timezone", type=timezone_option, metavar="TZ", help="show times in this zone (default: CONTEXT_TIMEZONE)"
)
@click.option("--json", "as_json", is_flag=True, help="JSON (each hit as GET /search gives it) instead of lines")
@click.argument("query", nargs=-1, required=True)
def search(
    user: str,
    surface: Surface | None,
    since: datetime | None,
    until: datetime | None,
    limit: int | None,
    timezone: ZoneInfo | None,
    as_json: bool,
    query: tuple[str, ...],
) -> int:
    """Print the person's best hits for the query, one a line: local date and time, surface,
    role, text."""
    from zoneinfo import ZoneInfo

    from core.errors import InputError
    from functions import runtime
    from functions.search_query import DEFAULT_LIMIT, MAX_QUERY_CHARS

    words = " ".join(query).strip()
    if not words:
        raise InputError("say what to search for: crossmem search --user ID WORDS")
    if len(words) > MAX_QUERY_CHARS:
        raise InputError(f"the query has {len(words)} characters; the limit is {MAX_QUERY_CHARS}")
    if since is not None and until is not None and since >= until:
        raise InputError("--since must be before --until")
    zone: ZoneInfo = timezone or ZoneInfo(runtime.settings().context_timezone)
    hits = runtime.memory().search(
        uuid.UUID(user), words, surface=surface, since=since, until=until, limit=limit or DEFAULT_LIMIT
    )
    if as_json:
        print(json.dumps([hit.as_json() for hit in hits], ensure_ascii=False, indent=2))
        return 0
    if not hits:
        print(f"no message of {user} matches {words!r}")
        return 0
    print(f"{len(hits)} hit(s) for {words!r}, best first, times in {zone.key}:")
    for hit in hits:
        print(hit_line(hit, zone))
    return 0


def hit_line(hit: MemoryHit, zone: ZoneInfo) -> str:
    """`2026-03-02 10:12 [whatsapp] user: the text`; the lines of a longer text indented under it."""
    message = hit.message
    text = message.content.replace("\n", "\n    ")
    return f"{local(message.created_at, zone)} [{message.surface.value}] {message.role.value}: {text}"


def local(moment: datetime, zone: ZoneInfo) -> str:
    return f"{moment.astimezone(zone):%Y-%m-%d %H:%M}"
