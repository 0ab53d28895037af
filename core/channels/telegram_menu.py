"""The bot's command menu: what Telegram lists when a person types "/" (the Bot API's
`setMyCommands`), and whether what it lists is ours (`getMyCommands`).

One menu per language of core/phrases/: the default language's is Telegram's default (no
`language_code`: every person whose app is in a language we have no menu for), each other one
goes with its `language_code`, a two-letter ISO 639-1 code as Telegram's (the phrase files are
named so). The scope is every private chat (`all_private_chats`): the bot talks only in private,
so a group lists none of its commands, and setting the menus deletes any left in Telegram's default
scope (an earlier version's, or BotFather's), which groups would show.
The descriptions are the phrases `telegram.menu.<command>`; Telegram takes 1 to 32 characters of
`a-z`, `0-9` and `_` for a command and 1 to 256 for its description (a test holds every file to
them). The commands are those core/surfaces/commands.py and core/surfaces/telegram.py answer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from core.errors import DeliveryFailed
from core.phrases.catalogue import Catalogue

# In the order the menu lists them.
MENU_COMMANDS = ("start", "help", "link", "unlink", "forget")
PRIVATE_CHATS = {"type": "all_private_chats"}
DEFAULT_SCOPE = {"type": "default"}  # what a group shows, and a private chat with no menu of its own

BotCall = Callable[[str, dict[str, Any]], dict[str, Any]]  # TelegramBot.call


@dataclass(frozen=True)
class Menu:
    """One language's menu; `language_code` None is Telegram's default one."""

    language: str
    language_code: str | None
    commands: tuple[tuple[str, str], ...]  # (command, description)

    @property
    def named(self) -> str:
        """How a message names it: "the default menu (en)", "the es menu"."""
        return f"the default menu ({self.language})" if self.language_code is None else f"the {self.language} menu"

    def asked(self, scope: dict[str, str] = PRIVATE_CHATS) -> dict[str, Any]:
        """The parameters that say which menu: the scope, and its language (none for the default)."""
        return {"scope": scope} | ({} if self.language_code is None else {"language_code": self.language_code})

    def payload(self) -> dict[str, Any]:
        """setMyCommands' request body."""
        listed = [{"command": command, "description": description} for command, description in self.commands]
        return {"commands": listed, **self.asked()}


def menus(catalogue: Catalogue) -> list[Menu]:
    """Every language's menu, the default first, then the others in alphabetical order."""
    languages = [catalogue.default_language, *sorted(catalogue.languages - {catalogue.default_language})]
    return [
        Menu(
            language,
            None if language == catalogue.default_language else language,
            tuple((command, catalogue.phrases(language).say(f"telegram.menu.{command}")) for command in MENU_COMMANDS),
        )
        for language in languages
    ]


def set_menus(call: BotCall, catalogue: Catalogue) -> list[str]:
    """Set every menu in private chats, and delete its language's in the default scope; what
    failed, one line each (empty when all went). Each is tried even when one before it failed: a
    menu in one language is better than none."""
    failures = []
    for menu in menus(catalogue):
        try:
            call("setMyCommands", menu.payload())
        except DeliveryFailed as exc:
            failures.append(f"{menu.named} was not set ({exc})")
        try:
            call("deleteMyCommands", menu.asked(DEFAULT_SCOPE))
        except DeliveryFailed as exc:
            failures.append(f"{menu.named} was not taken out of groups ({exc})")
    return failures


def menu_differences(call: BotCall, catalogue: Catalogue) -> list[str]:
    """What Telegram lists otherwise than ours, one phrase per menu that differs (empty when every
    menu is ours and no group lists it); a Bot API failure raises DeliveryFailed."""
    differences = []
    for menu in menus(catalogue):
        listed = {
            str(entry.get("command")): str(entry.get("description"))
            for entry in call("getMyCommands", menu.asked())["result"]
        }
        in_groups = ["is listed in groups too"] if call("getMyCommands", menu.asked(DEFAULT_SCOPE))["result"] else []
        ours = dict(menu.commands)
        said = (
            [
                *(f"lacks /{command}" for command in ours if command not in listed),
                *(
                    f"describes /{command} otherwise"
                    for command, text in ours.items()
                    if listed.get(command, text) != text
                ),
                *(f"lists /{command}, which the bot does not answer" for command in listed if command not in ours),
            ]
            if listed
            else ["is not set"]
        )
        if said := [*said, *in_groups]:
            differences.append(f"{menu.named} {', '.join(said)}")
    return differences
