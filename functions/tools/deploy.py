"""`crossmem deploy`: serverless.yml's functions as 2nd-gen functions (Cloud Run functions),
one `gcloud functions deploy NAME --gen2 ...` each.

serverless.yml keeps the Serverless Framework's layout, and stays the one description of the
functions, but the Framework no longer deploys it: its only Google provider makes 1st-gen
functions through Cloud Deployment Manager (docs/deploy.md#deploy). Beside the Framework's keys
(handler, memorySize, timeout, minInstances, maxInstances, environment) each function says
`cpu`, `concurrency`, `public`, `secrets` and `schedule`, and may say `needs`: the deploying
shell's variables without which it is not deployed (it would only refuse to serve).
`provider.secrets` go to every function, as `provider.environment` does. A function with a
`schedule` must be private: the deploy gives `provider.schedulerServiceAccount` roles/run.invoker
on it and creates (or updates) the Cloud Scheduler job that calls it with that account's OIDC token.

Every gcloud failure ends in one line with gcloud's own error and the likely fix
(functions/tools/tool_failures.py), never a traceback.

Values may use the Framework's variables: `${env:NAME}` (the deploying shell's), with a
default `${env:NAME, 'value'}`, and `${self:provider.region}`. A setting whose value is unset
is left out, so the function uses its own default (docs/configuration.md#configuration).
"""

from __future__ import annotations

import re
import shlex
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.stores.embedded import REPOSITORY
from functions.function_settings import deployment_problems
from functions.settings import Settings
from functions.tools.doc_links import GOOGLE_CLOUD
from functions.tools.tool_failures import ToolFailed, run_tool
from functions.tools.tool_loading import load_refusal
from functions.tools.upload import PACKAGE, build_package, unshipped_tools

SERVERLESS_YML = REPOSITORY / "serverless.yml"
ENV_FILES = REPOSITORY / "build" / "env"
INNERMOST_VARIABLE = re.compile(r"\$\{(env|self):([A-Za-z0-9_.]+)(?:,\s*'([^'${}]*)')?\}")
INSTALL_GCLOUD = (
    "gcloud is not on PATH. Install the Google Cloud CLI (https://cloud.google.com/sdk/docs/install), "
    f"then `gcloud auth login` and `gcloud config set project PROJECT` ({GOOGLE_CLOUD}), and run `make deploy` again. "
    "`crossmem deploy --dry-run` prints the commands without it."
)

# What whoever deploys needs for each kind of gcloud command the deploy runs (GOOGLE_CLOUD's page
# lists them; a test checks it against the dry run's commands).
DEPLOYER_ROLES: Mapping[tuple[str, str], list[str]] = {
    ("secrets", "list"): ["roles/secretmanager.viewer"],
    # Public access is an IAM policy on the function's Cloud Run service (roles/run.admin); the
    # functions run as GCP_SERVICE_ACCOUNT (actAs, roles/iam.serviceAccountUser on it).
    ("functions", "deploy"): ["roles/cloudfunctions.developer", "roles/run.admin", "roles/iam.serviceAccountUser"],
    ("functions", "add-invoker-policy-binding"): ["roles/run.admin"],
    # The job's OIDC token is the scheduler account's (actAs on it too).
    ("scheduler", "jobs"): ["roles/cloudscheduler.admin", "roles/iam.serviceAccountUser"],
}


class DescriptionError(ValueError):
    """serverless.yml cannot be turned into commands; the message says what to change."""


class TargetNotSet(DescriptionError):
    """The deploying shell does not say which project (or region) serverless.yml's functions are in."""

    def __init__(self, message: str, unset: list[str]) -> None:
        super().__init__(message)
        self.unset = unset  # the shell's variables to set, GCP_PROJECT first


@dataclass(frozen=True)
class Schedule:
    job: str
    cron: str
    time_zone: str
    attempt_deadline: str


@dataclass(frozen=True)
class FunctionSpec:
    name: str
    entry_point: str
    memory_mb: int
    cpu: str
    timeout: str
    concurrency: int
    min_instances: int
    max_instances: int
    public: bool
    environment: Mapping[str, str]  # name -> value template, the provider's then the function's
    secrets: Mapping[str, str]  # name -> Secret Manager reference
    schedule: Schedule | None = None
    needs: tuple[str, ...] = ()  # the shell's variables it is deployed only with

    def unmet(self, shell: Mapping[str, str]) -> list[str]:
        """What it needs that the deploying shell does not set: it is then not deployed."""
        return [name for name in self.needs if not shell.get(name)]


