"""The seed pattern (shared/SEED.md), on our tables, as the benchmarks' baseline.

A Telegram turn: select the person's conversations, select their recent messages, then
for each of the two new messages select (or insert) the singleton conversation, insert
the message and update the conversation: 8 round trips once the singleton exists.
A web turn: select the Telegram singleton and its recent messages to prepend, then the
frontend's own endpoint stores the two messages, each an insert and an update: 6.
Plain statements in autocommit, as supabase-js issues them.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

TELEGRAM_TITLE = "[Telegram]"


class SeedPattern:
    def __init__(self, conninfo: str) -> None:
        self.connection = psycopg.connect(conninfo, autocommit=True)

    def close(self) -> None:
        self.connection.close()

    def load_cross_context(self, user_id: uuid.UUID, hours: int = 24, limit: int = 14) -> list[tuple[Any, ...]]:
        cutoff = datetime.now(UTC) - timedelta(hours=hours)
        ids = [row[0] for row in self.connection.execute("select id from conversations where user_id = %s", (user_id,))]
        if not ids:
            return []
        rows = self.connection.execute(
            "select role, content, created_at from messages where conversation_id = any(%s) and created_at >= %s"
            " order by created_at desc limit %s",
            (ids, cutoff, limit),
        ).fetchall()
        return list(reversed(rows))

    def telegram_conversation(self, user_id: uuid.UUID) -> uuid.UUID:
        row = self.connection.execute(
            "select id from conversations where user_id = %s and title = %s", (user_id, TELEGRAM_TITLE)
        ).fetchone()
        if row:
            return uuid.UUID(str(row[0]))
        created = self.connection.execute(
            "insert into conversations (user_id, surface, title) values (%s, 'telegram', %s) returning id",
            (user_id, TELEGRAM_TITLE),
        ).fetchone()
        assert created is not None
        return uuid.UUID(str(created[0]))

    def append_telegram_message(self, user_id: uuid.UUID, role: str, content: str) -> None:
        conversation = self.telegram_conversation(user_id)
        self.connection.execute(
            "insert into messages (conversation_id, user_id, surface, role, content)"
            " values (%s, %s, 'telegram', %s, %s)",
            (conversation, user_id, role, content),
        )
        self.connection.execute("update conversations set updated_at = now() where id = %s", (conversation,))

    def telegram_turn(self, user_id: uuid.UUID, text: str, answer: Any) -> str:
        history = self.load_cross_context(user_id)
        reply = str(answer(history, text))
        self.append_telegram_message(user_id, "user", text)
        self.append_telegram_message(user_id, "assistant", reply)
        return reply

    def web_turn(self, user_id: uuid.UUID, conversation_id: uuid.UUID, text: str, answer: Any) -> str:
        row = self.connection.execute(
            "select id from conversations where user_id = %s and title = %s", (user_id, TELEGRAM_TITLE)
        ).fetchone()
        recent: list[tuple[Any, ...]] = []
        if row:
            cutoff = datetime.now(UTC) - timedelta(hours=24)
            recent = self.connection.execute(
                "select role, content, created_at from messages where conversation_id = %s and created_at >= %s"
                " order by created_at desc limit 8",
                (row[0], cutoff),
            ).fetchall()
        reply = str(answer(recent, text))
        for role, content in (("user", text), ("assistant", reply)):
            self.connection.execute(
                "insert into messages (conversation_id, user_id, surface, role, content)"
                " values (%s, %s, 'web', %s, %s)",
                (conversation_id, user_id, role, content),
            )
            self.connection.execute("update conversations set updated_at = now() where id = %s", (conversation_id,))
        return reply
