"""The paging queries of `GET /conversations/<id>/messages` (`?before=<message id>&limit=<n>`) and
of `GET /conversations` (`?before=<a page's next>&limit=<n>`), and the whole numbers of other
queries (functions/search_query.py).

A value that is not what the README promises is refused with the reason, never guessed at:
a frontend that sends `limit=abc` has a bug it should hear about.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from core.errors import InputError
from core.models import Conversation, ConversationPlace

DEFAULT_LIMIT = 50
MAX_LIMIT = 200
LARGEST_MESSAGE_ID = 2**63 - 1  # messages.id is a bigint
WHOLE_NUMBER = re.compile(r"[0-9]{1,19}")


@dataclass(frozen=True)
class PageQuery:
    before: int | None
    limit: int


def page_query(args: Mapping[str, str]) -> PageQuery:
    """`before` and `limit` from a query string; InputError saying which is wrong and why."""
    limit = bounded_number(args, "limit", MAX_LIMIT, f"a whole number from 1 to {MAX_LIMIT}")
    before = bounded_number(args, "before", LARGEST_MESSAGE_ID, "a message id (a whole number from 1)")
    return PageQuery(before, DEFAULT_LIMIT if limit is None else limit)


@dataclass(frozen=True)
class ConversationsQuery:
    before: ConversationPlace | None
    limit: int


# A page's `next`: the last listed conversation's place, `<updated_at in µs since 1970>-<its id>`.
PLACE = re.compile(r"([0-9]{1,17})-([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})")
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MICROSECOND = timedelta(microseconds=1)


def conversations_query(args: Mapping[str, str]) -> ConversationsQuery:
    """`before` (a page's `next`) and `limit`; InputError saying which is wrong and why."""
    limit = bounded_number(args, "limit", MAX_LIMIT, f"a whole number from 1 to {MAX_LIMIT}")
    before = None
    if "before" in args:
        place = PLACE.fullmatch(args["before"])
        if place is None:
            raise InputError(f"before must be a page's `next`, not {args['before'][:40]!r}")
        before = ConversationPlace(EPOCH + int(place[1]) * MICROSECOND, uuid.UUID(place[2]))
    return ConversationsQuery(before, DEFAULT_LIMIT if limit is None else limit)


def next_place(conversation: Conversation) -> str:
    """The `next` of a page that ends with `conversation`."""
    return f"{(conversation.updated_at - EPOCH) // MICROSECOND}-{conversation.id}"


def bounded_number(args: Mapping[str, str], name: str, largest: int, expected: str, smallest: int = 1) -> int | None:
    """The whole number `name` from `smallest` to `largest`; None when it is absent."""
    if name not in args:
        return None
    value = args[name]
    if not WHOLE_NUMBER.fullmatch(value) or not smallest <= int(value) <= largest:
        raise InputError(f"{name} must be {expected}, not {value[:40]!r}")
    return int(value)
