"""What ships: the upload `make package` builds by .gcloudignore (the same files gcloud picks),
and that code, installed from requirements.txt in a fresh virtual environment, serving a
signed Telegram update under a real functions-framework process against the real Postgres."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from core.stores.embedded import MIGRATIONS
from functions.tools.upload import GCLOUDIGNORE, upload_files
from functions.tools.upload import build_package as build
from tests.database import fresh_database
from tests.fakes.anthropic_api import FakeAnthropic
from tests.fakes.telegram_api import FakeTelegram
from tests.helpers import TELEGRAM_SECRET, free_port, production_settings, stored_turn, update

ROOT = Path(__file__).resolve().parents[2]
NEVER_SHIPPED = ("tests/", "bench/", ".venv/", "node_modules/", ".local/", "infra/", "functions/tools/demo/", "build/")

# Every kind of path a checkout holds, beside the ones that ship.
TREE = [
    "main.py",
    "requirements.txt",
    "core/turn.py",
    "core/__pycache__/turn.cpython-311.pyc",
    "functions/telegram.py",
    "functions/tools/local_dev.py",
    "functions/tools/deploy.py",
    "functions/tools/demo/index.html",
    "functions/sub/__pycache__/x.pyc",
    "tests/test_x.py",
    "bench/run.py",
    ".venv/bin/python",
    "infra/deploy/node_modules/supabase/index.js",
    ".local/pgdata/PG_VERSION",
    ".env",
    "serverless.yml",
    "README.md",
    "build/function-source/main.py",
]

# .gitignore's syntax beyond what our own .gcloudignore uses: `**` at the front and in the middle,
# a file taken back by `!` below a `**` rule, a directory-only rule at any depth.
STARRED_IGNORE = "**/fixtures/\ncore/**/*.md\n!core/**/README.md\n*.log\n!keep.log\n"
STARRED_TREE = [
    "main.py",
    "core/turn.py",
    "core/notes.md",
    "core/fixtures/big.bin",
    "core/deep/fixtures/case.py",
    "core/deep/er/notes.md",
    "core/deep/er/README.md",
    "debug.log",
    "logs/keep.log",
    "logs/other.log",
]


def planted(root: Path, tree: list[str]) -> Path:
    for relative in tree:
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text("x")
    return root


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    planted(tmp_path, TREE)
    shutil.copy(ROOT / GCLOUDIGNORE, tmp_path / GCLOUDIGNORE)
    return tmp_path


@pytest.fixture
def starred(tmp_path: Path) -> Path:
    root = planted(tmp_path / "starred", STARRED_TREE)
    (root / GCLOUDIGNORE).write_text(STARRED_IGNORE)
    return root


def test_the_upload_holds_the_functions_and_nothing_of_a_developers_machine(checkout: Path) -> None:
    assert upload_files(checkout) == ["core/turn.py", "functions/telegram.py", "main.py", "requirements.txt"]


def test_a_double_star_and_a_negation_take_files_out_and_back_at_any_depth(starred: Path) -> None:
    assert upload_files(starred) == [GCLOUDIGNORE, "core/deep/er/README.md", "core/turn.py", "logs/keep.log", "main.py"]


def test_make_package_copies_this_repositorys_upload(tmp_path: Path) -> None:
    shipped = build(ROOT, tmp_path / "package")
    assert {"main.py", "requirements.txt", "core/turn/turns.py", "functions/telegram.py"} <= set(shipped)
    assert {path.split("/")[0] for path in shipped} == {"main.py", "requirements.txt", "core", "functions"}
    for path in shipped:
        assert not path.startswith(NEVER_SHIPPED) and path != ".env" and "__pycache__" not in path, path
    assert not [path for path in shipped if path.startswith("functions/tools/")]
    # The code, and the catalogues of fixed phrases (core/phrases/*.toml).
    in_core = sorted(
        path.relative_to(ROOT).as_posix() for kind in ("*.py", "*.toml") for path in (ROOT / "core").rglob(kind)
    )
    assert [path for path in shipped if path.startswith("core/")] == in_core
    assert sorted(str(p.relative_to(tmp_path / "package")) for p in (tmp_path / "package").rglob("*.*")) == shipped


@pytest.mark.skipif(shutil.which("gcloud") is None, reason="the Google Cloud CLI is not installed")
@pytest.mark.parametrize("where", ["checkout", "repository", "starred"])
def test_our_reading_of_gcloudignore_is_gclouds(where: str, checkout: Path, starred: Path, tmp_path: Path) -> None:
    root = {"checkout": checkout, "repository": ROOT, "starred": starred}[where]
    config = tmp_path / "gcloud-config"
    config.mkdir()
    (config / "gce").write_text("False")  # no lookup of the metadata server
    listed = subprocess.run(
        ["gcloud", "meta", "list-files-for-upload", str(root)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env={"PATH": os.environ["PATH"], "HOME": str(tmp_path), "CLOUDSDK_CONFIG": str(config)},
    )
    assert sorted(listed.stdout.split()) == upload_files(root)


@pytest.fixture(scope="module")
def packaged(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The upload, and a fresh virtual environment with its requirements.txt, every line pinned
    and hashed as Cloud Functions' pip reads it, installed by the uv `make` put beside this
    Python (its cache already holds the lock's wheels: seconds, where pip took half a minute), with
    pip seeded for the test that installs the package itself."""
    source = tmp_path_factory.mktemp("upload") / "source"
    build(ROOT, source)
    venv = tmp_path_factory.mktemp("venv") / "venv"
    uv = str(Path(sys.executable).parent / "uv")
    subprocess.run([uv, "venv", "--quiet", "--seed", "--python", sys.executable, str(venv)], check=True, timeout=120)
    installing = subprocess.run(
        [
            uv,
            "pip",
            "install",
            "--quiet",
            "--require-hashes",
            "--python",
            str(venv / "bin" / "python"),
            "-r",
            str(source / "requirements.txt"),
        ],
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert installing.returncode == 0, installing.stderr
    return source, venv


@pytest.fixture
def function_process(
    packaged: tuple[Path, Path], database_url: str, fake_anthropic: FakeAnthropic, fake_telegram: FakeTelegram
) -> Iterator[str]:
    source, venv = packaged
    port = free_port()
    environment = {
        "PATH": f"{venv / 'bin'}:/usr/bin:/bin",
        "HOME": str(source.parent),
        **production_settings(database_url, fake_anthropic, fake_telegram),
    }
    command = [str(venv / "bin" / "functions-framework"), "--target=telegram_webhook", "--source=main.py"]
    process = subprocess.Popen(
        [*command, "--host=127.0.0.1", f"--port={port}"],
        cwd=source,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        while True:  # until it listens, or has died; pytest's timeout bounds the wait
            if process.poll() is not None:
                pytest.fail(f"functions-framework exited: {process.stdout.read() if process.stdout else ''}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                continue
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.mark.timeout(600)
def test_the_packaged_code_serves_a_signed_telegram_update_under_functions_framework(
    function_process: str, database_url: str, fake_telegram: FakeTelegram
) -> None:
    delivery = update("hello from the package", user_id=5150)
    headers = {"X-Telegram-Bot-Api-Secret-Token": TELEGRAM_SECRET}
    response = httpx.post(function_process + "/", json=delivery, headers=headers, timeout=30)
    assert response.status_code == 200
    assert response.json() == {"ok": True, "outcome": "answered"}
    ((sent),) = fake_telegram.sent()
    assert sent["chat_id"] == 5150
    assert sent["text"].startswith("Claude heard: [telegram · ") and sent["text"].endswith("] hello from the package")
    assert [role for role, _ in stored_turn(database_url, str(delivery["update_id"]))] == ["user", "assistant"]
    unsigned = httpx.post(function_process + "/", json=update("no secret"), timeout=30)
    assert unsigned.status_code == 401


@pytest.mark.timeout(600)
def test_an_installed_crossmem_migrates_from_its_package_data_and_fails_loudly_without(
    packaged: tuple[Path, Path], postgres_server: str, tmp_path: Path
) -> None:
    _, venv = packaged
    installed = tmp_path / "site"
    # setuptools builds in the tree's build/, and keeps there what an earlier run of this test put:
    # a migration renamed since (access.sql's baseline link, 13 then 14) was installed twice.
    shutil.rmtree(ROOT / "build", ignore_errors=True)
    pip = [str(venv / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check", "--no-deps"]
    installing = subprocess.run([*pip, f"--target={installed}", str(ROOT)], capture_output=True, text=True, timeout=300)
    assert installing.returncode == 0, installing.stderr
    assert sorted(p.name for p in (installed / "crossmem_sql" / "migrations").iterdir()) == sorted(
        p.name for p in MIGRATIONS.glob("*.sql")
    )
    work = tmp_path / "elsewhere"
    work.mkdir()
    crossmem = [str(venv / "bin" / "python"), "-m", "functions.tools.cli", "migrate"]
    with fresh_database(postgres_server) as url:
        environment = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(installed), "DATABASE_URL": url}
        done = subprocess.run(
            [*crossmem, "--supabase-standins"], cwd=work, env=environment, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        versions = [path.name.split("_")[0] for path in sorted(MIGRATIONS.glob("*.sql"))]
        assert done.stdout.strip() == f"applied {len(versions)} migration(s): {', '.join(versions)}"
        for migration in (installed / "crossmem_sql" / "migrations").glob("*.sql"):
            migration.unlink()
        broken = subprocess.run(crossmem, cwd=work, env=environment, capture_output=True, text=True, timeout=120)
    assert broken.returncode == 1
    assert broken.stderr.startswith("crossmem migrate: no migrations found in ")
