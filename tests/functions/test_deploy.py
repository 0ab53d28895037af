"""`crossmem deploy`: the gcloud commands serverless.yml makes, offline; and gcloud's own parser
accepting them when gcloud is installed (with an empty configuration: no account, no network)."""

from __future__ import annotations

import importlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from functions.settings import Settings
from functions.tools.cli import main
from functions.tools.deploy import DEPLOYER_ROLES, ENV_FILES, Target, deploy_command, read_description
from functions.tools.upload import PACKAGE, unshipped_tools, upload_files
from tests.fakes.gcloud import ACT_AS_DENIED, API_DISABLED, NOT_LOGGED_IN, PERMISSION_DENIED_SECRETS_LIST, FakeGcloud

ROOT = Path(__file__).resolve().parents[2]
EXTRA = re.compile(r"--extra ([a-z]+)")

SETTING_NAMES = [name.upper() for name in Settings.model_fields]
PUBLIC_BASE_URLS = ["WHATSAPP_PUBLIC_BASE_URL", "SMS_PUBLIC_BASE_URL"]  # the shell's, one a Twilio function
SECRETS = {
    "telegram_webhook": "ANTHROPIC_API_KEY=crossmem-anthropic-api-key:latest,"
    "DATABASE_URL=crossmem-database-url:latest,"
    "DEEPGRAM_API_KEY=crossmem-deepgram-api-key:latest,"
    "SUPABASE_SERVICE_ROLE_KEY=crossmem-supabase-service-role-key:latest,"
    "TELEGRAM_BOT_TOKEN=crossmem-telegram-bot-token:latest,"
    "TELEGRAM_WEBHOOK_SECRET=crossmem-telegram-webhook-secret:latest",
}


