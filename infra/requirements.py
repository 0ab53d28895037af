"""Print requirements.txt (what Cloud Functions installs) from pyproject.toml's dependencies.

`make requirements` writes it; tests/test_project.py fails when the two disagree.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"
HEADER = "# Generated from pyproject.toml by `make requirements`: what Cloud Functions installs.\n"


def requirements() -> str:
    dependencies = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    return HEADER + "".join(f"{dependency}\n" for dependency in dependencies)


if __name__ == "__main__":
    print(requirements(), end="")
