"""`crossmem deploy`: the gcloud commands serverless.yml makes, offline; and gcloud's own parser
accepting them when gcloud is installed (with an empty configuration: no account, no network)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from core.settings import Settings
from functions.cli import main
from functions.deploy import ENV_FILES, Target, deploy_command, read_description
from functions.upload import PACKAGE

SETTING_NAMES = [name.upper() for name in Settings.model_fields]
SECRETS = {
    "telegram_webhook": "ANTHROPIC_API_KEY=crossmem-anthropic-api-key:latest,"
    "DATABASE_URL=crossmem-database-url:latest,"
    "SUPABASE_SERVICE_ROLE_KEY=crossmem-supabase-service-role-key:latest,"
    "TELEGRAM_BOT_TOKEN=crossmem-telegram-bot-token:latest,"
    "TELEGRAM_WEBHOOK_SECRET=crossmem-telegram-webhook-secret:latest",
}


@pytest.fixture
def deploying_shell(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    """A shell with no crossmem setting, and no gcloud on PATH."""
    for name in [*SETTING_NAMES, "GCP_PROJECT", "GCP_REGION", "GCP_SERVICE_ACCOUNT"]:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("GCP_PROJECT", "advisor-prod")
    monkeypatch.setenv("GCP_REGION", "us-central1")
    return monkeypatch


def printed_commands(output: str) -> dict[str, list[str]]:
    commands = [shlex.split(line) for line in output.splitlines() if line.startswith("gcloud ")]
    return {command[3]: command for command in commands}


def test_dry_run_prints_one_gen2_deploy_per_function_without_gcloud(
    deploying_shell: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    deploying_shell.setenv("CORS_ORIGINS", "https://advisor.example.com,https://www.advisor.example.com")
    deploying_shell.setenv("IDENTITY_POLICY", "owner")
    assert main(["deploy", "--dry-run"]) == 0
    output = capsys.readouterr().out
    commands = printed_commands(output)
    assert sorted(commands) == ["memory_digest", "telegram_webhook", "web_chat", "whatsapp_webhook"]
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
    }
    assert (PACKAGE / "main.py").is_file() and (PACKAGE / "core" / "turn.py").is_file()


def test_the_identity_policy_default_is_the_settings_default(
    deploying_shell: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["deploy", "--dry-run"]) == 0
    given = yaml.safe_load((ENV_FILES / "telegram_webhook.env.yaml").read_text())
    assert "IDENTITY_POLICY" not in given and Settings.model_fields["identity_policy"].default == "auto"
    # Every default serverless.yml sets is the Settings default, but the pooler's prepared statements.
    assert given == {"APP_ENV": "production", "DATABASE_PREPARED_STATEMENTS": "false", "THREADS": "8"}


def test_a_custom_domain_replaces_the_whatsapp_functions_own_url(
    deploying_shell: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    deploying_shell.setenv("PUBLIC_BASE_URL", "https://hooks.advisor.example.com/whatsapp")
    assert main(["deploy", "--dry-run"]) == 0
    given = yaml.safe_load((ENV_FILES / "whatsapp_webhook.env.yaml").read_text())
    assert given["PUBLIC_BASE_URL"] == "https://hooks.advisor.example.com/whatsapp"


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
    for function, command in printed_commands(capsys.readouterr().out).items():
        done = subprocess.run([str(gcloud), *command[1:]], capture_output=True, text=True, env=environment, timeout=60)
        # Past the parser, gcloud stops at the missing account, before any request.
        assert done.returncode == 1, (function, done.stderr)
        assert "You do not currently have an active account selected" in done.stderr, (function, done.stderr)
        assert "unrecognized arguments" not in done.stderr
