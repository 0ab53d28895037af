"""`crossmem export`: the operator's copy of everything held of a person (an access request)."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import click

from functions.tools.person_option import user_option


@click.command(help="write everything held of a person as JSON (an access request)")
@user_option()
@click.option("--output", type=click.Path(dir_okay=False, path_type=Path), help="a file to write (default: stdout)")
def export(user: str, output: Path | None) -> int:
    from functions import runtime  # the whole server: only for the command that runs

    pieces = runtime.export().pieces(uuid.UUID(user))
    if output is None:
        sys.stdout.writelines(pieces)
        return 0
    # Written beside the file and moved over it once whole: a failed export leaves no half file.
    partial = output.with_name(output.name + ".partial")
    try:
        opened = partial.open("w", encoding="utf-8")
    except OSError as exc:  # a folder not there, or not writable: said as the file asked for
        raise click.FileError(str(output), exc.strerror) from None
    try:
        with opened as file:
            file.writelines(pieces)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    partial.replace(output)
    print(f"exported {user} to {output}", file=sys.stderr)
    return 0
