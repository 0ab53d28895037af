"""A deploy tool's failure (gcloud, npm, the Supabase CLI) as one plain line: the tool's own
error and the likely fix (log in, enable the API, the missing role by name), never a traceback.

`run_tool` runs a command, and raises `ToolFailed` with that line when it fails or is missing;
`diagnose` is the rule book, kept beside it so a test can read each rule's fix. The Makefile's
tool steps (`npm ci`, `supabase db push`) run through this module's `main`, so they end the same
way: `python -m functions.tools.tool_failures --as "make db-push" -- COMMAND...`.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections.abc import Sequence

from functions.tools.doc_links import DATABASE, DEPLOY, GOOGLE_CLOUD

# The role that carries each permission the deploy uses (docs/deploy.md#2-the-google-cloud-project,
# whoever deploys).
ROLE_OF_PERMISSION = {
    "secretmanager.secrets.list": "roles/secretmanager.viewer",
    "secretmanager.secrets.get": "roles/secretmanager.viewer",
    "cloudfunctions.functions.create": "roles/cloudfunctions.developer",
    "cloudfunctions.functions.update": "roles/cloudfunctions.developer",
    "cloudfunctions.functions.get": "roles/cloudfunctions.developer",
    "cloudfunctions.functions.list": "roles/cloudfunctions.developer",
    "cloudfunctions.functions.setIamPolicy": "roles/run.admin",
    "run.services.setIamPolicy": "roles/run.admin",
    "run.services.getIamPolicy": "roles/run.admin",
    "iam.serviceAccounts.actAs": "roles/iam.serviceAccountUser",
    "cloudscheduler.jobs.get": "roles/cloudscheduler.admin",
    "cloudscheduler.jobs.create": "roles/cloudscheduler.admin",
    "cloudscheduler.jobs.update": "roles/cloudscheduler.admin",
    "cloudscheduler.jobs.list": "roles/cloudscheduler.admin",
    "cloudbuild.builds.create": "roles/cloudbuild.builds.builder",
    "serviceusage.services.use": "roles/serviceusage.serviceUsageConsumer",
}

PERMISSION = re.compile(r"[Pp]ermission '?([a-z]+\.[A-Za-z]+\.[A-Za-z]+)'? (?:denied|is required)")
DISABLED_API = re.compile(r"([a-z0-9-]+\.googleapis\.com)")
# npm's lines that name the error's code or its log, before or after the one that says what happened.
NPM_BOOKKEEPING = re.compile(r"npm (ERR!|error) (code|errno|syscall|A complete log|Log files)")
NOT_LOGGED_IN = (
    "You do not currently have an active account selected",
    "Reauthentication failed",
    "There was a problem refreshing your current auth tokens",
    "Your current active account",
)


class ToolFailed(RuntimeError):
    """A deploy tool failed; str() is the one line to print, `fix` what to do, `said` the tool's error."""

    def __init__(self, message: str, fix: str, said: str) -> None:
        super().__init__(message)
        self.fix = fix
        self.said = said


def own_error(stderr: str) -> str:
    """The tool's own error, in one line: its ERROR line when it has one, else its last line."""
    # The Supabase CLI ends every error with this advice, below the error itself.
    lines = [line.strip() for line in stderr.splitlines() if line.strip() and not line.startswith("Try rerunning")]
    errors = [
        line
        for line in lines
        if line.startswith(("ERROR", "Error", "error", "npm ERR!", "npm error"))
        and not NPM_BOOKKEEPING.match(line)
        and line not in ("npm error", "npm ERR!")
    ]
    chosen = errors[0] if errors else (lines[-1] if lines else "(no message)")
    return chosen[:400]


def shown(command: Sequence[str]) -> str:
    """The command itself, up to its first flag (`gcloud functions deploy NAME`): never a
    flag's value, which may hold a password (`--remote=postgresql://...`)."""
    words: list[str] = []
    for word in command:
        if word.startswith("-"):
            break
        words.append(word.rsplit("/", 1)[-1] if not words else word)
    return " ".join(words)


