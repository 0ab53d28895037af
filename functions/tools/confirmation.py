"""Operator commands that delete or move a person's memory ask first (`--yes` skips the question):
a `9d` typed for `90d`, or the wrong user id pasted, should cost a "no", not a thread."""

from __future__ import annotations

import sys

import click

yes_option = click.option("--yes", is_flag=True, help="do it without asking (scripts)")


def confirmed(yes: bool, question: str) -> bool:
    """`--yes`, or the operator's "y" at a terminal; without a terminal to ask, no.

    click.prompt, not click.confirm: confirm asks again after an answer it does not know, and the
    rule (docs/configuration.md#commands) is that anything but `y` or `yes` is a no."""
    command = click.get_current_context().info_name
    if yes:
        return True
    if not sys.stdin.isatty():
        print(f"crossmem {command}: {question} Not done: run it again with --yes", file=sys.stderr)
        return False
    try:
        answer = click.prompt(f"{question} [y/N]", default="", show_default=False, prompt_suffix=" ")
    except click.Abort:  # Ctrl-D or Ctrl-C at the question: no answer is a no, not a traceback
        print()
        answer = ""
    if answer.strip().lower() in ("y", "yes"):
        return True
    print(f"crossmem {command}: not done", file=sys.stderr)
    return False
