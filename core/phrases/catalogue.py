"""The catalogue of fixed phrases: one TOML file per language beside this module, read with the
standard library's tomllib the first time a phrase of that language is asked for, once per
instance (docs/decisions.md, "Fixed phrases in the person's language").

A phrase is a dotted id (`link.invalid`: the table `[link]`, the key `invalid`) and a
str.format template. A phrase that counts something is a table with one form per plural
category (`one`, `other`), chosen by `Phrases.count`. A third language is a third file with
the same ids and the same placeholders (tests/core/phrases/test_phrases.py checks every file).
"""

from __future__ import annotations

import string
import tomllib
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.errors import ConfigurationError
from core.phrases.language import choose_language, language_tag

CATALOGUE_DIR = Path(__file__).parent
DEFAULT_LANGUAGE = "en"  # DEFAULT_LANGUAGE's default (functions/settings.py; a test keeps them one)

Entry = str | dict[str, str]  # a template, or a template per plural category


class Catalogue:
    """Every language's phrases, each file read when first needed. `default_language` is
    DEFAULT_LANGUAGE's: for a turn that names no language we have."""

    def __init__(self, default_language: str = DEFAULT_LANGUAGE, directory: Path = CATALOGUE_DIR) -> None:
        self._directory = directory
        self.languages: frozenset[str] = frozenset(path.stem for path in directory.glob("*.toml"))
        if default_language not in self.languages:
            raise ConfigurationError(
                f"DEFAULT_LANGUAGE={default_language}: there is no core/phrases/{default_language}.toml"
            )
        self.default_language = default_language
        self._entries: dict[str, dict[str, Entry]] = {}

    def choose(
        self, stated: str | None, text: str = "", *, remembered: str | None = None, heard: str | None = None
    ) -> str:
        """The language of a turn (core/phrases/language.py's rule): `stated` by the request,
        `remembered` as the person's, `heard` in its voice note, the words of `text`."""
        return choose_language(stated, text, self.languages, self.default_language, remembered=remembered, heard=heard)

    def has(self, stated: str | None) -> bool:
        """Whether `stated` (a BCP 47 tag) names a language there is a file for: then it is the
        answer's, and nothing else need be asked (the remembered language costs a round trip
        where no command's SQL function answers it)."""
        return language_tag(stated) in self.languages

    def phrases(self, language: str | None = None) -> Phrases:
        """The phrases of `language` (a language we have no file for, or None: the default's)."""
        return Phrases(self, language if language in self.languages else self.default_language)

    def entries(self, language: str) -> dict[str, Entry]:
        """Every phrase of a language by its dotted id."""
        if language not in self._entries:
            with (self._directory / f"{language}.toml").open("rb") as file:
                self._entries[language] = dict(_flattened(tomllib.load(file)))
        return self._entries[language]


@dataclass(frozen=True)
class Phrases:
    """One language's phrases."""

    catalogue: Catalogue
    language: str

    def say(self, phrase: str, **values: Any) -> str:
        return self._template(phrase, "other").format(**values)

    def count(self, phrase: str, count: int, **values: Any) -> str:
        """A phrase that counts (`{count} messages`), in the form `count` takes in this language."""
        return self._template(phrase, _plural_category(self.language, count)).format(count=count, **values)

    def decimal(self, value: float, places: int = 1) -> str:
        """A number as this language writes it ("3.8" in English, "3,8" in Spanish)."""
        return f"{value:.{places}f}".replace(".", self.say("number.decimal_point"))

    def megabytes(self, size_bytes: int) -> str:
        """A size as the media limits are said ("3.8 MB")."""
        return self.say("number.megabytes", amount=self.decimal(size_bytes / 1_000_000))

    def _template(self, phrase: str, category: str) -> str:
        entry = self.catalogue.entries(self.language).get(phrase)
        if entry is None:  # every file has every id (a test says so); a file being written may not yet
            entry = self.catalogue.entries(self.catalogue.default_language)[phrase]
        if isinstance(entry, str):
            return entry
        return entry.get(category) or entry["other"]


def placeholders(entry: Entry) -> frozenset[str]:
    """The names an entry's templates use, for the test that every language uses the same."""
    templates = [entry] if isinstance(entry, str) else list(entry.values())
    return frozenset(name for template in templates for _, name, _, _ in string.Formatter().parse(template) if name)


PLURAL_CATEGORIES: Collection[str] = ("zero", "one", "two", "few", "many", "other")


def _plural_category(language: str, count: int) -> str:
    """CLDR's plural category of a whole number. English and Spanish have `one` (exactly 1) and
    `other`; a language with more forms adds its rule here with its file."""
    return "one" if count == 1 else "other"


def _flattened(table: dict[str, Any], prefix: str = "") -> list[tuple[str, Entry]]:
    entries: list[tuple[str, Entry]] = []
    for key, value in table.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value and set(value) <= set(PLURAL_CATEGORIES):
            entries.append((name, {category: str(form) for category, form in value.items()}))
        elif isinstance(value, dict):
            entries.extend(_flattened(value, f"{name}."))
        else:
            entries.append((name, str(value)))
    return entries
