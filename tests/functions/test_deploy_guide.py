"""docs/deploy.md, run: every command of its ```sh blocks, in the page's order, as a person
would type it, with bash expanding it in a shell that holds what the page exported so far.

Where the command needs the cloud, it runs against a stand-in: gcloud is the fake of
tests/fakes/gcloud.py on PATH, the Bot API, Twilio, Anthropic and Deepgram are the local fakes,
the Supabase CLI shows its `--help` (and must know every flag the page gives it), `make db-push`
to a Supabase URL is `make -n`, and `make db-push` to the embedded database pushes for real. A
command that no runner below knows fails the test: a new command in the page needs one here.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import psycopg
import pytest
import yaml

from core.stores.embedded import MIGRATIONS, SUPABASE_STANDINS, start_embedded_postgres, stop_embedded_postgres
from functions.settings import Settings
from functions.tools.deploy import read_description, secret_id
from tests.fakes.anthropic_api import FakeAnthropic
from tests.fakes.deepgram_api import FakeDeepgram
from tests.fakes.gcloud import FUNCTION_NOT_FOUND, JOB_NOT_FOUND, FakeGcloud
from tests.fakes.telegram_api import FakeTelegram
from tests.fakes.twilio_api import FakeTwilio

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "deploy.md"
SUPABASE_CLI = ROOT / "infra" / "deploy" / "node_modules" / ".bin" / "supabase"
SETTING_NAMES = sorted(name.upper() for name in Settings.model_fields)
# What the page may export beside the settings: the deploy's own and the page's two pooler URLs.
DEPLOY_NAMES = {"GCP_PROJECT", "GCP_REGION", "GCP_SERVICE_ACCOUNT", "GCP_SCHEDULER_SERVICE_ACCOUNT"}
PAGE_NAMES = {"SESSION_URL", "TRANSACTION_URL"}
# The secrets the page creates only for some deployments (it says which), so need not export.
OPTIONAL_SECRETS = {"SUPABASE_JWT_SECRET", "SUPABASE_SERVICE_ROLE_KEY", "TWILIO_WEBHOOK_SHARED_KEY"}
FUNCTIONS = ["telegram_webhook", "whatsapp_webhook", "sms_webhook", "web_chat", "memory_digest"]
SERVERLESS_SECRETS = {secret_id(ref) for spec in read_description().functions for ref in spec.secrets.values()}
# The headings other pages and `crossmem doctor`'s fix texts link to: renaming one breaks them.
STABLE_ANCHORS = {
    "1-the-database-a-supabase-project",
    "which-database-url-goes-where",
    "an-offline-push-the-embedded-database",
    "2-the-google-cloud-project",
    "the-deployers-roles",
    "3-secrets-in-secret-manager",
    "the-telegram-bot-botfather",
    "the-whatsapp-sender-twilio",
    "the-anthropic-key-and-deepgrams",
    "create-the-secrets",
    "4-the-functions",
    "whose-bot-it-is-identity_policy",
    "deploy-make-deploy",
    "5-telegram-twilio-the-web",
    "the-webhook-urls",
    "the-telegram-webhook",
    "the-whatsapp-webhook",
    "the-web-frontend",
    "6-the-memory-digest-on-a-schedule",
    "7-check-it-crossmem-doctor",
    "scaling-and-cost",
}


def blocks(page: Path) -> list[tuple[str, str]]:
    """Each fenced block of the page: its language and its text."""
    return re.findall(r"^```(\w*)\n(.*?)^```", page.read_text(), re.M | re.S)


def without_comment(line: str) -> str:
    """The line up to a `#` that starts a shell comment (outside quotes, after a blank)."""
    quote = None
    for index, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (index == 0 or line[index - 1].isspace()):
            return line[:index].rstrip()
    return line.rstrip()


def commands(page: Path) -> list[str]:
    """The commands of the page's ```sh blocks, continuation lines joined, comments dropped."""
    found = []
    for language, text in blocks(page):
        if language == "sh":
            for line in text.replace("\\\n", " ").splitlines():
                if command := " ".join(without_comment(line).split()):
                    found.append(command)
    return found


