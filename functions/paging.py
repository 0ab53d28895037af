"""The paging queries of `GET /conversations/<id>/messages` (`?before=<message id>&limit=<n>`) and
of `GET /conversations` (`?before=<conversation id>&limit=<n>`), and the whole numbers of other
queries (functions/search_query.py).

A value that is not what the README promises is refused with the reason, never guessed at:
a frontend that sends `limit=abc` has a bug it should hear about.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from core.errors import InputError

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
    before: uuid.UUID | None
    limit: int


def conversations_query(args: Mapping[str, str]) -> ConversationsQuery:
    """`before` (a conversation's id) and `limit`; InputError saying which is wrong and why."""
    limit = bounded_number(args, "limit", MAX_LIMIT, f"a whole number from 1 to {MAX_LIMIT}")
    return ConversationsQuery(
        conversation_id(args["before"]) if "before" in args else None, DEFAULT_LIMIT if limit is None else limit
    )


def conversation_id(value: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        raise InputError(f"before must be a conversation id (a UUID), not {value[:40]!r}") from None


def bounded_number(args: Mapping[str, str], name: str, largest: int, expected: str, smallest: int = 1) -> int | None:
    """The whole number `name` from `smallest` to `largest`; None when it is absent."""
    if name not in args:
        return None
    value = args[name]
    if not WHOLE_NUMBER.fullmatch(value) or not smallest <= int(value) <= largest:
        raise InputError(f"{name} must be {expected}, not {value[:40]!r}")
    return int(value)
