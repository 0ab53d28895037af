"""`crossmem search --user ID QUERY`: a person's memory as memory search finds it (the same SQL
function as `GET /search` on the web), for the operator who wants to see what the agent could find.

Only the standard library at import: `crossmem --help` builds this parser, and stays fast
(tests/functions/test_cli_imports.py); the rest is imported by the command when it runs."""

from __future__ import annotations

import argparse
import json
import uuid
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from zoneinfo import ZoneInfo

    from core.models import MemoryHit, Surface


def search(args: argparse.Namespace) -> int:
    """Print the person's best hits for the query, one a line: local date and time, surface,
    role, text. `args`: user, query (words), surface, since, until, limit, timezone, json."""
    from zoneinfo import ZoneInfo

    from core.errors import InputError
    from functions import runtime
    from functions.search_query import DEFAULT_LIMIT, MAX_QUERY_CHARS

    query = " ".join(args.query).strip()
    if not query:
        raise InputError("say what to search for: crossmem search --user ID WORDS")
    if len(query) > MAX_QUERY_CHARS:
        raise InputError(f"the query has {len(query)} characters; the limit is {MAX_QUERY_CHARS}")
    if args.since is not None and args.until is not None and args.since >= args.until:
        raise InputError("--since must be before --until")
    zone: ZoneInfo = args.timezone or ZoneInfo(runtime.settings().context_timezone)
    hits = runtime.memory().search(
        uuid.UUID(args.user),
        query,
        surface=args.surface,
        since=args.since,
        until=args.until,
        limit=args.limit or DEFAULT_LIMIT,
    )
    if args.json:
        print(json.dumps([hit.as_json() for hit in hits], ensure_ascii=False, indent=2))
        return 0
    if not hits:
        print(f"no message of {args.user} matches {query!r}")
        return 0
    print(f"{len(hits)} hit(s) for {query!r}, best first, times in {zone.key}:")
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


def since_option(text: str) -> datetime:
    return moment_option("since", text)


def until_option(text: str) -> datetime:
    return moment_option("until", text)


def moment_option(name: str, text: str) -> datetime:
    """--since or --until as GET /search reads them; argparse's own error when it is neither."""
    from core.errors import InputError
    from functions.search_query import parse_moment

    try:
        return parse_moment(name, text)
    except InputError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix(f"{name} ")) from None


def timezone_option(text: str) -> ZoneInfo:
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        return ZoneInfo(text)
    except (ZoneInfoNotFoundError, ValueError, OSError):  # OSError: a folder of zones ("America")
        raise argparse.ArgumentTypeError(f"{text!r} is not an IANA timezone (Europe/Madrid, UTC)") from None


def surface_option(text: str) -> Surface:
    from core.models import Surface

    try:
        return Surface(text)
    except ValueError:
        names = ", ".join(surface.value for surface in Surface)
        raise argparse.ArgumentTypeError(f"invalid choice: {text!r} (choose from {names})") from None


def limit_option(text: str) -> int:
    from functions.search_query import MAX_LIMIT

    if not text.isdigit() or not 1 <= int(text) <= MAX_LIMIT:
        raise argparse.ArgumentTypeError(f"must be a whole number from 1 to {MAX_LIMIT}, not {text!r}")
    return int(text)


def add_commands(commands: Any) -> None:
    """Register `search` on the `crossmem` parser's subcommands."""
    command = commands.add_parser("search", help="search a person's messages on every surface, as the agent can")
    command.add_argument("--user", required=True, help="the person's user id (uuid)")
    command.add_argument("--surface", type=surface_option, help="only this surface's (web, telegram, whatsapp)")
    command.add_argument("--since", type=since_option, help="from this ISO date or date and time (UTC)")
    command.add_argument("--until", type=until_option, help="before this ISO date and time; a date: included")
    command.add_argument("--limit", type=limit_option, help="how many hits, as GET /search's limit")
    command.add_argument("--timezone", type=timezone_option, help="show times in this zone (default: CONTEXT_TIMEZONE)")
    command.add_argument("--json", action="store_true", help="JSON (each hit as GET /search gives it) instead of lines")
    command.add_argument("query", nargs="+", help="the words to search for, or a question as the person would ask it")
    command.set_defaults(run=search)
