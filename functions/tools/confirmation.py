"""Operator commands that delete or move a person's memory ask first (`--yes` skips the question):
a `9d` typed for `90d`, or the wrong user id pasted, should cost a "no", not a thread."""

from __future__ import annotations

import argparse
import sys


def add_yes(command: argparse.ArgumentParser) -> None:
    command.add_argument("--yes", action="store_true", help="do it without asking (scripts)")


def confirmed(args: argparse.Namespace, question: str) -> bool:
    """`--yes`, or the operator's "y" at a terminal; without a terminal to ask, no."""
    if args.yes:
        return True
    if not sys.stdin.isatty():
        print(f"crossmem {args.command}: {question} Not done: run it again with --yes", file=sys.stderr)
        return False
    try:
        answer = input(f"{question} [y/N] ")
    except EOFError:  # Ctrl-D at the question: no answer is a no, not a traceback
        print()
        answer = ""
    if answer.strip().lower() in ("y", "yes"):
        return True
    print(f"crossmem {args.command}: not done", file=sys.stderr)
    return False
