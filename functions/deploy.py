"""`crossmem deploy`: serverless.yml's functions as 2nd-gen functions (Cloud Run functions),
one `gcloud functions deploy NAME --gen2 ...` each.

serverless.yml keeps the Serverless Framework's layout, and stays the one description of the
functions, but the Framework no longer deploys it: its only Google provider makes 1st-gen
functions through Cloud Deployment Manager (README, Deploy). Beside the Framework's keys
(handler, memorySize, timeout, minInstances, maxInstances, environment) each function says
`cpu`, `concurrency`, `public` and `secrets`; `provider.secrets` go to every function, as
`provider.environment` does.

Values may use the Framework's variables: `${env:NAME}` (the deploying shell's), with a
default `${env:NAME, 'value'}`, and `${self:provider.region}`. A setting whose value is unset
is left out, so the function uses its own default (the README's configuration table).
"""

from __future__ import annotations

import argparse
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.embedded import REPOSITORY
from functions.function_settings import deployment_problems
from functions.upload import PACKAGE, build_package

SERVERLESS_YML = REPOSITORY / "serverless.yml"
ENV_FILES = REPOSITORY / "build" / "env"
INNERMOST_VARIABLE = re.compile(r"\$\{(env|self):([A-Za-z0-9_.]+)(?:,\s*'([^'${}]*)')?\}")
INSTALL_GCLOUD = (
    "gcloud is not on PATH. Install the Google Cloud CLI (https://cloud.google.com/sdk/docs/install), "
    "then `gcloud auth login` and `gcloud config set project PROJECT`, and run `make deploy` again. "
    "`crossmem deploy --dry-run` prints the commands without it."
)


class DescriptionError(ValueError):
    """serverless.yml cannot be turned into commands; the message says what to change."""


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
        raise DescriptionError("reading serverless.yml needs PyYAML: pip install 'crossmem[deploy]'") from None
    raw = yaml.safe_load(path.read_text())
    provider = raw["provider"]
    functions = []
    for name, spec in raw["functions"].items():
        if spec["handler"] != name:
            # The URL ends in the function's name; the README's URLs hold only when it is the entry point.
            raise DescriptionError(f"serverless.yml: function {name}'s handler must be {name}, not {spec['handler']}")
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


def function_url(region: str, project: str, function: str) -> str:
    return f"https://{region}-{project}.cloudfunctions.net/{function}"


def env_vars_file(function: FunctionSpec, shell: Mapping[str, str], raw: Mapping[str, Any], directory: Path) -> Path:
    """The function's plain settings, as gcloud's --env-vars-file (values may hold commas)."""
    import yaml

    values = {name: resolve(template, shell, raw) for name, template in function.environment.items()}
    given = {name: value for name, value in values.items() if value}
    # functions-framework's gunicorn runs this many threads: one per concurrent request.
    given["THREADS"] = str(function.concurrency)
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

    @classmethod
    def of(cls, description: Description, shell: Mapping[str, str]) -> Target:
        provider = description.raw["provider"]
        project = resolve(provider["project"], shell, description.raw)
        region = resolve(provider["region"], shell, description.raw)
        if project is None or region is None:
            raise DescriptionError(
                f"serverless.yml's provider.project is {provider['project']} and provider.region is "
                f"{provider['region']}: set them in the shell that deploys"
            )
        service_account = resolve(provider.get("serviceAccount", ""), shell, description.raw)
        return cls(project, region, description.runtime, service_account or None)


@dataclass(frozen=True)
class Step:
    function: FunctionSpec
    command: list[str]
    secrets_left_out: list[str]


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
    build_package(REPOSITORY, PACKAGE)
    steps = []
    for function in description.functions:
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
    listed = subprocess.run(
        ["gcloud", "secrets", "list", f"--project={project}", "--format=value(name.basename())"],
        capture_output=True,
        text=True,
        check=True,
    )
    return set(listed.stdout.split())


def deploy(args: argparse.Namespace, shell: Mapping[str, str]) -> int:
    description = read_description()
    target = Target.of(description, shell)
    if args.dry_run:
        steps = plan(description, target, shell, None)
        print("# --dry-run: every secret in serverless.yml is taken as present in Secret Manager")
    elif shutil.which("gcloud") is None:
        print(f"crossmem deploy: {INSTALL_GCLOUD}", file=sys.stderr)
        return 2
    else:
        steps = plan(description, target, shell, secrets_in_project(target.project))
    for step in steps:
        if step.secrets_left_out:
            print(f"# {step.function.name}: not in Secret Manager, so left out: {', '.join(step.secrets_left_out)}")
        print(shlex.join(step.command), flush=True)
        if not args.dry_run and subprocess.run(step.command).returncode != 0:
            print(
                f"crossmem deploy: gcloud could not deploy {step.function.name} (its error is above)", file=sys.stderr
            )
            return 1
        print(f"# {step.function.name}: {function_url(target.region, target.project, step.function.name)}")
    return 0