@dataclass(frozen=True)
class Description:
    raw: Mapping[str, Any]
    runtime: str
    functions: list[FunctionSpec]

    def problems(self) -> list[str]:
        return deployment_problems(
            {function.name: set(function.environment) for function in self.functions},
            {function.name: function.secrets for function in self.functions},
        )


def read_description(path: Path = SERVERLESS_YML) -> Description:
    try:
        import yaml
    except ImportError:
        # crossmem is not on PyPI: its `deploy` extra is installed from the checkout, or PyYAML alone.
        raise DescriptionError(
            f"reading serverless.yml needs PyYAML, which {sys.executable} does not have: `make dev` installs it in "
            f".venv (the `deploy` extra); here, `{sys.executable} -m pip install 'pyyaml>=6'`"
        ) from None
    raw = yaml.safe_load(path.read_text())
    provider = raw["provider"]
    functions = []
    for name, spec in raw["functions"].items():
        if spec["handler"] != name:
            # The URL ends in the function's name; the README's URLs hold only when it is the entry point.
            raise DescriptionError(f"serverless.yml: function {name}'s handler must be {name}, not {spec['handler']}")
        schedule = None
        if "schedule" in spec:
            if spec["public"]:
                raise DescriptionError(f"serverless.yml: {name} has a schedule, so it must be private (public: false)")
            job = spec["schedule"]
            schedule = Schedule(job["job"], job["cron"], job.get("timeZone", "Etc/UTC"), job["attemptDeadline"])
        functions.append(
            FunctionSpec(
                name=name,
                entry_point=spec["handler"],
                memory_mb=int(spec.get("memorySize", provider["memorySize"])),
                cpu=str(spec.get("cpu", provider.get("cpu", 1))),
                timeout=str(spec["timeout"]),
                concurrency=int(spec["concurrency"]),
                min_instances=int(spec.get("minInstances", 0)),
                max_instances=int(spec["maxInstances"]),
                public=bool(spec["public"]),
                environment={**provider.get("environment", {}), **spec.get("environment", {})},
                secrets={**provider.get("secrets", {}), **spec.get("secrets", {})},
                schedule=schedule,
                needs=tuple(spec.get("needs", ())),
            )
        )
    return Description(raw, str(provider["runtime"]), functions)


def resolve(template: object, shell: Mapping[str, str], raw: Mapping[str, Any]) -> str | None:
    """A value with its variables replaced, innermost first; None when one is unset without default."""
    text = str(template)
    while match := INNERMOST_VARIABLE.search(text):
        kind, name, default = match.groups()
        if kind == "env":
            value = shell.get(name) or default
        else:
            node: Any = raw
            for part in name.split("."):
                node = node[part]
            value = resolve(node, shell, raw)
        if value is None:
            return None
        text = text[: match.start()] + value + text[match.end() :]
    return text


def unset_variables(template: object, shell: Mapping[str, str]) -> list[str]:
    """The `${env:NAME}` of `template` that the shell leaves unset and that have no default."""
    return [
        name
        for kind, name, default in INNERMOST_VARIABLE.findall(str(template))
        if kind == "env" and not shell.get(name) and not default
    ]


def function_url(region: str, project: str, function: str) -> str:
    return f"https://{region}-{project}.cloudfunctions.net/{function}"


def plain_settings(function: FunctionSpec, shell: Mapping[str, str], raw: Mapping[str, Any]) -> dict[str, str]:
    """The function's environment, secrets aside: each setting that resolves to a value."""
    values = {name: resolve(template, shell, raw) for name, template in function.environment.items()}
    given = {name: value for name, value in values.items() if value}
    # functions-framework's gunicorn runs this many threads: one per concurrent request.
    given["THREADS"] = str(function.concurrency)
    return given


def env_vars_file(function: FunctionSpec, shell: Mapping[str, str], raw: Mapping[str, Any], directory: Path) -> Path:
    """The function's plain settings, as gcloud's --env-vars-file (values may hold commas)."""
    import yaml

    given = plain_settings(function, shell, raw)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{function.name}.env.yaml"
    path.write_text(yaml.safe_dump(given, allow_unicode=True, default_flow_style=False, sort_keys=True))
    return path