def diagnose(command: Sequence[str], stderr: str, project: str | None = None) -> str:
    """The likely fix for `command`'s failure, from what the tool printed."""
    for_project = f" --project={project}" if project else ""
    tool = command[0].rsplit("/", 1)[-1]
    if any(marker in stderr for marker in NOT_LOGGED_IN):
        return (
            f"log in: `gcloud auth login`, then `gcloud config set project PROJECT`, and run it again ({GOOGLE_CLOUD})"
        )
    if "SERVICE_DISABLED" in stderr or "has not been used in project" in stderr or "API has not been" in stderr:
        api = DISABLED_API.search(stderr)
        name = api.group(1) if api else "the API it names"
        return f"enable the API: `gcloud services enable {name}{for_project}` ({GOOGLE_CLOUD})"
    if permission := PERMISSION.search(stderr):
        needed = permission.group(1)
        role = ROLE_OF_PERMISSION.get(needed, "a role that holds it")
        return (
            f"the permission {needed} is missing: grant whoever deploys {role} (the deployer's roles: {GOOGLE_CLOUD})"
        )
    if "PERMISSION_DENIED" in stderr or "does not have permission" in stderr:
        return f"a permission is missing: grant whoever deploys the roles {GOOGLE_CLOUD} lists"
    if 'schema "auth" does not exist' in stderr or 'role "anon" does not exist' in stderr:
        return (
            "this Postgres is not a Supabase project: create the stand-ins first "
            f"(`make db-standins DB_URL=…`, or `crossmem migrate --supabase-standins`; {DATABASE})"
        )
    if "password authentication failed" in stderr:
        return (
            f"the database refused the password in DB_URL: check it (Supabase: Project Settings, Database; {DATABASE})"
        )
    if "connection refused" in stderr.lower() or "could not translate host name" in stderr:
        return f"nothing answers at DB_URL's host and port: check the URL (and that the database runs; {DATABASE})"
    if tool == "npm" and ("in sync" in stderr or "EUSAGE" in stderr):
        return (
            "infra/deploy/package.json and package-lock.json disagree: "
            f"`npm install --prefix infra/deploy`, then commit the lock ({DATABASE})"
        )
    if tool == "npm":
        return (
            "npm could not install the pinned tools: check the registry is reachable "
            f"(npm config get registry; {DATABASE})"
        )
    return f"see the tool's message ({DEPLOY})"


def how_to_install(tool: str) -> str:
    name = tool.rsplit("/", 1)[-1]
    if name == "gcloud":
        return f"install the Google Cloud CLI ({GOOGLE_CLOUD})"
    if name == "supabase":
        return f"`make deploy-tools` installs the pinned Supabase CLI ({DATABASE})"
    if name == "npm":
        return f"install Node.js and npm (Debian: `apt-get install npm`), then `make deploy-tools` ({DATABASE})"
    return f"install it ({DEPLOY})"


def explain(command: Sequence[str], stderr: str, project: str | None = None) -> str:
    """What went wrong with `command` and what to do, in one line."""
    return f"`{shown(command)}` failed: {diagnose(command, stderr, project)}. It said: {own_error(stderr)}"


def run_tool(
    command: Sequence[str], *, project: str | None = None, capture_stdout: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run `command`; its stderr is echoed (when stdout streams) and explained on failure."""
    try:
        done = subprocess.run(
            list(command), stdout=subprocess.PIPE if capture_stdout else None, stderr=subprocess.PIPE, text=True
        )
    except FileNotFoundError:
        fix = how_to_install(command[0])
        raise ToolFailed(f"{command[0]} is not on PATH: {fix}", fix, f"{command[0]}: not found") from None
    if not capture_stdout and done.stderr:
        sys.stderr.write(done.stderr)
    if done.returncode != 0:
        raise ToolFailed(
            explain(command, done.stderr, project), diagnose(command, done.stderr, project), own_error(done.stderr)
        )
    return done


def main(argv: list[str] | None = None) -> int:
    """Run a tool for a Makefile target: its output as it prints it, and when it fails, one
    last line naming the target, the tool's own error and the likely fix; no traceback."""
    arguments = argparse.ArgumentParser(prog="python -m functions.tools.tool_failures")
    arguments.add_argument("--as", dest="target", required=True, help="who runs it: make db-push")
    arguments.add_argument("command", nargs=argparse.REMAINDER, help="-- the tool and its arguments")
    args = arguments.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        arguments.error("give the command after --")
    try:
        run_tool(command, capture_stdout=False)
    except ToolFailed as exc:
        print(f"{args.target}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
