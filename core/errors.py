"""The one error hierarchy of crossmem; `functions/http.py` maps it to HTTP answers.

CrossmemError
├── InputError            the caller sent something we cannot take (4xx)
│   ├── EmptyMessage
│   ├── MessageTooLong
│   ├── HistoryTooLong    the web client's history, as much as the context would use of it
│   ├── DateOutOfRange    a date the context cannot show in its time zone
│   └── BodyTooLarge
├── NotFound              no such conversation for this person (404)
├── AuthError             no valid credentials (401)
├── AuthUnavailable       the sign-in provider's keys could not be fetched to check them
├── Forbidden             valid credentials of someone this deployment does not serve (403)
├── Conflict              the request does not fit the deployment's state (409)
│   ├── LinkingNotNeeded
│   ├── KeyOfAnotherConversation  a web message's id that names a message of another conversation
│   └── StillAnswering    a delivery whose attempt may still answer: ask again later
├── OverBudget            the person is past their turns or tokens for now (429)
├── StoreUnavailable      the database failed or could not be reached
├── ModelUnavailable      the model failed, answered nonsense or passed its deadline
│   └── ModelDeclined     its safety classifiers declined the turn (stop reason `refusal`)
├── DeliveryFailed        a surface's API refused a reply or could not be reached
├── MediaUnreadable       a photo, PDF or voice note that could not be fetched, read or transcribed
└── ConfigurationError    invalid or missing settings (503)
    └── InvalidSetting    a setting that does not parse, said to whoever reads it
"""

from datetime import UTC, datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from zoneinfo import ZoneInfo


class CrossmemError(Exception):
    """Base of every error crossmem raises on purpose."""


class InputError(CrossmemError):
    """Bad input from a person or a client."""


class EmptyMessage(InputError):
    def __init__(self) -> None:
        super().__init__("the message is empty")


class MessageTooLong(InputError):
    def __init__(self, length: int, limit: int) -> None:
        super().__init__(f"the message has {length} characters; the limit is {limit}")
        self.length = length
        self.limit = limit


class HistoryTooLong(InputError):
    def __init__(self, length: int, limit: int) -> None:
        super().__init__(f"the history the context would use has {length} characters; the limit is {limit}")
        self.length = length
        self.limit = limit


class DateOutOfRange(InputError):
    def __init__(self, value: datetime) -> None:
        super().__init__(f"the date {value.isoformat()} cannot be shown in the context's time zone")


class UnsupportedBodyType(InputError):
    """A body of another type than the one its receiver reads (JSON, a form)."""

    def __init__(self, expected: str) -> None:
        super().__init__(f"the body must be {expected}")


class BodyTooLarge(InputError):
    def __init__(self, limit: int, advice: str = "") -> None:
        super().__init__(f"the request body is larger than {limit} bytes" + (f": {advice}" if advice else ""))


class NotFound(CrossmemError):
    """A conversation that does not exist or belongs to someone else (never told apart)."""


class AuthError(CrossmemError):
    """Missing, expired or invalid credentials."""


class AuthUnavailable(CrossmemError):
    """Credentials that could not be checked: the project's JWKS unreachable (a failure of ours,
    not the caller's: their token may well be valid)."""


class Forbidden(CrossmemError):
    """A valid token of a person this deployment does not serve (owner policy: not the owner)."""


class Conflict(CrossmemError):
    """A request that cannot apply here, whoever sends it."""


class LinkingNotNeeded(Conflict):
    """Linking under IDENTITY_POLICY=owner: the owner's apps are configured, not linked."""


class TooManyEmptyConversations(Conflict):
    """A new web conversation while the person holds EMPTY_CONVERSATIONS_PER_PERSON never written in."""

    def __init__(self, most: int) -> None:
        super().__init__(
            f"you already have {most} conversations you have not written in: write in one of them, or delete"
            " one, before starting another"
        )
        self.most = most


class KeyOfAnotherConversation(Conflict):
    """A web message's id (its idempotency key) that names the person's message in another
    conversation, or one they deleted: one id is one message of the person's, whichever
    conversation a request names."""

    def __init__(self) -> None:
        super().__init__(
            "this message id is another message of yours (in another conversation, or one you deleted):"
            " give each message an id of its own across conversations (useChat's generateId does)"
        )