@dataclass(frozen=True)
class Target:
    project: str
    region: str
    runtime: str
    service_account: str | None
    scheduler_service_account: str | None = None

    @classmethod
    def of(cls, description: Description, shell: Mapping[str, str]) -> Target:
        provider = description.raw["provider"]
        project = resolve(provider["project"], shell, description.raw)
        region = resolve(provider["region"], shell, description.raw)
        if project is None or region is None:
            unset = [
                name
                for template in (provider["project"], provider["region"])
                for name in unset_variables(template, shell)
            ]
            raise TargetNotSet(
                f"serverless.yml's provider.project is {provider['project']} and provider.region is "
                f"{provider['region']}: set {' and '.join(unset) or 'them'} in the shell that deploys",
                unset,
            )
        service_account = resolve(provider.get("serviceAccount", ""), shell, description.raw)
        scheduler = resolve(provider.get("schedulerServiceAccount", ""), shell, description.raw)
        return cls(project, region, description.runtime, service_account or None, scheduler or None)


@dataclass(frozen=True)
class Step:
    function: FunctionSpec
    command: list[str]
    secrets_left_out: list[str]


def invoker_command(function: FunctionSpec, target: Target) -> list[str]:
    """Let the scheduler's account, and no one else, call the private function (for a 2nd-gen
    function gcloud grants roles/run.invoker on its Cloud Run service)."""
    return [
        "gcloud",
        "functions",
        "add-invoker-policy-binding",
        function.name,
        f"--project={target.project}",
        f"--region={target.region}",
        f"--member=serviceAccount:{target.scheduler_service_account}",
    ]


def scheduler_command(function: FunctionSpec, target: Target, *, exists: bool) -> list[str]:
    """`gcloud scheduler jobs create http` (or `update http` when the job exists): POST to the
    function's URL with an OIDC token whose audience is that URL; no header carries a secret."""
    assert function.schedule is not None
    url = function_url(target.region, target.project, function.name)
    command = [
        "gcloud",
        "scheduler",
        "jobs",
        "update" if exists else "create",
        "http",
        function.schedule.job,
        f"--project={target.project}",
        f"--location={target.region}",
        f"--schedule={function.schedule.cron}",
        f"--time-zone={function.schedule.time_zone}",
        f"--uri={url}",
        "--http-method=POST",
        f"--oidc-service-account-email={target.scheduler_service_account}",
        f"--oidc-token-audience={url}",
        f"--attempt-deadline={function.schedule.attempt_deadline}",
    ]
    if exists:
        command.append("--clear-headers")  # a job made by an older deploy carried X-Digest-Secret
    return command


def job_exists(function: FunctionSpec, target: Target) -> bool:
    assert function.schedule is not None
    described = [
        "gcloud",
        "scheduler",
        "jobs",
        "list",
        f"--project={target.project}",
        f"--location={target.region}",
        "--format=value(name.basename())",
    ]
    return function.schedule.job in run_tool(described, project=target.project).stdout.split()


def deploy_command(
    function: FunctionSpec, target: Target, source: Path, env_file: Path, secrets: Mapping[str, str]
) -> list[str]:
    """The gcloud command that makes `function` what serverless.yml says, replacing all its
    settings and secrets (so one removed there is removed from the function too)."""
    command = [
        "gcloud",
        "functions",
        "deploy",
        function.name,
        "--gen2",
        f"--project={target.project}",
        f"--region={target.region}",
        f"--runtime={target.runtime}",
        f"--source={source}",
        f"--entry-point={function.entry_point}",
        "--trigger-http",
        "--allow-unauthenticated" if function.public else "--no-allow-unauthenticated",
        f"--memory={function.memory_mb}Mi",
        f"--cpu={function.cpu}",
        f"--timeout={function.timeout}",
        f"--concurrency={function.concurrency}",
        f"--min-instances={function.min_instances}",
        f"--max-instances={function.max_instances}",
        f"--env-vars-file={env_file}",
    ]
    if secrets:
        command.append("--set-secrets=" + ",".join(f"{name}={reference}" for name, reference in secrets.items()))
    else:
        command.append("--clear-secrets")
    if target.service_account:
        command.append(f"--service-account={target.service_account}")
    command.append("--quiet")
    return command


