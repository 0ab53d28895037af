"""Bugs that once went unnoticed (issue #23): each test here fails for its bug when run alone.

A person without notes is given none; a digest run whose claim expired writes nothing; the
offline notes stay within their budget; a message of exactly MAX_MESSAGE_CHARS is stored;
and every secret is compared in constant time, by the one helper.
"""

from __future__ import annotations

import ast
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from zoneinfo import ZoneInfo

import psycopg
import pytest

from core.errors import MessageTooLong
from core.memory.digest import DigestJob, ExtractiveDigester
from core.memory.service import Memory
from core.model.llm import approximate_tokens
from core.models import Person, StoredMessage, Surface
from core.stores.postgres_store import PostgresStore
from tests.helpers import context_limits, digest_limits

ROOT = Path(__file__).resolve().parents[2]
WINDOW = context_limits(max_messages=4, window_step=2)
LIMITS = digest_limits(max_messages=4, window_step=2, window_hours=24, idle_s=0)


@pytest.fixture
def small(store: PostgresStore) -> Memory:
    return Memory(store, WINDOW)


def converse(memory: Memory, person: uuid.UUID, texts: Sequence[str]) -> None:
    for text in texts:
        start = memory.begin_turn(Person(user_id=person), Surface.TELEGRAM, text, uuid.uuid4().hex)
        assert start.message_id is not None
        memory.finish_turn(person, start.message_id, f"reply to {text}")


def notes_row(database_url: str, person: uuid.UUID) -> tuple[object, ...] | None:
    """(content, revision, claim) of the person's notes."""
    with psycopg.connect(database_url) as connection:
        return connection.execute(
            "select content, revision, claim from memory_notes where user_id = %s", (person,)
        ).fetchone()


class FixedDigester:
    """Notes that say which run wrote them; `during` runs inside the digest, while the claim is held."""

    name = "fixed"

    def __init__(self, text: str, during: Iterator[None] | None = None) -> None:
        self.text = text
        self.during = during

    def digest(self, notes: str, messages: Sequence[StoredMessage], zone: ZoneInfo | None = None) -> str:
        if self.during is not None:
            next(self.during, None)
        return self.text


# --- begin_turn's notes are the person's own ---------------------------------------------


def test_begin_turn_gives_a_person_without_notes_none_while_another_person_has_some(
    small: Memory, store: PostgresStore
) -> None:
    with_notes, without = uuid.uuid4(), uuid.uuid4()
    converse(small, with_notes, ["my sister's name is Ana", "b", "c"])
    assert DigestJob(store, ExtractiveDigester(800), LIMITS).run(with_notes).updated == 1
    # The other person's notes are the newest of the database now.

    start = small.begin_turn(Person(user_id=without), Surface.TELEGRAM, "who is my sister?", uuid.uuid4().hex)
    assert not start.degraded and start.message_id is not None
    assert start.notes == "", "a person without notes was given someone else's"

    own = small.begin_turn(Person(user_id=with_notes), Surface.WHATSAPP, "who is my sister?", uuid.uuid4().hex)
    assert not own.degraded and own.notes.endswith("] my sister's name is Ana")


# --- a stale digest run writes nothing -----------------------------------------------------


def test_a_digest_run_whose_claim_expired_writes_nothing_over_the_run_that_took_over(
    small: Memory, store: PostgresStore, database_url: str
) -> None:
    person = uuid.uuid4()
    converse(small, person, ["my sister's name is Ana", "b", "c"])
    fresh = DigestJob(store, FixedDigester("- [telegram · fresh] Sister's name is Ana."), LIMITS)
    taken_over: list[tuple[int, int]] = []

    def another_run_takes_the_person_over() -> Iterator[None]:
        # The stale run is slow: its claim expires, and a second run claims and writes.
        with psycopg.connect(database_url) as connection:
            connection.execute(
                "update memory_notes set claimed_until = now() - interval '1 second' where user_id = %s", (person,)
            )
        run = fresh.run(person)
        taken_over.append((run.updated, run.failed))
        yield

    stale = DigestJob(
        store, FixedDigester("- [telegram · stale] Nothing.", another_run_takes_the_person_over()), LIMITS
    )
    run = stale.run(person)
    assert taken_over == [(1, 0)]
    assert notes_row(database_url, person) == ("- [telegram · fresh] Sister's name is Ana.", 1, None), (
        "the stale run's notes overwrote the fresh ones"
    )
    assert (run.updated, run.failed) == (0, 1), "the run whose claim expired counted its write"


