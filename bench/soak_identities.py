"""Who the soak's person number `n` is on each surface (shared by the people and the check)."""

from __future__ import annotations

import uuid

OWNER_DEVICES = 3  # person numbers 0, 1, 2: the owner on Telegram, WhatsApp and the web


def telegram_id(person: int) -> int:
    return 7_000_000 + person


def whatsapp_sender(person: int) -> str:
    """Half the people write from a number, half with a WhatsApp username, known by a
    business-scoped user id only (the owner, person 1, among them)."""
    return f"US.1555{person:07d}" if person % 2 else f"+1555{person:07d}"


def web_user(person: int) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"crossmem-soak-person-{person}"))
