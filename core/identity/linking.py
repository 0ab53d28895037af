"""Linking: one person on every app. A web person's code joins a Telegram chat or a
WhatsApp number to them; unlinking lets it go.

    web:       POST /links -> a code (and a Telegram deep link)
    Telegram:  /start CODE (what the deep link sends), /link CODE, /unlink
    WhatsApp:  link CODE, unlink
    SMS:       link CODE, then link CODE 123456: the six digits the answer sent to the number (a
               caller ID can be forged; only the number's holder reads them), unlink

Codes are 9 characters from an alphabet without look-alikes (about 44.6 bits), read
without regard to case, spaces or dashes, single-use, expiring, and stored only as a
SHA-256 hash. Each operation is one SQL function call (see the identity_links migration):
the hourly limit on wrong codes, the single use and the merge of an `auto` person's
history all happen inside it.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import unicodedata
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any
from uuid import UUID

from core.errors import InputError, LinkingNotNeeded, StoreUnavailable
from core.identity.policy import IdentityPolicy, identity_key
from core.identity.remembered_language import RememberedLanguage
from core.models import Surface
from core.phrases.catalogue import Catalogue, Phrases
from core.stores.store import MemoryStore
from core.surfaces import rules

CODE_ALPHABET = "ABCDEFGHJKMNPQRSTUVWXYZ23456789"  # no I, L, O, 0, 1: nothing to misread
CODE_LENGTH = 9
_CODE_SHAPE = re.compile(rf"^[{CODE_ALPHABET}]{{{CODE_LENGTH}}}$")


def new_code() -> str:
    return "".join(secrets.choice(CODE_ALPHABET) for _ in range(CODE_LENGTH))


def normalise_code(typed: str) -> str:
    """A code as a phone may deliver it: any case, with spaces, dashes or a full stop around."""
    return re.sub(r"[^0-9A-Za-z]", "", typed).upper()


def looks_like_code(typed: str) -> bool:
    return bool(_CODE_SHAPE.match(normalise_code(typed)))


# A message that is only a code, as the web page shows it or a person retypes it: nine characters
# of the alphabet, whole or in groups of three (spaces, dashes), in any case, with at least one
# digit or all in capitals ("yes thanks" is not a code; "Q63 C6J 332" and "q63-c6j-332" are).
_BARE_CODE = re.compile(r"^[0-9A-Za-z]{3}[\s-]?[0-9A-Za-z]{3}[\s-]?[0-9A-Za-z]{3}$")
# `link`, `/link` or `/link@bot` and whatever follows: a code as typed, spaces and dashes included.
_LINK_COMMAND = re.compile(r"^/?link(?:@\w+)?:?(?:\s+(.*))?$", re.IGNORECASE | re.DOTALL)


def link_command(text: str) -> str | None:
    """The code a link command carries, "" for the command alone, None for any other text. One
    parser for every surface: `link Q63 C6J 332`, `/link q63-c6j-332`, a code on its own (`bare_code`)."""
    text = text.strip()
    if command := _LINK_COMMAND.match(text):
        argument = (command[1] or "").strip()
        # One word (a code, maybe mistyped) or a code typed in parts; "link me to the article"
        # is a sentence, for the thread.
        if len(argument.split()) <= 1 or len(normalise_code(argument)) == CODE_LENGTH:
            return argument
        return None
    if _BARE_CODE.match(text) and looks_like_code(text) and (any(c.isdigit() for c in text) or text.isupper()):
        return text
    return None


def bare_code(text: str) -> bool:
    """Whether a text `link_command` read a code from is that code alone, with no `link` before it."""
    return _LINK_COMMAND.match(text.strip()) is None


def six_digits(typed: str) -> str | None:
    """Six digits as a phone may type them (a keyboard's own digits, `٠٤٢٩١٧`, read as `042917`), or None."""
    if len(typed) != 6 or not typed.isdecimal():
        return None
    return "".join(str(unicodedata.decimal(digit)) for digit in typed)


def confirmed_link(text: str) -> tuple[str, str] | None:
    """`link CODE 123456`: the code and the six digits its answer sent to the number, or None. The
    digits typed against the code (`link CODE123456`) are told apart by the code's fixed length."""
    if (command := _LINK_COMMAND.match(text.strip())) and command[1]:
        code, _, typed = command[1].strip().rpartition(" ")
        if not code and len(glued := re.sub(r"[\s-]", "", typed)) == CODE_LENGTH + 6:
            code, typed = glued[:CODE_LENGTH], glued[CODE_LENGTH:]
        if (digits := six_digits(typed)) and looks_like_code(code):
            return code, digits
    return None


def retry_said(phrases: Phrases, retry_at: datetime | None) -> str:
    """When an identity past its wrong codes may try again, as an answer says it."""
    if retry_at is None:
        return phrases.say("link.retry_in_an_hour")
    return phrases.say("link.retry_at", time=f"{retry_at.astimezone(UTC):%H:%M}")


def mask_account(email: str | None, phone: str | None) -> str:
    """A web account as a chat may name it to the person: `j•••@example.com`, `•••1234`."""
    if email and "@" in email:
        name, _, domain = email.partition("@")
        return f"{name[:1]}•••@{domain}"
    if phone:
        return "•••" + phone[-4:]
    return ""


def code_hash(code: str) -> str:
    return hashlib.sha256(normalise_code(code).encode()).hexdigest()


def mask(surface: Surface, value: str) -> str:
    """Enough of a chat id or number to recognise it, not enough to use it (its surface's rule)."""
    return rules(surface).mask(value)


@dataclass(frozen=True)
class LinkCode:
    code: str
    expires_at: datetime
    telegram_url: str | None
    whatsapp_text: str

    def as_json(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "expires_at": self.expires_at.isoformat(),
            "telegram_url": self.telegram_url,
            "whatsapp_text": self.whatsapp_text,
        }


@dataclass(frozen=True)
class LinkedIdentity:
    surface: Surface
    external_id: str
    linked_at: datetime

    def as_json(self) -> dict[str, Any]:
        return {
            "surface": self.surface.value,
            "external_id": mask(self.surface, self.external_id),
            "linked_at": self.linked_at.isoformat(),
        }


class LinkStatus(StrEnum):
    LINKED = "linked"
    ALREADY_LINKED = "already_linked"
    INVALID = "invalid"
    EXPIRED = "expired"
    USED = "used"
    TOO_MANY_ATTEMPTS = "too_many_attempts"
    LINKED_ELSEWHERE = "linked_elsewhere"
    NEEDS_CONSENT = "needs_consent"  # a chat with history: it asks before anything moves
    # a sender its platform does not vouch for (an SMS's caller ID): the holder types back six digits
    NEEDS_CONFIRMATION = "needs_confirmation"


@dataclass(frozen=True)
class LinkOutcome:
    status: LinkStatus
    user_id: UUID | None = None
    moved_messages: int = 0
    retry_at: datetime | None = None
    account: str = ""  # the code's web account, masked
    messages: int = 0  # NEEDS_CONSENT: the chat's messages that would join that account
    language: str | None = None  # the identity's person's, as remembered once it is done
    confirmation: str | None = None  # NEEDS_CONFIRMATION: the six digits, sent to the identity only

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> LinkOutcome:
        return cls(
            status=LinkStatus(row["status"]),
            user_id=UUID(row["user_id"]) if row.get("user_id") else None,
            moved_messages=int(row.get("moved_messages") or 0),
            retry_at=datetime.fromisoformat(row["retry_at"]) if row.get("retry_at") else None,
            account=str(row.get("account") or ""),
            messages=int(row.get("messages") or 0),
            language=row.get("language") or None,
            confirmation=row.get("confirmation") or None,
        )


@dataclass(frozen=True)
class LinkRequest:
    """`/start CODE`, `/link CODE` or `link CODE` from a Telegram chat or WhatsApp number."""

    surface: Surface
    sender_id: str
    code: str
    # Typed by the person (`/link CODE`, `link CODE`, a button they tapped): their consent. A deep
    # link's `/start CODE` is one tap on a link anyone can make: not consent for a chat's history.
    consented: bool = True
    # `link CODE 123456`: the six digits this code's answer sent to a number its platform does not
    # vouch for (SMS), typed back by its holder.
    confirmation: str | None = None
    # A code alone, no `link` before it: it may be a message of the thread (an order number), and
    # is one when no code has it (docs/design.md, Identity).
    bare: bool = False
    # The platform's id of the message that carried it (a Telegram update_id, a Twilio MessageSid):
    # a redelivery of that message counts as one wrong code, not another (links.sql's link_attempts).
    delivery: str | None = None
    also_known_as: str | None = None  # the same sender's other id (a WhatsApp number beside its BSUID)


@dataclass(frozen=True)
class UnlinkRequest:
    surface: Surface
    sender_id: str
    also_known_as: str | None = None  # the same sender's other id (a WhatsApp number beside its BSUID)


@dataclass(frozen=True)
class LinkAnswer:
    """What to tell the chat, in `language`; `confirm_code`: offer to confirm linking with this
    code (a button, labelled in the same language)."""

    text: str
    language: str
    confirm_code: str | None = None
    for_the_thread: bool = False  # a bare code no code has: no command, a message of the thread


# The phrase (core/phrases/*.toml) that answers each outcome.
ANSWERS = {
    LinkStatus.LINKED: "link.linked",
    LinkStatus.ALREADY_LINKED: "link.already_linked",
    LinkStatus.INVALID: "link.invalid",
    LinkStatus.EXPIRED: "link.expired",
    LinkStatus.USED: "link.used",
    LinkStatus.TOO_MANY_ATTEMPTS: "link.too_many_attempts",
    LinkStatus.LINKED_ELSEWHERE: "link.linked_elsewhere",
    LinkStatus.NEEDS_CONSENT: "link.needs_consent",
    LinkStatus.NEEDS_CONFIRMATION: "link.needs_confirmation",
}


class Linking:
    def __init__(
        self,
        store: MemoryStore,
        identity: IdentityPolicy,
        *,
        ttl_minutes: int = 10,
        attempts_per_hour: int = 5,
        telegram_bot_username: str | None = None,
        stranger_reply: str = "",
        catalogue: Catalogue | None = None,
    ) -> None:
        self._store = store
        self._catalogue = catalogue or Catalogue()
        self._identity = identity
        self._remembered = RememberedLanguage(store, identity)
        self._ttl_minutes = ttl_minutes
        self._attempts_per_hour = attempts_per_hour
        self._bot_username = telegram_bot_username
        self._stranger_reply = stranger_reply

    # The web's side: a signed-in person.

    def new_code(self, user_id: UUID, account: str = "") -> LinkCode:
        """A code for the person; `account` names their web account (masked) to the chat that uses it."""
        self.refuse_under_owner()
        code = new_code()
        row = self._store.call(
            "create_link_code",
            {
                "p_user_id": str(user_id),
                "p_code_hash": code_hash(code),
                "p_ttl_minutes": self._ttl_minutes,
                "p_account": account,
            },
        )
        telegram_url = f"https://t.me/{self._bot_username}?start={code}" if self._bot_username else None
        return LinkCode(code, datetime.fromisoformat(row["expires_at"]), telegram_url, f"link {code}")

    def identities(self, user_id: UUID) -> list[LinkedIdentity]:
        rows = self._store.call("list_identities", {"p_user_id": str(user_id)})
        return [
            LinkedIdentity(Surface(row["surface"]), str(row["external_id"]), datetime.fromisoformat(row["linked_at"]))
            for row in rows
        ]

    def unlink_surface(self, user_id: UUID, surface: Surface) -> int:
        self.refuse_under_owner()
        if not surface.is_secondary:
            linkable = " and ".join(each.value for each in Surface if each.is_secondary)
            raise InputError(f"only {linkable} can be unlinked")
        row = self._store.call(
            "unlink_identities", {"p_surface": surface.value, "p_user_id": str(user_id), "p_external_id": None}
        )
        return int(row["unlinked"])

    # The other apps' side: a chat or number that sent a command.

    def answer(self, request: LinkRequest | UnlinkRequest, stated: str | None = None, text: str = "") -> LinkAnswer:
        """What to tell the person who sent the command (it is never part of the thread), in their
        language: `stated` by the request, else as remembered (the command's SQL function answers
        it), else the words of `text`, else DEFAULT_LANGUAGE."""
        language = self._catalogue.choose(stated, text)
        if self._identity.mode == "owner":
            if isinstance(request, LinkRequest) and request.bare:
                return LinkAnswer("", language, for_the_thread=True)  # no linking here: nothing to take it for
            known = self._identity.resolve(request.surface, request.sender_id) is not None
            if not known:
                return LinkAnswer(
                    self._stranger_reply or self._catalogue.phrases(language).say("turn.stranger"), language
                )
            if not self._catalogue.has(stated):
                remembered = self._remembered.of(request.surface, request.sender_id)
                language = self._catalogue.choose(stated, text, remembered=remembered)
            return LinkAnswer(self._catalogue.phrases(language).say("link.not_needed"), language)
        key = identity_key(request.surface, request.sender_id)
        try:
            if isinstance(request, UnlinkRequest):
                return self._unlinked(request, key, stated, text)
            if not request.code:
                example = rules(request.surface).command("link ABC234XYZ")
                return LinkAnswer(self._catalogue.phrases(language).say("link.no_code", example=example), language)
            outcome = self.redeem(
                request.surface,
                key,
                request.code,
                consented=request.consented,
                confirmation=request.confirmation,
                delivery=request.delivery,
                also_known_as=request.also_known_as,
            )
        except StoreUnavailable:
            return LinkAnswer(self._catalogue.phrases(language).say("link.unavailable"), language)
        language = self._catalogue.choose(stated, text, remembered=outcome.language)
        if request.bare and outcome.status in (LinkStatus.INVALID, LinkStatus.TOO_MANY_ATTEMPTS):
            # No code has it (or it could not be tried): counted as a wrong code all the same, so
            # guessing stays bounded, and answered as what the person wrote.
            return LinkAnswer("", language, for_the_thread=True)
        phrases = self._catalogue.phrases(language)
        retry = retry_said(phrases, outcome.retry_at)
        unlink = rules(request.surface).send_command("unlink", phrases.say("link.send_unlink"))
        code = normalise_code(request.code)
        # Unnamed, an account asking a number to confirm is not "yours": a forger's may name nothing.
        unnamed = "link.unnamed_account" if outcome.status is LinkStatus.NEEDS_CONFIRMATION else "link.unknown_account"
        phrase = ANSWERS[outcome.status]
        if outcome.status is LinkStatus.NEEDS_CONSENT and outcome.messages == 0:
            phrase = "link.needs_consent_memory"  # what a purge of its messages left: no count to say
        answer = phrases.say(
            phrase,
            retry=retry,
            unlink=unlink,
            account=outcome.account or phrases.say(unnamed),
            messages=phrases.count("count.messages", outcome.messages),
            code=code,
            confirm=rules(request.surface).command(f"link {code} {outcome.confirmation}"),
        )
        return LinkAnswer(answer, language, code if outcome.status is LinkStatus.NEEDS_CONSENT else None)

    def _unlinked(self, request: UnlinkRequest, key: str, stated: str | None, text: str) -> LinkAnswer:
        """`/unlink` (its number beside a BSUID too), answered in the language of the person the
        chat was theirs, as remembered before it left them: the sender's own identity's only, never
        the number's (a number can have changed hands; turn.sql's rule for the number beside a BSUID)."""
        unlinked, remembered, waiting = self._unlink(request.surface, key)
        if request.also_known_as:
            also, _, also_waiting = self._unlink(request.surface, identity_key(request.surface, request.also_known_as))
            unlinked, waiting = unlinked + also, waiting + also_waiting
        language = self._catalogue.choose(stated, text, remembered=remembered)
        phrases = self._catalogue.phrases(language)
        if not unlinked:
            return LinkAnswer(phrases.say("link.not_linked"), language)
        answer = phrases.say("link.unlinked")
        if waiting:  # promised in this chat, and said to nobody unless it is linked again in time
            pending = phrases.count("count.follow_ups", waiting)
            answer += " " + phrases.say("link.unlinked_follow_ups", follow_ups=pending)
        return LinkAnswer(answer, language)

    def redeem(
        self,
        surface: Surface,
        identity_id: str,
        code: str,
        *,
        consented: bool = True,
        confirmation: str | None = None,
        delivery: str | None = None,
        also_known_as: str | None = None,
    ) -> LinkOutcome:
        row = self._store.call(
            "redeem_link_code",
            {
                "p_surface": surface.value,
                "p_external_id": identity_id,
                "p_code_hash": code_hash(code),
                "p_max_attempts": self._attempts_per_hour,
                "p_consented": consented,
                "p_vouched_for": rules(surface).sender_vouched_for,
                "p_confirmation": confirmation,
                "p_delivery": delivery,
                "p_sender_alias": identity_key(surface, also_known_as) if also_known_as else None,
            },
        )
        return LinkOutcome.from_row(row)

    # The operator's side.

    def link(self, user_id: UUID, surface: Surface, identity_id: str) -> LinkOutcome:
        self.refuse_under_owner()  # the owner's apps are their lists: a linked chat would still be a stranger
        row = self._store.call(
            "link_identity",
            {
                "p_user_id": str(user_id),
                "p_surface": surface.value,
                "p_external_id": identity_key(surface, identity_id),
            },
        )
        return LinkOutcome.from_row(row)

    def unlink(self, surface: Surface, identity_id: str) -> int:
        return self._unlink(surface, identity_id)[0]

    def _unlink(self, surface: Surface, identity_id: str) -> tuple[int, str | None, int]:
        """How many identities were unlinked, the language of the person they were theirs, and how
        many of that person's pending follow-ups were asked from it."""
        row = self._store.call(
            "unlink_identities",
            {"p_surface": surface.value, "p_user_id": None, "p_external_id": identity_key(surface, identity_id)},
        )
        return int(row["unlinked"]), row.get("language") or None, int(row.get("follow_ups") or 0)

    def refuse_under_owner(self) -> None:
        if self._identity.mode == "owner":
            raise LinkingNotNeeded(
                "IDENTITY_POLICY=owner: this assistant serves one person, whose apps are configured "
                "(the OWNER_* settings, one for each app); there is nothing to link"
            )
