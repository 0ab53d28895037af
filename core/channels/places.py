"""A shared place or contact, as the text the person's thread keeps of it.

Telegram (`location`, `venue`, `contact`) and WhatsApp through Twilio (`Latitude`, `Longitude`,
`Address`, `Label`) send a place or a person as fields, not words; the thread keeps them as a
line the model reads like any message and the search finds later:

- a place: `[location: Plaza Mayor, Madrid · 40.4155, -3.7074]`, its name and address when the
  platform gives them, its coordinates to 4 decimals (about 11 m: enough to say where, no more);
- a contact card: `[contact: Ana López]`, the name only. Its phone number, its vCard and its
  Telegram user id are never stored nor shown to the model: they are a third person's, who never
  wrote to us (docs/decisions.md, Places and contacts; SECURITY.md, Privacy);
- a forwarded message's origin, before its words: `[forwarded from Ana López]` (a person's name,
  a chat's or channel's title: never an id), or `[forwarded]` when the platform names no one.
"""

from __future__ import annotations

import math

# A name or an address longer than this is cut: a place is a line of the thread, not a document.
FIELD_LIMIT = 200


def location_text(latitude: object, longitude: object, name: object = None, address: object = None) -> str | None:
    """The place as a line of the thread; None when it has neither valid coordinates nor a name."""
    named = ", ".join(part for part in (_clean(name), _clean(address)) if part)
    coordinates = _coordinates(latitude, longitude)
    said = " · ".join(part for part in (named, coordinates) if part)
    return f"[location: {said}]" if said else None


def contact_text(first_name: object, last_name: object = None) -> str:
    """A shared contact as a line of the thread: its name, never its number."""
    name = " ".join(part for part in (_clean(first_name), _clean(last_name)) if part)
    return f"[contact: {name}]" if name else "[contact]"


def forwarded_text(origin: object = None) -> str:
    """Whose words a forwarded message holds, as the thread keeps it before them."""
    name = _clean(origin)
    return f"[forwarded from {name}]" if name else "[forwarded]"


def _coordinates(latitude: object, longitude: object) -> str:
    lat, lon = _number(latitude), _number(longitude)
    if lat is None or lon is None or abs(lat) > 90 or abs(lon) > 180:
        return ""
    return f"{_degrees(lat)}, {_degrees(lon)}"


def _degrees(value: float) -> str:
    # `+ 0.0` turns the -0.0 that rounding a tiny negative gives into 0.0: "-0.0000" reads wrong.
    return f"{round(value, 4) + 0.0:.4f}"


def _number(value: object) -> float | None:
    """A coordinate as Telegram (a JSON number) or Twilio (a form string) sends it."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        number = float(value)  # float() takes a string's surrounding whitespace itself
    except (ValueError, OverflowError):  # OverflowError: an int past a float's range (10**400)
        return None
    return number if math.isfinite(number) else None


def _clean(value: object) -> str:
    """One line of at most FIELD_LIMIT characters: whitespace (newlines too) collapsed, control
    characters dropped."""
    if not isinstance(value, str):
        return ""
    line = " ".join("".join(c for c in value if c.isprintable() or c.isspace()).split())
    return line if len(line) <= FIELD_LIMIT else line[: FIELD_LIMIT - 1].rstrip() + "…"
