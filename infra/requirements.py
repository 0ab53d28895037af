"""Print requirements.txt (what Cloud Functions installs) from uv.lock: the runtime packages
only (no extras, no project), each `==` a version with its hashes, for Cloud Build's pip.

`make requirements` writes it after `uv lock`; tests/test_project.py fails when the two disagree.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEADER = (
    "# Exported from uv.lock by `make requirements` (never edited by hand): what Cloud Functions installs,\n"
    "# the versions `make test` ran, with their hashes (so pip installs nothing else).\n"
)
EXPORT = ["export", "--frozen", "--format", "requirements-txt", "--no-dev", "--no-emit-project", "--no-header"]


def uv() -> str:
    """The uv the Makefile installed beside this Python, else one on PATH."""
    beside = Path(sys.executable).parent / "uv"
    found = str(beside) if beside.is_file() else shutil.which("uv")
    if found is None:
        raise SystemExit("uv is not installed: `make .venv/.installed` installs it into .venv")
    return found


def requirements() -> str:
    exported = subprocess.run([uv(), *EXPORT, "--quiet"], cwd=ROOT, capture_output=True, text=True, check=True)
    return HEADER + exported.stdout


if __name__ == "__main__":
    print(requirements(), end="")