@pytest.fixture
def deploying_shell(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    """A shell with no crossmem setting, and no gcloud on PATH."""
    for name in [*SETTING_NAMES, *PUBLIC_BASE_URLS, "GCP_PROJECT", "GCP_REGION", "GCP_SERVICE_ACCOUNT"]:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("GCP_PROJECT", "advisor-prod")
    monkeypatch.setenv("GCP_REGION", "us-central1")
    # A Twilio account with a WhatsApp sender: whatsapp_webhook's `needs` (serverless.yml).
    monkeypatch.setenv("TWILIO_ACCOUNT_SID", "AC" + "0" * 32)
    monkeypatch.setenv("TWILIO_WHATSAPP_FROM", "whatsapp:+14155238886")
    return monkeypatch


def sms_number(shell: pytest.MonkeyPatch) -> None:
    """What sms_webhook is deployed with beside the account (serverless.yml's `needs`): an SMS number."""
    shell.setenv("TWILIO_SMS_FROM", "+14155550100")


def printed_commands(output: str) -> dict[str, list[str]]:
    commands = [shlex.split(line) for line in output.splitlines() if line.startswith("gcloud functions deploy ")]
    return {command[3]: command for command in commands}


def every_printed_command(output: str) -> list[list[str]]:
    return [shlex.split(line) for line in output.splitlines() if line.startswith("gcloud ")]


DIGEST_URL = "https://us-central1-advisor-prod.cloudfunctions.net/memory_digest"
SCHEDULER = "crossmem-scheduler@advisor-prod.iam.gserviceaccount.com"
INVOKER = [
    "gcloud",
    "functions",
    "add-invoker-policy-binding",
    "memory_digest",
    "--project=advisor-prod",
    "--region=us-central1",
    f"--member=serviceAccount:{SCHEDULER}",
]


def scheduler_job(verb: str) -> list[str]:
    return [
        "gcloud",
        "scheduler",
        "jobs",
        verb,
        "http",
        "crossmem-memory-digest",
        "--project=advisor-prod",
        "--location=us-central1",
        "--schedule=* * * * *",
        "--time-zone=Etc/UTC",
        f"--uri={DIGEST_URL}",
        "--http-method=POST",
        f"--oidc-service-account-email={SCHEDULER}",
        f"--oidc-token-audience={DIGEST_URL}",
        "--attempt-deadline=320s",
        *(["--clear-headers"] if verb == "update" else []),
    ]


def test_dry_run_prints_one_gen2_deploy_per_function_without_gcloud(
    deploying_shell: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    deploying_shell.setenv("CORS_ORIGINS", "https://advisor.example.com,https://www.advisor.example.com")
    deploying_shell.setenv("IDENTITY_POLICY", "owner")
    assert main(["deploy", "--dry-run"]) == 0
    output = capsys.readouterr().out
    commands = printed_commands(output)
    assert sorted(commands) == ["memory_digest", "telegram_webhook", "web_chat", "whatsapp_webhook"]
    assert (
        "# sms_webhook: not deployed: it needs TWILIO_ACCOUNT_SID and TWILIO_SMS_FROM; not set here: TWILIO_SMS_FROM\n"
    ) in output
    assert commands["telegram_webhook"] == [
        "gcloud",
        "functions",
        "deploy",
        "telegram_webhook",
        "--gen2",
        "--project=advisor-prod",
        "--region=us-central1",
        "--runtime=python311",
        f"--source={PACKAGE}",
        "--entry-point=telegram_webhook",
        "--trigger-http",
        "--allow-unauthenticated",
        "--memory=512Mi",
        "--cpu=1",
        "--timeout=60s",
        "--concurrency=8",
        "--min-instances=0",
        "--max-instances=5",
        f"--env-vars-file={ENV_FILES / 'telegram_webhook.env.yaml'}",
        "--set-secrets=" + SECRETS["telegram_webhook"],
        "--quiet",
    ]
    assert "--set-secrets=ANTHROPIC_API_KEY=crossmem-anthropic-api-key:latest,DATABASE_URL=" in " ".join(
        commands["web_chat"]
    )
    assert "--timeout=15s" in commands["whatsapp_webhook"] and "--timeout=120s" in commands["web_chat"]
    for function in commands:
        assert f"# {function}: https://us-central1-advisor-prod.cloudfunctions.net/{function}" in output
    # Settings unset in the shell are left out (the function's own default), set ones pass as they are.
    assert yaml.safe_load((ENV_FILES / "web_chat.env.yaml").read_text()) == {
        "APP_ENV": "production",
        "CORS_ORIGINS": "https://advisor.example.com,https://www.advisor.example.com",
        "DATABASE_PREPARED_STATEMENTS": "false",
        "IDENTITY_POLICY": "owner",
        "THREADS": "8",
    }
    assert yaml.safe_load((ENV_FILES / "whatsapp_webhook.env.yaml").read_text()) == {
        "APP_ENV": "production",
        "DATABASE_PREPARED_STATEMENTS": "false",
        "IDENTITY_POLICY": "owner",
        "PUBLIC_BASE_URL": "https://us-central1-advisor-prod.cloudfunctions.net/whatsapp_webhook",
        "THREADS": "8",
        "TWILIO_ACCOUNT_SID": "AC" + "0" * 32,
        "TWILIO_WHATSAPP_FROM": "whatsapp:+14155238886",
    }
    assert (PACKAGE / "main.py").is_file() and (PACKAGE / "core" / "turn" / "turns.py").is_file()


def test_the_identity_policy_default_is_the_settings_default(
    deploying_shell: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["deploy", "--dry-run"]) == 0
    given = yaml.safe_load((ENV_FILES / "telegram_webhook.env.yaml").read_text())
    assert "IDENTITY_POLICY" not in given and Settings.model_fields["identity_policy"].default == "auto"
    # Every default serverless.yml sets is the Settings default, but the pooler's prepared statements.
    assert given == {"APP_ENV": "production", "DATABASE_PREPARED_STATEMENTS": "false", "THREADS": "8"}


def test_a_custom_domain_replaces_the_whatsapp_functions_own_url_and_not_the_sms_ones(
    deploying_shell: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each Twilio function checks signatures against its own URL: one shell variable for both (a
    review's finding) made every SMS fail its check, 403, once WhatsApp had a custom domain."""
    deploying_shell.setenv("WHATSAPP_PUBLIC_BASE_URL", "https://hooks.advisor.example.com/whatsapp")
    sms_number(deploying_shell)
    assert main(["deploy", "--dry-run"]) == 0
    given = yaml.safe_load((ENV_FILES / "whatsapp_webhook.env.yaml").read_text())
    assert given["PUBLIC_BASE_URL"] == "https://hooks.advisor.example.com/whatsapp"
    given = yaml.safe_load((ENV_FILES / "sms_webhook.env.yaml").read_text())
    assert given["PUBLIC_BASE_URL"] == "https://us-central1-advisor-prod.cloudfunctions.net/sms_webhook"
    deploying_shell.setenv("SMS_PUBLIC_BASE_URL", "https://hooks.advisor.example.com/sms")
    assert main(["deploy", "--dry-run"]) == 0
    given = yaml.safe_load((ENV_FILES / "sms_webhook.env.yaml").read_text())
    assert given["PUBLIC_BASE_URL"] == "https://hooks.advisor.example.com/sms"


def test_without_a_project_it_says_what_to_set(
    deploying_shell: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    deploying_shell.delenv("GCP_PROJECT")
    assert main(["deploy", "--dry-run"]) == 1
    assert "GCP_PROJECT" in capsys.readouterr().err


def test_a_real_deploy_without_gcloud_says_how_to_install_it_and_stops(
    deploying_shell: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["deploy"]) == 2
    captured = capsys.readouterr()
    assert "gcloud is not on PATH" in captured.err and "https://cloud.google.com/sdk/docs/install" in captured.err
    assert captured.out == ""


def test_secrets_missing_from_secret_manager_are_left_out() -> None:
    description = read_description()
    telegram = description.functions[0]
    target = Target("advisor-prod", "us-central1", "python311", "crossmem-runtime@advisor-prod.iam.gserviceaccount.com")
    some = {"TELEGRAM_BOT_TOKEN": "crossmem-telegram-bot-token:latest"}
    command = deploy_command(telegram, target, Path("/src"), Path("/env.yaml"), some)
    assert command[-3:] == [
        "--set-secrets=TELEGRAM_BOT_TOKEN=crossmem-telegram-bot-token:latest",
        "--service-account=crossmem-runtime@advisor-prod.iam.gserviceaccount.com",
        "--quiet",
    ]
    assert deploy_command(telegram, target, Path("/src"), Path("/env.yaml"), {})[-3] == "--clear-secrets"


@pytest.mark.skipif(shutil.which("gcloud") is None, reason="the Google Cloud CLI is not installed")
def test_gclouds_own_parser_accepts_every_command(
    deploying_shell: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    gcloud = shutil.which("gcloud", path=os.defpath + ":/usr/lib/google-cloud-sdk/bin")
    assert main(["deploy", "--dry-run"]) == 0
    config = tmp_path / "gcloud-config"
    config.mkdir()
    # Cached "not on Google Compute Engine": without it gcloud looks up metadata.google.internal.
    (config / "gce").write_text("False")
    environment = {
        "PATH": os.defpath,
        "HOME": str(tmp_path),
        "CLOUDSDK_CONFIG": str(config),
        "CLOUDSDK_CORE_DISABLE_USAGE_REPORTING": "true",
        "CLOUDSDK_COMPONENT_MANAGER_DISABLE_UPDATE_CHECK": "true",
    }
    for command in every_printed_command(capsys.readouterr().out):
        done = subprocess.run([str(gcloud), *command[1:]], capture_output=True, text=True, env=environment, timeout=60)
        # Past the parser, gcloud stops at the missing account, before any request.
        assert done.returncode == 1, (command, done.stderr)
        assert "You do not currently have an active account selected" in done.stderr, (command, done.stderr)
        assert "unrecognized arguments" not in done.stderr


def test_the_digest_is_private_and_its_scheduler_job_carries_an_oidc_token_not_a_secret(
    deploying_shell: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["deploy", "--dry-run"]) == 0
    output = capsys.readouterr().out
    digest = printed_commands(output)["memory_digest"]
    assert "--no-allow-unauthenticated" in digest and "--allow-unauthenticated" not in digest
    assert [arg for arg in digest if "DIGEST_SECRET" in arg] == []
    commands = every_printed_command(output)
    assert commands[-2:] == [INVOKER, scheduler_job("create")]
    # The three webhooks stay public: Telegram, Twilio and browsers call them without Google credentials.
    for function in ("telegram_webhook", "whatsapp_webhook", "web_chat"):
        assert "--allow-unauthenticated" in printed_commands(output)[function]
    shipped = [output, (ROOT / "serverless.yml").read_text(), *(p.read_text() for p in ENV_FILES.glob("*.yaml"))]
    assert not [text for text in shipped if re.search("digest.secret", text, re.I)]


def test_a_scheduled_function_cannot_be_public(tmp_path: Path) -> None:
    description = yaml.safe_load((ROOT / "serverless.yml").read_text())
    description["functions"]["memory_digest"]["public"] = True
    (tmp_path / "serverless.yml").write_text(yaml.safe_dump(description))
    with pytest.raises(ValueError, match="memory_digest has a schedule, so it must be private"):
        read_description(tmp_path / "serverless.yml")


@pytest.fixture
def fake_gcloud(deploying_shell: pytest.MonkeyPatch, tmp_path: Path) -> FakeGcloud:
    """A gcloud on PATH (the only thing there) that records its calls."""
    gcloud = FakeGcloud(tmp_path / "bin")
    deploying_shell.setenv("PATH", str(gcloud.directory))
    return gcloud


def deploy_in_a_process(extra: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    """`crossmem deploy` as a person runs it: a process of its own, so a traceback would show."""
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "functions.tools.cli", "deploy", *(extra or [])],
        env=environment,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_secrets_list_refused_names_the_permission_and_the_role_in_one_line(fake_gcloud: FakeGcloud) -> None:
    fake_gcloud.fail(["secrets", "list"], PERMISSION_DENIED_SECRETS_LIST)
    done = deploy_in_a_process()
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == (
        "crossmem deploy: `gcloud secrets list` failed: the permission secretmanager.secrets.list is missing: "
        "grant whoever deploys roles/secretmanager.viewer (the deployer's roles: "
        "docs/deploy.md#2-the-google-cloud-project). It said: " + PERMISSION_DENIED_SECRETS_LIST.strip() + "\n"
    )
    assert "Traceback" not in done.stderr and "CalledProcessError" not in done.stderr
    assert fake_gcloud.calls == [["secrets", "list", "--project=advisor-prod", "--format=value(name.basename())"]]


@pytest.mark.parametrize(
    ("said", "fix"),
    [
        (
            NOT_LOGGED_IN,
            "log in: `gcloud auth login`, then `gcloud config set project PROJECT`, and run it again "
            "(docs/deploy.md#2-the-google-cloud-project)",
        ),
        (
            API_DISABLED,
            "enable the API: `gcloud services enable secretmanager.googleapis.com --project=advisor-prod` "
            "(docs/deploy.md#2-the-google-cloud-project)",
        ),
    ],
)
def test_not_logged_in_or_the_api_off_says_what_to_run(
    fake_gcloud: FakeGcloud, capsys: pytest.CaptureFixture[str], said: str, fix: str
) -> None:
    fake_gcloud.fail(["secrets", "list"], said)
    assert main(["deploy"]) == 1
    captured = capsys.readouterr()
    assert captured.err.startswith(f"crossmem deploy: `gcloud secrets list` failed: {fix}")
    assert captured.err.count("\n") == 1 and captured.out == ""


def test_a_deploy_runs_every_command_then_creates_the_job_and_updates_it_the_next_time(
    fake_gcloud: FakeGcloud, deploying_shell: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    sms_number(deploying_shell)
    fake_gcloud.answer(["secrets", "list"], "crossmem-database-url\ncrossmem-anthropic-api-key\n")
    assert main(["deploy"]) == 0
    calls = fake_gcloud.calls
    assert [call[:4] for call in calls[:6]] == [
        ["secrets", "list", "--project=advisor-prod", "--format=value(name.basename())"],
        ["functions", "deploy", "telegram_webhook", "--gen2"],
        ["functions", "deploy", "whatsapp_webhook", "--gen2"],
        ["functions", "deploy", "sms_webhook", "--gen2"],
        ["functions", "deploy", "web_chat", "--gen2"],
        ["functions", "deploy", "memory_digest", "--gen2"],
    ]
    listing = ["scheduler", "jobs", "list", "--project=advisor-prod", "--location=us-central1"]
    assert calls[6:] == [INVOKER[1:], [*listing, "--format=value(name.basename())"], scheduler_job("create")[1:]]
    assert "# memory_digest: " + DIGEST_URL in capsys.readouterr().out
    fake_gcloud.answer(["scheduler", "jobs", "list"], "crossmem-memory-digest\n")
    assert main(["deploy"]) == 0
    assert fake_gcloud.calls[-1] == scheduler_job("update")[1:]


def test_a_refused_function_deploy_names_the_missing_role_and_stops(
    fake_gcloud: FakeGcloud, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_gcloud.fail(["functions", "deploy", "telegram_webhook"], ACT_AS_DENIED)
    assert main(["deploy"]) == 1
    err = capsys.readouterr().err
    assert err.endswith(
        "crossmem deploy: `gcloud functions deploy telegram_webhook` failed: the permission iam.serviceAccounts.actAs "
        "is missing: grant whoever deploys roles/iam.serviceAccountUser (the deployer's roles: "
        "docs/deploy.md#2-the-google-cloud-project). "
        "It said: " + ACT_AS_DENIED.strip() + "\n"
    )
    assert [call[:3] for call in fake_gcloud.calls][-1] == ["functions", "deploy", "telegram_webhook"]


def test_the_readme_lists_the_role_every_deploy_command_needs(
    deploying_shell: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    documented = (ROOT / "README.md").read_text() + "".join(p.read_text() for p in (ROOT / "docs").glob("*.md"))
    assert main(["deploy", "--dry-run"]) == 0
    kinds = {tuple(command[1:3]) for command in every_printed_command(capsys.readouterr().out)}
    kinds |= {("secrets", "list"), ("scheduler", "jobs")}  # what a real deploy also runs
    assert kinds <= set(DEPLOYER_ROLES)
    for kind in sorted(kinds):
        for role in DEPLOYER_ROLES[kind]:
            assert f"`{role}`" in documented, f"{' '.join(kind)} needs {role}: list it in docs/deploy.md"


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_dev_installs_what_deploy_and_doctor_read_serverless_yml_with() -> None:
    """`make dev` alone is enough for `crossmem deploy --dry-run` and `crossmem doctor`: the extras
    its `uv sync` names hold PyYAML (crossmem is not on PyPI: `pip install 'crossmem[deploy]'` cannot)."""
    shown = subprocess.run(["make", "-n", "-B", "-C", str(ROOT), "dev"], capture_output=True, text=True, check=True)
    extras = {extra for line in shown.stdout.splitlines() if " sync " in line for extra in EXTRA.findall(line)}
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    installed = [
        *project["dependencies"],
        *(line for extra in extras for line in project["optional-dependencies"][extra]),
    ]
    assert "pyyaml" in {canonicalize_name(Requirement(line).name) for line in installed}, extras


def test_a_tool_the_upload_would_not_carry_stops_the_deploy_before_any_function(
    deploying_shell: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """EXTRA_TOOLS left in the shell from `make dev` (a module of the checkout that the upload
    leaves out, a package installed here but not in requirements.txt, a typo) would make every
    deployed function refuse every turn: the deploy names each and deploys nothing."""
    deploying_shell.setenv(
        "EXTRA_TOOLS",
        "tests.fakes.gcloud:FakeGcloud, pytest:fixture,functions.nowhere:tool,functions.logs,functions.logs:redactd",
    )
    assert main(["deploy", "--dry-run"]) == 1
    said = capsys.readouterr()
    assert said.err == (
        "crossmem deploy: telegram_webhook would refuse every turn:\n"
        "  EXTRA_TOOLS: tests.fakes.gcloud:FakeGcloud is tests/fakes/gcloud.py, which the upload leaves out "
        "(.gcloudignore): put it in functions/ (docs/extending.md)\n"
        "  EXTRA_TOOLS: pytest:fixture comes from pytest, which requirements.txt does not list: add it to "
        "pyproject.toml's dependencies and run `make requirements` (docs/extending.md)\n"
        "  EXTRA_TOOLS: functions.nowhere:tool: no module functions.nowhere here, where the deploy looks for it: "
        "put it in functions/, or install its package (docs/extending.md)\n"
        "  EXTRA_TOOLS: functions.logs is not package.module:callable (docs/extending.md)\n"
        # a typo of the callable's name in a module the upload carries: seen deployed, every turn 503
        "  EXTRA_TOOLS: functions.logs:redactd: functions/logs.py defines no redactd (docs/extending.md)\n"
    )
    assert "gcloud " not in said.out


SHIPPED_TOOLS = """\
def opening_hours(arguments):
    \"\"\"When a shop near the person is open.\"\"\"
    return "open"


opening_hours.input_schema = {"type": "object", "properties": {"shop": {"type": "string"}}, "required": ["shop"]}


def search_memory(arguments):
    \"\"\"Search elsewhere.\"\"\"
    return "nothing"


search_memory.input_schema = {"type": "object", "properties": {}}


def hours_on(arguments):
    \"\"\"Opening hours on a day.\"\"\"
    return "open"


hours_on.input_schema = {"type": "object", "properties": {"day": {"type": "int"}}}
"""


@pytest.fixture
def shipped_tools() -> Iterator[str]:
    """A module of tools in functions/, which the upload carries (one per test process: a name
    of its own), removed after the test."""
    module = f"deploy_tools_{os.getpid()}"
    path = ROOT / "functions" / f"{module}.py"
    path.write_text(SHIPPED_TOOLS)
    importlib.invalidate_caches()
    try:
        yield f"functions.{module}"
    finally:
        path.unlink()


def test_a_module_in_functions_or_of_a_required_package_is_shipped() -> None:
    """What the upload carries, or requirements.txt installs, passes the lookup; whether it is a
    tool is the functions' own loader's to say (below)."""
    assert unshipped_tools("functions.logs:redacted,twilio.rest:Client,json:dumps", upload_files()) == []


def test_a_tool_in_functions_is_deployed_with_its_setting(
    deploying_shell: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], shipped_tools: str
) -> None:
    tools = f"{shipped_tools}:opening_hours"
    deploying_shell.setenv("EXTRA_TOOLS", tools)
    assert main(["deploy", "--dry-run"]) == 0
    assert "gcloud functions deploy telegram_webhook " in capsys.readouterr().out
    assert yaml.safe_load((ENV_FILES / "telegram_webhook.env.yaml").read_text())["EXTRA_TOOLS"] == tools


@pytest.mark.parametrize(
    ("entry", "refusal"),
    [
        # a callable of a required module, but no tool: json:dumps was deployed, and every turn answered 503
        ("json:dumps", 'EXTRA_TOOLS: json:dumps needs an input_schema, a JSON schema of "type": "object"'),
        (
            "{module}:search_memory",
            "EXTRA_TOOLS: {module}:search_memory is named search_memory, as a built-in tool is: "
            "give it a name of its own",
        ),
        (
            "{module}:hours_on",
            "EXTRA_TOOLS: {module}:hours_on's input_schema.properties.day.type is refused by JSON Schema draft "
            "2020-12: \"int\" is not valid under any of the schemas listed in the 'anyOf' keyword: JSON Schema's "
            "types are array, boolean, integer, null, number, object, string",
        ),
        # on the deploying shell's PYTHONPATH, outside the checkout and of no package: not uploaded
        (
            "elsewhere_tools:lookup",
            "EXTRA_TOOLS: elsewhere_tools:lookup could not be loaded "
            "(ModuleNotFoundError: not installed, or not on PYTHONPATH)",
        ),
    ],
)
def test_a_tool_the_functions_would_refuse_as_they_load_it_stops_the_deploy_before_any_function(
    deploying_shell: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    shipped_tools: str,
    tmp_path: Path,
    entry: str,
    refusal: str,
) -> None:
    (tmp_path / "elsewhere_tools.py").write_text(
        'def lookup(arguments):\n    """Look it up."""\n    return ""\nlookup.input_schema = {"type": "object"}\n'
    )
    deploying_shell.syspath_prepend(str(tmp_path))
    deploying_shell.setenv("EXTRA_TOOLS", entry.format(module=shipped_tools))
    assert main(["deploy", "--dry-run"]) == 1
    said = capsys.readouterr()
    assert said.err == (
        "crossmem deploy: telegram_webhook would refuse every turn:\n"
        f"  {refusal.format(module=shipped_tools)} (docs/extending.md)\n"
    )
    assert "gcloud " not in said.out


def test_a_tool_named_as_a_built_in_tool_that_is_off_is_deployed(
    deploying_shell: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], shipped_tools: str
) -> None:
    """The deploy asks the functions' own rule, with their settings: without the memory search
    (MEMORY_SEARCH=false) no built-in tool is named search_memory, and the functions take one."""
    deploying_shell.setenv("MEMORY_SEARCH", "false")
    deploying_shell.setenv("EXTRA_TOOLS", f"{shipped_tools}:search_memory")
    assert main(["deploy", "--dry-run"]) == 0
    assert "gcloud functions deploy memory_digest " in capsys.readouterr().out
