"""What a surface is, and how this deployment reaches it: the one interface every surface implements.

`SurfaceRules` (no settings, no I/O): the conversation's title, how a sender is keyed and masked,
how a chat command is spelled, whether the sender is a chat or number a person links to their web
account. `SurfaceAdapter` (built once in functions/runtime.py from the settings): those rules, the
model's deadline, the owner's ids under IDENTITY_POLICY=owner, where its media is fetched, the
channel an owed reply goes through, how a due follow-up is said, and what the deployment lacks to
say anything later there (SMS without its sending number). The rest of the code asks the
registry (core/surfaces/__init__.py) and never names a surface.

`Surface`, `Delivery` and `Sent` live here, below everything, so that the adapters import nothing from
the package but this module (core/models.py re-exports both).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from core.channels.media_fetch import MediaSource
    from core.turn.request import ReplyChannel


class Surface(StrEnum):
    WEB = "web"
    TELEGRAM = "telegram"
    WHATSAPP = "whatsapp"
    SMS = "sms"

    @property
    def is_secondary(self) -> bool:
        """A chat or number beside the person's web account (the SQL keeps one thread of each)."""
        return self is not Surface.WEB


class Delivery(StrEnum):
    """What became of a reply pushed to a surface."""

    DELIVERED = "delivered"
    GIVEN_UP = "given_up"  # retrying cannot help: the person blocked the bot, the chat is gone
    OWED = "owed"  # may pass (5xx, 429, network, timeout): a redelivery of the update sends it


@dataclass(frozen=True)
class Sent:
    """What became of a text pushed to a surface, and how far it got: a text longer than the
    surface takes goes in parts (core/channels/splitting.py), and a later part may fail after the
    ones before it went out. `parts`: how many are out, those a resend started after included."""

    delivery: Delivery
    parts: int
    # Given up because the chat or number opted out at the platform (Twilio's 21610 after an SMS
    # STOP): nothing more goes there until it opts in, so the follow-up job holds it for that, as
    # after an opt-out it knew of (core/follow_ups/opted_out.py), rather than giving it up.
    opted_out: bool = False

    @property
    def unsent_from(self) -> int | None:
        """The part a send of the rest starts from, while the text is owed; else None (delivered,
        or given up): what the reply's row keeps (messages.sql's unsent_from)."""
        return self.parts if self.delivery is Delivery.OWED else None


class SurfaceRules:
    """What a surface is, the same in every deployment. Subclassed once per surface."""

    surface: ClassVar[Surface]
    label: ClassVar[str]  # its name to people: the conversation's title is `[label]`
    command_prefix: ClassVar[str] = ""  # Telegram's commands start with a slash
    # Whether the platform vouches for who sent a message: Telegram's user id, a WhatsApp number
    # (Meta signs its users in) and the web's token do. An SMS's number is the caller ID the
    # carriers pass on, which another sender can forge; there, what cannot be undone (forgetting)
    # waits for a code sent to the number, which only its holder reads (core/memory/forgetting.py).
    sender_vouched_for: ClassVar[bool] = True
    # What a sender is here, for whoever typed one that is not (an operator's `--external-id`).
    sender_form: ClassVar[str] = "a sender id"
    # Whether the carriers carry its texts as SMS: each of a text's messages then says its place,
    # `(1/3) ` (they deliver them in any order), and typographic punctuation goes as GSM-7's
    # look-alikes (one curly apostrophe sends the whole message in UCS-2's shorter segments).
    carried_as_sms: ClassVar[bool] = False
    # Whether its chats or numbers opt out of messages at the platform (SMS's STOP): a message from
    # one that has is stored and answered by nobody (turn.sql's begin_turn reads the sender for it).
    opts_out: ClassVar[bool] = False
    # When a follow-up held there (its time passed and it could not be said) is said, as the
    # list tool tells the model (core/follow_ups/capability.py).
    held_until: ClassVar[str] = "with their next message there"
    # What the model must know of the surface to answer there (SMS: the words Twilio answers
    # itself), in the system prompt's "How the conversation reaches you" (core/turn/capabilities.py):
    # lines of "- ", each ending in a newline, the same bytes in every turn; "" for nothing.
    instructions: ClassVar[str] = ""

    @classmethod
    def key(cls, sender: str) -> str:
        """A sender as `identities` keys it."""
        return sender.strip()

    @classmethod
    def is_sender(cls, key: str) -> bool:
        """Whether `key`, as `key` made it, can be a sender here (a message can come from it)."""
        return bool(key)

    @classmethod
    def mask(cls, key: str) -> str:
        """Enough of a chat id or number to recognise it, not enough to use it."""
        return "•" * max(len(key) - 4, 0) + key[-4:]

    @classmethod
    def command(cls, name: str) -> str:
        """A chat command as the person types it: `/forget` on Telegram, `forget` elsewhere."""
        return cls.command_prefix + name

    @classmethod
    def send_command(cls, name: str, told: str) -> str:
        """How an answer tells the person to send a command: the command itself where it has a
        prefix (`/unlink`), else `told`, the phrase saying it in the person's language."""
        return cls.command(name) if cls.command_prefix else told

    @classmethod
    def title(cls) -> str:
        return f"[{cls.label}]"