def test_a_stale_claim_cannot_write_while_another_run_holds_the_person(
    small: Memory, store: PostgresStore, database_url: str
) -> None:
    person = uuid.uuid4()
    converse(small, person, ["my sister's name is Ana", "b", "c"])
    arguments: dict[str, str | int | None] = {
        "p_batch": 1,
        "p_max_messages": 4,
        "p_window_step": 2,
        "p_window_hours": 24,
        "p_lease_seconds": 300,
        "p_digest_limit": 200,
        "p_user_id": str(person),
        "p_idle_seconds": 0,
    }
    first = store.call("claim_memory_digests", arguments)
    with psycopg.connect(database_url) as connection:
        connection.execute(
            "update memory_notes set claimed_until = now() - interval '1 second' where user_id = %s", (person,)
        )
    second = store.call("claim_memory_digests", arguments)
    assert len(first) == 1 and len(second) == 1 and first[0]["claim"] != second[0]["claim"]
    last = first[0]["messages"][-1]
    written = store.call(
        "write_memory_notes",
        {
            "p_user_id": str(person),
            "p_claim": first[0]["claim"],
            "p_content": "- stale",
            "p_covered_at": last["created_at"],
            "p_covered_id": last["id"],
        },
    )
    assert written == {"written": False, "revision": None}
    assert notes_row(database_url, person) == ("", 0, uuid.UUID(second[0]["claim"]))


# --- the offline notes stay within MEMORY_NOTES_MAX_TOKENS ---------------------------------


def test_the_offline_digest_cuts_the_stored_notes_to_their_budget(
    small: Memory, store: PostgresStore, database_url: str
) -> None:
    person = uuid.uuid4()
    texts = [f"weather report {k}: " + "cloudy and mild, " * 6 for k in range(6)]  # ~120 characters each
    converse(small, person, texts)  # 12 messages: 8 have left the window of 4
    assert DigestJob(store, ExtractiveDigester(50), LIMITS).run(person).updated == 1
    row = notes_row(database_url, person)
    assert row is not None
    content = str(row[0])
    assert approximate_tokens(content) <= 50, f"notes of {len(content)} characters for a budget of 50 tokens"
    # A line takes at most a quarter of the budget: the four digested messages, each cut, in order.
    lines = content.split("\n")
    assert [line.split("] ", 1)[1][:17] for line in lines] == [f"weather report {k}:" for k in range(4)]
    assert all(line.startswith("- [telegram · ") and line.endswith("…") for line in lines)


def test_the_offline_digest_keeps_digesting_a_person_past_the_tables_limit(
    store: PostgresStore, database_url: str
) -> None:
    """At the largest budget (8000 tokens, 32000 characters) long messages would pass the table's
    64000-character check within a few runs if the notes were not cut: every write would fail."""
    memory = Memory(store, context_limits(max_messages=4, window_step=2, max_message_chars=16000))
    person = uuid.uuid4()
    job = DigestJob(store, ExtractiveDigester(8000), LIMITS)
    converse(memory, person, [f"long story {k} " + "x" * 15_000 for k in range(2)])
    for k in range(2, 8):
        converse(memory, person, [f"long story {k} " + "x" * 15_000])
        run = job.run(person)
        assert (run.updated, run.failed) == (1, 0), f"digest {k - 1} wrote nothing"
    row = notes_row(database_url, person)
    assert row is not None and row[1] == 6
    # A line takes at most a quarter of 8000 tokens: the newest four digested (stories 2 to 5), each cut.
    lines = str(row[0]).split("\n")
    assert [line.split("] ", 1)[1][:14] for line in lines] == [f"long story {k} x" for k in range(2, 6)]
    assert all(line.endswith("…") for line in lines)
    assert approximate_tokens(str(row[0])) <= 8000


# --- MAX_MESSAGE_CHARS is inclusive ----------------------------------------------------------


def test_a_message_of_exactly_the_limit_is_stored_and_one_more_is_refused(
    store: PostgresStore, database_url: str
) -> None:
    memory = Memory(store, context_limits(max_message_chars=50))
    person = uuid.uuid4()
    start = memory.begin_turn(Person(user_id=person), Surface.TELEGRAM, "a" * 50, uuid.uuid4().hex)
    assert start.message_id is not None
    with pytest.raises(MessageTooLong, match="51 characters"):
        memory.begin_turn(Person(user_id=person), Surface.TELEGRAM, "a" * 51, uuid.uuid4().hex)
    with psycopg.connect(database_url) as connection:
        stored = connection.execute("select content from messages where user_id = %s", (person,)).fetchall()
    assert stored == [("a" * 50,)]


