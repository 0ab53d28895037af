"""The query of `GET /search`: `?q=<words>&surface=&since=&until=&limit=&offset=`.

As with paging (functions/paging.py), a value that is not what docs/api.md promises is refused
with the reason, never guessed at. Search results are ranked, not ordered by id, so they page by
`offset` (how many of the best hits the client already has), not by a message id.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from core.errors import InputError
from core.memory.service import SEARCH_QUERY_CHARS, storable
from core.models import Surface
from functions.paging import bounded_number

# Memory.search reads at most this much of a query: a longer one is refused, not cut unseen.
MAX_QUERY_CHARS = SEARCH_QUERY_CHARS
DEFAULT_LIMIT = 20
MAX_LIMIT = 50  # a hit carries up to 12,000 characters with its neighbours
MAX_OFFSET = 10_000
SURFACES = ", ".join(surface.value for surface in Surface)
# A week without its day (2026-W14, 2026W14): no day, though fromisoformat reads it as its Monday.
WEEK_ALONE = re.compile(r"[0-9]{4}-?W[0-9]{2}(?:[T ]|$)")


@dataclass(frozen=True)
class SearchQuery:
    text: str
    surface: Surface | None
    since: datetime | None
    until: datetime | None
    limit: int
    offset: int


def search_query(args: Mapping[str, str]) -> SearchQuery:
    """The search from a query string; InputError saying which parameter is wrong and why."""
    text = query_text(args)
    surface = surface_named(args)
    since = moment(args, "since")
    until = moment(args, "until")
    if since is not None and until is not None and since >= until:
        raise InputError(f"since ({args['since'][:40]}) must be before until ({args['until'][:40]})")
    limit = bounded_number(args, "limit", MAX_LIMIT, f"a whole number from 1 to {MAX_LIMIT}")
    offset = bounded_number(args, "offset", MAX_OFFSET, f"a whole number from 0 to {MAX_OFFSET}", smallest=0)
    return SearchQuery(text, surface, since, until, DEFAULT_LIMIT if limit is None else limit, offset or 0)


def query_text(args: Mapping[str, str]) -> str:
    if "q" not in args:
        raise InputError("q is missing: say what to search for, as ?q=words")
    text = storable(args["q"]).strip()  # NUL is searched as nothing: `?q=%00` was 200 with no hits
    if not text:
        raise InputError("q is empty: say what to search for, as ?q=words")
    if len(text) > MAX_QUERY_CHARS:
        raise InputError(f"q has {len(text)} characters; the limit is {MAX_QUERY_CHARS}")
    return text


def surface_named(args: Mapping[str, str]) -> Surface | None:
    if "surface" not in args:
        return None
    value = args["surface"]
    try:
        return Surface(value)
    except ValueError:
        raise InputError(f"surface must be one of {SURFACES}, not {value[:40]!r}") from None


def moment(args: Mapping[str, str], name: str) -> datetime | None:
    """`since` or `until` from a query string, as `parse_moment` reads it; None when absent."""
    return parse_moment(name, args[name]) if name in args else None


def is_day(value: str) -> bool:
    """A calendar day alone, told apart from a date and time (in any of ISO 8601's spellings:
    2026-03-31, 20260331, 2026-W14-2): `until=2026-03-31` includes that day."""
    try:
        date.fromisoformat(value)
    except ValueError:
        return False
    return True


def parse_moment(name: str, value: str) -> datetime:
    """`since` or `until` as a UTC time: an ISO 8601 date and time (UTC without an offset), or a
    day, which is that day's midnight UTC for `since` and the next one for `until`, so that
    `since=2026-03-01&until=2026-03-31` is the whole of March. InputError when it is neither."""
    expected = f"{name} must be an ISO 8601 date (2026-03-31) or date and time (2026-03-31T18:30:00+02:00)"
    try:
        parsed = datetime.fromisoformat(value) if len(value) <= 40 and not WEEK_ALONE.match(value) else None
        if parsed is None:
            raise ValueError(value)
        parsed = parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)
        if name == "until" and is_day(value):
            parsed += timedelta(days=1)
    except OverflowError:  # a day past year 9999, or before year 1, in UTC
        raise InputError(f"{name} is out of range: a day from 0001-01-02 to 9999-12-30, not {value[:40]!r}") from None
    except ValueError:
        raise InputError(f"{expected}, not {value[:40]!r}") from None
    return parsed
