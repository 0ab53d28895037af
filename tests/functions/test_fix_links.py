"""Every page a fix names exists, with the heading it names: the links of functions/tools/
(`docs/deploy.md#4-the-functions`, most of them functions/tools/doc_links.py's) followed to
their file, and their #fragment to one of its headings as GitHub makes anchors of them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from functions.tools import doc_links

ROOT = Path(__file__).resolve().parents[2]
TOOLS = sorted((ROOT / "functions" / "tools").glob("*.py"))
DOC_LINK = re.compile(r"docs/[\w.-]+\.md(?:#[\w-]*)?")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def github_anchors(page: Path) -> set[str]:
    """The #fragments GitHub gives a page's headings: lower case, punctuation other than `-` and
    `_` dropped, each space a `-`; a repeated one gets -1, -2, ... (headings in code fences are none)."""
    made: set[str] = set()
    for heading in re.findall(r"^#{1,6} (.+?)#*$", FENCE.sub("", page.read_text()), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        made.add(slug if slug not in made else next(f"{slug}-{n}" for n in range(1, 100) if f"{slug}-{n}" not in made))
    return made


DOC_LINKS = {value for name, value in vars(doc_links).items() if name.isupper()}


def links_in_the_tools() -> list[str]:
    """Every mention of a page of docs/ in functions/tools/, fixes and comments alike."""
    return sorted({link for path in TOOLS for link in DOC_LINK.findall(path.read_text())} | DOC_LINKS)


def test_the_slugs_are_githubs() -> None:
    page = ROOT / "docs" / "deploy.md"
    assert {"deploy", "7-check-it-crossmem-doctor", "5-telegram-twilio-the-web"} <= github_anchors(page)


@pytest.mark.parametrize("link", links_in_the_tools())
def test_each_link_of_a_fix_reaches_its_page_and_heading(link: str) -> None:
    path, _, fragment = link.partition("#")
    page = ROOT / path
    assert page.is_file(), f"{link}: {path} does not exist"
    if fragment or link in DOC_LINKS:  # a fix names the heading too (the doctor's tests check each fix does)
        assert fragment in github_anchors(page), f"{link}: {path} has no heading whose anchor is #{fragment}"


def test_no_fix_points_at_a_place_that_does_not_exist() -> None:
    # "(README, Deploy, 1)" named a README section that had moved to docs/deploy.md long before.
    for path in TOOLS:
        assert "README, Deploy" not in path.read_text(), f"{path.name} still points at the README's Deploy"
