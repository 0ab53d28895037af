"""The tables and SQL functions the migrations define, and which of them a database lacks:
`crossmem doctor` tells a partly migrated database (its bookkeeping says every migration ran, but
a function or a table was dropped, or a migration was recorded without running) from a whole one.

The migrations are read, not the catalog of a reference database: each `create table` and `create
[or replace] function` of a migration that the database records as applied, in order, less what a
later one drops. A function is looked up by schema and name (an overload with other arguments
counts as present); a table by schema and name among ordinary and partitioned tables.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_STATEMENT = re.compile(
    r"\b(create|drop)\s+(?:or\s+replace\s+)?(table|function)\s+(?:if\s+(?:not\s+)?exists\s+)?"
    r"([a-z_][a-z0-9_]*)\.([a-z_][a-z0-9_]*)",
    re.IGNORECASE,
)
_COMMENT = re.compile(r"--[^\n]*")

# One round trip: each expected object with whether the catalog has it.
_MISSING = """
select o.kind, o.schema, o.name
  from unnest(%s::text[], %s::text[], %s::text[]) with ordinality as o(kind, schema, name, position)
 where not case o.kind
         when 'table' then exists (
             select from pg_class c join pg_namespace n on n.oid = c.relnamespace
              where n.nspname = o.schema and c.relname = o.name and c.relkind in ('r', 'p'))
         else exists (
             select from pg_proc p join pg_namespace n on n.oid = p.pronamespace
              where n.nspname = o.schema and p.proname = o.name)
       end
 order by o.position
"""


@dataclass(frozen=True)
class SchemaObject:
    kind: str  # "table" or "function"
    schema: str
    name: str
    defined_in: str  # the file that defines it (a migration links to its definition)

    def __str__(self) -> str:
        return f"{self.kind} {self.schema}.{self.name} ({self.defined_in})"


def defined_objects(migrations: list[Path]) -> list[SchemaObject]:
    """The tables and functions `migrations` (in the order they run) leave behind."""
    defined: dict[tuple[str, str, str], SchemaObject] = {}
    for path in migrations:
        for verb, kind, schema, name in _STATEMENT.findall(_COMMENT.sub("", path.read_text())):
            key = (kind.lower(), schema.lower(), name.lower())
            if verb.lower() == "create":
                defined.setdefault(key, SchemaObject(*key, path.resolve().name))
            else:
                defined.pop(key, None)
    return list(defined.values())


def missing_objects(connection: Any, expected: list[SchemaObject]) -> list[SchemaObject]:
    """Those of `expected` the database behind `connection` (a psycopg connection) lacks."""
    if not expected:
        return []
    lacking = {
        (kind, schema, name)
        for kind, schema, name in connection.execute(
            _MISSING,
            ([o.kind for o in expected], [o.schema for o in expected], [o.name for o in expected]),
        )
    }
    return [o for o in expected if (o.kind, o.schema, o.name) in lacking]
