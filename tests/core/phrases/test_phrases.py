"""The catalogue of fixed phrases (core/phrases/): every language has every phrase with the same
placeholders, a phrase that counts has its plural forms, numbers are written as the language
writes them, and the language of a turn is chosen by the rule of docs/decisions.md."""

from __future__ import annotations

import ast
import re
import string
from datetime import UTC, datetime
from pathlib import Path

import pytest

from core.errors import ConfigurationError, OverBudget
from core.phrases.catalogue import CATALOGUE_DIR, Catalogue, placeholders
from core.phrases.language import choose_language, language_tag, written_in
from core.phrases.refusals import over_budget
from core.surfaces import Surface, rules
from tests.helpers import ENGLISH, ROOT, SPANISH


def differences(catalogue: Catalogue) -> list[str]:
    """What each language lacks, or has that the default has not, or fills differently."""
    reference = catalogue.entries(catalogue.default_language)
    found: list[str] = []
    for language in sorted(catalogue.languages - {catalogue.default_language}):
        entries = catalogue.entries(language)
        found += [f"{language}: no {phrase}" for phrase in sorted(reference.keys() - entries.keys())]
        found += [f"{language}: {phrase} is not in en" for phrase in sorted(entries.keys() - reference.keys())]
        for phrase in sorted(reference.keys() & entries.keys()):
            ours, theirs = reference[phrase], entries[phrase]
            if placeholders(ours) != placeholders(theirs):
                found.append(
                    f"{language}: {phrase} fills {sorted(placeholders(theirs))}, en {sorted(placeholders(ours))}"
                )
            if isinstance(ours, dict) != isinstance(theirs, dict):
                found.append(f"{language}: {phrase} counts in one language only")
    return found


def test_every_language_has_every_phrase_with_the_same_placeholders() -> None:
    catalogue = Catalogue()
    assert catalogue.languages == {"en", "es"}
    assert len(catalogue.entries("en")) > 60
    assert differences(catalogue) == []


def test_a_spanish_file_without_one_phrase_fails_the_check(tmp_path: Path) -> None:
    """The check above, on a copy of the catalogue whose Spanish file lost `link.invalid` and
    whose `forget.forgotten` forgot its placeholder."""
    (tmp_path / "en.toml").write_bytes((CATALOGUE_DIR / "en.toml").read_bytes())
    spanish = (CATALOGUE_DIR / "es.toml").read_text(encoding="utf-8").splitlines(keepends=True)
    kept = [line for line in spanish if not line.startswith("invalid = ")]
    kept = [line.replace("({messages})", "(todo)") if line.startswith("forgotten = ") else line for line in kept]
    assert len(kept) == len(spanish) - 1
    (tmp_path / "es.toml").write_text("".join(kept), encoding="utf-8")
    assert differences(Catalogue(directory=tmp_path)) == [
        "es: no link.invalid",
        "es: forget.forgotten fills [], en ['messages']",
    ]


def test_a_third_language_is_one_file(tmp_path: Path) -> None:
    for name in ("en.toml", "es.toml"):
        (tmp_path / name).write_bytes((CATALOGUE_DIR / name).read_bytes())
    english = (CATALOGUE_DIR / "en.toml").read_text(encoding="utf-8")
    (tmp_path / "pt.toml").write_text(english.replace("Linked to the web account", "Ligado à conta web"), "utf-8")
    catalogue = Catalogue(directory=tmp_path)
    assert catalogue.languages == {"en", "es", "pt"}
    assert catalogue.choose("pt-BR") == "pt"
    assert catalogue.phrases("pt").say("link.linked", account="a•••@x.com").startswith("Ligado à conta web a•••@x.com!")
    assert differences(catalogue) == []


def test_phrases_that_count_and_numbers_are_said_as_each_language_says_them() -> None:
    assert ENGLISH.count("count.messages", 1) == "1 message"
    assert ENGLISH.count("count.messages", 0) == "0 messages"
    assert SPANISH.count("count.conversations", 1) == "1 conversación"
    assert SPANISH.count("count.conversations", 3) == "3 conversaciones"
    assert ENGLISH.megabytes(3_800_000) == "3.8 MB"
    assert SPANISH.megabytes(3_800_000) == "3,8 MB"
    assert SPANISH.count("budget.in_seconds", 1) == "dentro de 1 segundo"


