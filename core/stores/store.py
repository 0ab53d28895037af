"""The `MemoryStore` protocol: how the memory service reaches the database.

The turn logic lives in SQL functions (infra/supabase/migrations); a store only calls one
of them by name with named arguments and returns its JSON result. One `call` is one round
trip to the database. Two implementations: `PostgresStore` (psycopg) and `SupabaseStore`
(PostgREST `rpc`). Both raise `StoreUnavailable` for every failure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from core.errors import StoreUnavailable

# SQLSTATE classes of a failure that may pass (PostgreSQL's appendix A): the connection (08), a
# transaction rolled back on a conflict (40), resources (53), an operator's intervention (57: a
# restart, a cancelled statement) and the system (58). Any other answered error is final.
PASSING_SQLSTATE_CLASSES = frozenset({"08", "40", "53", "57", "58"})
# And a prepared statement gone behind the store's back (a pooler's DISCARD ALL: 26000), or one
# already there (a transaction pooler with prepared statements on: 42P05): the next call starts over.
PASSING_SQLSTATES = frozenset({"26000", "42P05"})


def final_error(sqlstate: str | None) -> bool:
    """Whether an error the database answered with `sqlstate` would come again, whatever the
    retry (None: no answer from the database, which may pass)."""
    passing = sqlstate is None or sqlstate in PASSING_SQLSTATES or sqlstate[:2] in PASSING_SQLSTATE_CLASSES
    return not passing


# The SQL functions a store may call; anything else is refused before it reaches the wire.
SQL_FUNCTIONS = frozenset(
    {
        "begin_turn",
        "finish_turn",
        "finish_turn_follow_ups",
        "reserve_follow_up",
        "follow_ups_of",
        "follow_ups_with_apps",
        "cancel_follow_up",
        "claim_due_follow_ups",
        "finish_follow_up",
        "release_follow_ups",
        "try_follow_up",
        "follow_up_elsewhere",
        "move_follow_up",
        "end_attempt",
        "send_follow_ups_later",
        "wrote_outside_thread",
        "claim_owed_replies",
        "give_up_owed",
        "record_delivery",
        "stop_generation",
        "generation_stopped",
        "edit_message",
        "create_conversation",
        "list_conversations",
        "conversation_messages",
        "unanswered_message",
        "web_messages_by_client_id",
        "message_delivery",
        "replace_message",
        "person_history",
        "search_memory",
        "create_link_code",
        "redeem_link_code",
        "link_identity",
        "list_identities",
        "person_language",
        "record_opt_out",
        "unlink_identities",
        "forget_conversations",
        "forget_person",
        "forget_request",
        "export_person",
        "purge_messages",
        "expire_usage",
        "claim_memory_digests",
        "write_memory_notes",
        "release_memory_claim",
        "memory_claim_holds",
        "fail_memory_digest",
        "memory_notes_of",
        "reserve_voice_seconds",
        "settle_voice_seconds",
    }
)

JsonScalar = str | int | float | bool | None


class MemoryStore(Protocol):
    def call(self, function: str, arguments: Mapping[str, JsonScalar]) -> Any:
        """Run `public.<function>(name => value, ...)` and return its JSON result."""
        ...

    def close(self) -> None: ...


def check_function(function: str) -> None:
    if function not in SQL_FUNCTIONS:
        raise ValueError(f"{function!r} is not one of the memory's SQL functions")


class UnavailableStore:
    """The store of an instance whose database could not even be set up (say, no
    DATABASE_URL on Cloud Functions): every call fails the way a down database does,
    so turns degrade to answers without memory instead of crashing. `reason` is what a caller
    is told; `cause`, the failure itself, is each error's cause (`crossmem` says it)."""

    def __init__(self, reason: str, cause: Exception | None = None) -> None:
        self.reason = reason
        self.cause = cause

    def call(self, function: str, arguments: Mapping[str, JsonScalar]) -> Any:
        raise StoreUnavailable(self.reason) from self.cause

    def close(self) -> None:
        pass
