"""Where a fix sends the reader: a page of docs/ and one of its headings, as GitHub links them
(`docs/deploy.md#4-the-functions`, relative to the checkout's root).

Every fix that `crossmem doctor`, `crossmem deploy` and the Makefile's tool steps print names one
of these, so a rewrite of the docs changes them here, once. tests/functions/test_fix_links.py
follows each link of functions/tools/ to its file and heading. Standard library only: the
Makefile's tool steps run before the venv exists.
"""

from __future__ import annotations

# docs/deploy.md: the page's opening (how failures are explained), then its steps.
DEPLOY = "docs/deploy.md#deploy"
DATABASE = "docs/deploy.md#1-the-database-a-supabase-project"
GOOGLE_CLOUD = "docs/deploy.md#2-the-google-cloud-project"  # gcloud, the APIs, the deployer's roles
SECRETS = "docs/deploy.md#3-secrets-in-secret-manager"
FUNCTIONS = "docs/deploy.md#4-the-functions"
WEBHOOKS = "docs/deploy.md#5-telegram-twilio-the-web"
SCHEDULE = "docs/deploy.md#6-the-memory-digest-on-a-schedule"
DOCTOR = "docs/deploy.md#7-check-it-crossmem-doctor"
PARTLY_MIGRATED = "docs/deploy.md#a-partly-migrated-database"
OLDER_DEFINITIONS = "docs/deploy.md#a-database-made-from-older-definitions"
# docs/configuration.md: every setting.
CONFIGURATION = "docs/configuration.md#configuration"
