"""A stand-in for the Google Cloud CLI: an executable `gcloud` in a directory put on PATH.

It records each invocation's arguments (one JSON list a line) and answers from rules:
`fail(prefix, stderr)` makes every command starting with `prefix` print `stderr` and exit 1,
as gcloud does; `answer(prefix, stdout)` gives a command its output (a list's lines; a later answer to the same
prefix replaces it). Anything
else succeeds silently. The messages the tests give it are gcloud's own wording (README, Deploy).
`described_function` and `described_job` are what `gcloud functions describe` and `gcloud
scheduler jobs describe` print with `--format=json` (the v2 Function and the Cloud Scheduler Job
resources, the fields `crossmem doctor` reads).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

SCRIPT = """#!{python}
import json, sys
from pathlib import Path
here = Path(__file__).resolve().parent
args = sys.argv[1:]
with open(here / "calls.jsonl", "a") as calls:
    calls.write(json.dumps(args) + "\\n")
for rule in json.loads((here / "rules.json").read_text()):
    if args[: len(rule["prefix"])] == rule["prefix"]:
        sys.stdout.write(rule["stdout"])
        sys.stderr.write(rule["stderr"])
        sys.exit(rule["exit"])
"""

PERMISSION_DENIED_SECRETS_LIST = (
    "ERROR: (gcloud.secrets.list) PERMISSION_DENIED: Permission 'secretmanager.secrets.list' denied for resource "
    "'projects/advisor-prod' (or it may not exist). This command is authenticated as deployer@example.com which "
    "is the active account specified by the [core/account] property.\n"
)
NOT_LOGGED_IN = (
    "ERROR: (gcloud.secrets.list) You do not currently have an active account selected.\n"
    "Please run:\n\n  $ gcloud auth login\n\nto obtain new credentials.\n"
)
API_DISABLED = (
    "ERROR: (gcloud.secrets.list) PERMISSION_DENIED: Secret Manager API has not been used in project 123456789012 "
    "before or it is disabled. Enable it by visiting https://console.developers.google.com/apis/api/"
    "secretmanager.googleapis.com/overview?project=123456789012 then retry. If you enabled this API recently, "
    "wait a few minutes for the action to propagate to our systems and retry. This command is authenticated "
    "as deployer@example.com which is the active account specified by the [core/account] property.\n"
    "- '@type': type.googleapis.com/google.rpc.ErrorInfo\n  reason: SERVICE_DISABLED\n"
)
ACT_AS_DENIED = (
    "ERROR: (gcloud.functions.deploy) ResponseError: status=[403], code=[Ok], message=[Permission "
    "'iam.serviceAccounts.actAs' denied on service account crossmem-runtime@advisor-prod.iam.gserviceaccount.com "
    "(or it may not exist).]\n"
)
FUNCTION_NOT_FOUND = (
    "ERROR: (gcloud.functions.describe) NOT_FOUND: Resource 'projects/advisor-prod/locations/us-central1/"
    "functions/{name}' was not found\n"
)
JOB_NOT_FOUND = "ERROR: (gcloud.scheduler.jobs.describe) NOT_FOUND: Job not found.\n"


def described_function(project: str, region: str, name: str, url: str, secrets: dict[str, str]) -> str:
    """`gcloud functions describe NAME --format=json` for an ACTIVE 2nd-gen function; `secrets`:
    environment name -> secret id, as `--set-secrets` gave them."""
    variables = [
        {"key": key, "projectId": project, "secret": secret, "version": "latest"} for key, secret in secrets.items()
    ]
    function: dict[str, Any] = {
        "name": f"projects/{project}/locations/{region}/functions/{name}",
        "environment": "GEN_2",
        "state": "ACTIVE",
        "url": url,
        "serviceConfig": {"uri": url, "secretEnvironmentVariables": variables},
    }
    return json.dumps(function, indent=2) + "\n"


def described_job(project: str, region: str, job: str, uri: str, **fields: Any) -> str:
    """`gcloud scheduler jobs describe JOB --format=json`: enabled, last run at 12:00:00 UTC,
    succeeded (an empty `status`); `fields` replace any of them (`status={"code": 7}`; a job
    `gcloud scheduler jobs pause` paused: `state="PAUSED"`)."""
    described: dict[str, Any] = {
        "name": f"projects/{project}/locations/{region}/jobs/{job}",
        "schedule": "* * * * *",
        "timeZone": "Etc/UTC",
        "state": "ENABLED",
        "httpTarget": {"uri": uri, "httpMethod": "POST"},
        "lastAttemptTime": "2026-12-01T12:00:00.123456Z",
        "scheduleTime": "2026-12-01T12:01:00Z",
        "status": {},
        **fields,
    }
    return json.dumps(described, indent=2) + "\n"


class FakeGcloud:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self._rules: list[dict[str, object]] = []
        self._write_rules()
        script = directory / "gcloud"
        script.write_text(SCRIPT.format(python=sys.executable))
        script.chmod(0o755)

    def fail(self, prefix: list[str], stderr: str, exit_code: int = 1) -> None:
        self._rules.insert(0, {"prefix": prefix, "stdout": "", "stderr": stderr, "exit": exit_code})
        self._write_rules()

    def answer(self, prefix: list[str], stdout: str) -> None:
        """Answer commands starting with `prefix`, in place of an earlier answer to that prefix."""
        self._rules = [rule for rule in self._rules if rule["prefix"] != prefix or rule["exit"] != 0]
        self._rules.append({"prefix": prefix, "stdout": stdout, "stderr": "", "exit": 0})
        self._write_rules()

    @property
    def calls(self) -> list[list[str]]:
        log = self.directory / "calls.jsonl"
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    def _write_rules(self) -> None:
        (self.directory / "rules.json").write_text(json.dumps(self._rules))
