"""Exporting: a person gets everything the memory holds of them, the right of access and of
portability (forgetting's twin, core/memory/forgetting.py).

    web:       GET /export, the signed-in person's own data as a JSON download
    operator:  crossmem export --user ID [--output FILE]

The export is one JSON object: what is held of the person (conversations, memory notes,
follow-ups, identities, language, time zone, the budget's counts, link codes, forget requests),
then `messages`, every message of theirs on every surface, oldest first. It is read with one SQL
function (`export_person`, infra/supabase/schemas/export.sql), a page of `page_size` messages a
call, and written out a page at a time, so a person with 100,000 messages never sits whole in
memory nor in one statement. The first page is read before the first piece is given out: a store
that is down fails the request (a 503), not a download already begun. A later page that fails
ends the output before its closing bracket (the file is no JSON, never a short export that looks
whole), and is logged. The pages are separate reads: a message stored during the export is in it
when it comes after the page being read, one deleted meanwhile may be left out.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any
from uuid import UUID

from core.stores.store import MemoryStore

log = logging.getLogger("crossmem.export")

EXPORT_PAGE = 500  # messages a call: at most 100 MB of text even at 200,000 characters each
FORMAT = "crossmem-export/1"


class Export:
    def __init__(self, store: MemoryStore, clock: Callable[[], datetime], *, page_size: int = EXPORT_PAGE) -> None:
        self._store = store
        self._clock = clock
        self._page_size = page_size

    def pieces(self, person: UUID) -> Iterator[str]:
        """The export of `person` as pieces of JSON text, joined as they come. Reads the first page
        now (StoreUnavailable here, before any piece), the rest as the pieces are taken."""
        first = self._page(person, None)
        return self._write(person, first)

    def filename(self, person: UUID) -> str:
        return f"crossmem-export-{person}-{self._clock():%Y%m%d}.json"

    def _page(self, person: UUID, after: dict[str, Any] | None) -> dict[str, Any]:
        page: dict[str, Any] = self._store.call(
            "export_person",
            {
                "p_user_id": str(person),
                "p_after_at": after["at"] if after else None,
                "p_after_id": after["id"] if after else None,
                "p_limit": self._page_size,
            },
        )
        return page

    def _write(self, person: UUID, first: dict[str, Any]) -> Iterator[str]:
        head = {"format": FORMAT, "exported_at": self._clock().isoformat(), **first["person"]}
        yield json.dumps(head, ensure_ascii=False)[:-1] + ', "messages": ['
        page, written = first, 0
        while True:
            for message in page["messages"]:
                yield ("," if written else "") + "\n" + json.dumps(message, ensure_ascii=False)
                written += 1
            if page["next"] is None:
                break
            try:
                page = self._page(person, page["next"])
            except Exception as exc:  # its type only: a driver's message may quote what it read
                log.error(
                    "an export stopped partway",
                    extra={"user_id": str(person), "messages": written, "error": type(exc).__name__},
                )
                raise
        yield "\n]}\n"