def test_each_file_is_read_once_and_only_when_a_phrase_of_it_is_asked_for(tmp_path: Path) -> None:
    for name in ("en.toml", "es.toml"):
        (tmp_path / name).write_bytes((CATALOGUE_DIR / name).read_bytes())
    catalogue = Catalogue(directory=tmp_path)
    (tmp_path / "es.toml").write_text("this is not TOML", encoding="utf-8")  # never read
    assert catalogue.phrases("en").say("link.expired") == "That code has expired. Ask for a new one on the web."
    (tmp_path / "en.toml").unlink()  # read already: the instance keeps it
    assert catalogue.phrases(None).say("link.used") == "That code has already been used. Ask for a new one on the web."


def test_a_default_language_without_a_file_is_refused() -> None:
    with pytest.raises(ConfigurationError, match=r"^DEFAULT_LANGUAGE=fr: there is no core/phrases/fr.toml$"):
        Catalogue("fr")


@pytest.mark.parametrize(
    ("stated", "text", "chosen"),
    [
        ("es", "hello, how are you today?", "es"),  # what the app says wins over the words
        ("es-MX", "", "es"),
        ("es_419", "", "es"),
        ("EN-gb", "hola, ¿qué tal estás?", "en"),
        ("fr", "hola, ¿qué tal estás?", "es"),  # a language we have no file for: the words
        ("fr", "bonjour", "en"),  # then DEFAULT_LANGUAGE
        (None, "Quiero saber cuánto gasté en el bar", "es"),
        (None, "What did I spend at the bar yesterday?", "en"),
        (None, "ok", "en"),
        (None, "/forget", "en"),
        ("not a tag!", "gracias por todo, de verdad", "es"),
    ],
)
def test_the_language_of_a_turn(stated: str | None, text: str, chosen: str) -> None:
    assert choose_language(stated, text, {"en", "es"}, "en") == chosen


@pytest.mark.parametrize(
    ("stated", "remembered", "heard", "text", "chosen"),
    [
        ("en-US", "es", "es", "hola, ¿qué tal estás?", "en"),  # stated first: the person's choice now
        (None, "es", "en", "hello, how are you today?", "es"),  # then remembered, over what was heard
        ("fr", "es", None, "hello, how are you today?", "es"),  # a stated one without a file says nothing
        (None, None, "es", "hello, how are you today?", "es"),  # then heard, over the words
        (None, "pt", "es-419", "ok", "es"),  # a remembered one without a file says nothing
        (None, "pt", None, "hello, how are you today?", "en"),  # then the words
        (None, None, None, "ok", "en"),  # then DEFAULT_LANGUAGE
    ],
)
def test_stated_then_remembered_then_heard_then_the_words(
    stated: str | None, remembered: str | None, heard: str | None, text: str, chosen: str
) -> None:
    assert choose_language(stated, text, {"en", "es"}, "en", remembered=remembered, heard=heard) == chosen
    assert Catalogue().choose(stated, text, remembered=remembered, heard=heard) == chosen


def test_the_default_language_is_the_settings() -> None:
    assert choose_language(None, "ok", {"en", "es"}, "es") == "es"
    assert Catalogue("es").phrases("fr").language == "es"


@pytest.mark.parametrize(
    "text",
    ["hola como estas", "cuando llega mi hermana", "si, manana te escribo", "donde estan las llaves"],
)
def test_spanish_typed_without_accents_reads_as_spanish(text: str) -> None:
    """On a phone most Spanish is typed without its accents: "como" is "cómo", "estan" "están"."""
    assert written_in(text) == "es"


def test_the_budgets_pause_is_said_on_the_persons_clock_else_in_utc() -> None:
    """Monday 20:00 in New York is Tuesday 01:00 UTC: a pause until Tuesday 13:00 UTC ends tomorrow
    morning for them. It was said "after 13:00 UTC", on UTC's day, with no "tomorrow", to a
    person whose clock the turn knew (their tags, reminders and search results are on it)."""
    now, until = datetime(2026, 12, 8, 1, 0, tzinfo=UTC), datetime(2026, 12, 8, 13, 0, tzinfo=UTC)
    pause = "You've written a lot in a short time, so I'm taking a pause. You can write again "
    assert over_budget(ENGLISH, OverBudget(until, now, timezone="America/New_York")) == pause + "tomorrow after 08:00."
    assert over_budget(ENGLISH, OverBudget(until, now)) == pause + "after 13:00 UTC."
    assert over_budget(ENGLISH, OverBudget(until, now, timezone="Mars/Olympus")) == pause + "after 13:00 UTC."
    spanish = over_budget(ENGLISH, OverBudget(until, now, language="es", timezone="America/New_York"))
    assert spanish.endswith("Puedes volver a escribirme mañana después de las 08:00.")


