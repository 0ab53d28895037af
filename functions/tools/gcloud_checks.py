"""`crossmem doctor`'s checks that ask gcloud about serverless.yml's functions in the project:
the secrets they reference, each function (deployed, ACTIVE, its URL answering as it should),
and the scheduler job. `Cloud` says whether gcloud can be asked at all (GCP_PROJECT set, gcloud
on PATH), and why not."""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from functions.tools.check_results import Check, fail, ok, skip
from functions.tools.deploy import Description, FunctionSpec, Target, TargetNotSet, function_url, secret_id
from functions.tools.doc_links import FUNCTIONS, GOOGLE_CLOUD, SCHEDULE, SECRETS
from functions.tools.tool_failures import ToolFailed, run_tool

PROBE_TIMEOUT_S = 10.0

# google.rpc.Code of a Cloud Scheduler job's last attempt, and what usually causes each.
RPC_CODES = {
    4: ("DEADLINE_EXCEEDED", "the run took longer than the job's attempt deadline"),
    5: ("NOT_FOUND", "nothing at the job's URL: `make deploy`"),
    7: ("PERMISSION_DENIED", "the scheduler's account may not invoke the function: `make deploy` grants it"),
    13: ("INTERNAL", "the function answered 5xx: read its logs"),
    14: ("UNAVAILABLE", "the function answered 503: read its logs"),
    16: ("UNAUTHENTICATED", "the job's OIDC token was refused: `make deploy` sets its audience"),
}


@dataclass(frozen=True)
class Cloud:
    """serverless.yml's functions and the project they are deployed in; `not_asked`: why gcloud
    is not asked about them (None: it is)."""

    functions: list[FunctionSpec]
    target: Target | None
    not_asked: str | None

    @classmethod
    def of(cls, description: Description, shell: Mapping[str, str]) -> Cloud:
        try:
            target = Target.of(description, shell)
        except TargetNotSet as exc:
            unset = " and ".join(exc.unset) or "the project"
            return cls(description.functions, None, f"{unset} is not set here: set it to ask gcloud ({FUNCTIONS})")
        if shutil.which("gcloud") is None:
            return cls(
                description.functions,
                target,
                f"gcloud is not on PATH: install the Google Cloud CLI to ask it ({GOOGLE_CLOUD})",
            )
        return cls(description.functions, target, None)

    def url_of(self, function: str, deployed: Mapping[str, Deployed]) -> list[str]:
        """The function's URLs as gcloud describes it; none when gcloud is not asked (the project
        alone gives only one of its two URLs, and a webhook may rightly use the other)."""
        if self.not_asked is not None or self.target is None:
            return []
        if function in deployed:
            return deployed[function].urls(self.target)
        return [function_url(self.target.region, self.target.project, function)]


# The functions, as gcloud describes them.


@dataclass(frozen=True)
class Deployed:
    spec: FunctionSpec
    described: Mapping[str, Any] | None  # None: describe failed
    failure: ToolFailed | None = None

    def urls(self, target: Target) -> list[str]:
        """Its URLs: the one gcloud gives first, then the run.app one and the documented one."""
        found = []
        if self.described is not None:
            found += [self.described.get("url"), self.described.get("serviceConfig", {}).get("uri")]
        found.append(function_url(target.region, target.project, self.spec.name))
        return list(dict.fromkeys(url for url in found if url))


def describe(spec: FunctionSpec, target: Target) -> Deployed:
    command = [
        "gcloud",
        "functions",
        "describe",
        spec.name,
        "--gen2",
        f"--project={target.project}",
        f"--region={target.region}",
        "--format=json",
    ]
    try:
        return Deployed(spec, json.loads(run_tool(command, project=target.project).stdout))
    except ToolFailed as exc:
        return Deployed(spec, None, exc)


def check_secrets(deployed: list[Deployed], target: Target) -> Check:
    name = "secrets"
    referenced: dict[str, list[str]] = {}
    for function in deployed:
        for variable in (function.described or {}).get("serviceConfig", {}).get("secretEnvironmentVariables", []):
            referenced.setdefault(secret_id(str(variable["secret"])), []).append(function.spec.name)
    if not any(function.described for function in deployed):
        if all(function.failure is not None and not_found(function.failure) for function in deployed):
            return skip(name, "no function is deployed, so none references a secret yet")
        return skip(
            name,
            "gcloud described no function (each function's line says why), so the secrets they reference are not known",
        )
    try:
        listed = run_tool(
            ["gcloud", "secrets", "list", f"--project={target.project}", "--format=value(name.basename())"],
            project=target.project,
        )
    except ToolFailed as exc:
        return fail(name, f"`gcloud secrets list` failed: {exc.said}", exc.fix)
    existing = set(listed.stdout.split())
    missing = sorted(set(referenced) - existing)
    if missing:
        users = "; ".join(f"{secret} (by {', '.join(referenced[secret])})" for secret in missing)
        return fail(
            name,
            f"referenced but not in Secret Manager: {users}; a new instance cannot start",
            f"`printf %s VALUE | gcloud secrets create {missing[0]} --data-file=-` ({SECRETS}), "
            "or `make deploy` to drop the reference",
        )
    return ok(name, f"all {len(referenced)} referenced secrets exist in Secret Manager")


