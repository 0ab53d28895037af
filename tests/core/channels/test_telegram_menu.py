"""The command menu (core/channels/telegram_menu.py) against the fake_telegram Bot API: the exact
setMyCommands bodies, one menu refused without the other lost, and what getMyCommands lacks."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from core.channels.telegram_bot import TelegramBot
from core.channels.telegram_menu import MENU_COMMANDS, menu_differences, menus, set_menus
from core.phrases.catalogue import Catalogue
from tests.fakes.telegram_api import FakeTelegram
from tests.helpers import BOT_TOKEN, DEFAULT, ENGLISH_MENU, PRIVATE, SPANISH_MENU


@pytest.fixture
def bot(fake_telegram: FakeTelegram) -> Iterator[TelegramBot]:
    client = TelegramBot(BOT_TOKEN, fake_telegram.url)
    yield client
    client.close()


def test_the_default_menu_is_english_and_spanish_goes_with_its_language_code(
    bot: TelegramBot, fake_telegram: FakeTelegram
) -> None:
    assert set_menus(bot.call, Catalogue()) == []
    assert fake_telegram.calls == [
        ("setMyCommands", {"commands": ENGLISH_MENU, "scope": PRIVATE}),
        ("deleteMyCommands", {"scope": DEFAULT}),
        ("setMyCommands", {"commands": SPANISH_MENU, "scope": PRIVATE, "language_code": "es"}),
        ("deleteMyCommands", {"scope": DEFAULT, "language_code": "es"}),
    ]
    assert menu_differences(bot.call, Catalogue()) == []
    assert fake_telegram.calls[4:] == [
        ("getMyCommands", {"scope": PRIVATE}),
        ("getMyCommands", {"scope": DEFAULT}),
        ("getMyCommands", {"scope": PRIVATE, "language_code": "es"}),
        ("getMyCommands", {"scope": DEFAULT, "language_code": "es"}),
    ]


def test_with_spanish_as_the_default_language_english_is_the_one_with_a_code(
    bot: TelegramBot, fake_telegram: FakeTelegram
) -> None:
    assert set_menus(bot.call, Catalogue("es")) == []
    assert fake_telegram.calls[::2] == [
        ("setMyCommands", {"commands": SPANISH_MENU, "scope": PRIVATE}),
        ("setMyCommands", {"commands": ENGLISH_MENU, "scope": PRIVATE, "language_code": "en"}),
    ]


def test_a_refused_menu_is_said_and_the_other_is_still_set(bot: TelegramBot, fake_telegram: FakeTelegram) -> None:
    fake_telegram.fail_with("too_many_requests", times=1, method="setMyCommands")
    assert set_menus(bot.call, Catalogue()) == [
        "the default menu (en) was not set (setMyCommands: Too Many Requests: retry after 41)"
    ]
    assert fake_telegram.calls[1] == (
        "setMyCommands",
        {"commands": SPANISH_MENU, "scope": PRIVATE, "language_code": "es"},
    )
    assert menu_differences(bot.call, Catalogue()) == ["the default menu (en) is not set"]


def test_what_the_listed_menu_lacks_describes_otherwise_or_adds_is_said(
    bot: TelegramBot, fake_telegram: FakeTelegram
) -> None:
    # A menu set earlier: an old description, a command the bot never answered.
    fake_telegram.menus[("all_private_chats", "")] = [
        {"command": "start", "description": "Say hello"},
        {"command": "help", "description": "Help"},
        {"command": "settings", "description": "Settings"},
    ]
    fake_telegram.menus[("all_private_chats", "es")] = SPANISH_MENU[:3]
    assert menu_differences(bot.call, Catalogue()) == [
        "the default menu (en) lacks /link, lacks /unlink, lacks /forget, describes /help otherwise, "
        "lists /settings, which the bot does not answer",
        "the es menu lacks /unlink, lacks /forget",
    ]
    fake_telegram.menus[("all_private_chats", "")] = list(reversed(ENGLISH_MENU))  # the order is Telegram's
    fake_telegram.menus[("all_private_chats", "es")] = SPANISH_MENU
    assert menu_differences(bot.call, Catalogue()) == []


def test_a_menu_left_in_telegrams_default_scope_shows_in_groups_and_is_taken_out(
    bot: TelegramBot, fake_telegram: FakeTelegram
) -> None:
    """An earlier version set its menus in the default scope (or BotFather did): groups list them,
    where the bot only says it talks in private."""
    fake_telegram.menus[("default", "")] = ENGLISH_MENU
    fake_telegram.menus[("default", "es")] = SPANISH_MENU
    fake_telegram.menus[("all_private_chats", "es")] = SPANISH_MENU
    assert menu_differences(bot.call, Catalogue()) == [
        "the default menu (en) is not set, is listed in groups too",
        "the es menu is listed in groups too",
    ]
    assert set_menus(bot.call, Catalogue()) == []
    assert fake_telegram.menus == {("all_private_chats", ""): ENGLISH_MENU, ("all_private_chats", "es"): SPANISH_MENU}
    assert menu_differences(bot.call, Catalogue()) == []


def test_a_menu_telegram_will_not_take_out_of_groups_is_said(bot: TelegramBot, fake_telegram: FakeTelegram) -> None:
    fake_telegram.fail_with("too_many_requests", times=1, method="deleteMyCommands")
    assert set_menus(bot.call, Catalogue()) == [
        "the default menu (en) was not taken out of groups (deleteMyCommands: Too Many Requests: retry after 41)"
    ]


def test_every_language_keeps_to_telegrams_limits() -> None:
    """BotCommand: a command of 1 to 32 characters of a-z, 0-9 and _, a description of 1 to 256;
    language_code, a two-letter ISO 639-1 code."""
    catalogue = Catalogue()
    assert all(re.fullmatch(r"[a-z0-9_]{1,32}", command) for command in MENU_COMMANDS)
    for menu in menus(catalogue):
        assert menu.language_code is None or re.fullmatch(r"[a-z]{2}", menu.language_code)
        assert [command for command, _ in menu.commands] == list(MENU_COMMANDS)
        assert all(1 <= len(description.strip()) == len(description) <= 256 for _, description in menu.commands)
    assert [menu.language for menu in menus(catalogue)] == ["en", "es"]
