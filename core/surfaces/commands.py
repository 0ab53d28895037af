"""The chat surfaces' commands, read once for Telegram and WhatsApp, and answered by one router.

    /link CODE, link CODE, a code alone, the Confirm button  -> LinkRequest (consent given; a code alone
                                                                that no code has is a message of the thread)
    link CODE 123456 (the digits an SMS number was sent)    -> LinkRequest (its holder's confirmation)
    /start CODE (what a deep link sends)                     -> LinkRequest (asks first on a chat with history)
    /unlink, unlink                                          -> UnlinkRequest
    /forget, forget; /forget confirm, forget confirm [CODE]  -> ForgetRequest
    /start alone, or with a payload that is not a code       -> not a command (a welcome)

A slash command names its bot when the chat has several (`/link@advisor_bot`); one for another
bot is not ours. Written without the slash, a command is the whole text: "forget it" and "link me
to the article" are messages of the thread. None of these is ever stored in the thread. A new
command is added here, in `chat_command` and `Commands.answer`, and both surfaces have it.
"""

from __future__ import annotations

from dataclasses import dataclass

from core.identity.linking import (
    LinkAnswer,
    Linking,
    LinkRequest,
    UnlinkRequest,
    bare_code,
    confirmed_link,
    link_command,
    looks_like_code,
    six_digits,
)
from core.memory.forgetting import ForgetRequest, Forgetting
from core.models import Surface

ChatCommand = LinkRequest | UnlinkRequest | ForgetRequest


def chat_command(
    surface: Surface,
    sender_id: str,
    text: str,
    *,
    also_known_as: str | None = None,
    bot_username: str | None = None,
    delivery: str | None = None,
) -> ChatCommand | None:
    """The command `text` is, or None for a message of the thread; `delivery`, the platform's id of
    the message, goes with a link request (a redelivery counts one wrong code, not two)."""
    text = text.strip()
    if text.startswith("/"):
        named = _slash_command(text, bot_username)
        if named is None:
            return None
        name, argument = named
    else:
        name, _, argument = text.partition(" ")
        name, argument = name.lower(), argument.strip()
    if name == "start" and text.startswith("/"):
        if argument and looks_like_code(argument):
            return LinkRequest(
                surface, sender_id, argument, consented=False, delivery=delivery, also_known_as=also_known_as
            )
        return None
    if confirmed := confirmed_link(_without_addressee(text)):
        return LinkRequest(
            surface,
            sender_id,
            confirmed[0],
            confirmation=confirmed[1],
            delivery=delivery,
            also_known_as=also_known_as,
        )
    if name in ("link", "link:") or not text.startswith("/"):
        code = link_command(_without_addressee(text))
        if code is not None:
            return LinkRequest(
                surface, sender_id, code, bare=bare_code(text), delivery=delivery, also_known_as=also_known_as
            )
    if name == "unlink" and not argument:
        return UnlinkRequest(surface, sender_id, also_known_as)
    # Written out, only "forget", "forget confirm" and "forget confirm 123456" (the code an SMS
    # request was answered with); as a slash command anything else asks.
    if name == "forget":
        confirm, _, typed = argument.lower().partition(" ")
        if not typed and confirm.startswith("confirm") and len(confirm) > 7:  # "confirm042917", typed fast
            confirm, typed = "confirm", confirm[7:]
        code = six_digits(typed.strip())
        if confirm == "confirm" and (not typed.strip() or code):
            return ForgetRequest(surface, sender_id, confirm=True, code=code, also_known_as=also_known_as)
        if not argument or text.startswith("/"):
            return ForgetRequest(surface, sender_id, confirm=False, also_known_as=also_known_as)
    return None


def _slash_command(text: str, bot_username: str | None) -> tuple[str, str] | None:
    """A slash command's name (lower case, no slash) and argument; None for one addressed to
    another bot (`/cmd@other_bot`)."""
    command, *arguments = text.split(maxsplit=1)
    name, _, addressee = command.lower().removeprefix("/").partition("@")
    if addressee and (not bot_username or addressee != bot_username.lower()):
        return None
    return name, arguments[0].strip() if arguments else ""


def _without_addressee(text: str) -> str:
    """`/link@advisor_bot CODE` as `/link CODE`, for the one link-code parser."""
    command, _, rest = text.partition(" ")
    if command.startswith("/"):
        command = command.split("@", 1)[0]
    if "\n" in command:
        command, _, more = command.partition("\n")
        rest = f"{more} {rest}".strip()
    return f"{command} {rest}".strip()


@dataclass(frozen=True)
class CommandAnswer:
    """What to tell the chat; `confirm_code`: offer a button that confirms linking with it, its
    label in `language` (the answer's)."""

    text: str
    confirm_code: str | None = None
    language: str | None = None
    for_the_thread: bool = False  # a code alone that no code has: the message goes to the thread


class Commands:
    """The one router of the chat commands: linking (core/identity/linking.py), forgetting
    (core/memory/forgetting.py)."""

    def __init__(self, linking: Linking, forgetting: Forgetting) -> None:
        self._linking = linking
        self._forgetting = forgetting

    def answer(self, command: ChatCommand, stated: str | None = None, text: str = "") -> CommandAnswer:
        """The answer in the person's language: `stated` by the request (Telegram's
        `language_code`), else as remembered (each command's SQL function answers it), else the
        words of `text`, else DEFAULT_LANGUAGE (docs/decisions.md, "The person's language")."""
        if isinstance(command, ForgetRequest):
            return CommandAnswer(self._forgetting.answer(command, stated, text))
        answered: LinkAnswer = self._linking.answer(command, stated, text)
        return CommandAnswer(answered.text, answered.confirm_code, answered.language, answered.for_the_thread)