def test_what_the_heuristic_cannot_tell() -> None:
    assert language_tag("zh-Hant-TW") == "zh" and language_tag("") is None and language_tag("e") is None
    assert written_in("sí") is None  # one word says too little
    assert written_in("the la") is None  # a tie says nothing
    assert written_in("Ciao, come stai? Che cosa fai oggi?") is None
    assert written_in("Eu quero saber mais, está bem?") == "es"  # Portuguese may read as Spanish


# Where an English phrase may still be written in code, and why.
ALLOWED_IN_CODE = {
    # The web's 429 JSON says OverBudget's message (functions/http.py's error table); the chat
    # surfaces say `budget.pause` in the person's language (core/phrases/refusals.py).
    ("core/errors.py", "budget.pause"),
}
# Phrases whose English is also, by design, the code's own words: the reasons a file could not be
# used, kept in the thread in English for the model like the prompt (core/media/turn_media.py,
# core/channels/media_fetch.py); the reasons a message is refused, also the web's 400 JSON
# (core/errors.py); and the counted nouns, too short to tell from other words.
ALSO_THE_CODES_OWN = ("media.reason.", "turn.reason.", "count.")
# Words that begin a sentence said to a person, never to a log, an error or the model.
SAID_TO_A_PERSON = re.compile(r"\b(Sorry|Could you|Please|Thanks|I can't|Hi!)\b")


def code_strings() -> dict[str, list[str]]:
    """Every string in the code of core/ and functions/ that is not a docstring, by file; the
    prompts (core/model/) and the operator's tools (functions/tools/) left out."""
    root = ROOT
    found: dict[str, list[str]] = {}
    for path in sorted([*(root / "core").rglob("*.py"), *(root / "functions").rglob("*.py")]):
        name = str(path.relative_to(root))
        if name.startswith(("core/model/", "functions/tools/")):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef)
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
        }
        found[name] = [
            node.value
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
        ]
    return found


def test_no_fixed_phrase_is_left_in_code() -> None:
    """Each English phrase's longest fixed part (between placeholders) is in no string of the
    code; and no string of the code begins a sentence to a person ("Sorry", "Could you"...)."""
    strings = code_strings()
    assert "core/identity/linking.py" in strings and "functions/telegram.py" in strings
    left = []
    for phrase, entry in Catalogue().entries("en").items():
        if phrase.startswith(ALSO_THE_CODES_OWN):
            continue
        templates = [entry] if isinstance(entry, str) else list(entry.values())
        for template in templates:
            fixed = max((text for text, *_ in string.Formatter().parse(template)), key=len)
            if len(fixed.strip()) < 12:
                continue
            left += [
                f"{name}: {phrase}"
                for name, constants in strings.items()
                if (name, phrase) not in ALLOWED_IN_CODE and any(fixed in constant for constant in constants)
            ]
    assert left == []
    addressed = [
        f"{name}: {constant!r}"
        for name, constants in strings.items()
        for constant in constants
        if SAID_TO_A_PERSON.search(constant) and name != "core/errors.py"  # its OverBudget: ALLOWED_IN_CODE
    ]
    assert addressed == []


def test_a_phrase_of_every_surface_names_no_surface() -> None:
    """Only a surface's own phrases ([telegram], [whatsapp]) may name an app: one said on every
    surface (forget's warning) would be wrong, and one more file to edit, for each new surface."""
    apps = {rules(surface).label for surface in Surface if surface.is_secondary}
    named = [
        f"{language}: {phrase} names {app}"
        for language in sorted(Catalogue().languages)
        for phrase, entry in Catalogue().entries(language).items()
        if phrase.split(".")[0] not in set(Surface)
        for app in sorted(apps)
        if app in str(entry)
    ]
    assert named == []
