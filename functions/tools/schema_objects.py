"""The tables, columns, SQL functions, indexes, policies and triggers the migrations define, which
of them a database lacks, and which of its functions are not as defined: `crossmem doctor` tells a partly
migrated database (its bookkeeping says every migration ran, but an object was dropped, forgotten
while the database was brought across by hand, or a migration was recorded without running), and
one made from other definitions (pushed from an earlier checkout: the baseline links to the
definitions, so a changed definition changes a migration already recorded as applied, which no
push runs again), from a whole one.

The migrations are read, not the catalog of a reference database: each `create table` (and the
columns it lists), `alter table ... add|drop column`, `create [or replace] function`, `create [unique]
index`, `create policy` and `create trigger` of a migration that the database records as applied,
in order, less what a later one drops. A function is looked up by schema and name (an overload with
other arguments counts as present); a table by schema and name among ordinary and partitioned
tables; an index by schema and name; a column, a policy or a trigger by name on its table (a
missing table's are not named: it is). What a column, an index, a policy, a trigger or a table's
check says is not compared, only that it is there. A function's body is the text between its dollar
quotes, which Postgres keeps as written (`prosrc`): a function whose last definition's bodies are
not all among the database's bodies of that name differs. A SQL-standard body (`begin atomic`,
`return`), kept parsed, is looked up by name only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from functions.tools.doc_links import OLDER_DEFINITIONS, PARTLY_MIGRATED

_STATEMENT = re.compile(
    r"\b(create|drop)\s+(?:or\s+replace\s+)?(table|function)\s+(?:if\s+(?:not\s+)?exists\s+)?"
    r"([a-z_][a-z0-9_]*)\.([a-z_][a-z0-9_]*)",
    re.IGNORECASE,
)
# An index (named alone, in its table's schema; dropped by schema.name), a policy or a trigger (named
# on its table): `create [unique] index NAME on [only] S.T`, `create policy NAME on S.T`, `create
# trigger NAME ... on S.T`, `drop index S.NAME`, `drop policy|trigger NAME on S.T`.
_ON_TABLE = re.compile(
    r"\b(create|drop)\s+(?:or\s+replace\s+)?(?:unique\s+)?(?:constraint\s+)?(index|policy|trigger)\s+"
    r"(?:concurrently\s+)?(?:if\s+(?:not\s+)?exists\s+)?(?:([a-z_][a-z0-9_]*)\.)?([a-z_][a-z0-9_]*)"
    r"(?:[^;]*?\bon\s+(?:only\s+)?([a-z_][a-z0-9_]*)\.([a-z_][a-z0-9_]*))?",
    re.IGNORECASE,
)
_COMMENT = re.compile(r"--[^\n]*")
# A table's columns: where its list opens, each part's first word (a column's name, unless the part
# is a table constraint), and what an `alter table` adds or drops.
_CREATE_TABLE = re.compile(
    r"\bcreate\s+table\s+(?:if\s+not\s+exists\s+)?([a-z_][a-z0-9_]*)\.([a-z_][a-z0-9_]*)\s*\(", re.IGNORECASE
)
_FIRST_WORD = re.compile(r"\s*([a-z_][a-z0-9_]*)", re.IGNORECASE)
_NOT_COLUMNS = frozenset({"constraint", "primary", "unique", "check", "foreign", "exclude", "like"})
_ALTER_TABLE = re.compile(
    r"\balter\s+table\s+(?:if\s+exists\s+)?(?:only\s+)?([a-z_][a-z0-9_]*)\.([a-z_][a-z0-9_]*)\s+([^;]*)",
    re.IGNORECASE,
)
_COLUMN_CHANGE = re.compile(
    r"\b(add|drop)\s+(?:column\s+)?(?:if\s+(?:not\s+)?exists\s+)?([a-z_][a-z0-9_]*)", re.IGNORECASE
)
# A function's statement as it starts a line (never inside a comment), then what ends its header:
# its body's opening dollar quote, or the `;` of a SQL-standard body's first statement.
_FUNCTION = re.compile(r"^\s*create\s+(?:or\s+replace\s+)?function\s+(\w+)\.(\w+)\s*\(", re.IGNORECASE | re.MULTILINE)
_BODY_OPENS = re.compile(r"\bas\s+(\$\w*\$)|;", re.IGNORECASE)

# One round trip: each expected object with whether the catalog has it.
_MISSING = """
select o.kind, o.schema, o.name, o.on_table
  from unnest(%s::text[], %s::text[], %s::text[], %s::text[])
       with ordinality as o(kind, schema, name, on_table, position)
 where not case o.kind
         when 'table' then exists (
             select from pg_class c join pg_namespace n on n.oid = c.relnamespace
              where n.nspname = o.schema and c.relname = o.name and c.relkind in ('r', 'p'))
         when 'column' then exists (
             select from pg_attribute a
               join pg_class c on c.oid = a.attrelid join pg_namespace n on n.oid = c.relnamespace
              where n.nspname = o.schema and c.relname = o.on_table and a.attname = o.name and a.attnum > 0
                and not a.attisdropped)
         when 'index' then exists (
             select from pg_class c join pg_namespace n on n.oid = c.relnamespace
              where n.nspname = o.schema and c.relname = o.name and c.relkind in ('i', 'I'))
         when 'policy' then exists (
             select from pg_policies p
              where p.schemaname = o.schema and p.tablename = o.on_table and p.policyname = o.name)
         when 'trigger' then exists (
             select from pg_trigger t join pg_class c on c.oid = t.tgrelid join pg_namespace n on n.oid = c.relnamespace
              where n.nspname = o.schema and c.relname = o.on_table and t.tgname = o.name and not t.tgisinternal)
         else exists (
             select from pg_proc p join pg_namespace n on n.oid = p.pronamespace
              where n.nspname = o.schema and p.proname = o.name)
       end
 order by o.position
