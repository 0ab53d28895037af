"""All configuration, from environment variables (and `.env`), read once by `functions/`.

core never reads the environment, nor this module: `functions/runtime.py` builds one `Settings`
and hands the pieces to the objects that need them, so every setting's default lives here only.
Secrets are `SecretStr`, so they never print in a log line or a traceback. A setting that does not
parse is held back: whoever reads it is told which and why (`InvalidSetting`), never its value,
and nothing else is stopped by it (docs/configuration.md: "A wrong setting stops only what reads it").

A setting of one surface (or of a few) says so where it is declared, `setting_of(Surface.SMS)`:
which deployed functions read it follows from that mark (functions/function_settings.py),
so a new surface's settings are placed here, beside their defaults, and nowhere else.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal
from urllib.parse import urlsplit
from uuid import UUID
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import AfterValidator, BeforeValidator, Field, PrivateAttr, SecretStr, ValidationError, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from core.errors import InvalidSetting
from core.memory.retention import MAX_AGE_DAYS
from core.model.llm import Thinking
from core.model.prompt import DEFAULT_PERSONA
from core.surfaces.adapter import Surface


def comma_separated(value: object) -> object:
    """An environment value as its comma-separated parts, blanks dropped; a list as it is."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


# Split by its type, wherever it is declared: a new surface's owners' list needs no other line.
CommaList = Annotated[list[str], NoDecode, BeforeValidator(comma_separated)]


def http_url(value: str | None) -> str | None:
    """A base URL the SDKs and httpx will call: http or https, a host, a port that is a number
    (httpx met `http://localhost:80x81` at the first call, a 500 on every delivery)."""
    try:
        parts = urlsplit(value or "")
        valid = parts.scheme in ("http", "https") and bool(parts.hostname) and (parts.port or 0) >= 0
    except ValueError:  # a port that is no number, an unclosed IPv6 bracket
        valid = False
    if value is not None and not valid:
        raise ValueError("not an http(s) URL with a host")
    return value


HttpUrl = AfterValidator(http_url)


def time_zone(value: str) -> str:
    """An IANA time zone the turns and the digest will load (`Europe/Pari` was a 500 on every request)."""
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError, OSError):  # OSError: a folder of zones ("America")
        raise ValueError("no IANA time zone of that name") from None
    return value


def whatsapp_sender(value: str | None) -> str | None:
    """The sender of the messages the agent starts, as Twilio takes it: a From without `whatsapp:`
    is an SMS number, which Twilio refuses beside a WhatsApp To (error 21910), every owed reply
    and reminder lost while the turns' own answers (in the TwiML) still went out."""
    if value is not None and not value.startswith("whatsapp:"):
        raise ValueError("a WhatsApp sender is written whatsapp:+NUMBER")
    return value


def sms_sender(value: str | None) -> str | None:
    """The sender of the SMS the agent starts: a WhatsApp sender (the value copied from
    TWILIO_WHATSAPP_FROM) beside an SMS To is refused by Twilio, every owed reply and reminder lost."""
    if value is not None and value.startswith("whatsapp:"):
        raise ValueError("an SMS sender is a number (+14155238886), not a WhatsApp sender")
    return value


def telegram_user_ids(value: list[str]) -> list[str]:
    """Telegram's ids of people, which updates carry: a username (`@advisor`) matched no update,
    and the owner it was meant for was a stranger to their own bot, with nothing said."""
    if not all(user.isascii() and user.isdigit() for user in value):
        raise ValueError("each is a Telegram user id, digits (getUpdates' from.id), not a username")
    return value


NOT_ORIGINS = (
    "each is * or an origin as a browser sends it: https://HOST[:PORT], no path, no trailing /, "
    "lowercase, no default port, an ASCII host"
)
DEFAULT_PORTS = {"http": 80, "https": 443}


def browser_origins(value: list[str]) -> list[str]:
    """Origins as a browser's `Origin` header gives them, which is all they are compared with: one
    with a path or a trailing / (`https://app.example.com/`), no scheme, a capital, the scheme's
    default port (`:443`) or a host not in punycode never matched, and every request of the
    frontend failed CORS with nothing said here."""
    for origin in value:
        if origin == "*":
            continue
        try:
            parts = urlsplit(origin)
            port = parts.port
        except ValueError:  # a port that is no number
            raise ValueError(NOT_ORIGINS) from None
        host = parts.hostname or ""  # lowercased, as the scheme is
        shown = f"[{host}]" if ":" in host else host
        kept = "" if port in (None, DEFAULT_PORTS.get(parts.scheme)) else f":{port}"
        # an app's own scheme too (capacitor://localhost)
        if not (host and host.isascii() and origin == f"{parts.scheme}://{shown}{kept}"):
            raise ValueError(NOT_ORIGINS)
    return value