def secret_id(reference: str) -> str:
    """`crossmem-x:latest` or `projects/P/secrets/crossmem-x:3` -> `crossmem-x`."""
    return reference.rsplit(":", 1)[0].rsplit("/", 1)[-1]


def plan(
    description: Description, target: Target, shell: Mapping[str, str], existing_secrets: set[str] | None
) -> list[Step]:
    """Build the upload and each function's env-vars file; return each function's command.
    `existing_secrets` None (a dry run) takes every secret as present."""
    problems = description.problems()
    if problems:
        raise DescriptionError("serverless.yml does not match what the functions read:\n  " + "\n  ".join(problems))
    files = build_package(REPOSITORY, PACKAGE)
    steps = []
    for function in description.functions:
        if function.unmet(shell):
            continue
        if "EXTRA_TOOLS" in function.environment:
            tools = resolve(function.environment["EXTRA_TOOLS"], shell, description.raw)
            problems = unshipped_tools(tools or "", files)
            # Shipped: loaded as the function loads them, with its settings (which built-in tools are on).
            if tools and not problems:
                settings = plain_settings(function, shell, description.raw)
                refusal = load_refusal(settings, shell, Settings.model_fields, PACKAGE)
                problems = [f"{refusal} (docs/extending.md)"] if refusal else []
            if problems:
                raise DescriptionError(f"{function.name} would refuse every turn:\n  " + "\n  ".join(problems))
        present = {
            name: reference
            for name, reference in sorted(function.secrets.items())
            if existing_secrets is None or secret_id(reference) in existing_secrets
        }
        env_file = env_vars_file(function, shell, description.raw, ENV_FILES)
        command = deploy_command(function, target, PACKAGE, env_file, present)
        steps.append(Step(function, command, sorted(set(function.secrets) - set(present))))
    return steps


def secrets_in_project(project: str) -> set[str]:
    listed = run_tool(
        ["gcloud", "secrets", "list", f"--project={project}", "--format=value(name.basename())"], project=project
    )
    return set(listed.stdout.split())


def deploy(dry_run: bool, shell: Mapping[str, str]) -> int:
    description = read_description()
    target = Target.of(description, shell)
    if dry_run:
        steps = plan(description, target, shell, None)
        print("# --dry-run: every secret in serverless.yml is taken as present in Secret Manager")
    elif shutil.which("gcloud") is None:
        print(f"crossmem deploy: {INSTALL_GCLOUD}", file=sys.stderr)
        return 2
    else:
        try:
            steps = plan(description, target, shell, secrets_in_project(target.project))
        except ToolFailed as exc:
            print(f"crossmem deploy: {exc}", file=sys.stderr)
            return 1
    for function in description.functions:
        if unmet := function.unmet(shell):
            needs = " and ".join(function.needs)
            print(f"# {function.name}: not deployed: it needs {needs}; not set here: {', '.join(unmet)}")
    for step in steps:
        if step.secrets_left_out:
            print(f"# {step.function.name}: not in Secret Manager, so left out: {', '.join(step.secrets_left_out)}")
        try:
            run_step(step.command, dry_run, target)
            print(f"# {step.function.name}: {function_url(target.region, target.project, step.function.name)}")
            if step.function.schedule is not None:
                schedule(step.function, target, dry_run)
        except ToolFailed as exc:
            print(f"crossmem deploy: {exc}", file=sys.stderr)
            return 1
    return 0


def run_step(command: list[str], dry_run: bool, target: Target) -> None:
    print(shlex.join(command), flush=True)
    if not dry_run:
        run_tool(command, project=target.project, capture_stdout=False)


def schedule(function: FunctionSpec, target: Target, dry_run: bool) -> None:
    """The private function's invoker, then its Cloud Scheduler job, created or updated."""
    assert function.schedule is not None
    if target.scheduler_service_account is None:
        raise DescriptionError(f"serverless.yml: {function.name} has a schedule: set provider.schedulerServiceAccount")
    run_step(invoker_command(function, target), dry_run, target)
    if dry_run:
        print(f"# {function.schedule.job}: `gcloud scheduler jobs update http` with the same flags when it exists")
    exists = False if dry_run else job_exists(function, target)
    run_step(scheduler_command(function, target, exists=exists), dry_run, target)
