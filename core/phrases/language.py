"""Which language a turn's fixed phrases are in, from what the turn carries.

The rule (docs/decisions.md, "The person's language"), first that names a language we have:

1. what the request states: Telegram's `from.language_code`, the web client's `language`
   (navigator.language);
2. the person's language as remembered (person_languages: what a request of theirs last stated,
   on any app, or what the transcription service last heard when nothing was stated);
3. the language the transcription service heard in this turn's voice note;
4. the language the message itself is written in (`written_in`: Spanish or English only);
5. `DEFAULT_LANGUAGE`.

A tag is read as its primary language ("es-MX" and "es_419" are "es"): a catalogue is one
file per language, not per region.
"""

from __future__ import annotations

import re
from collections.abc import Collection

_TAG = re.compile(r"^([A-Za-z]{2,3})(?:[-_][0-9A-Za-z]{1,8})*$")

# Spanish as most of it is typed on a phone, without its accents ("como estas"): the words are
# compared with theirs taken off, so "cómo" and "como" count alike.
_PLAIN = str.maketrans("áéíóúüñ", "aeiouun")
# Words that are common in one language and rare in the other, and letters only Spanish uses.
_SPANISH = frozenset(
    "que de el la los las del por para con una es está están hola gracias qué cómo cuándo dónde "
    "porque pero muy también mi mis tu tus yo estoy tengo quiero puedes hoy mañana ayer bien buenos "
    "buenas días sí nada algo esto eso este esta".translate(_PLAIN).split()
)
_ENGLISH = frozenset(
    "the and is are you i what how when where why but very also my your me am have want can "
    "today tomorrow yesterday hello hi thanks thank please good morning yes this that it of to with".split()
)
_SPANISH_LETTERS = frozenset("ñ¿¡áéíóúü")
_WORDS = re.compile(r"[^\W\d_]+")


def language_tag(tag: str | None) -> str | None:
    """The primary language of a BCP 47 tag ("es-MX" -> "es"), None for anything else."""
    if not tag:
        return None
    match = _TAG.match(tag.strip())
    return match[1].lower() if match else None


def written_in(text: str) -> str | None:
    """ "es" or "en" when the text says so clearly enough, else None: a cheap count of words
    common in one language and of letters only Spanish has. It knows no other language (Italian
    or Portuguese may read as Spanish) and a message of a word or two ("ok", "/forget") says
    nothing."""
    lowered = text.lower()
    words = _WORDS.findall(lowered.translate(_PLAIN))
    # map over a set's own __contains__, not a generator: every turn that states no language asks
    spanish = sum(map(_SPANISH.__contains__, words)) + (not _SPANISH_LETTERS.isdisjoint(lowered))
    english = sum(map(_ENGLISH.__contains__, words))
    if len(words) < 2 or max(spanish, english) < 2 or spanish == english:
        return None
    return "es" if spanish > english else "en"


def choose_language(
    stated: str | None,
    text: str,
    known: Collection[str],
    default: str,
    *,
    remembered: str | None = None,
    heard: str | None = None,
) -> str:
    """The language to answer in: the stated one, else the remembered one, else the one heard,
    else the text's, else `default` (each only when a catalogue for it exists)."""
    for tag in (stated, remembered, heard):
        candidate = language_tag(tag)
        if candidate is not None and candidate in known:
            return candidate
    candidate = written_in(text)  # read only when nothing said it: a person's remembered one mostly does
    return candidate if candidate is not None and candidate in known else default
