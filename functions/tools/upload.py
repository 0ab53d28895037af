"""The functions' source upload: the files `gcloud functions deploy` sends, chosen by
.gcloudignore. `make package` (and `crossmem deploy`, which uploads that very directory)
copies them to build/function-source/, so what was checked offline is what ships.

.gcloudignore is .gitignore's syntax (`**`, `!`, a trailing `/` for directories, a `/` that
anchors), read by pathspec's gitignore patterns; gcloud's walk is kept: the last matching rule
wins, and nothing inside an ignored directory comes back (gcloud never descends into one).
tests/functions/test_upload.py compares the result with `gcloud meta list-files-for-upload`.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from pathspec import GitIgnoreSpec

from core.stores.embedded import REPOSITORY

GCLOUDIGNORE = ".gcloudignore"
PACKAGE = REPOSITORY / "build" / "function-source"


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


if __name__ == "__main__":
    shipped = build_package()
    print(f"{PACKAGE.relative_to(REPOSITORY)}/: {len(shipped)} files, as `crossmem deploy` uploads them")
    print("\n".join(shipped))