def words_of(command: str) -> list[str]:
    return shlex.split(command, comments=True)


def anchors(page: Path) -> set[str]:
    """GitHub's #fragments for the page's headings (as tests/test_project.py makes them)."""
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
    return {
        re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in re.findall(r"^#+ (.+)$", text, re.M)
    }


@dataclass
class Guide:
    """The stand-ins the page's commands meet, and the shell they run in."""

    sandbox: Path
    checkout: Path
    gcloud: FakeGcloud
    database_url: str
    embedded_data: Path
    environment: dict[str, str]
    exports: list[str] = field(default_factory=list)
    fakes: dict[str, object] = field(default_factory=dict)
    created_secrets: list[str] = field(default_factory=list)

    def bash(self, script: str) -> subprocess.CompletedProcess[str]:
        """`script` after every export and assignment the page made so far, `set -eu`: a variable
        the page never set is an error, as it would be for the reader (`-a`: an assignment such as
        `SUPABASE=…` is kept as an export is)."""
        prelude = "\n".join(["set -eua", *self.exports])
        return subprocess.run(
            ["bash", "-c", f"{prelude}\n{script}"],
            cwd=self.sandbox,
            env=self.environment,
            capture_output=True,
            text=True,
            timeout=60,
        )

    def expand(self, command: str) -> list[str]:
        """The command's words as bash gives them to the program."""
        done = self.bash(f"set -- {command}\nprintf '%s\\0' \"$@\"")
        assert done.returncode == 0, f"{command}: {done.stderr}"
        return done.stdout.split("\0")[:-1]

    def shell(self, script: str = "") -> dict[str, str]:
        """The environment after the page's exports (and `script`)."""
        done = self.bash(f"{script}\nenv -0")
        assert done.returncode == 0, f"{script}: {done.stderr}"
        return dict(item.split("=", 1) for item in done.stdout.split("\0") if "=" in item)

    def export(self, command: str) -> dict[str, str]:
        """Run an export of the page, and keep what it set as plain values: a `$(openssl rand …)`
        is drawn once, as in the reader's shell."""
        before, after = self.shell(), self.shell(command)
        for name, value in after.items():
            if before.get(name) != value:
                self.exports.append(f"export {name}={shlex.quote(value)}")
        return after

    def fake(self, name: str, make: Callable[[], object]) -> object:
        if name not in self.fakes:
            self.fakes[name] = make()
        return self.fakes[name]

    def offline(self) -> dict[str, str]:
        """The shell, with every service the tools would call pointed at a local fake (each made
        with the credentials the page exported, once it has)."""
        shell = self.shell()
        bases = {"ANTHROPIC_BASE_URL": self.fake("anthropic", FakeAnthropic)}
        bases["DEEPGRAM_API_BASE"] = self.fake("deepgram", lambda: FakeDeepgram(shell.get("DEEPGRAM_API_KEY", "key")))
        if "TELEGRAM_BOT_TOKEN" in shell:
            bases["TELEGRAM_API_BASE"] = self.fake("telegram", lambda: FakeTelegram(shell["TELEGRAM_BOT_TOKEN"]))
        if "TWILIO_ACCOUNT_SID" in shell and "TWILIO_AUTH_TOKEN" in shell:
            made = self.fake("twilio", lambda: FakeTwilio(shell["TWILIO_ACCOUNT_SID"], shell["TWILIO_AUTH_TOKEN"]))
            bases["TWILIO_API_BASE"] = made
        return {**shell, **{name: fake.url for name, fake in bases.items()}}  # type: ignore[attr-defined]

    def crossmem(self, words: list[str], environment: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
        """`crossmem ARGS` as the page runs it, from `cwd`'s code (the checkout copy for the deploy)."""
        return subprocess.run(
            [sys.executable, "-m", "functions.tools.cli", *words[1:]],
            cwd=cwd,
            env={**environment, "PYTHONPATH": str(cwd)},
            capture_output=True,
            text=True,
            timeout=180,
        )

    def close(self) -> None:
        for fake in self.fakes.values():
            fake.close()  # type: ignore[attr-defined]


# --- the runners: one kind of command each -----------------------------------------------------


def run_export(guide: Guide, command: str) -> None:
    """`export NAME=VALUE …` and `NAME=VALUE`: run as written; each name is a setting, the deploy's,
    or one of the page's own."""
    for word in words_of(command):
        if word == "export":
            continue
        name = word.split("=", 1)[0]
        assert name in {*SETTING_NAMES, *DEPLOY_NAMES, *PAGE_NAMES, "SUPABASE"}, f"{command}: {name} is no setting"
    shell = guide.export(command)
    # Every setting the page exported so far is one the functions would accept.
    Settings(_env_file=None, **{name.lower(): value for name, value in shell.items() if name in SETTING_NAMES})
    if "TELEGRAM_WEBHOOK_SECRET=" in command:  # Telegram's rule for secret_token
        assert re.fullmatch(r"[A-Za-z0-9_-]{1,256}", shell["TELEGRAM_WEBHOOK_SECRET"]), command
    if "OWNER_USER_ID=" in command:
        uuid.UUID(shell["OWNER_USER_ID"])
    if command.startswith("SUPABASE="):  # relative to the repository's root, where the page runs
        assert (guide.sandbox / shell["SUPABASE"]).resolve() == SUPABASE_CLI.resolve(), command


def run_supabase(guide: Guide, command: str) -> None:
    """`$SUPABASE SUBCOMMAND …`: the pinned CLI's help for that subcommand, which must list every
    flag the page passes; a `migration repair --status applied` names exactly the baseline."""
    words = words_of(command)[1:]
    subcommand = [word for word in words[:2] if not word.startswith("-")]
    if len(subcommand) == 2 and subcommand[1] not in {"repair", "push"}:
        subcommand = subcommand[:1]
    done = subprocess.run(
        [str(SUPABASE_CLI), *subcommand, "--help"],
        capture_output=True,
        text=True,
        env={**guide.environment, "SUPABASE_TELEMETRY_DISABLED": "1", "DO_NOT_TRACK": "1"},
        timeout=60,
    )
    assert done.returncode == 0, f"{command}: {done.stderr}"
    for flag in (word.split("=", 1)[0] for word in words if word.startswith("--")):
        listed = re.search(rf"{re.escape(flag)}(?![\w-])", done.stdout)
        assert listed, f"{command}: the Supabase CLI's `{' '.join(subcommand)}` has no {flag}"
    if "applied" in words:
        versions = words[words.index("applied") + 1 :]
        assert versions == [path.name.split("_")[0] for path in sorted(MIGRATIONS.glob("*.sql"))], command


def db_push(url: str, home: Path) -> subprocess.CompletedProcess[str]:
    environment = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "DB_URL": url,
        "SUPABASE_TELEMETRY_DISABLED": "1",
        "DO_NOT_TRACK": "1",
    }
    return subprocess.run(
        ["make", "--no-print-directory", "-C", str(ROOT), "db-push"],
        capture_output=True,
        text=True,
        env=environment,
        timeout=180,
    )


