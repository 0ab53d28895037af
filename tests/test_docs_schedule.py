"""What the pages say of the scheduled job's cadence is serverless.yml's cron: docs/design.md once
said "every 15 minutes" where the job runs every minute (issue 30, finding 8)."""

from __future__ import annotations

import re
from pathlib import Path

from functions.tools.deploy import read_description

ROOT = Path(__file__).resolve().parents[1]
# docs/benchmarks.md describes the caching bench's own simulated clock (bench/caching.py's
# DIGEST_EVERY), not the deployment's schedule.
PAGES = sorted({*ROOT.glob("docs/*.md"), ROOT / "README.md", ROOT / "SECURITY.md"} - {ROOT / "docs/benchmarks.md"})
ABOUT_THE_JOB = re.compile(r"digest|scheduler|scheduled job|the job|memory_digest", re.IGNORECASE)
CADENCE = re.compile(r"every (\d+)[ -]minutes?|every minute", re.IGNORECASE)


def minutes_of(cron: str) -> int:
    minute, *rest = cron.split()
    assert rest == ["*", "*", "*", "*"], f"{cron!r}: only a minute cadence is read here"
    return 1 if minute == "*" else int(minute.removeprefix("*/"))


def test_every_page_gives_the_scheduled_job_the_cadence_of_serverless_yml() -> None:
    (cron,) = [spec.schedule.cron for spec in read_description().functions if spec.schedule]
    every = minutes_of(cron)
    wrong = []
    for page in PAGES:
        text = " ".join(page.read_text().split())  # a sentence may span lines
        for sentence in re.split(r"(?<=[.;:])\s", text):
            if not ABOUT_THE_JOB.search(sentence):
                continue
            for found in CADENCE.finditer(sentence):
                said = int(found[1]) if found[1] else 1
                if said != every:
                    wrong.append(f"{page.relative_to(ROOT)}: {found[0]!r} in {sentence[:160]!r}")
    assert wrong == [], f"serverless.yml runs the job every {every} minute(s)"