"""

# Each function's body, and the stored generated columns whose expression calls it: a `create or
# replace` of such a function is taken (same arguments) but computes no stored value again, so the
# column must be dropped before it and added after it (Postgres records the call from the column's
# default, pg_attrdef; a `drop function` is refused while it stands).
_BODIES = """
select n.nspname, p.proname, p.prosrc,
       array(select format('%%s.%%s.%%s', c.relnamespace::regnamespace, c.relname, a.attname)
               from pg_depend d
               join pg_attrdef ad on d.classid = 'pg_attrdef'::regclass and ad.oid = d.objid
               join pg_attribute a on a.attrelid = ad.adrelid and a.attnum = ad.adnum
               join pg_class c on c.oid = a.attrelid
              where d.refclassid = 'pg_proc'::regclass and d.refobjid = p.oid and a.attgenerated = 's')
  from pg_proc p join pg_namespace n on n.oid = p.pronamespace
 where n.nspname = any(%s)
"""


@dataclass(frozen=True)
class SchemaObject:
    kind: str  # "table", "column", "function", "index", "policy" or "trigger"
    schema: str
    name: str
    defined_in: str  # the file that defines it (a migration links to its definition)
    on_table: str = ""  # a column's, an index's, a policy's or a trigger's table (in `schema`)
    computes: str = ""  # a differing function's: the generated columns that call it, "schema.table.column, ..."

    def __str__(self) -> str:
        if self.kind == "column":
            return f"column {self.schema}.{self.on_table}.{self.name} ({self.defined_in})"
        if self.on_table and self.kind != "index":  # an index's name is its schema's alone
            return f"{self.kind} {self.name} on {self.schema}.{self.on_table} ({self.defined_in})"
        if self.computes:
            return (
                f"{self.kind} {self.schema}.{self.name} ({self.defined_in}; the generated column {self.computes} "
                "calls it: drop the column and its indexes before the function, add them again after it, or its "
                "rows keep what the old function computed)"
            )
        return f"{self.kind} {self.schema}.{self.name} ({self.defined_in})"


def defined_objects(migrations: list[Path]) -> list[SchemaObject]:
    """The tables, their columns, functions, indexes, policies and triggers `migrations` (in the
    order they run) leave behind, each file's in the order it states them."""
    defined: dict[tuple[str, str, str, str], SchemaObject] = {}
    for path in migrations:
        text, made_in = _COMMENT.sub("", path.read_text()), path.resolve().name
        found = [(m.start(), m[1], m[2], m[3], m[4], "") for m in _STATEMENT.finditer(text)]
        for m in _ON_TABLE.finditer(text):
            verb, kind, named_in, name, table_schema, table = m.groups(default="")
            if kind.lower() == "index" or table_schema:  # an index is in its table's schema, dropped as schema.name
                found.append((m.start(), verb, kind, table_schema or named_in, name, table))
        found += columns_stated(text)
        for _, verb, kind, schema, name, table in sorted(found):
            kind, schema, name, table = kind.lower(), schema.lower(), name.lower(), table.lower()
            key = (kind, schema, name, "" if kind == "index" else table)
            if verb.lower() == "create":
                defined.setdefault(key, SchemaObject(kind, schema, name, made_in, table))
            else:
                defined.pop(key, None)
    return list(defined.values())


