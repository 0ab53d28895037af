"""The surfaces: one adapter each (core/surfaces/<name>.py), asked through one registry.

Everything that differs between Telegram, WhatsApp and the web lives in that surface's module:
its rules (`SurfaceRules`: title, identity key, masking, command spelling) and how a follow-up is
said on it; functions/runtime.py builds each `SurfaceAdapter` once from the settings (deadline,
owner's ids, media source, owed-reply channel, follow-up sender) and hands the registry to the
code that needs it. Nothing outside this package branches on a surface: a surface missing from
the registry fails where the registry is built (`registry`), never silently further on.

Each adapter is built on the first use of its surface (`Registry`): a function reads the settings
of the surfaces it serves only (functions/tools/function_settings.py lists them), and a Telegram
invocation never builds WhatsApp's.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Final, TypeVar

from core.errors import ConfigurationError
from core.surfaces.adapter import Delivery, SayFollowUp, Surface, SurfaceAdapter, SurfaceRules, not_pushed
from core.surfaces.sms import SmsRules
from core.surfaces.telegram import TelegramRules
from core.surfaces.web import WebRules
from core.surfaces.whatsapp import WhatsAppRules

__all__ = [
    "RULES",
    "Registry",
    "Delivery",
    "SayFollowUp",
    "Surface",
    "SurfaceAdapter",
    "SurfaceRules",
    "Surfaces",
    "complete",
    "not_pushed",
    "registry",
    "rules",
]

Surfaces = Mapping[Surface, SurfaceAdapter]
T = TypeVar("T")


def complete(table: Mapping[Surface, T], what: str) -> Mapping[Surface, T]:
    """`table` if it names every surface; else a ConfigurationError naming the missing ones."""
    if missing := [surface.value for surface in Surface if surface not in table]:
        raise ConfigurationError(f"{what} has no entry for: {', '.join(missing)}")
    return table


RULES: Final[Mapping[Surface, type[SurfaceRules]]] = complete(
    {rules.surface: rules for rules in (WebRules, TelegramRules, WhatsAppRules, SmsRules)}, "the surfaces' rules"
)


def rules(surface: Surface) -> type[SurfaceRules]:
    return RULES[surface]


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
