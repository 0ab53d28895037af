"""`--user`, the person a `crossmem` command is about: a uuid, refused as a usage error that names
the option (exit 2) before the command runs, as every other option's bad value is."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import click


def _a_user_id(context: click.Context, option: click.Parameter, value: str | None) -> str | None:
    if value is None:
        return None
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a user id (a uuid)") from None


def user_option(help: str = "the person's user id (uuid)", *, required: bool = True) -> Callable[[Any], Any]:
    return click.option("--user", required=required, callback=_a_user_id, help=help)
