"""A deploy tool's failure (gcloud, npm, the Supabase CLI) as one plain line: the tool's own
error and the likely fix (log in, enable the API, the missing role by name), never a traceback.

`run_tool` runs a command, and raises `ToolFailed` with that line when it fails or is missing;
`explain` is the rule book, kept beside it so a test can read each rule's fix.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Sequence

# The role that carries each permission the deploy uses (README, Deploy: whoever deploys).
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
NOT_LOGGED_IN = (
    "You do not currently have an active account selected",
    "Reauthentication failed",
    "There was a problem refreshing your current auth tokens",
    "Your current active account",
)


class ToolFailed(RuntimeError):
    """A deploy tool failed; str() is the one line to print."""


def own_error(stderr: str) -> str:
    """The tool's own error, in one line: its ERROR line when it has one, else its last line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith(("ERROR", "Error", "error", "npm ERR!", "npm error"))]
    chosen = errors[0] if errors else (lines[-1] if lines else "(no message)")
    return chosen[:400]


def explain(command: Sequence[str], stderr: str, project: str | None = None) -> str:
    """What went wrong with `command` and what to do, from what the tool printed."""
    words = []
    for word in command:  # the command itself, up to its first flag: `gcloud functions deploy NAME`
        if word.startswith("-"):
            break
        words.append(word)
    shown = " ".join(words)
    said = own_error(stderr)
    for_project = f" --project={project}" if project else ""
    if any(marker in stderr for marker in NOT_LOGGED_IN):
        fix = "log in: `gcloud auth login`, then `gcloud config set project PROJECT`, and run it again"
    elif "SERVICE_DISABLED" in stderr or "has not been used in project" in stderr or "API has not been" in stderr:
        api = DISABLED_API.search(stderr)
        name = api.group(1) if api else "the API it names"
        fix = f"enable the API: `gcloud services enable {name}{for_project}` (README, Deploy, step 2)"
    elif permission := PERMISSION.search(stderr):
        needed = permission.group(1)
        role = ROLE_OF_PERMISSION.get(needed, "a role that holds it")
        fix = (
            f"the permission {needed} is missing: grant whoever deploys {role} "
            f"(README, Deploy: the deployer's roles)"
        )
    elif "PERMISSION_DENIED" in stderr or "does not have permission" in stderr:
        fix = "a permission is missing: grant whoever deploys the roles README, Deploy lists"
    elif "schema \"auth\" does not exist" in stderr or 'role "anon" does not exist' in stderr:
        fix = (
            "this Postgres is not a Supabase project: create the stand-ins first "
            "(`make db-standins DB_URL=…`, or `crossmem migrate --supabase-standins`)"
        )
    elif "password authentication failed" in stderr:
        fix = "the database refused the password in DB_URL: check it (Supabase: Project Settings, Database)"
    elif "connection refused" in stderr.lower() or "could not translate host name" in stderr:
        fix = "nothing answers at DB_URL's host and port: check the URL (and that the database runs)"
    elif command[0] == "npm":
        fix = "npm could not install the pinned tools: check the registry is reachable (npm config get registry)"
    else:
        fix = "see the tool's message"
    return f"`{shown}` failed: {fix}. It said: {said}"


def run_tool(
    command: Sequence[str], *, project: str | None = None, capture_stdout: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run `command`; its stderr is echoed (when stdout streams) and explained on failure."""
    try:
        done = subprocess.run(
            list(command), stdout=subprocess.PIPE if capture_stdout else None, stderr=subprocess.PIPE, text=True
        )
    except FileNotFoundError:
        raise ToolFailed(f"{command[0]} is not on PATH (README, Deploy, says how to install it)") from None
    if not capture_stdout and done.stderr:
        sys.stderr.write(done.stderr)
    if done.returncode != 0:
        raise ToolFailed(explain(command, done.stderr, project))
    return done