def not_found(failure: ToolFailed) -> bool:
    """gcloud's describe found no such function (not: it could not ask)."""
    return "NOT_FOUND" in failure.said


def check_function(function: Deployed, target: Target) -> Check:
    name = f"function {function.spec.name}"
    if function.described is None:
        assert function.failure is not None
        if not_found(function.failure):
            return fail(name, "not deployed", f"`make deploy` ({FUNCTIONS})")
        return fail(name, f"`gcloud functions describe` failed: {function.failure.said}", function.failure.fix)
    state = function.described.get("state")
    if state != "ACTIVE":
        return fail(name, f"state {state}", f"`make deploy` again; `gcloud functions describe` says why ({FUNCTIONS})")
    url = function.urls(target)[0]
    try:
        answer = httpx.get(url, timeout=PROBE_TIMEOUT_S)
    except httpx.HTTPError as exc:
        return fail(name, f"{url} does not answer: {type(exc).__name__}", f"check the URL; `make deploy` ({FUNCTIONS})")
    status = answer.status_code
    if status == 404:
        return fail(
            name,
            f"{url} answers 404: no function there",
            f"`make deploy` (a function's URL ends in its name: {FUNCTIONS})",
        )
    if not function.spec.public:
        if status in (401, 403):
            return ok(name, f"{url} refuses a call without a token ({status}): private, as it should be")
        return fail(
            name,
            f"{url} answers {status} to a call without a token: it is public",
            f"`make deploy` (it deploys {function.spec.name} with --no-allow-unauthenticated: {SCHEDULE})",
        )
    if status == 403:
        return fail(
            name,
            f"{url} answers 403: Cloud Run refuses callers without a Google identity",
            "`make deploy` (it deploys the webhooks with --allow-unauthenticated; an organization policy "
            f"restricting allUsers forbids that: {FUNCTIONS})",
        )
    if status >= 500:
        said = error_message(answer)
        return fail(
            name,
            f"{url} answers {status}{said}",
            f"give it what it names (serverless.yml), then `make deploy` ({FUNCTIONS})",
        )
    return ok(name, f"{url} answers {status} without credentials, as the function does")


def error_message(answer: httpx.Response) -> str:
    """Our functions' JSON error (`not_configured: ...`), when the answer is one."""
    try:
        body = answer.json()
    except ValueError:
        return ""
    if isinstance(body, dict) and "error" in body:
        return f": {body['error']}: {body.get('message', '')}"
    return ""


# The scheduled job.


def check_schedule(spec: FunctionSpec, deployed: Deployed | None, target: Target) -> Check:
    assert spec.schedule is not None
    job = spec.schedule.job
    name = f"scheduler job {job}"
    command = [
        "gcloud",
        "scheduler",
        "jobs",
        "describe",
        job,
        f"--project={target.project}",
        f"--location={target.region}",
        "--format=json",
    ]
    try:
        described = json.loads(run_tool(command, project=target.project).stdout)
    except ToolFailed as exc:
        if "NOT_FOUND" in exc.said:
            return fail(name, "does not exist", f"`make deploy` (it creates the job: {SCHEDULE})")
        return fail(name, f"`gcloud scheduler jobs describe` failed: {exc.said}", exc.fix)
    state = described.get("state")
    if state != "ENABLED":
        # PAUSED (by hand, or `gcloud scheduler jobs pause`), DISABLED (by the system), UPDATE_FAILED.
        said = "paused" if state == "PAUSED" else f"not enabled (state {state})"
        return fail(
            name,
            f"{said}: it calls {spec.name} no more, so owed replies, due follow-ups and memory notes wait",
            f"`gcloud scheduler jobs resume {job} --location={target.region}` ({SCHEDULE})",
        )
    uri = described.get("httpTarget", {}).get("uri")
    ours = deployed.urls(target) if deployed else [function_url(target.region, target.project, spec.name)]
    if uri not in ours:
        return fail(
            name, f"calls {uri}, not {spec.name} ({ours[0]})", f"`make deploy` (it updates the job: {SCHEDULE})"
        )
    last = described.get("lastAttemptTime")
    if last is None:
        return ok(name, f"enabled, {described.get('schedule')}; not run yet")
    code = int(described.get("status", {}).get("code", 0))
    if code:
        kind, cause = RPC_CODES.get(code, (f"code {code}", "read the function's logs"))
        said = described["status"].get("message", "")
        return fail(
            name,
            f"its last run, at {last}, failed: {kind}{f' ({said})' if said else ''}",
            f"{cause}; `gcloud functions logs read {spec.name} --region={target.region}` ({SCHEDULE})",
        )
    return ok(name, f"enabled, {described.get('schedule')}; its last run, at {last}, succeeded")
