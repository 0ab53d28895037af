"""The seam between the turn and what the agent can do (core/turn/capabilities.py): the turn, the tool
loop and what they read import no capability's module, so a capability is added as a module and
one line of functions/runtime.py's list, never as a branch in the turn."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers import ROOT

CORE = ROOT / "core"
# The modules every turn runs through, and the capabilities' own.
TURN = ("turn/turns.py", "turn/tool_loop.py", "turn/request.py", "turn/estimate.py")
CAPABILITIES = {"core.follow_ups.capability", "core.memory.search", "core.media.capability", "core.turn.operator_tools"}


def imported(path: Path) -> set[str]:
    """Every module a file imports, at its top or inside a function."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_the_turn_and_the_tool_loop_import_no_capability() -> None:
    """Seen failing with `from core.memory.search import MemorySearchTools` put back in core/turn/turns.py."""
    named = {module: sorted(imported(CORE / module) & CAPABILITIES) for module in TURN}
    assert named == {module: [] for module in TURN}