# --- every secret is compared in constant time, by one helper ------------------------------

SECRET_WORDS = {"secret", "token", "signature", "password", "key"}


def names_a_secret(node: ast.expr) -> bool:
    """A secret's value: get_secret_value(), a method of a secret (`secret.encode()`), a slice of
    one, or a name or attribute one of whose words is a secret's (`webhook_secret`, `auth_token`,
    `shared_key`, `signature`); not `tokens_per_day`, nor an attribute of a key (`key.algorithm_name`)."""
    if isinstance(node, ast.Call):
        method = node.func
        return isinstance(method, ast.Attribute) and (method.attr == "get_secret_value" or names_a_secret(method.value))
    if isinstance(node, ast.Attribute):
        return names_a_secret_word(node.attr)
    if isinstance(node, ast.Name):
        return names_a_secret_word(node.id)
    if isinstance(node, ast.Subscript):
        return names_a_secret(node.value)
    return False


def names_a_secret_word(identifier: str) -> bool:
    words = identifier.lower().split("_")
    # A header's name (SECRET_HEADER) is no secret: it is said in every request.
    return "header" not in words and bool(SECRET_WORDS & set(words))


def sources() -> list[Path]:
    return sorted(p for folder in ("core", "functions") for p in (ROOT / folder).rglob("*.py"))


def secret_comparisons(tree: ast.AST) -> list[int]:
    """The lines of `==` or `!=` with a secret on either side."""
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Compare)
            and any(isinstance(op, ast.Eq | ast.NotEq) for op in node.ops)
            and any(names_a_secret(side) for side in [node.left, *node.comparators])
        ):
            found.append(node.lineno)
    return found


def constant_time_comparisons(tree: ast.AST) -> list[tuple[str, int]]:
    """Where compare_digest is named (hmac's or secrets'), and in which function."""
    found = []
    for function in [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]:
        for node in ast.walk(function):
            if isinstance(node, ast.Attribute | ast.Name) and "compare_digest" in ast.unparse(node):
                found.append((function.name, node.lineno))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and any(alias.name == "compare_digest" for alias in node.names):
            found.append(("import", node.lineno))
    return found


def test_no_secret_is_compared_with_equality_outside_the_constant_time_helper() -> None:
    offending = []
    for path in sources():
        for line in secret_comparisons(ast.parse(path.read_text(), str(path))):
            offending.append(f"{path.relative_to(ROOT)}:{line}")
    assert offending == [], "secrets compared with ==/!= instead of functions.http.same_secret"


def test_compare_digest_is_used_only_inside_same_secret() -> None:
    uses = {}
    for path in sources():
        found = constant_time_comparisons(ast.parse(path.read_text(), str(path)))
        if found:
            uses[str(path.relative_to(ROOT))] = sorted({name for name, _ in found})
    assert uses == {"functions/http.py": ["same_secret"]}, (
        "compare_digest must be same_secret's, and only same_secret's"
    )


def test_the_checker_sees_a_secret_compared_with_equality() -> None:
    """The scan's own rule, on code it must flag and code it must leave alone."""
    flagged = """
def check(request, config, given, signature, expected_token):
    a = request.headers.get("X") == config.telegram_webhook_secret.get_secret_value()
    b = given != config.digest_secret
    c = signature == expected_token
    d = hmac_value == config.twilio_auth_token.get_secret_value()[:8]
    e = given.encode() == self._secret.encode()
"""
    assert secret_comparisons(ast.parse(flagged)) == [3, 4, 5, 6, 7]
    legitimate = """
def check(config, algorithm, path, name, status, signing_key, request):
    a = algorithm == HMAC_SHA1
    b = config.tokens_per_day == 0
    c = path != "/"
    d = name == SECRET_HEADER
    e = config.telegram_webhook_secret is None
    f = status == 401
    g = signing_key.algorithm_name != algorithm
    h = request.headers.get("X-Telegram-Bot-Api-Secret-Token") is None
"""
    assert secret_comparisons(ast.parse(legitimate)) == []
