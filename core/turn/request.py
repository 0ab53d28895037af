"""What a turn is asked and what it answers: the request a surface makes, the channel a reply goes
out through, the outcome, the figures of its log line, and the settings a turn reads.
core/turn/turns.py runs it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Protocol, runtime_checkable
from uuid import UUID

from core.media.kinds import MediaRef
from core.model.llm import Usage
from core.models import PlatformMessage, SaidFirst, Sent, Surface
from core.phrases.catalogue import Catalogue, Phrases
from core.turn.context import ContextItem as ContextItem  # a web client's history: part of the request

if TYPE_CHECKING:
    from core.turn.capabilities import Capability


class ReplyChannel(Protocol):
    """How a surface that pushes its replies (Telegram's Bot API) reaches the person.

    `until` is the moment the turn's attempt must have sent by, on the turn's clock (the
    monotonic one): past it the message may be owed and answered by someone else (core/turn/owed.py),
    so nothing a channel does (typing, drafts, a 429's wait, an HTTP timeout, the send itself)
    runs past it. A reply that cannot go out by then is not sent: `send` answers OWED."""

    def show_typing(self, until: float) -> None: ...

    def draft(self, text: str) -> None:
        """The reply so far, as the model writes it (a preview; never stored)."""
        ...

    def send(self, text: str, until: float, first_part: int = 0) -> Sent:
        """Deliver the text by `until`, from its part `first_part` (the ones before it went out
        earlier: a stored reply's `unsent_from`); whether it arrived, and if not, whether it is
        still owed and from which part."""
        ...


@runtime_checkable
class StopButton(Protocol):
    """A `ReplyChannel` whose person can stop the reply while it is written (Telegram's drafts,
    Bot API 10.3: core/turn/stopped_generation.py)."""

    def stopped(self) -> str | None:
        """The text the person was shown when they stopped the reply; None while they have not."""
        ...

    @property
    def checks(self) -> int:
        """How often the channel asked the database whether they stopped it: a round trip each."""
        ...

    def stopped_before(self) -> bool:
        """Whether the person stopped this reply before this attempt began: an earlier attempt was
        writing it, and died. One round trip, asked only by an attempt that takes an owed message
        over; False when the database cannot say."""
        ...


@runtime_checkable
class CarriesShortReplies(Protocol):
    """A `ReplyChannel` whose caller answers a text that `carries` inside its HTTP response (Telegram's
    webhook answer, TELEGRAM_REPLY_IN_WEBHOOK) and pushes a longer one. Whether that response
    arrived cannot be known: a redelivery repeats a reply it carried, as a surface without a channel
    does, and sends only the rest of one it pushed, as a pushing surface does."""

    def carries(self, text: str) -> bool: ...


@dataclass(frozen=True)
class TurnRequest:
    surface: Surface
    text: str
    external_id: str | None
    sender_id: str | None = None
    sender_alias: str | None = None  # the same sender's other id (a WhatsApp number beside a BSUID)
    user_id: UUID | None = None
    conversation_id: UUID | None = None
    client_history: Sequence[ContextItem] | None = None
    # A client that cannot shorten the history it sends (useChat posts its whole thread): past
    # MAX_HISTORY_CHARS its window's start moves on (core/turn/context.py's client_window), not a 413.
    history_fits: bool = False
    # The client's history is its page's whole thread as shown (a new message's send; not the thread
    # before an edit, which drops what followed): what another app said in that thread since the
    # page's newest stored message, never shown there, is read after it (core/turn/context.py's web_items).
    history_is_page: bool = False
    deadline_s: float = 30.0
    media: tuple[MediaRef, ...] = ()  # photos, PDFs, voice notes; `text` is then their caption
    timezone: str | None = None  # the web client's (Intl), the person's when it differs, not over one they stated
    platform: PlatformMessage | None = None  # the platform's name for it, and what it replies to
    # A surface that answers in its HTTP response to a platform that stops waiting (Twilio: 15 s):
    # how long after the turn's start the response is still taken. Past it the reply is not given
    # (nor stored): the attempt ends and the message is owed (core/turn/owed.py answers it).
    reply_within_s: float | None = None
    # A surface that answers in its response, with room for only so many messages (Twilio's 10 a
    # TwiML answer): how many of the held follow-ups said first fit beside a reply of this text. The
    # rest are left to the follow-up job in the round trip that ends the turn (core/turn/turns.py).
    first_room: Callable[[str, Sequence[SaidFirst]], int] | None = None
    # The language the request states (a BCP 47 tag: Telegram's language_code, the web's
    # navigator.language; None: it states none), first of the fixed phrases' rule (core/phrases/).
    language: str | None = None


class Outcome(StrEnum):
    ANSWERED = "answered"
    FALLBACK = "fallback"
    DUPLICATE = "duplicate"
    REDELIVERED = "redelivered"
    REFUSED = "refused"
    # The model declined the turn (its stop reason `refusal`): a fixed answer says so, stored with the
    # message, both left out of every later context (docs/decisions.md).
    DECLINED = "declined"
    # The web client went away mid-stream: what the model spent is counted, the message is owed.
    ABANDONED = "abandoned"
    # Media that could not be used (too large, unreadable, no transcription): a fixed answer, no model.
    MEDIA_REFUSED = "media_refused"
    # The person stopped the reply as it was written (Telegram's stop button): what they were shown
    # is the reply, sent and stored; what the model spent is counted.
    STOPPED = "stopped"
    # From a chat or number that opted out (an SMS number's STOP: Twilio refuses every send to it
    # until START, error 21610): stored, no model asked, nothing reserved, nothing said.
    OPTED_OUT = "opted_out"


@dataclass
class TurnFigures:
    latency_ms: float = 0.0
    round_trips: int = 0
    model_requests: int = 0  # an answer, then one more for each round of tool results it needed
    tool_calls: int = 0  # the model's calls of its tools that ran (none past the last round)
    tool_errors: int = 0  # of those, the ones said back as not done (a refusal, a failure, no time)
    input_tokens: int = 0
    output_tokens: int = 0
    cache_creation_tokens: int = 0
    cache_read_tokens: int = 0
    media_tokens: int = 0  # the description of a photo or PDF (core/media/turn_media.py)
    reserved_tokens: int = 0  # what begin_turn reserved of TOKENS_PER_DAY, settled to model_tokens
    context_messages: int = 0
    degraded: bool = False
    owed: bool = False  # this turn answered a message an earlier attempt left unanswered
    ended: bool = False  # finish_turn or end_attempt was asked: the attempt is never ended twice
    error: str | None = None

    @property
    def model_tokens(self) -> int:
        """Every token the model read or wrote for this turn: what the person's daily budget counts."""
        answer = self.input_tokens + self.output_tokens + self.cache_creation_tokens + self.cache_read_tokens
        return answer + self.media_tokens

    def add_usage(self, usage: Usage) -> None:
        self.input_tokens = usage.input_tokens
        self.output_tokens = usage.output_tokens
        self.cache_creation_tokens = usage.cache_creation_input_tokens
        self.cache_read_tokens = usage.cache_read_input_tokens


@dataclass
class TurnResult:
    outcome: Outcome
    reply: str | None
    user_id: UUID | None = None
    conversation_id: UUID | None = None
    message_id: int | None = None
    reply_id: int | None = None
    figures: TurnFigures = field(default_factory=TurnFigures)
    # A stored reply that could not be pushed for a reason that may pass, or a message handed over
    # unanswered because the attempt's time ran out: the surface should ask for a redelivery,
    # which sends the stored reply, or answers the message (unless the scheduled job has).
    reply_owed: bool = False
    # Follow-ups held outside WhatsApp's window, said (and stored) before this reply: a surface
    # that answers in its response puts them first.
    follow_ups_first: list[SaidFirst] = field(default_factory=list)
    # The follow-ups this turn's reply was stored with ({"content", "due_at", "timezone"}): the web
    # stream tells the page, which can show them without asking.
    follow_ups_scheduled: list[dict[str, str]] = field(default_factory=list)
    # The reply answers a turn the model declined (Outcome.DECLINED, or that answer sent again): a
    # web client keeps the mark, and its history then leaves the turn out.
    declined: bool = False


@dataclass(frozen=True)
class TurnSettings:
    system_prompt: str
    # FALLBACK_REPLY and STRANGER_REPLY: set, they are said in every language; empty, the
    # catalogue's phrase in the turn's language (docs/decisions.md).
    fallback_reply: str
    stranger_reply: str
    annotate: bool = True
    timezone: str = "UTC"
    memory_notes: bool = True  # MEMORY_NOTES: send the person's notes with each turn
    # What the agent can do (core/turn/capabilities.py): their tools go with every turn, in this order.
    capabilities: tuple[Capability, ...] = ()
    tool_rounds: int = 4  # TOOL_ROUNDS: rounds of tool calls a turn runs before it must answer
    catalogue: Catalogue = field(default_factory=Catalogue)

    def phrases(self, language: str | None) -> Phrases:
        return self.catalogue.phrases(language)

    def fallback(self, language: str | None, kept: bool = True) -> str:
        """What a person waiting is told when the model fails; `kept`: their message is stored (and
        so answered later). Not kept (the database away), the person is asked to send it again:
        nothing will answer it."""
        return self.fallback_reply or self.phrases(language).say("turn.fallback" if kept else "turn.fallback_not_kept")

    def declined(self, language: str | None) -> str:
        """What a person is told when the model declines their turn (its stop reason `refusal`)."""
        return self.phrases(language).say("turn.declined")

    def stranger(self, language: str | None) -> str:
        """What a sender the identity policy turns away is told."""
        return self.stranger_reply or self.phrases(language).say("turn.stranger")
