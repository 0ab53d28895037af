"""Telegram's `Update` as it reaches the webhook, and what each kind of update asks of us.

The models accept unknown and missing fields (Telegram adds fields; updates from 2018
lack some now required). `classify` turns an update into one of three actions:

- `Converse`: a private text message or a captioned file: a turn of the person's thread.
- `Notice`: a short fixed answer, nothing stored (media we cannot read, groups).
- `Ignore`: a 200 and nothing else (service updates, edits, queries, channels).
- `AccountCommand`: `/start CODE`, `/link CODE`, `/unlink`: linking, never part of the thread.
The README's table lists every kind.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from core.linking import LinkRequest, UnlinkRequest, looks_like_code
from core.models import Surface


class _Tolerant(BaseModel):
    model_config = ConfigDict(extra="allow")


class User(_Tolerant):
    id: int
    is_bot: bool = False
    first_name: str = ""
    username: str | None = None


class Chat(_Tolerant):
    id: int
    type: str = "private"


class MessageEntity(_Tolerant):
    type: str
    offset: int = 0
    length: int = 0


class Message(_Tolerant):
    message_id: int
    chat: Chat
    from_: User | None = Field(default=None, alias="from")
    text: str | None = None
    caption: str | None = None
    entities: list[MessageEntity] = []
    reply_to_message: Message | None = None
    photo: list[dict[str, object]] | None = None
    sticker: dict[str, object] | None = None
    voice: dict[str, object] | None = None
    audio: dict[str, object] | None = None
    video: dict[str, object] | None = None
    video_note: dict[str, object] | None = None
    document: dict[str, object] | None = None
    location: dict[str, object] | None = None
    contact: dict[str, object] | None = None

    model_config = ConfigDict(extra="allow", populate_by_name=True)


class TelegramUpdate(_Tolerant):
    update_id: int
    message: Message | None = None
    edited_message: Message | None = None
    channel_post: Message | None = None
    edited_channel_post: Message | None = None
    callback_query: dict[str, object] | None = None
    inline_query: dict[str, object] | None = None
    my_chat_member: dict[str, object] | None = None


@dataclass(frozen=True)
class Converse:
    chat_id: int
    sender_id: str
    text: str
    update_id: int


@dataclass(frozen=True)
class Notice:
    chat_id: int
    text: str
    reason: str


@dataclass(frozen=True)
class Ignore:
    reason: str


@dataclass(frozen=True)
class AccountCommand:
    chat_id: int
    request: LinkRequest | UnlinkRequest


TelegramAction = Converse | Notice | Ignore | AccountCommand

TEXT_ONLY = "I can only read text for now. Could you tell me in words what you sent?"
PRIVATE_ONLY = "I keep our conversations private, so I only talk in a direct chat with you. Message me there."
WELCOME = (
    "Hi! I'm your advisor. Write to me here, on WhatsApp or on the web: "
    "I remember our one conversation across all of them."
)


def _media_kind(message: Message) -> str | None:
    for kind in ("photo", "sticker", "voice", "audio", "video", "video_note", "document", "location", "contact"):
        if getattr(message, kind) is not None:
            return kind
    extra = message.model_extra or {}
    for kind in ("animation", "poll", "venue", "dice", "game", "story"):
        if kind in extra:
            return kind
    return None


def _addressed_to_bot(message: Message, bot_id: int | None, bot_username: str | None) -> bool:
    if message.reply_to_message and message.reply_to_message.from_ and message.reply_to_message.from_.id == bot_id:
        return True
    text = message.text or message.caption or ""
    return bool(bot_username) and f"@{bot_username}".lower() in text.lower()


def classify(update: TelegramUpdate, bot_id: int | None = None, bot_username: str | None = None) -> TelegramAction:
    if update.message is None:
        for kind in ("edited_message", "channel_post", "edited_channel_post", "callback_query", "inline_query"):
            if getattr(update, kind) is not None:
                return Ignore(kind)
        if update.my_chat_member is not None:
            status = update.my_chat_member.get("new_chat_member", {})
            return Ignore(f"my_chat_member:{status.get('status', '?') if isinstance(status, dict) else '?'}")
        return Ignore("unhandled update kind")
    message = update.message
    sender = message.from_
    if sender is None or sender.is_bot:
        return Ignore("not from a person")
    if message.chat.type != "private":
        if _addressed_to_bot(message, bot_id, bot_username):
            return Notice(message.chat.id, PRIVATE_ONLY, f"{message.chat.type} message addressed to the bot")
        return Ignore(f"{message.chat.type} message")
    text = (message.text or message.caption or "").strip()
    if message.text and (command := _account_command(text, str(sender.id), bot_username)):
        return AccountCommand(message.chat.id, command)
    if text in ("/start", f"/start@{bot_username}") or (text.startswith("/start ") and not message.caption):
        return Notice(message.chat.id, WELCOME, "start")
    if text:
        return Converse(message.chat.id, str(sender.id), text, update.update_id)
    media = _media_kind(message)
    if media is not None:
        return Notice(message.chat.id, TEXT_ONLY, media)
    return Ignore("private message without text")


def _account_command(text: str, sender_id: str, bot_username: str | None) -> LinkRequest | UnlinkRequest | None:
    """`/start CODE` (a deep link's payload that is a link code), `/link [CODE]`, `/unlink`."""
    if not text.startswith("/"):
        return None
    command, *arguments = text.split(maxsplit=1)
    name, _, addressee = command.lower().partition("@")
    if addressee and (not bot_username or addressee != bot_username.lower()):
        return None
    argument = arguments[0].strip() if arguments else ""
    if name == "/start" and argument and looks_like_code(argument):
        return LinkRequest(Surface.TELEGRAM, sender_id, argument)
    if name == "/link":
        return LinkRequest(Surface.TELEGRAM, sender_id, argument)
    if name == "/unlink" and not argument:
        return UnlinkRequest(Surface.TELEGRAM, sender_id)
    return None