def run_make(guide: Guide, command: str) -> None:
    words = guide.expand(command)
    target = words[1]
    if target == "deploy-tools":
        # `make test` installs the pinned CLI; the page's command then has nothing to do.
        done = subprocess.run(["make", "-q", "-C", str(ROOT), "deploy-tools"], capture_output=True, timeout=60)
        assert done.returncode == 0, "the Supabase CLI is not installed: `make deploy-tools` (make test runs it)"
        return
    if target == "db-push":
        url = next(word for word in words if word.startswith("DB_URL=")).removeprefix("DB_URL=")
        if urlparse(url).hostname == "localhost" and "host" in parse_qs(urlparse(url).query):
            # The embedded database, over its socket: pushed for real, then up to date.
            migrations = sorted(MIGRATIONS.glob("*.sql"))
            first = db_push(url, guide.sandbox)
            assert first.returncode == 0, f"{command}: {first.stderr}"
            assert all(f"Applying migration {path.name}..." in first.stderr for path in migrations), first.stderr
            assert url not in first.stdout + first.stderr  # it holds the password
            again = db_push(url, guide.sandbox)
            assert "Remote database is up to date." in again.stdout + again.stderr, again.stderr
            return
        done = subprocess.run(
            ["make", "-n", "--no-print-directory", "-C", str(ROOT), "db-push", f"DB_URL={url}"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0 and "db push --workdir infra --remote" in done.stdout, f"{command}: {done.stderr}"
        return
    if target == "deploy":
        shown = subprocess.run(
            ["make", "-n", "--no-print-directory", "-C", str(ROOT), "deploy"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert shown.stdout.strip().endswith("crossmem deploy"), shown.stdout
        # What `make deploy` runs, with the fake gcloud: from a copy of the checkout, so that its
        # build/ is not the one test_deploy.py reads at the same time.
        guide.gcloud.answer(["secrets", "list"], "".join(f"{name}\n" for name in guide.created_secrets))
        environment = {**guide.shell(), "PATH": f"{guide.gcloud.directory}:{os.environ['PATH']}"}
        before = len(guide.gcloud.calls)
        done = guide.crossmem(["crossmem", "deploy"], environment, guide.checkout)
        assert done.returncode == 0, f"{command}: {done.stderr}"
        calls = guide.gcloud.calls[before:]
        assert [call[2] for call in calls if call[:2] == ["functions", "deploy"]] == FUNCTIONS
        assert any(call[:4] == ["scheduler", "jobs", "create", "http"] for call in calls)
        return
    raise AssertionError(f"{command}: no runner for make {target}")


def run_gcloud(guide: Guide, command: str) -> None:
    """`gcloud …`, or `printf %s "$X" | gcloud secrets create …`: the fake records exactly the
    arguments bash gives it."""
    given = ""
    piped = re.fullmatch(r'printf %s "\$(\w+)"\s*\|\s*(gcloud .*)', command)
    if piped:
        shell, name = guide.shell(), piped.group(1)
        assert name in shell or name in OPTIONAL_SECRETS, f"{command}: the page never sets ${name}"
        given, command = shell.get(name, ""), piped.group(2)
    words = guide.expand(command)
    done = subprocess.run(
        [str(guide.gcloud.directory / "gcloud"), *words[1:]], input=given, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert guide.gcloud.calls[-1] == words[1:]
    if words[1:3] == ["secrets", "create"]:
        assert words[3] in SERVERLESS_SECRETS, f"{command}: serverless.yml names no secret {words[3]}"
        assert words[4:] == ["--data-file=-"], command
        guide.created_secrets.append(words[3])
    if words[1:3] == ["services", "enable"]:
        needed = {"cloudfunctions", "run", "cloudbuild", "artifactregistry", "secretmanager", "cloudscheduler"}
        assert needed <= {word.removesuffix(".googleapis.com") for word in words[3:]}, command


def run_curl(guide: Guide, command: str) -> None:
    """`curl …api.telegram.org/bot$TOKEN/METHOD`: the same request to the fake Bot API (which takes
    its methods as POST)."""
    words = guide.expand(command)
    offline = guide.offline()
    telegram = guide.fakes["telegram"]
    url = next(word for word in words if word.startswith("https://api.telegram.org/"))
    assert url.startswith(f"https://api.telegram.org/bot{offline['TELEGRAM_BOT_TOKEN']}/"), command
    local = url.replace("https://api.telegram.org", telegram.url)  # type: ignore[attr-defined]
    done = subprocess.run(
        [*[local if word == url else word for word in words], "-X", "POST"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and json.loads(done.stdout)["ok"] is True, done.stdout + done.stderr
    assert telegram.calls[-1][0] == url.rsplit("/", 1)[1]  # type: ignore[attr-defined]


def run_crossmem(guide: Guide, command: str) -> None:
    words = guide.expand(command)
    assert Path(words[0]).name == "crossmem", command
    if words[1:] == ["deploy", "--dry-run"]:
        shell = guide.shell()
        path = [part for part in os.environ["PATH"].split(":") if not Path(part, "gcloud").exists()]
        done = guide.crossmem(words, {**shell, "PATH": ":".join(path)}, guide.checkout)
        assert done.returncode == 0, f"{command}: {done.stderr}"
        deployed = [line.split()[3] for line in done.stdout.splitlines() if line.startswith("gcloud functions deploy ")]
        assert deployed == FUNCTIONS, done.stdout
        # What the page exported reaches the functions: the owner policy and the bot's username.
        given = yaml.safe_load((guide.checkout / "build" / "env" / "telegram_webhook.env.yaml").read_text())
        for name in ("IDENTITY_POLICY", "OWNER_USER_ID", "OWNER_TELEGRAM_IDS", "TELEGRAM_BOT_USERNAME"):
            assert given.get(name) == shell[name], (name, given)
        return
    if words[1] == "telegram":
        environment = guide.offline()
        telegram = guide.fakes["telegram"]
        done = guide.crossmem(words, environment, guide.sandbox)
        assert done.returncode == 0, f"{command}: {done.stderr}"
        method, payload = telegram.calls[-1]  # type: ignore[attr-defined]
        if words[2] == "set-webhook":
            url = words[words.index("--url") + 1]
            # The webhook, then a command menu in each language.
            method, payload = telegram.calls[-5]  # type: ignore[attr-defined]
            assert [name for name, _ in telegram.calls[-4:]] == ["setMyCommands", "deleteMyCommands"] * 2  # type: ignore[attr-defined]
            assert method == "setWebhook" and payload["url"] == url
            assert payload["secret_token"] == environment["TELEGRAM_WEBHOOK_SECRET"]
            assert url.endswith("/telegram_webhook")
        else:
            assert words[2:] == ["info"] and method == "getWebhookInfo"
            json.loads(done.stdout)
        return
    if words[1] == "doctor":
        # The deploying shell, its database the tests' (migrated), every service a local fake,
        # and nothing deployed: the doctor runs every check and says what is missing.
        for name in FUNCTIONS:
            guide.gcloud.fail(["functions", "describe", name], FUNCTION_NOT_FOUND.format(name=name))
        guide.gcloud.fail(["scheduler", "jobs", "describe"], JOB_NOT_FOUND)
        environment = {
            **guide.offline(),
            "DATABASE_URL": guide.database_url,
            "PATH": f"{guide.gcloud.directory}:{os.environ['PATH']}",
        }
        done = guide.crossmem(words, environment, guide.sandbox)
        assert done.returncode in (0, 1) and "Traceback" not in done.stderr, f"{command}: {done.stderr}"
        if "--json" in words:
            checks = json.loads(done.stdout)["checks"]
            assert {check["status"] for check in checks} <= {"ok", "skip", "fail"}
            assert {check["check"]: check["status"] for check in checks}["database"] == "ok", checks
        else:
            assert re.search(r"^ok +database", done.stdout, re.M), done.stdout
        return
    raise AssertionError(f"{command}: no runner for crossmem {words[1]}")


Runner = Callable[[Guide, str], None]


def runner_for(command: str) -> Runner | None:
    """Which runner runs a command of the page, by its first words; None: none does."""
    words = words_of(command)
    if words[0] == "export" or (len(words) == 1 and re.fullmatch(r"[A-Z_]+=\S+", words[0])):
        return run_export
    if words[0] == "$SUPABASE":
        return run_supabase
    if words[0] == "make" and words[1] in {"deploy-tools", "db-push", "deploy"}:
        return run_make
    if words[0] == "gcloud" or (words[0] == "printf" and "gcloud" in words):
        return run_gcloud
    if words[0] == "curl" and any(word.startswith("https://api.telegram.org/") for word in words):
        return run_curl
    if words[0].endswith("/crossmem") and words[1] in {"deploy", "telegram", "doctor"}:
        return run_crossmem
    return None


# --- the tests ---------------------------------------------------------------------------------


def test_every_block_is_commands_or_output() -> None:
    """```sh holds what to run (and this file runs it), ```text what it prints."""
    assert {language for language, _ in blocks(GUIDE)} <= {"sh", "text"}


def test_every_command_of_the_guide_has_a_runner() -> None:
    unknown = [command for command in commands(GUIDE) if runner_for(command) is None]
    assert not unknown, f"docs/deploy.md has commands no runner of this file runs: {unknown}"


def test_the_guide_creates_every_secret_serverless_yml_references() -> None:
    created = {words_of(c)[words_of(c).index("create") + 1] for c in commands(GUIDE) if "secrets create" in c}
    assert created == SERVERLESS_SECRETS


def test_the_headings_other_pages_link_to_are_there() -> None:
    assert anchors(GUIDE) >= STABLE_ANCHORS


@pytest.fixture
def embedded_database() -> Iterator[Path]:
    """An embedded Postgres made like a Supabase project (stand-ins, no migrations yet): the
    database of the page's offline `make db-push`. Yields its data directory."""
    with tempfile.TemporaryDirectory(prefix="crossmem-pg-") as directory:
        data = Path(directory) / "data"
        try:
            url = start_embedded_postgres(data, delete_on_exit=True)
            with psycopg.connect(url, autocommit=True) as connection:
                connection.execute(SUPABASE_STANDINS.read_text())
            yield data
        finally:
            stop_embedded_postgres(data)


@pytest.fixture
def guide(tmp_path: Path, database_url: str, embedded_database: Path) -> Iterator[Guide]:
    sandbox = tmp_path / "shell"
    (sandbox / ".local").mkdir(parents=True)
    (sandbox / ".local" / "pgdata").symlink_to(embedded_database)  # what `make dev` leaves there
    (sandbox / "infra").symlink_to(ROOT / "infra")  # $SUPABASE, relative to the root
    checkout = tmp_path / "checkout"
    for part in ("core", "functions"):
        shutil.copytree(ROOT / part, checkout / part, ignore=shutil.ignore_patterns("__pycache__"))
    for part in ("main.py", "requirements.txt", "serverless.yml", ".gcloudignore"):
        shutil.copy2(ROOT / part, checkout / part)
    environment = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "LANG": "C.UTF-8",
        "DB_URL": database_url,  # the reference section's "a database with data worth keeping"
    }
    made = Guide(sandbox, checkout, FakeGcloud(tmp_path / "gcloud"), database_url, embedded_database, environment)
    yield made
    made.close()


def test_every_command_of_the_guide_runs(guide: Guide) -> None:
    ran = []
    for command in commands(GUIDE):
        runner = runner_for(command)
        assert runner is not None, command
        runner(guide, command)
        ran.append(runner.__name__)
    # The page goes the whole way: a push, the secrets, a deploy, both webhooks' tools, the doctor.
    assert {"run_make", "run_gcloud", "run_crossmem", "run_curl", "run_supabase", "run_export"} <= set(ran)
    assert sorted(guide.created_secrets) == sorted(SERVERLESS_SECRETS)


def test_the_connections_counted_are_every_function_of_serverless_yml() -> None:
    """Scaling and cost counts each function's most instances times the pool (DATABASE_POOL_SIZE's
    default): sms_webhook was once left out, and the sum said 176, within Supabase's 200, where the
    functions could open 216."""
    pool = Settings.defaults().database_pool_size
    section = " ".join(GUIDE.read_text().partition("## Scaling and cost")[2].partition("### ")[0].split())
    counted = {name: int(most) for name, most in re.findall(rf"(\w+_\w+) (\d+) × {pool} = \d+", section)}
    deployed = {function.name: function.max_instances for function in read_description().functions}
    assert counted == deployed
    total = sum(deployed.values()) * pool
    assert f"**{total}**" in section