def mask_number(key: str) -> str:
    """A phone number (or an id as long) with its country code and last four digits shown."""
    return key[:3] + "•" * max(len(key) - 7, 0) + key[-4:] if len(key) > 7 else "•" * len(key)


# A due follow-up said on a surface: (the chat or number it goes to, None on the web; the stored
# row; now) -> what became of it and the outcome to record ("sent", "held" or "retry"). Said from
# the row's part `unsent_part(row)`: a retry after its first parts went out.
SayFollowUp = Callable[[str | None, Mapping[str, Any], datetime], tuple[Sent, str]]


def unsent_part(row: Mapping[str, Any]) -> int:
    """The part of a follow-up its send starts from (follow_ups.sql's unsent_from)."""
    return int(row.get("unsent_from") or 0)


@dataclass(frozen=True)
class SurfaceAdapter:
    """One surface as this deployment reaches it."""

    rules: type[SurfaceRules]
    deadline_s: float  # the model's, for a turn on this surface
    media: Callable[[], MediaSource]  # built on the first message with a photo, PDF or voice note
    say_follow_up: SayFollowUp
    owner_ids: frozenset[str] = frozenset()  # under IDENTITY_POLICY=owner, as `rules.key` keys them
    # The channel an owed reply goes through, to a sender as stored; None: this deployment cannot
    # push to the surface (no token, no sender), so its owed messages wait.
    reply_channel: Callable[[str], ReplyChannel] | None = None
    # The settings this deployment lacks to say anything later on the surface (an owed reply, a
    # follow-up the agent promised), where it answers in the webhook's own answer without them
    # (SMS: "TWILIO_ACCOUNT_SID and TWILIO_SMS_FROM"); its function refuses to serve without them
    # outside APP_ENV=local (functions/twilio.py). None: nothing lacks.
    later_needs: str | None = None
    # How long after the person's last message on the surface a follow-up can still be said there
    # (WhatsApp's 24-hour window, without an approved template); None: at any time. A later one
    # waits for their next message, and the tool that schedules it says so.
    said_within: timedelta | None = None
    # Records a sender's message that is no turn (a chat command, a notice, one over budget): it opens the window
    # `said_within` counts from, and with True lets their held follow-ups go to the follow-up job
    # (core/follow_ups/outside_thread.py); None: the surface has no such window (all but WhatsApp).
    off_thread: Callable[[str, bool], object] | None = None

    @property
    def surface(self) -> Surface:
        return self.rules.surface


def not_pushed(to: str | None, row: Mapping[str, Any], now: datetime) -> tuple[Sent, str]:
    """A follow-up on a surface this deployment cannot push to: tried again later (a deploy may
    bring its token), never recorded as sent."""
    return Sent(Delivery.OWED, unsent_part(row)), "retry"
