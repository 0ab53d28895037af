"""The answer of one of `crossmem doctor`'s checks: ok, fail (with the fix, which names its
page of docs/), or skip (with what to set); and `guarded`, which keeps a check that breaks from
taking the others with it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from functions.logs import redacted
from functions.tools.doc_links import DOCTOR


@dataclass(frozen=True)
class Check:
    check: str
    status: str  # "ok", "fail" or "skip"
    detail: str
    fix: str | None = None

    def __post_init__(self) -> None:
        # A driver's error can quote the connection string it could not parse, password and all.
        object.__setattr__(self, "detail", redacted(self.detail))

    def line(self) -> str:
        fix = f". Fix: {self.fix}" if self.fix else ""
        return f"{self.status.upper() if self.status == 'fail' else self.status:<4}  {self.check}: {self.detail}{fix}"


def ok(check: str, detail: str) -> Check:
    return Check(check, "ok", detail)


def fail(check: str, detail: str, fix: str) -> Check:
    return Check(check, "fail", detail, fix)


def skip(check: str, detail: str) -> Check:
    return Check(check, "skip", detail)


def guarded(name: str, check: Callable[..., Check], *args: Any) -> Check:
    """The check's answer; a check that breaks is one failed line, not a traceback that would
    hide the other checks' answers (and turn `--json` into something else than JSON)."""
    try:
        return check(*args)
    except Exception as exc:
        said = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return fail(
            name,
            f"the check itself failed: {type(exc).__name__}{f': {said}' if said else ''}",
            f"run it again; if it fails the same way, it is a bug of crossmem doctor ({DOCTOR})",
        )
