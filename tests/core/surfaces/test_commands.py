"""One parser for the chat commands on every surface (core/surfaces/commands.py): a command is added once,
and Telegram and WhatsApp read it the same way."""

from __future__ import annotations

import pytest

from core.identity.linking import LinkRequest, UnlinkRequest
from core.memory.forgetting import ForgetRequest
from core.models import Surface
from core.surfaces.commands import chat_command

SAME_ON_EVERY_SURFACE = [
    ("link Q63 C6J 332", "link", "Q63 C6J 332"),
    ("/link q63-c6j-332", "link", "q63-c6j-332"),
    ("Q63 C6J 332", "bare", "Q63 C6J 332"),
    ("link", "link", ""),
    ("unlink", "unlink", None),
    ("/unlink", "unlink", None),
    ("forget", "forget", False),
    ("Forget  CONFIRM", "forget", True),
    ("/forget confirm", "forget", True),
    ("forget it", None, None),
    ("link me to the article", None, None),
    ("yes thanks", None, None),
    ("unlink everything", None, None),
]


@pytest.mark.parametrize("surface", [Surface.TELEGRAM, Surface.WHATSAPP])
@pytest.mark.parametrize(("text", "kind", "value"), SAME_ON_EVERY_SURFACE)
def test_every_surface_reads_a_command_the_same_way(
    surface: Surface, text: str, kind: str | None, value: object
) -> None:
    command = chat_command(surface, "sender", text, bot_username="advisor_bot")
    if kind is None:
        assert command is None
    elif kind in ("link", "bare"):
        assert command == LinkRequest(surface, "sender", str(value), bare=kind == "bare")
    elif kind == "unlink":
        assert command == UnlinkRequest(surface, "sender")
    else:
        assert command == ForgetRequest(surface, "sender", confirm=bool(value))


def test_a_deep_link_asks_first_and_a_command_for_another_bot_is_not_ours() -> None:
    assert chat_command(Surface.TELEGRAM, "42", "/start ABCDEFGHJ") == LinkRequest(
        Surface.TELEGRAM, "42", "ABCDEFGHJ", consented=False
    )
    assert chat_command(Surface.TELEGRAM, "42", "/start newsletter-2026") is None
    assert chat_command(Surface.TELEGRAM, "42", "/link@other_bot ABCDEFGHJ", bot_username="advisor_bot") is None
    assert chat_command(Surface.TELEGRAM, "42", "/link@advisor_bot ABCDEFGHJ", bot_username="advisor_bot") == (
        LinkRequest(Surface.TELEGRAM, "42", "ABCDEFGHJ")
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("forget confirm 042917", ForgetRequest(Surface.SMS, "+34600111222", confirm=True, code="042917")),
        ("FORGET CONFIRM  042917 ", ForgetRequest(Surface.SMS, "+34600111222", confirm=True, code="042917")),
        ("forget confirm042917", ForgetRequest(Surface.SMS, "+34600111222", confirm=True, code="042917")),
        ("forget confirm", ForgetRequest(Surface.SMS, "+34600111222", confirm=True)),
        ("forget", ForgetRequest(Surface.SMS, "+34600111222", confirm=False)),
        ("forget confirm ٠٤٢٩١٧", ForgetRequest(Surface.SMS, "+34600111222", confirm=True, code="042917")),
        ("forget confirm 1", None),  # not a code: a message, as it was
        ("forget confirm it all", None),  # a sentence, for the thread
        ("forget it", None),
    ],
)
def test_a_forget_confirmation_carries_the_code_it_was_sent(text: str, expected: ForgetRequest | None) -> None:
    assert chat_command(Surface.SMS, "+34600111222", text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("link ABC234XYZ 042917", LinkRequest(Surface.SMS, "+34600111222", "ABC234XYZ", confirmation="042917")),
        ("LINK abc-234-xyz 042917", LinkRequest(Surface.SMS, "+34600111222", "abc-234-xyz", confirmation="042917")),
        ("link ABC 234 XYZ 042917", LinkRequest(Surface.SMS, "+34600111222", "ABC 234 XYZ", confirmation="042917")),
        ("link ABC234XYZ", LinkRequest(Surface.SMS, "+34600111222", "ABC234XYZ")),
        ("link ABC234XYZ ０４２９１７", LinkRequest(Surface.SMS, "+34600111222", "ABC234XYZ", confirmation="042917")),
        ("link me to the article 042917", None),  # a sentence, for the thread
        # the digits typed against the code: the code's length tells them apart
        ("link ABC234XYZ042917", LinkRequest(Surface.SMS, "+34600111222", "ABC234XYZ", confirmation="042917")),
        ("link abc-234-xyz042917", LinkRequest(Surface.SMS, "+34600111222", "abc234xyz", confirmation="042917")),
        ("link ABC234XYZ04291", LinkRequest(Surface.SMS, "+34600111222", "ABC234XYZ04291")),  # a wrong code
    ],
)
def test_a_link_confirmation_carries_the_digits_the_number_was_sent(text: str, expected: LinkRequest | None) -> None:
    assert chat_command(Surface.SMS, "+34600111222", text) == expected
