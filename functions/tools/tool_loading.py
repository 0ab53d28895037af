"""EXTRA_TOOLS as a deployed function loads them, asked by `crossmem deploy` before it deploys
anything: this file, run by path in a process of its own on the upload's code alone
(build/function-source/ on PYTHONPATH, the checkout not), with a function's plain settings,
builds that function's capabilities as its first turn would (functions/runtime.py). What that
refuses (a callable with no `input_schema`, a schema the Messages API would refuse, a name a
built-in tool has, a module the upload does not carry) the deploy refuses, in the same words:
one rule decides both. The operator's module is imported there, as the function imports it.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Collection, Mapping
from pathlib import Path

REFUSED = 3  # the child's exit status when the functions would refuse: its stdout says why
LOAD_S = 120  # an import that takes longer is one no function would finish loading either


def load_refusal(
    settings: Mapping[str, str], shell: Mapping[str, str], setting_names: Collection[str], package: Path
) -> str | None:
    """What a function with these plain `settings`, deployed from `package`, would refuse every
    turn with as it loads its tools, or None. The deploying `shell`'s other variables go along (a
    tool may read its own at import), never one of crossmem's `setting_names`: the function reads
    its settings from serverless.yml only."""
    environment = {name: value for name, value in shell.items() if name.lower() not in setting_names}
    environment.update(settings)
    environment["PYTHONPATH"] = str(package)
    try:
        done = subprocess.run(
            [sys.executable, "-P", __file__],  # -P: not this file's directory on sys.path
            env=environment,
            cwd=package,  # no .env there, as in the upload
            capture_output=True,
            text=True,
            timeout=LOAD_S,
        )
    except subprocess.TimeoutExpired:
        return f"EXTRA_TOOLS: loading the tools took over {LOAD_S} s, as a function would load them"
    if done.returncode == 0:
        return None
    if done.returncode == REFUSED:
        return done.stdout.strip()
    said = done.stderr.strip().splitlines()
    return f"EXTRA_TOOLS: loading the tools as a function would failed: {said[-1] if said else done.returncode}"


def main() -> int:
    from core.errors import ConfigurationError
    from functions import runtime

    try:
        runtime.capabilities(runtime.settings())
    except ConfigurationError as refused:
        print(refused)
        return REFUSED
    return 0


if __name__ == "__main__":
    sys.exit(main())
