"""The surfaces: one adapter each (core/surfaces/<name>.py), asked through one registry.

Everything that differs between the surfaces lives in that surface's module, named after its
`Surface` value: its rules (`Rules`, a `SurfaceRules`: title, identity key, masking, command
spelling) and how a follow-up is said on it; functions/runtime.py builds each `SurfaceAdapter` once
from the settings (deadline, owner's ids, media source, owed-reply channel, follow-up sender) and
hands the registry to the code that needs it. Nothing outside this package branches on a surface:
a surface missing from a registry fails where the registry is built (`registry`, and `RULES` when
this package is imported: a member of `Surface` without its module), never silently further on.

`RULES` is found from `Surface`, so a new surface adds its module and no line here. Each module is
imported on its surface's first ask (`rules`), not with this package: `core.models` (which titles a
conversation by its rules) stays a leaf, and a surface's module may import what reading its inbound
messages needs (pydantic, core.models) without a cycle.

Each adapter is built on the first use of its surface (`Registry`): a function reads the settings
of the surfaces it serves only (functions/function_settings.py lists them), and a Telegram
invocation never builds WhatsApp's.
"""

from __future__ import annotations

import functools
import importlib
import threading
from collections.abc import Callable, Iterator, Mapping
from importlib.util import find_spec
from typing import Final, TypeVar

from core.errors import ConfigurationError
from core.surfaces.adapter import (
    Delivery,
    SayFollowUp,
    Sent,
    Surface,
    SurfaceAdapter,
    SurfaceRules,
    not_pushed,
    unsent_part,
)

__all__ = [
    "RULES",
    "Registry",
    "Delivery",
    "SayFollowUp",
    "Sent",
    "Surface",
    "SurfaceAdapter",
    "SurfaceRules",
    "Surfaces",
    "complete",
    "not_pushed",
    "registry",
    "rules",
    "unsent_part",
]

Surfaces = Mapping[Surface, SurfaceAdapter]
T = TypeVar("T")


def complete(table: Mapping[Surface, T], what: str) -> Mapping[Surface, T]:
    """`table` if it names every surface; else a ConfigurationError naming the missing ones."""
    if missing := [surface.value for surface in Surface if surface not in table]:
        raise ConfigurationError(f"{what} has no entry for: {', '.join(missing)}")
    return table


class Registry(Mapping[Surface, T]):
    """One value per surface, every surface named when it is made; each value built on first use."""

    def __init__(self, builders: Mapping[Surface, Callable[[], T]], what: str = "the surface registry") -> None:
        self._builders = complete(builders, what)
        self._built: dict[Surface, T] = {}
        self._lock = threading.Lock()

    def __getitem__(self, surface: Surface) -> T:
        if surface not in self._built:
            with self._lock:
                if surface not in self._built:
                    self._built[surface] = self._builders[surface]()
        return self._built[surface]

    def __iter__(self) -> Iterator[Surface]:
        return iter(self._builders)

    def __len__(self) -> int:
        return len(self._builders)


def registry(adapters: Mapping[Surface, Callable[[], SurfaceAdapter]]) -> Registry[SurfaceAdapter]:
    """The deployment's adapters by surface, one for every surface, each built when first asked."""
    return Registry(adapters)


def surface_module(surface: Surface) -> str:
    """The module of a surface's rules: core/surfaces/<its value>.py."""
    return f"{__name__}.{surface.value}"


def imported_rules(surface: Surface) -> type[SurfaceRules]:
    """`Rules` of the surface's module, which must be that surface's."""
    found = importlib.import_module(surface_module(surface)).Rules
    if not (isinstance(found, type) and issubclass(found, SurfaceRules) and found.surface is surface):
        raise ConfigurationError(f"{surface_module(surface)}.Rules is not the {surface.value} surface's SurfaceRules")
    return found


RULES: Final[Registry[type[SurfaceRules]]] = Registry(
    {
        surface: functools.partial(imported_rules, surface)
        for surface in Surface
        if find_spec(surface_module(surface)) is not None
    },
    "the surfaces' rules (core/surfaces/<surface>.py)",
)


def rules(surface: Surface) -> type[SurfaceRules]:
    return RULES[surface]
