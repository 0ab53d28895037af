"""The functions' source upload: the files `gcloud functions deploy` sends, chosen by
.gcloudignore. `make package` (and `crossmem deploy`, which uploads that very directory)
copies them to build/function-source/, so what was checked offline is what ships.

.gitignore's rules as gcloud applies them, for the forms .gcloudignore uses: one pattern a
line, `#` comments, `!` to take a path back, a trailing `/` for directories only, a `/`
inside or in front to anchor at the top, `*` and `?` within one path segment (no `**`); the
last matching rule wins, and nothing inside an ignored directory comes back.
tests/functions/test_upload.py compares the result with `gcloud meta list-files-for-upload`.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path

from core.stores.embedded import REPOSITORY

GCLOUDIGNORE = ".gcloudignore"
PACKAGE = REPOSITORY / "build" / "function-source"


@dataclass(frozen=True)
class IgnoreRule:
    pattern: str
    negated: bool
    directories_only: bool
    anchored: bool

    @classmethod
    def parse(cls, line: str) -> IgnoreRule | None:
        line = line.strip()
        if not line or line.startswith("#"):
            return None
        negated = line.startswith("!")
        pattern = line.removeprefix("!")
        directories_only = pattern.endswith("/")
        pattern = pattern.rstrip("/")
        return cls(pattern.lstrip("/"), negated, directories_only, "/" in pattern)

    def matches(self, relative: str, is_directory: bool) -> bool:
        if self.directories_only and not is_directory:
            return False
        if not self.anchored:
            return fnmatchcase(relative.rsplit("/", 1)[-1], self.pattern)
        # Segment by segment: a wildcard never crosses a `/`.
        parts, pattern = relative.split("/"), self.pattern.split("/")
        return len(parts) == len(pattern) and all(map(fnmatchcase, parts, pattern))


def read_rules(root: Path) -> list[IgnoreRule]:
    ignore_file = root / GCLOUDIGNORE
    if not ignore_file.is_file():
        raise FileNotFoundError(f"{ignore_file} is missing: without it gcloud would upload the whole directory")
    return [rule for line in ignore_file.read_text().splitlines() if (rule := IgnoreRule.parse(line))]


def is_ignored(rules: list[IgnoreRule], relative: str, is_directory: bool) -> bool:
    ignored = False
    for rule in rules:
        if rule.matches(relative, is_directory):
            ignored = not rule.negated
    return ignored


def upload_files(root: Path = REPOSITORY) -> list[str]:
    """The paths, relative to `root` and sorted, that gcloud would upload from it."""
    rules = read_rules(root)
    found: list[str] = []
    pending = [root]
    while pending:
        directory = pending.pop()
        for path in sorted(directory.iterdir()):
            relative = path.relative_to(root).as_posix()
            if is_ignored(rules, relative, path.is_dir()):
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


if __name__ == "__main__":
    shipped = build_package()
    print(f"{PACKAGE.relative_to(REPOSITORY)}/: {len(shipped)} files, as `crossmem deploy` uploads them")
    print("\n".join(shipped))