class ReadBy(Enum):
    """Which deployed functions read a surface's setting."""

    ITS_FUNCTION = "its function"  # the surface's own: its webhook, or web_chat
    # ... and the scheduled job, which reaches every surface (owed replies, follow-ups, a purge's
    # window of turns in flight): how this deployment reaches the surface (its SurfaceAdapter).
    ITS_FUNCTION_AND_THE_JOB = "its function and the scheduled job"
    EVERY_FUNCTION = "every function"  # the identity policy's owners: any function may resolve a sender


@dataclass(frozen=True)
class SurfaceSetting:
    """The mark of a setting of these surfaces (in its `Annotated` type), and who reads it."""

    surfaces: frozenset[Surface]
    read_by: ReadBy


def setting_of(*surfaces: Surface, read_by: ReadBy = ReadBy.ITS_FUNCTION_AND_THE_JOB) -> SurfaceSetting:
    return SurfaceSetting(frozenset(surfaces), read_by)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_file=".env", extra="ignore", case_sensitive=False, env_ignore_empty=True)

    # Where this runs: `local` relaxes nothing but the refusal to serve without secrets.
    app_env: Literal["local", "production"] = "production"
    port: int = Field(default=8080, ge=1, le=65535)

    # Storage: DATABASE_URL (psycopg), else SUPABASE_URL (PostgREST rpc), else embedded.
    database_url: SecretStr | None = None
    database_prepared_statements: bool = True
    database_connect_timeout: int = Field(default=2, ge=1)
    database_pool_size: int = Field(default=8, ge=1)
    supabase_url: Annotated[str | None, HttpUrl] = None
    supabase_service_role_key: SecretStr | None = None
    supabase_timeout: float = Field(default=5.0, gt=0)
    embedded_data_dir: Path | None = None  # the embedded Postgres's data: .local/pgdata when unset

    # Context rules.
    context_window_hours: int = Field(default=24, ge=1)
    context_max_messages: int = Field(default=40, ge=1)
    context_window_step: int = Field(default=24, ge=1)
    web_prepend_messages: int = Field(default=8, ge=0)
    context_annotations: bool = True
    context_timezone: Annotated[str, AfterValidator(time_zone)] = "UTC"
    max_message_chars: int = Field(default=16000, ge=1)
    max_history_chars: int | None = Field(default=None, ge=1)  # unset: 4 x MAX_MESSAGE_CHARS

    # A person's budget, across all their apps (0: no limit).
    turns_per_minute: int = Field(default=12, ge=0)
    turns_per_day: int = Field(default=300, ge=0)
    tokens_per_day: int = Field(default=2_000_000, ge=0)

    # Memory notes: what has left the window, condensed per person by the digest job.
    memory_notes: bool = True
    memory_notes_max_tokens: int = Field(default=800, ge=50, le=8000)
    # The current Haiku (Haiku 4.5 is legacy since 7 Oct 2026): adaptive thinking like Sonnet 5.5,
    # so its max_tokens leaves thinking room above the notes' budget, at `low` effort.
    anthropic_digest_model: str = "claude-haiku-5-5"
    anthropic_digest_effort: Literal["low", "medium", "high", "xhigh", "max"] | None = "low"
    digest_secret: SecretStr | None = None
    digest_batch_size: int = Field(default=10, ge=1)
    digest_time_budget: float = Field(default=240.0, gt=0)
    digest_pause_seconds: int = Field(default=300, ge=0)  # the prompt cache's lifetime
    # Memory search (core/memory/search.py): the search_memory tool over everything the person
    # ever said, and the most a search may add to the model's request, in tokens (about 4
    # characters each), hits with their neighbours, best first.
    memory_search: bool = True
    search_max_tokens: int = Field(default=1500, ge=100, le=20000)
    search_max_hits: int = Field(default=8, ge=1, le=50)

    # Follow-ups the agent starts (core/follow_ups/capability.py): at most this many pending per person; 0
    # gives the model no follow-up tools. 20 is a dense week of reminders (about three a day),
    # keeps the list begin_turn returns short, and bounds what a runaway conversation schedules.
    follow_ups_per_person: int = Field(default=20, ge=0, le=1000)

    # The model's tools (core/turn/tool_loop.py): rounds of tool calls a turn runs (a search, then a
    # narrower one, then a list...) before the model must answer without tools. Each round is one
    # more model request, and a turn reserves its tokens for every one of them.
    tool_rounds: int = Field(default=4, ge=1, le=20)
    # Tools an operator adds without editing core: comma-separated `package.module:callable`
    # (core/turn/operator_tools.py says what a callable carries; docs/extending.md has an example).
    extra_tools: CommaList = []

    # Who may talk to the agent.
    identity_policy: Literal["owner", "auto"] = "auto"
    owner_user_id: UUID | None = None
    owner_telegram_ids: Annotated[
        CommaList, setting_of(Surface.TELEGRAM, read_by=ReadBy.EVERY_FUNCTION), AfterValidator(telegram_user_ids)
    ] = []
    owner_whatsapp_numbers: Annotated[CommaList, setting_of(Surface.WHATSAPP, read_by=ReadBy.EVERY_FUNCTION)] = []
    owner_sms_numbers: Annotated[CommaList, setting_of(Surface.SMS, read_by=ReadBy.EVERY_FUNCTION)] = []
    link_code_ttl_minutes: int = Field(default=10, ge=1, le=1440)
    link_attempts_per_hour: int = Field(default=5, ge=0)

    # Retention: `crossmem purge` without --older-than deletes messages older than this (0: never).
    message_retention_days: int = Field(default=0, ge=0, le=MAX_AGE_DAYS)
    purge_batch: int = Field(default=5000, ge=1)

    # The model.
    anthropic_api_key: SecretStr | None = None
    anthropic_base_url: Annotated[str | None, HttpUrl] = None
    # Anthropic's current Sonnet (models overview and its migration guide, read 2026): adaptive
    # thinking is on by default, and max_tokens bounds thinking and reply together, so it leaves
    # room for both; `low` effort keeps a chat turn inside the surfaces' deadlines (12 s on WhatsApp).
    anthropic_model: str = "claude-sonnet-5-5"
    anthropic_max_tokens: int = Field(default=4096, ge=1)
    anthropic_effort: Literal["low", "medium", "high", "xhigh", "max"] | None = "low"
    # The turn's thinking (docs/decisions.md, "Thinking between tool calls"): between_tools (Sonnet
    # 5.5: no up-front thinking, and a note before a tool call reaches the person) or adaptive (the
    # models' default; a model whose capabilities lack between_tools needs it: crossmem doctor).
    anthropic_thinking: Thinking = "between_tools"
    anthropic_timeout: float = Field(default=30.0, gt=0)
    anthropic_max_retries: int = Field(default=2, ge=0)
    # Outside APP_ENV=local, no ANTHROPIC_API_KEY means refusing to serve, unless this says the
    # offline stand-in is wanted (a demo deployment).
    allow_offline_model: bool = False
    # The persona only: the parts of the capabilities that are on follow it (core/model/prompt.py).
    system_prompt: str = DEFAULT_PERSONA
    fallback_reply: str = ""  # empty: core/phrases/'s, in the person's language; set: in every language
    stranger_reply: str = ""  # the same
    default_language: str = "en"  # the fixed phrases' when a turn names no language we have a file for

    # Telegram. The bot's username is every function's: linking answers with its deep link.
    telegram_bot_token: Annotated[SecretStr | None, setting_of(Surface.TELEGRAM)] = None
    telegram_webhook_secret: Annotated[SecretStr | None, setting_of(Surface.TELEGRAM, read_by=ReadBy.ITS_FUNCTION)] = (
        None
    )
    telegram_api_base: Annotated[str, setting_of(Surface.TELEGRAM), HttpUrl] = "https://api.telegram.org"
    telegram_bot_username: str | None = None
    telegram_reply_in_webhook: Annotated[bool, setting_of(Surface.TELEGRAM, read_by=ReadBy.ITS_FUNCTION)] = False
    # Stream the reply as it is written (sendMessageDraft).
    telegram_drafts: Annotated[bool, setting_of(Surface.TELEGRAM, read_by=ReadBy.ITS_FUNCTION)] = True
    telegram_model_deadline: Annotated[float, setting_of(Surface.TELEGRAM)] = Field(default=25.0, gt=0)

    # Owed replies: the scheduled job answers Telegram and WhatsApp messages left unanswered
    # (an instance died mid-turn) while they are younger than this many minutes (0: never).
    owed_reply_max_age: int = Field(default=10, ge=0, le=1440)
    # How many times the job asks the model for one owed message before it sends the fallback
    # instead (stored, so the message is no longer owed): a message the model never answers in time
    # costs a bounded number of calls, and gets an answer.
    owed_reply_max_tries: int = Field(default=3, ge=1, le=20)

    # WhatsApp through Twilio (the account, its token and its REST API are SMS's too).
    twilio_account_sid: Annotated[str | None, setting_of(Surface.WHATSAPP, Surface.SMS)] = None
    # The sender of messages the agent starts: whatsapp:+14155238886.
    twilio_whatsapp_from: Annotated[str | None, setting_of(Surface.WHATSAPP), AfterValidator(whatsapp_sender)] = None
    # Twilio's REST API (tests point it at a fake).
    twilio_api_base: Annotated[str | None, setting_of(Surface.WHATSAPP, Surface.SMS), HttpUrl] = None
    # An approved WhatsApp template (Content API, HX...) with one variable, {{1}}: the follow-up's
    # text. Outside the 24-hour window a follow-up goes out through it (the scheduled job); unset,
    # it waits for the person's next WhatsApp message, which the tool scheduling it says (the turn).
    twilio_follow_up_content_sid: Annotated[str | None, setting_of(Surface.WHATSAPP)] = None
    # "typing…" on WhatsApp while a turn runs (needs TWILIO_ACCOUNT_SID); it marks the message read.
    whatsapp_typing_indicator: Annotated[bool, setting_of(Surface.WHATSAPP, read_by=ReadBy.ITS_FUNCTION)] = True
    twilio_auth_token: Annotated[SecretStr | None, setting_of(Surface.WHATSAPP, Surface.SMS)] = None
    twilio_webhook_shared_key: Annotated[
        SecretStr | None, setting_of(Surface.WHATSAPP, Surface.SMS, read_by=ReadBy.ITS_FUNCTION)
    ] = None
    public_base_url: Annotated[
        str | None, setting_of(Surface.WHATSAPP, Surface.SMS, read_by=ReadBy.ITS_FUNCTION), HttpUrl
    ] = None
    whatsapp_model_deadline: Annotated[float, setting_of(Surface.WHATSAPP)] = Field(default=12.0, gt=0)

    # SMS through Twilio (the account, token and shared key above).
    # The number of messages the agent starts: +14155238886.
    twilio_sms_from: Annotated[str | None, setting_of(Surface.SMS), AfterValidator(sms_sender)] = None
    sms_model_deadline: Annotated[float, setting_of(Surface.SMS)] = Field(default=12.0, gt=0)

    # Voice notes, photos and documents (docs/media.md): limits, and the transcription service.
    media_max_items: int = Field(default=4, ge=1, le=10)
    image_max_bytes: int = Field(default=3_750_000, ge=1, le=3_750_000)  # Claude: 5 MB of base64
    pdf_max_bytes: int = Field(default=10_000_000, ge=1, le=20_000_000)  # Telegram serves bots 20 MB
    pdf_max_pages: int = Field(default=30, ge=1, le=100)  # Claude reads at most 100
    voice_max_seconds: int = Field(default=120, ge=1, le=600)
    voice_seconds_per_day: int = Field(default=1800, ge=0)  # a person's transcribed voice a day; 0: no limit
    media_fetch_timeout: float = Field(default=5.0, gt=0)
    deepgram_api_key: SecretStr | None = None  # unset: voice notes get a polite answer, not a transcript
    deepgram_api_base: Annotated[str, HttpUrl] = "https://api.deepgram.com"
    deepgram_model: str = "nova-3"
    transcription_timeout: float = Field(default=8.0, gt=0)
    media_descriptions: bool = True  # a small model (ANTHROPIC_DIGEST_MODEL) describes photos and PDFs

    # Web.
    supabase_jwt_secret: Annotated[SecretStr | None, setting_of(Surface.WEB, read_by=ReadBy.ITS_FUNCTION)] = None
    supabase_jwks_url: Annotated[str | None, setting_of(Surface.WEB, read_by=ReadBy.ITS_FUNCTION), HttpUrl] = None
    cors_origins: Annotated[
        CommaList, setting_of(Surface.WEB, read_by=ReadBy.ITS_FUNCTION), AfterValidator(browser_origins)
    ] = []
    web_model_deadline: Annotated[float, setting_of(Surface.WEB)] = Field(default=60.0, gt=0)
    # POST /conversations: web conversations never written in a person may hold (0: no limit).
    empty_conversations_per_person: Annotated[int, setting_of(Surface.WEB, read_by=ReadBy.ITS_FUNCTION)] = Field(
        default=20, ge=0
    )

    @model_validator(mode="after")
    def consistent(self) -> Settings:
        if self.context_window_step > self.context_max_messages:
            raise ValueError("CONTEXT_WINDOW_STEP must not exceed CONTEXT_MAX_MESSAGES")
        if self.anthropic_thinking == "between_tools" and self.anthropic_effort in ("xhigh", "max"):
            raise ValueError("ANTHROPIC_THINKING=between_tools takes ANTHROPIC_EFFORT low, medium or high")
        return self

    # The settings that did not parse, each with what is wrong: held back (see from_environment).
    _invalid: dict[str, str] = PrivateAttr(default_factory=dict)

    @classmethod
    def from_environment(cls) -> Settings:
        """The settings. One that does not parse is held back, with what is wrong and never its value:
        reading it raises InvalidSetting (a ConfigurationError) naming it, and so does `require_valid`
        of any list of settings that holds it, so a function refuses only for the settings it reads.
        A problem of no one setting (CONTEXT_WINDOW_STEP above CONTEXT_MAX_MESSAGES) is every
        reader's: raised here."""
        try:
            return cls()
        except ValidationError as exc:
            invalid = problems(exc)
        if "" in invalid:
            raise InvalidSetting(refusal(invalid))
        # Read again with each invalid one at its default, then dropped: never a default in its place.
        defaults = {name: cls.model_fields[name].get_default(call_default_factory=True) for name in invalid}
        try:
            config = cls(**defaults)
        except ValidationError as exc:
            raise InvalidSetting(refusal({**invalid, **problems(exc)})) from None
        for name in invalid:
            del config.__dict__[name]
        config._invalid = invalid
        return config

    def require_valid(self, names: Iterable[str] | None = None) -> None:
        """InvalidSetting naming each of these settings (every setting: None) that did not parse."""
        wanted = type(self).model_fields if names is None else set(names)
        if wrong := {name: problem for name, problem in self._invalid.items() if name in wanted}:
            raise InvalidSetting(refusal(wrong))

    if not TYPE_CHECKING:  # as pydantic's own: mypy still sees every field, and no other name

        def __getattr__(self, name: str) -> Any:
            if name in type(self).model_fields and name in self._invalid:
                self.require_valid([name])
            return super().__getattr__(name)

    @classmethod
    def defaults(cls) -> Settings:
        """Every setting at its default, without reading the environment (tests, benchmarks)."""
        return cls.model_construct()

    @property
    def is_local(self) -> bool:
        return self.app_env == "local"

    @property
    def history_chars_limit(self) -> int:
        """The most characters of history a web client may send (as much as the context uses)."""
        return self.max_history_chars or 4 * self.max_message_chars

    @property
    def telegram_bot_id(self) -> int | None:
        """The bot's own user id: the digits before the colon of its token."""
        if self.telegram_bot_token is None:
            return None
        head = self.telegram_bot_token.get_secret_value().split(":", 1)[0]
        return int(head) if head.isdigit() else None


def problems(error: ValidationError) -> dict[str, str]:
    """Each invalid setting's field name ("" for a rule of several) -> what is wrong, its name first
    and never its value: `TWILIO_API_BASE: Value error, not an http(s) URL with a host`."""
    found: dict[str, str] = {}
    for item in error.errors(include_input=False, include_url=False):
        where = ".".join(str(part) for part in item["loc"]).upper()
        said = f"{where}: {item['msg']}" if where else str(item["msg"]).removeprefix("Value error, ")
        name = str(item["loc"][0]) if item["loc"] else ""
        found[name] = f"{found[name]}; {said}" if name in found else said
    return found


def refusal(invalid: Mapping[str, str]) -> str:
    return "invalid configuration: " + "; ".join(invalid.values())