class StillAnswering(Conflict):
    """The same delivery again (a retry, a redelivery) while its first attempt may still answer.
    After `retry_after_s` that attempt can no longer answer and the delivery answers it."""

    def __init__(self, retry_after_s: int) -> None:
        super().__init__(f"this message is still being answered; ask again in {retry_after_s} seconds")
        self.retry_after_s = retry_after_s


class OverBudget(CrossmemError):
    """A person past their budget of turns or tokens: no model call, nothing stored. The
    message is the polite answer, saying when they can write again."""

    def __init__(
        self, until: datetime, now: datetime, language: str | None = None, timezone: str | None = None
    ) -> None:
        self.until = until
        self.now = now  # the chat surfaces say it in the person's language: core/phrases/refusals.py
        self.language = language  # the person's, as remembered (person_languages), when known
        self.timezone = timezone  # the person's (person_timezones), when known: the chat surfaces' clock
        wait_s = (until - now).total_seconds()
        self.wait_s = max(int(wait_s) + 1, 1)  # whole seconds, never short of `until`
        if wait_s < 120:
            when = f"in {self.wait_s} seconds"
        else:
            # Named: a page may be open in another zone than the person's.
            local, another_day, zone = self.on_their_clock()
            day = "tomorrow " if another_day else ""
            when = f"{day}after {local:%H:%M} ({zone})" if zone else f"{day}after {local:%H:%M} UTC"
        super().__init__(f"You've written a lot in a short time, so I'm taking a pause. You can write again {when}.")

    def on_their_clock(self) -> tuple[datetime, bool, str | None]:
        """`until` on the person's clock when they have one (else UTC's), whether that is another day
        there than `now`, and their zone's name (None: UTC's clock): how every surface says the pause."""
        zone = _zone(self.timezone)
        local = self.until.astimezone(zone or UTC)
        return local, local.date() != self.now.astimezone(zone or UTC).date(), zone.key if zone else None


def _zone(name: str | None) -> "ZoneInfo | None":
    """The IANA zone of that name, or None (core/follow_ups/wall_clock.py's zone_named)."""
    # Imported here: zoneinfo loads sysconfig, which the records (core/models.py) need not.
    from core.follow_ups.wall_clock import zone_named

    return zone_named(name)


class StoreUnavailable(CrossmemError):
    """The memory store could not answer.

    `final`: the database answered with an error asking again cannot change (a bad argument, a
    function's own refusal: a bug of ours), not a connection lost or a database busy or away."""

    def __init__(self, message: str, *, final: bool = False) -> None:
        super().__init__(message)
        self.final = final


class ModelUnavailable(CrossmemError):
    """The model could not give an answer in time. `usage`: what a whole answer that was no answer
    (a refusal, no text) reported spending (core/model/llm.py's Usage), which still counts."""

    usage: object = None


class ModelDeclined(ModelUnavailable):
    """The model declined the turn (its stop reason `refusal`): asking again with the same context
    is declined again, so the person's turn answers it (core/turn/turns.py) and leaves it out of
    every later context; elsewhere (the digest, a photo's description) it is a failure as any.
    `category`: the policy area Anthropic names (`stop_details.category`), when it names one."""

    def __init__(self, category: str | None = None) -> None:
        super().__init__(f"the model declined to answer ({category or 'no category'})")
        self.category = category


class DeliveryFailed(CrossmemError):
    """A surface's API (Telegram's Bot API) refused a reply or could not be reached.

    `final`: retrying cannot help (the person blocked the bot, the chat is gone).
    `retry_after_s`: how long the API asked us to wait (429), when it said."""

    def __init__(self, message: str, *, final: bool = False, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.final = final
        self.retry_after_s = retry_after_s


class MediaUnreadable(CrossmemError):
    """Media we could not use; the message says why ("larger than 3.8 MB", "the download
    failed"), never a URL or a token: it is what the thread keeps, which the person reads in their
    history and the model in later turns, so in words a person understands (never a status code
    or a service's fault: those are the log line's, where it is raised). The person's answer says
    `phrase` (core/phrases/*.toml's `media.reason` table) filled with `values`, in their language."""

    def __init__(self, message: str, phrase: str = "unusable", **values: object) -> None:
        super().__init__(message)
        self.phrase = phrase
        self.values = values


class ConfigurationError(CrossmemError):
    """Invalid settings. The message names the variables, never their values."""


class InvalidSetting(ConfigurationError):
    """Settings that do not parse (functions/settings.py holds each back): raised to whoever reads
    one, never turned into a degraded answer (a store that "could not be set up")."""