def columns_stated(text: str) -> list[tuple[int, str, str, str, str, str]]:
    """Each column a `create table` lists (its parts at the top level of its parentheses that are
    no table constraint) or an `alter table` adds or drops, where it is stated: as a "create" or a
    "drop" of a "column" on its table."""
    found = []
    for table in _CREATE_TABLE.finditer(text):
        depth, part_starts = 0, table.end()
        for at in range(table.end(), len(text)):
            if text[at] == "(":
                depth += 1
            elif text[at] in ",)" and depth == 0:
                if (name := _FIRST_WORD.match(text, part_starts)) and name[1].lower() not in _NOT_COLUMNS:
                    found.append((name.start(1), "create", "column", table[1], name[1], table[2]))
                if text[at] == ")":
                    break
                part_starts = at + 1
            elif text[at] == ")":
                depth -= 1
    for altered in _ALTER_TABLE.finditer(text):
        for change in _COLUMN_CHANGE.finditer(altered[3]):
            if change[2].lower() not in _NOT_COLUMNS:
                verb = "create" if change[1].lower() == "add" else "drop"
                found.append((altered.start(3) + change.start(), verb, "column", altered[1], change[2], altered[2]))
    return found


def missing_objects(connection: Any, expected: list[SchemaObject]) -> list[SchemaObject]:
    """Those of `expected` the database behind `connection` (a psycopg connection) lacks."""
    if not expected:
        return []
    lacking = set(
        connection.execute(
            _MISSING,
            (
                [o.kind for o in expected],
                [o.schema for o in expected],
                [o.name for o in expected],
                [o.on_table for o in expected],
            ),
        )
    )
    gone = [o for o in expected if (o.kind, o.schema, o.name, o.on_table) in lacking]
    # A table missing takes its indexes, policies and triggers with it: it alone is named.
    tables_gone = {(o.schema, o.name) for o in gone if o.kind == "table"}
    return [o for o in gone if (o.schema, o.on_table) not in tables_gone]


def defined_bodies(migrations: list[Path]) -> dict[SchemaObject, set[str]]:
    """Each function `migrations` define with a dollar-quoted body: the bodies of the last
    migration that defines its name (its overloads there)."""
    last: dict[tuple[str, str], tuple[SchemaObject, set[str]]] = {}
    for path in migrations:
        text, here = path.read_text(), dict[tuple[str, str], tuple[SchemaObject, set[str]]]()
        # Its comments blanked, where a header is read: one may hold a `;` (the offsets stay).
        blanked = _COMMENT.sub(lambda comment: " " * len(comment[0]), text)
        for match in _FUNCTION.finditer(blanked):
            opens = _BODY_OPENS.search(blanked, match.end())
            if opens is None or opens[1] is None:
                continue
            end = text.find(opens[1], opens.end())
            key = (match[1].lower(), match[2].lower())
            function = SchemaObject("function", *key, path.resolve().name)
            here.setdefault(key, (function, set()))[1].add(text[opens.end() : end])
        last.update(here)
    return dict(last.values())


def differing_said(differing: list[SchemaObject]) -> str:
    """How `crossmem doctor` and `crossmem migrate` name the functions not as defined."""
    return f"{len(differing)} SQL function(s) differ from their definition in infra/supabase/schemas/: " + ", ".join(
        map(str, differing)
    )


# What brings a database made from older definitions across (a push runs nothing recorded as applied).
BRING_ACROSS = f"a push runs no migration recorded as applied: bring the database across ({OLDER_DEFINITIONS})"
# What mends a partly migrated one.
CREATE_AGAIN = f"create each again from its definition in infra/supabase/schemas/ ({PARTLY_MIGRATED})"


def differing_functions(connection: Any, expected: dict[SchemaObject, set[str]]) -> list[SchemaObject]:
    """Those of `expected` the database behind `connection` has, but not with every body defined."""
    held: dict[tuple[str, str], set[str]] = {}
    computes: dict[tuple[str, str], set[str]] = {}
    schemas = sorted({function.schema for function in expected})
    for schema, name, body, columns in connection.execute(_BODIES, (schemas,)):
        # As a file is read here (universal newlines): a body pushed from a checkout with Windows
        # line ends is the same text.
        held.setdefault((schema, name), set()).add(body.replace("\r\n", "\n"))
        computes.setdefault((schema, name), set()).update(columns)
    return [
        replace(function, computes=", ".join(sorted(computes[(function.schema, function.name)])))
        for function, bodies in expected.items()
        if (function.schema, function.name) in held and not bodies <= held[(function.schema, function.name)]
    ]
