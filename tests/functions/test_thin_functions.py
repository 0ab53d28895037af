"""The function modules stay thin (issue 33): verify, parse, call core, render. The action dispatch
lives in core (core/surfaces/telegram_inbound.py, twilio_inbound.py), an error is answered by
functions/http.py's one table, the web's routes are one werkzeug `Map` whose handlers live in
`<noun>_routes.py` modules, and no module of `functions/` names an SQL function (it asks core)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from core.stores.store import SQL_FUNCTIONS
from functions import web

FUNCTIONS = Path(__file__).resolve().parents[2] / "functions"
# The modules main.py's functions call, and the one every Twilio webhook shares.
FUNCTION_MODULES = ("telegram.py", "whatsapp.py", "web.py", "twilio.py", "digest.py")
ABOUT_30 = 40  # lines of code: no docstring, comment, import or blank line, nor the web's route table


def code_lines(path: Path) -> int:
    """The lines of code of a module, without its docstrings, comments, imports, blank lines and
    the web's route table (`URLS`: a line a route)."""
    source = path.read_text()
    skipped: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import | ast.ImportFrom):
            skipped.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "URLS" for t in node.targets):
            skipped.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
        if isinstance(node, ast.Module | ast.FunctionDef | ast.ClassDef) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                skipped.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    lines = enumerate(source.splitlines(), 1)
    return sum(
        1 for number, line in lines if line.strip() and not line.strip().startswith("#") and number not in skipped
    )


@pytest.mark.parametrize("module", FUNCTION_MODULES)
def test_a_function_module_is_about_30_lines(module: str) -> None:
    assert code_lines(FUNCTIONS / module) <= ABOUT_30


@pytest.mark.parametrize("module", FUNCTION_MODULES)
def test_a_function_module_maps_no_error_by_hand(module: str) -> None:
    """An error of ours reaches functions/http.py's table (`serving`, `error_response`); a module
    that catches InputError itself answers it its own way (issue 33: functions/whatsapp.py did)."""
    names = {node.id for node in ast.walk(ast.parse((FUNCTIONS / module).read_text())) if isinstance(node, ast.Name)}
    assert names & {"InputError", "OverBudget", "StillAnswering", "DeliveryFailed"} == set()


def test_every_web_route_is_handled_in_a_routes_module() -> None:
    modules = {rule.endpoint.__module__ for rule in web.URLS.iter_rules()}
    assert [module for module in sorted(modules) if not module.endswith("_routes")] == []


def test_no_module_of_functions_calls_an_sql_function() -> None:
    """SQL functions are core's to call (core/stores/, core/memory/service.py, core/follow_ups/capability.py...): no
    `store().call(...)` in functions/, and no route or function module names one."""
    calls = [
        path.name
        for path in sorted(FUNCTIONS.glob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute) and node.attr == "call"
    ]
    assert calls == []
    surface_and_routes = [*FUNCTION_MODULES[:-1], *(path.name for path in FUNCTIONS.glob("*_routes.py"))]
    named = {
        (module, node.value)
        for module in sorted(surface_and_routes)
        for node in ast.walk(ast.parse((FUNCTIONS / module).read_text()))
        if isinstance(node, ast.Constant) and node.value in SQL_FUNCTIONS
    }
    assert named == set()
