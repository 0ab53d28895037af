"""The functions' source upload: the files `gcloud functions deploy` sends, chosen by
.gcloudignore. `make package` (and `crossmem deploy`, which uploads that very directory)
copies them to build/function-source/, so what was checked offline is what ships.

.gcloudignore is .gitignore's syntax (`**`, `!`, a trailing `/` for directories, a `/` that
anchors), read by pathspec's gitignore patterns; gcloud's walk is kept: the last matching rule
wins, and nothing inside an ignored directory comes back (gcloud never descends into one).
tests/functions/test_upload.py compares the result with `gcloud meta list-files-for-upload`.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import re
import shutil
import sys
from collections.abc import Collection
from pathlib import Path

from pathspec import GitIgnoreSpec

from core.stores.embedded import REPOSITORY

GCLOUDIGNORE = ".gcloudignore"
PACKAGE = REPOSITORY / "build" / "function-source"
REQUIREMENTS = "requirements.txt"


def read_rules(root: Path) -> GitIgnoreSpec:
    ignore_file = root / GCLOUDIGNORE
    if not ignore_file.is_file():
        raise FileNotFoundError(f"{ignore_file} is missing: without it gcloud would upload the whole directory")
    return GitIgnoreSpec.from_lines(ignore_file.read_text().splitlines())


def upload_files(root: Path = REPOSITORY) -> list[str]:
    """The paths, relative to `root` and sorted, that gcloud would upload from it."""
    rules = read_rules(root)
    found: list[str] = []
    pending = [root]
    while pending:
        directory = pending.pop()
        for path in sorted(directory.iterdir()):
            relative = path.relative_to(root).as_posix()
            # A directory is asked about as `name/`: so pathspec applies the rules meant for directories only.
            if rules.match_file(f"{relative}/" if path.is_dir() else relative):
                continue
            if path.is_dir():
                pending.append(path)
            else:
                found.append(relative)
    return sorted(found)


def build_package(root: Path = REPOSITORY, destination: Path = PACKAGE) -> list[str]:
    """Copy the upload to `destination` (emptied first); return its files."""
    files = upload_files(root)
    shutil.rmtree(destination, ignore_errors=True)
    for relative in files:
        target = destination / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / relative, target)
    return files


def unshipped_tools(extra_tools: str, files: Collection[str], root: Path = REPOSITORY) -> list[str]:
    """What EXTRA_TOOLS (`package.module:callable`, comma-separated) names that the deployed
    functions could not import, one line each: a module the upload `files` leave out (a file of
    the checkout outside them), one from an installed package requirements.txt does not list, or
    one not found here at all. A function with such a tool refuses every turn (503), so the deploy
    stops first."""
    requirements = {
        _distribution(line.split("==")[0])
        for line in (root / REQUIREMENTS).read_text().splitlines()
        if re.match(r"[A-Za-z0-9]", line)
    }
    problems = []
    for entry in (part.strip() for part in extra_tools.split(",") if part.strip()):
        module, _, attribute = entry.partition(":")
        if not module or not attribute:
            problems.append(f"EXTRA_TOOLS: {entry} is not package.module:callable (docs/extending.md)")
            continue
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            spec = None
        origin = Path(spec.origin) if spec is not None and spec.origin and spec.has_location else None
        if origin is None:
            problems.append(
                f"EXTRA_TOOLS: {entry}: no module {module} here, where the deploy looks for it: put it in "
                "functions/, or install its package (docs/extending.md)"
            )
        elif origin.is_relative_to(root) and not origin.is_relative_to(sys.prefix):  # .venv may be in the checkout
            if origin.relative_to(root).as_posix() not in files:
                problems.append(
                    f"EXTRA_TOOLS: {entry} is {origin.relative_to(root).as_posix()}, which the upload leaves out "
                    "(.gcloudignore): put it in functions/ (docs/extending.md)"
                )
            elif not may_define(origin, attribute):
                problems.append(
                    f"EXTRA_TOOLS: {entry}: {origin.relative_to(root).as_posix()} defines no {attribute} "
                    "(docs/extending.md)"
                )
        else:
            installed_by = importlib.metadata.packages_distributions().get(module.split(".")[0], [])
            if installed_by and not requirements & {_distribution(name) for name in installed_by}:
                problems.append(
                    f"EXTRA_TOOLS: {entry} comes from {', '.join(sorted(installed_by))}, which {REQUIREMENTS} does "
                    "not list: add it to pyproject.toml's dependencies and run `make requirements` (docs/extending.md)"
                )
    return problems


def may_define(path: Path, name: str) -> bool:
    """Whether the module at `path` may bind `name` at its top level, read as written (its code is
    not run at deploy): a def, class, assignment or import of it, in an `if` or `try` too; or one
    that binds names unseen (`from x import *`, `globals()`, a module `__getattr__`). A module that
    does not parse is left to the functions' own refusal."""
    try:
        tree = ast.parse(path.read_text(), str(path))
    except (SyntaxError, ValueError, OSError):
        return True
    bound: set[str] = set()
    pending: list[ast.AST] = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(node.name)  # its body binds nothing at the top
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            bound.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, ast.Name) and (isinstance(node.ctx, ast.Store) or node.id == "globals"):
            bound.add(node.id)
        if not isinstance(node, ast.Lambda):
            pending.extend(ast.iter_child_nodes(node))
    return bool(bound & {name, "*", "globals", "__getattr__"})


def _distribution(name: str) -> str:
    """A distribution's name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


if __name__ == "__main__":
    shipped = build_package()
    print(f"{PACKAGE.relative_to(REPOSITORY)}/: {len(shipped)} files, as `crossmem deploy` uploads them")
    print("\n".join(shipped))
