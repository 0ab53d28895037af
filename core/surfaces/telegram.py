"""Telegram: a chat id, commands with a slash, follow-ups through the Bot API's sendMessage; and
its `Update` as it reaches the webhook, with what each kind of update asks of us.

The models accept unknown and missing fields (Telegram adds fields; updates from 2018
lack some now required). `classify` turns an update into one of six actions:

- `Converse`: a private text message, photo, PDF, image file, voice note or audio (with its
  `media`, fetched by the turn: core/media/turn_media.py), or a shared location, venue or contact (as
  a line of text: core/channels/places.py): a turn of the person's thread. Its
  `platform` names it ("chat_id:message_id") and, for a reply, the message replied to and the
  text quoted (`quote`, the part the person picked, else the replied message's text or caption).
- `MessageEdit`: the person corrected the text of a private message: its stored text is replaced
  (core/memory/edits.py), and nothing is answered.
- `Notice`: a short fixed answer (a phrase, core/phrases/), nothing stored (stickers, videos, groups).
- `Ignore`: a 200 and nothing else (service updates, edited captions, a live location's new
  positions, queries, channels, and every update kind this code does not know: Bot API 10.x
  added `guest_message`, `managed_bot`, `subscription`..., docs/decisions.md, Bot API 10.x).
- `Command`: a chat command (core/surfaces/commands.py: linking, unlinking, forgetting) the person
  typed (a forwarded one is someone else's words), or the Confirm button under a link's question (a
  `callback_query`): never part of the thread.
- `StopGeneration`: the person tapped the stop button under a reply's draft (Bot API 10.3's
  `stopped_message_generation`): the turn writing it stops (core/turn/stopped_generation.py).
docs/api.md's table lists every kind; `WEBHOOK_UPDATES` the kinds the webhook is set up to get.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from core.channels.places import contact_text, forwarded_text, location_text
from core.identity.linking import LinkRequest, looks_like_code
from core.media.kinds import MediaKind, MediaRef, media_kind, photo_size
from core.memory.edits import MessageEdit
from core.models import PlatformMessage
from core.surfaces.adapter import SayFollowUp, Sent, Surface, SurfaceRules, unsent_part
from core.surfaces.commands import ChatCommand, chat_command


class Rules(SurfaceRules):
    surface: ClassVar[Surface] = Surface.TELEGRAM
    label: ClassVar[str] = "Telegram"
    command_prefix: ClassVar[str] = "/"
    sender_form: ClassVar[str] = "a Telegram user id (digits)"

    @classmethod
    def is_sender(cls, key: str) -> bool:
        return re.fullmatch(r"-?[0-9]+", key) is not None


def say_follow_up(send_parts: Callable[[int, str, int], Sent]) -> SayFollowUp:
    """A follow-up as one message (split past 4096 characters) to the chat, from its first part not
    sent (`send_parts(chat, text, first_part)`)."""

    def say(to: str | None, row: Mapping[str, Any], now: datetime) -> tuple[Sent, str]:
        if to is None:
            raise ValueError("a Telegram follow-up needs a chat")
        return send_parts(int(to), str(row["content"]), unsent_part(row)), "sent"

    return say


class _Tolerant(BaseModel):
    model_config = ConfigDict(extra="allow")


class User(_Tolerant):
    id: int
    is_bot: bool = False
    first_name: str = ""
    username: str | None = None
    language_code: str | None = None  # the person's app language (IETF tag), when Telegram says it


class Chat(_Tolerant):
    id: int
    type: str = "private"


class MessageEntity(_Tolerant):
    type: str
    offset: int = 0
    length: int = 0


class TextQuote(_Tolerant):
    """The part of the replied message the person quoted (Bot API 7.0's `quote`)."""

    text: str = ""


class Message(_Tolerant):
    message_id: int
    chat: Chat
    from_: User | None = Field(default=None, alias="from")
    text: str | None = None
    caption: str | None = None
    entities: list[MessageEntity] = []
    reply_to_message: Message | None = None
    quote: TextQuote | None = None
    edit_date: int | None = None
    photo: list[dict[str, object]] | None = None
    sticker: dict[str, object] | None = None
    voice: dict[str, object] | None = None
    audio: dict[str, object] | None = None
    video: dict[str, object] | None = None
    video_note: dict[str, object] | None = None
    document: dict[str, object] | None = None
    location: dict[str, object] | None = None
    venue: dict[str, object] | None = None
    contact: dict[str, object] | None = None
    forward_origin: dict[str, object] | None = None  # a MessageOrigin: whose message this was (Bot API 7.0)

    model_config = ConfigDict(extra="allow", populate_by_name=True)


class MessageGenerationStopped(_Tolerant):
    """Bot API 10.3: "a user asked the bot to stop the generation of a message" (its draft's)."""

    chat: Chat
    draft_id: int
    message_thread_id: int | None = None


class TelegramUpdate(_Tolerant):
    update_id: int
    message: Message | None = None
    edited_message: Message | None = None
    channel_post: Message | None = None
    edited_channel_post: Message | None = None
    callback_query: dict[str, object] | None = None
    inline_query: dict[str, object] | None = None
    my_chat_member: dict[str, object] | None = None
    stopped_message_generation: MessageGenerationStopped | None = None


@dataclass(frozen=True)
class Converse:
    chat_id: int
    sender_id: str
    text: str
    update_id: int
    media: tuple[MediaRef, ...] = field(default=())  # then `text` is the caption
    platform: PlatformMessage | None = None
    language_code: str | None = None  # the sender's `from.language_code`


@dataclass(frozen=True)
class Notice:
    """A fixed answer: the id of its phrase (core/phrases/*.toml), said in the sender's language
    (`sender_id`: the person's Telegram id, which in a group is not the chat's)."""

    chat_id: int
    phrase: str
    reason: str
    language_code: str | None = None
    sender_id: str = ""


@dataclass(frozen=True)
class Ignore:
    reason: str


@dataclass(frozen=True)
class Command:
    """A chat command (core/surfaces/commands.py): never a message of the thread."""

    chat_id: int
    request: ChatCommand
    callback_query_id: str | None = None  # a tapped button, which Telegram wants answered
    language_code: str | None = None  # the sender's `from.language_code`


@dataclass(frozen=True)
class StopGeneration:
    """The stop button under the draft `draft_id` (the update_id of the message being answered)."""

    chat_id: int
    draft_id: int


# The update kinds the webhook asks Telegram for (setWebhook's `allowed_updates`): the ones
# `classify` acts on. Any other is a 200 and nothing else, should it come.
WEBHOOK_UPDATES = ("message", "edited_message", "callback_query", "my_chat_member", "stopped_message_generation")

# How Telegram names its update kinds: an unknown kind is named in our answer only when it looks so.
UPDATE_KIND = re.compile(r"[a-z][a-z_]{0,63}")

# The data of the button that confirms a link (at most 64 bytes: the prefix and a 9-character code).
CONFIRM_LINK = "link:"


TelegramAction = Converse | MessageEdit | Notice | Ignore | Command | StopGeneration

TEXT_ONLY = "media.text_only"
PRIVATE_ONLY = "telegram.private_only"
WELCOME = "telegram.welcome"
HELP = "telegram.help"


def _media_kind(message: Message) -> str | None:
    kinds = ("photo", "sticker", "voice", "audio", "video", "video_note", "document", "location", "venue", "contact")
    for kind in kinds:
        if getattr(message, kind) is not None:
            return kind
    extra = message.model_extra or {}
    for kind in ("animation", "poll", "dice", "game", "story", "checklist"):  # checklist: Bot API 9.1
        if kind in extra:
            return kind
    return None


def _unknown_kind(update: TelegramUpdate) -> str:
    """The name of an update kind this code does not know (Bot API 10.x added several), for the
    answer and the log: a field name as Telegram writes them, else a generic one."""
    for name in update.model_extra or {}:
        if UPDATE_KIND.fullmatch(name):
            return name
    return "unhandled update kind"


def _addressed_to_bot(message: Message, bot_id: int | None, bot_username: str | None) -> bool:
    if message.reply_to_message and message.reply_to_message.from_ and message.reply_to_message.from_.id == bot_id:
        return True
    text = message.text or message.caption or ""
    return bool(bot_username) and f"@{bot_username}".lower() in text.lower()


def classify(
    update: TelegramUpdate, bot_id: int | None = None, bot_username: str | None = None, commands: bool = True
) -> TelegramAction:
    """What an update asks for; `commands` false: its text is a message of the thread even when it
    reads as a command (a code alone that no code has: core/identity/linking.py)."""
    if (stopped := update.stopped_message_generation) is not None:
        return StopGeneration(stopped.chat.id, stopped.draft_id)
    if update.callback_query is not None:
        return _confirmed_link(update.callback_query, str(update.update_id)) or Ignore("callback_query")
    if update.message is None and update.edited_message is not None:
        return _edit(update.edited_message)
    if update.message is None:
        for kind in ("channel_post", "edited_channel_post", "callback_query", "inline_query"):
            if getattr(update, kind) is not None:
                return Ignore(kind)
        if update.my_chat_member is not None:
            status = update.my_chat_member.get("new_chat_member", {})
            return Ignore(f"my_chat_member:{status.get('status', '?') if isinstance(status, dict) else '?'}")
        return Ignore(_unknown_kind(update))
    message = update.message
    sender = message.from_
    if sender is None or sender.is_bot:
        return Ignore("not from a person")
    language = sender.language_code
    if message.chat.type != "private":
        if _addressed_to_bot(message, bot_id, bot_username):
            reason = f"{message.chat.type} message addressed to the bot"
            return Notice(message.chat.id, PRIVATE_ONLY, reason, language, str(sender.id))
        return Ignore(f"{message.chat.type} message")
    text = (message.text or message.caption or "").strip()
    sender_id, delivery = str(sender.id), str(update.update_id)
    # A command is a text the person typed: a caption never is, nor someone else's message forwarded.
    reads = commands and message.text and not forwarded(message)
    if reads and (
        command := chat_command(Surface.TELEGRAM, sender_id, text, bot_username=bot_username, delivery=delivery)
    ):
        return Command(message.chat.id, command, language_code=language)
    if text in ("/start", f"/start@{bot_username}") or (text.startswith("/start ") and not message.caption):
        return Notice(message.chat.id, WELCOME, "start", language, str(sender.id))
    if text in ("/help", f"/help@{bot_username}"):  # what every Telegram bot answers: its commands
        return Notice(message.chat.id, HELP, "help", language, str(sender.id))
    platform = platform_message(message)
    chat, person, update_id = message.chat.id, str(sender.id), update.update_id
    if attached := readable_media(message):
        caption = _said_by(message, (message.caption or "").strip())
        return Converse(chat, person, caption, update_id, attached, platform, language)
    if text:
        return Converse(chat, person, _said_by(message, text), update_id, platform=platform, language_code=language)
    if shared := shared_place_or_contact(message):
        return Converse(chat, person, _said_by(message, shared), update_id, platform=platform, language_code=language)
    media = _media_kind(message)
    if media is not None:
        return Notice(message.chat.id, TEXT_ONLY, media, language, str(sender.id))
    return Ignore("private message without text")


def forwarded(message: Message) -> bool:
    """Whether the message is someone else's, forwarded: Bot API 7.0's `forward_origin`, or the
    `forward_date` that every forward carried before it. One that names the person themself (their
    own message, forwarded from their Saved Messages, say) is still their own words."""
    origin = message.forward_origin
    if origin is None:
        return "forward_date" in (message.model_extra or {})
    own = origin.get("sender_user")
    return not (isinstance(own, dict) and message.from_ is not None and own.get("id") == message.from_.id)


def _said_by(message: Message, text: str) -> str:
    """The text as the thread keeps it: a forward's words after whose they were
    (`[forwarded from Ana López] …`), so that no one else's message is remembered as the person's."""
    if not forwarded(message):
        return text
    origin = message.forward_origin or {}
    by: object = origin.get("sender_user_name")  # a person who hides their account: a name only
    for key in ("sender_user", "sender_chat", "chat"):  # a person, a group, a channel
        if isinstance(found := origin.get(key), dict):
            title, first, last = found.get("title"), found.get("first_name"), found.get("last_name")
            by = title or " ".join(part for part in (first, last) if isinstance(part, str) and part) or None
            break
    return f"{forwarded_text(by)} {text}".strip()


def platform_message(message: Message) -> PlatformMessage:
    """The message as Telegram names it, with the one it replies to and what it quotes: the part
    the person picked (`quote`), else the replied message's text or caption. A replied message
    without either (a voice note) is quoted from memory, when it is the person's (begin_turn)."""
    replied = message.reply_to_message
    quoted = message.quote.text if message.quote is not None and message.quote.text.strip() else None
    if replied is not None and quoted is None:
        quoted = replied.text or replied.caption or None
    reply_to = f"{replied.chat.id}:{replied.message_id}" if replied is not None else None
    return PlatformMessage(f"{message.chat.id}:{message.message_id}", reply_to, quoted)


def _edit(message: Message) -> MessageEdit | Ignore:
    """A person's edit of a private text message. An edited caption is left alone: its stored
    message is what the turn learned of the photo or file, which the caption alone would lose."""
    sender = message.from_
    if sender is None or sender.is_bot or message.chat.type != "private":
        return Ignore("edited_message")
    if message.location is not None:
        # A live location moving (or stopped): its first position was the message, answered once.
        return Ignore("live location update")
    text = (message.text or "").strip()
    if not text:
        return Ignore("edited_message without text")
    return MessageEdit(Surface.TELEGRAM, str(sender.id), text, platform_message(message), _edited_at(message.edit_date))


def _edited_at(edit_date: int | None) -> datetime:
    """Telegram's edit_date (Unix time); now when it is missing or no date at all."""
    try:
        return datetime.fromtimestamp(edit_date, UTC) if edit_date else datetime.now(UTC)
    except (OverflowError, OSError, ValueError):
        return datetime.now(UTC)


def shared_place_or_contact(message: Message) -> str | None:
    """A location, a venue (with its title and address) or a contact card, as the line of text
    the thread keeps (core/channels/places.py: a contact's name, never its number). None for
    anything else, or a location without usable coordinates."""
    if message.venue is not None:
        where = message.venue.get("location")
        point = where if isinstance(where, dict) else (message.location or {})
        title, address = message.venue.get("title"), message.venue.get("address")
        return location_text(point.get("latitude"), point.get("longitude"), title, address)
    if message.location is not None:
        return location_text(message.location.get("latitude"), message.location.get("longitude"))
    if message.contact is not None:
        return contact_text(message.contact.get("first_name"), message.contact.get("last_name"))
    return None


def readable_media(message: Message) -> tuple[MediaRef, ...]:
    """A photo (the size that fits Claude's recommended dimensions), a voice note or an audio
    file, or a document (an image, a PDF, audio; any other file as one the model cannot read)."""
    if message.photo:
        best = photo_size(message.photo)
        if isinstance(best.get("file_id"), str):
            return (MediaRef(MediaKind.IMAGE, "image/jpeg", str(best["file_id"]), size=_int(best.get("file_size"))),)
    for sound in (message.voice, message.audio):
        if sound is not None and isinstance(sound.get("file_id"), str):
            mime = str(sound.get("mime_type") or "audio/ogg")
            size, seconds = _int(sound.get("file_size")), _int(sound.get("duration"))
            return (MediaRef(MediaKind.VOICE, mime, str(sound["file_id"]), size=size, seconds=seconds),)
    # A GIF comes as an `animation` and, "for backward compatibility", as a `document` too (the Bot
    # API's Message.animation): it is answered as the animation it is, as a video is, not as a file.
    document = message.document if "animation" not in (message.model_extra or {}) else None
    if document is not None and isinstance(document.get("file_id"), str):
        mime = str(document.get("mime_type") or "")
        kind = media_kind(mime)
        name = str(document["file_name"]) if document.get("file_name") else None
        return (MediaRef(kind, mime, str(document["file_id"]), size=_int(document.get("file_size")), name=name),)
    return ()


def _int(value: object) -> int | None:
    return value if isinstance(value, int) else None


def _confirmed_link(query: dict[str, object], delivery: str) -> Command | None:
    """The Confirm button under a link's question, tapped in a private chat by its person."""
    data, sender, message = query.get("data"), query.get("from"), query.get("message")
    if not (isinstance(data, str) and data.startswith(CONFIRM_LINK)):
        return None
    if not (isinstance(sender, dict) and isinstance(message, dict) and isinstance(message.get("chat"), dict)):
        return None
    chat = message["chat"]
    if chat.get("type") != "private" or chat.get("id") != sender.get("id") or sender.get("is_bot"):
        return None
    if not isinstance(chat["id"], int) or isinstance(chat["id"], bool):  # a chat id is a number
        return None
    code = data.removeprefix(CONFIRM_LINK)
    if not looks_like_code(code):
        return None
    # the chat's id, a number (the sender's equals it, but may be another type: True == 1, 42.0 == 42)
    request = LinkRequest(Surface.TELEGRAM, str(chat["id"]), code, consented=True, delivery=delivery)
    language = sender.get("language_code")
    return Command(
        int(chat["id"]),
        request,
        callback_query_id=str(query.get("id", "")),
        language_code=language if isinstance(language, str) else None,
    )
