"""The per-instance cache: settings and clients, each built on first use and then kept,
so a warm instance reuses its database connections and SDK clients.

This is the only module-level state of the project. `reset()` drops it (tests, CLI). An
instance serves THREADS requests at once (serverless.yml's `concurrency`), and a new one is sent
a burst's first requests together: each client is built by one of them while the others wait
(`built_once`), never once by each (a store each is a pool of connections nobody closes).
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Hashable, Iterable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from core.channels.telegram_bot import TelegramBot, TelegramChannel
from core.errors import ConfigurationError, InvalidSetting
from core.follow_ups.capability import FollowUpRules, FollowUps
from core.follow_ups.delivery import FollowUpDelivery
from core.follow_ups.outside_thread import MessagesOutsideThread
from core.identity.linking import Linking
from core.identity.opt_outs import OptOuts
from core.identity.policy import IdentityPolicy
from core.identity.remembered_language import RememberedLanguage
from core.media.capability import Media
from core.media.kinds import MediaLimits
from core.media.turn_media import MediaReader
from core.memory.digest import DigestJob, DigestLimits, ExtractiveDigester, ModelDigester
from core.memory.edits import Corrections
from core.memory.export import Export
from core.memory.forgetting import Forgetting
from core.memory.retention import Retention, in_flight_window
from core.memory.search import MemorySearch, SearchRules
from core.memory.service import ContextLimits, Memory, TurnBudget
from core.model.llm import AnthropicModel, Model, Thinking
from core.model.offline_model import OfflineModel
from core.models import Sent, Surface
from core.phrases.catalogue import Catalogue
from core.stores.embedded import REPOSITORY, current_embedded_database
from core.stores.postgres_store import PostgresStore
from core.stores.store import MemoryStore, UnavailableStore
from core.surfaces import Registry, SayFollowUp, SurfaceAdapter, Surfaces, not_pushed, registry
from core.surfaces import sms as sms_surface
from core.surfaces import telegram as telegram_surface
from core.surfaces import web as web_surface
from core.surfaces import whatsapp as whatsapp_surface
from core.surfaces.commands import Commands
from core.turn.capabilities import Capability, checked, standing_instructions
from core.turn.owed import OwedReplies
from core.turn.request import TurnSettings
from core.turn.turns import Turns
from functions.extra_tools import extra_tools
from functions.logs import configure_json_logging
from functions.settings import Settings

if TYPE_CHECKING:
    from core.channels.media_fetch import MediaSource
    from core.channels.whatsapp import TwilioSignatures, WhatsAppSender
    from core.identity.web_auth import TokenVerifier
    from core.model.transcription import Transcriber
    from core.turn.request import ReplyChannel

EMBEDDED_DATA = REPOSITORY / ".local" / "pgdata"
log = logging.getLogger("crossmem.runtime")
# The digest's model thinks (adaptively) before it writes: max_tokens bounds both.
DIGEST_THINKING_TOKENS = 2048
DESCRIPTION_TOKENS = 300  # what a photo's or a PDF's description may say


T = TypeVar("T")
# One build at a time, on every thread of the instance: a builder calls others (turns: memory,
# store), so it is reentrant, and one lock for all of them can never be taken in two orders.
_BUILDING = threading.RLock()


class built_once(Generic[T]):  # noqa: N801 (a decorator, named as functools.cache is)
    """functools.cache, whose function runs once per arguments however many threads ask at once
    (functools.cache runs it for each thread that asks before the first build returns)."""

    def __init__(self, build: Callable[..., T]) -> None:
        self._cached = functools.cache(build)
        functools.update_wrapper(self, build)

    def __call__(self, *args: Hashable) -> T:
        with _BUILDING:
            return self._cached(*args)

    def cache_info(self) -> Any:
        return self._cached.cache_info()

    def cache_clear(self) -> None:
        with _BUILDING:
            self._cached.cache_clear()


def now() -> datetime:
    """The wall clock the follow-ups read ("tomorrow at 9", what is due): tests move it."""
    return datetime.now(UTC)


@built_once
def settings() -> Settings:
    configure_json_logging()
    return Settings.from_environment()


def store_kind(config: Settings) -> str:
    if config.database_url is not None:
        return "postgres"
    if config.supabase_url:
        return "supabase"
    return "embedded"


def check_can_serve(config: Settings, reads: Iterable[str] | None = None) -> None:
    """Refuse to serve while a setting the function reads (`reads`; every one when None) does not
    parse, naming each. And outside APP_ENV=local, refuse rather than degrade without a word: with
    no database a deployed function would reach for the embedded one (not installed there) and
    answer every turn without memory; with no model key the offline stand-in would answer
    real people."""
    config.require_valid(reads)
    if config.is_local:
        return
    if store_kind(config) == "embedded":
        raise ConfigurationError(
            "no database: set DATABASE_URL (on Supabase, the transaction pooler's URL) "
            "or SUPABASE_URL with SUPABASE_SERVICE_ROLE_KEY"
        )
    if store_kind(config) == "supabase" and config.supabase_service_role_key is None:
        raise ConfigurationError("SUPABASE_URL is set but SUPABASE_SERVICE_ROLE_KEY is not")
    if config.anthropic_api_key is None and not config.allow_offline_model:
        raise ConfigurationError(
            "no model: set ANTHROPIC_API_KEY, or ALLOW_OFFLINE_MODEL=true to answer with the offline stand-in"
        )


@built_once
def store() -> MemoryStore:
    config = settings()
    try:
        return build_store(config)
    except InvalidSetting:  # said as the setting it is (`crossmem history`), not as a store down
        raise
    except Exception as exc:  # any failure to set up: the instance still answers, without memory
        log.error("the memory store could not be set up", extra={"error": f"{type(exc).__name__}: {exc}"})
        return UnavailableStore(f"the memory store could not be set up: {type(exc).__name__}", exc)


def build_store(config: Settings) -> MemoryStore:
    kind = store_kind(config)
    if kind == "supabase":
        from core.stores.supabase_store import SupabaseStore

        if config.supabase_service_role_key is None:
            raise RuntimeError("SUPABASE_URL is set but SUPABASE_SERVICE_ROLE_KEY is not")
        assert config.supabase_url is not None
        key = config.supabase_service_role_key.get_secret_value()
        return SupabaseStore(config.supabase_url, key, timeout_s=config.supabase_timeout)
    if config.database_url is not None:
        url = config.database_url.get_secret_value()
    else:
        url = current_embedded_database(config.embedded_data_dir or EMBEDDED_DATA)
    return PostgresStore(
        url,
        connect_timeout_s=config.database_connect_timeout,
        prepared_statements=config.database_prepared_statements,
        max_connections=config.database_pool_size,
    )


@built_once
def memory() -> Memory:
    config = settings()
    return Memory(store(), context_limits(config), turn_budget(config))


def context_limits(config: Settings) -> ContextLimits:
    return ContextLimits(
        window_hours=config.context_window_hours,
        max_messages=config.context_max_messages,
        window_step=config.context_window_step,
        web_prepend=config.web_prepend_messages,
        max_message_chars=config.max_message_chars,
        max_history_chars=config.history_chars_limit,
    )


def turn_budget(config: Settings) -> TurnBudget:
    return TurnBudget(
        config.turns_per_minute, config.turns_per_day, config.tokens_per_day, reply_tokens=config.anthropic_max_tokens
    )


@built_once
def model() -> Model:
    config = settings()
    if config.anthropic_api_key is None:
        return OfflineModel()
    return claude(
        config,
        config.anthropic_model,
        config.anthropic_max_tokens,
        effort=config.anthropic_effort,
        thinking=config.anthropic_thinking,
    )


def claude(
    config: Settings,
    name: str,
    max_tokens: int,
    *,
    cached: bool = True,
    effort: str | None = None,
    thinking: Thinking = "adaptive",
) -> AnthropicModel:
    assert config.anthropic_api_key is not None
    return AnthropicModel(
        api_key=config.anthropic_api_key.get_secret_value(),
        model=name,
        max_tokens=max_tokens,
        base_url=config.anthropic_base_url,
        timeout_s=config.anthropic_timeout,
        max_retries=config.anthropic_max_retries,
        cached=cached,
        effort=effort,
        thinking=thinking,
    )


@built_once
def identity() -> IdentityPolicy:
    config = settings()
    # Each surface's list read when a sender of that surface is first resolved.
    owners = Registry({surface: functools.partial(owner_ids, surface) for surface in surfaces()})
    return IdentityPolicy(config.identity_policy, config.owner_user_id, owners)


def owner_ids(surface: Surface) -> frozenset[str]:
    return surfaces()[surface].owner_ids


@built_once
def surfaces() -> Surfaces:
    """Every surface as this deployment reaches it (core/surfaces/): the one registry the rest asks."""
    config = settings()
    return registry(
        {
            Surface.WEB: lambda: web(config),
            Surface.TELEGRAM: lambda: telegram(config),
            Surface.WHATSAPP: lambda: whatsapp(config),
            Surface.SMS: lambda: sms(config),
        }
    )


def web(config: Settings) -> SurfaceAdapter:
    return SurfaceAdapter(web_surface.Rules, config.web_model_deadline, inline_media, web_surface.say_follow_up)


def telegram(config: Settings) -> SurfaceAdapter:
    """Telegram: pushed through the Bot API when TELEGRAM_BOT_TOKEN is set (the bot built on the
    first push, not here: a turn that pushes nothing builds no client)."""
    say: SayFollowUp = not_pushed
    channel = None
    if config.telegram_bot_token is not None:
        say = telegram_surface.say_follow_up(
            lambda chat, text, part: telegram_bot().send_parts(chat, text, first_part=part)
        )
        channel = lambda sender: TelegramChannel(telegram_bot(), int(sender))  # noqa: E731
    return SurfaceAdapter(
        telegram_surface.Rules,
        config.telegram_model_deadline,
        telegram_files,
        say,
        frozenset(telegram_surface.Rules.key(sender) for sender in config.owner_telegram_ids),
        channel,
    )


def whatsapp(config: Settings) -> SurfaceAdapter:
    """WhatsApp: pushed through Twilio's Messages API when the account and TWILIO_WHATSAPP_FROM
    are set (twilio imported on the first push: a Telegram invocation never imports it), which
    whatsapp_webhook needs outside APP_ENV=local, as sms_webhook its own."""
    send_parts = template = channel = None
    later_needs: str | None = "TWILIO_ACCOUNT_SID and TWILIO_WHATSAPP_FROM"
    if config.twilio_whatsapp_from and whatsapp_configured(config):
        send_parts = lambda to, text, part: twilio_sender().send_parts(to, text, first_part=part)  # noqa: E731
        channel = lambda to: twilio_sender().channel(to)  # noqa: E731
        template = lambda to, text, part: follow_up_template(config, to, text, part)  # noqa: E731
        later_needs = None
    return SurfaceAdapter(
        whatsapp_surface.Rules,
        config.whatsapp_model_deadline,
        twilio_media,
        whatsapp_surface.say_follow_up(send_parts, template),
        frozenset(whatsapp_surface.Rules.key(sender) for sender in config.owner_whatsapp_numbers),
        channel,
        later_needs,
        None if config.twilio_follow_up_content_sid else whatsapp_surface.WHATSAPP_WINDOW,
        # with a template too: inside the window a reminder goes free-form; ones held before it was set go
        off_thread=lambda sender, let_go: outside_thread(Surface.WHATSAPP).record(sender, let_go),
    )


def capabilities(config: Settings) -> tuple[Capability, ...]:
    """What this deployment's agent can do, as its settings switch it, in the prompt's order:
    each says its part of the prompt (what it can, or cannot, do) and brings its tools."""
    search = None
    if config.memory_search:
        search = SearchRules(
            config.search_max_tokens, config.search_max_hits, config.message_retention_days, config.memory_notes
        )
    built_in = (
        Media(),
        FollowUps(
            FollowUpRules(
                max_pending=config.follow_ups_per_person,
                max_chars=config.max_message_chars,
                # the turn's surface only, built when a follow-up is scheduled there
                said_within=lambda surface: surfaces()[surface].said_within,
                reaches=lambda surface, sender, owner, person: identity().reaches(surface, sender, owner, person),
            )
        ),
        MemorySearch(search),
    )
    taken = {definition["name"] for capability in built_in for definition in capability.definitions}
    # EXTRA_TOOLS: the operator's own (docs/extending.md), refused where one would shadow a built-in
    return checked((*built_in, extra_tools(config.extra_tools, taken)))


@built_once
def turns() -> Turns:
    config = settings()
    able = capabilities(config)
    return Turns(
        memory(),
        model,
        identity(),
        TurnSettings(
            system_prompt=standing_instructions(config.system_prompt, able, tagged=config.context_annotations),
            fallback_reply=config.fallback_reply,
            stranger_reply=config.stranger_reply,
            annotate=config.context_annotations,
            timezone=config.context_timezone,
            memory_notes=config.memory_notes,
            capabilities=able,
            tool_rounds=config.tool_rounds,
            catalogue=catalogue(),
        ),
        media=media_reader,  # built on the first photo, PDF or voice note
        now=lambda: now(),
    )


@built_once
def media_reader() -> MediaReader:
    """Photos, PDFs and voice notes: each app's files, the transcriber and the describer, each
    built on the first message that needs it (a text turn builds none of them)."""
    config = settings()
    return MediaReader(
        {surface: functools.partial(media_source, surface) for surface in surfaces()},
        transcriber,
        describer,
        media_limits(config),
        fetch_timeout_s=config.media_fetch_timeout,
        transcription_timeout_s=config.transcription_timeout,
    )


def media_limits(config: Settings) -> MediaLimits:
    return MediaLimits(
        max_items=config.media_max_items,
        image_max_bytes=config.image_max_bytes,
        pdf_max_bytes=config.pdf_max_bytes,
        pdf_max_pages=config.pdf_max_pages,
        voice_max_seconds=config.voice_max_seconds,
        voice_seconds_per_day=config.voice_seconds_per_day,
    )


def media_source(surface: Surface) -> MediaSource:
    return surfaces()[surface].media()


@built_once
def telegram_files() -> MediaSource:
    from core.channels.media_fetch import TelegramFiles

    config = settings()
    token = config.telegram_bot_token.get_secret_value() if config.telegram_bot_token else ""
    return TelegramFiles(token, config.telegram_api_base)


@built_once
def twilio_media() -> MediaSource:
    from core.channels.media_fetch import TwilioMedia

    config = settings()
    token = config.twilio_auth_token.get_secret_value() if config.twilio_auth_token else ""
    return TwilioMedia(config.twilio_account_sid, token, config.twilio_api_base)


@built_once
def inline_media() -> MediaSource:
    from core.channels.media_fetch import InlineMedia

    return InlineMedia()


@built_once
def transcriber() -> Transcriber | None:
    """Deepgram when DEEPGRAM_API_KEY is set; else none (voice notes get a polite answer)."""
    config = settings()
    if config.deepgram_api_key is None:
        return None
    from core.model.transcription import DeepgramTranscriber

    return DeepgramTranscriber(
        config.deepgram_api_key.get_secret_value(), config.deepgram_model, config.deepgram_api_base
    )


@built_once
def describer() -> Model | None:
    """The small model that describes photos and PDFs for the memory (none offline)."""
    config = settings()
    if config.anthropic_api_key is None or not config.media_descriptions:
        return None
    # Haiku 5.5 thinks by default, and its thinking counts toward max_tokens: 300 alone could end
    # after a thinking block with no description (docs/research/model-changes-2026.md, 3.5).
    room = DESCRIPTION_TOKENS + DIGEST_THINKING_TOKENS
    return claude(config, config.anthropic_digest_model, room, cached=False, effort=config.anthropic_digest_effort)


@built_once
def digest_job() -> DigestJob:
    """The memory digest: ANTHROPIC_DIGEST_MODEL with a key, else the offline extractive notes."""
    from zoneinfo import ZoneInfo

    config = settings()
    zone = ZoneInfo(config.context_timezone)
    limits = digest_limits(config)
    if config.anthropic_api_key is None:
        return DigestJob(store(), ExtractiveDigester(config.memory_notes_max_tokens, zone), limits)
    room = config.memory_notes_max_tokens + DIGEST_THINKING_TOKENS
    writer = claude(config, config.anthropic_digest_model, room, cached=False, effort=config.anthropic_digest_effort)
    digester = ModelDigester(writer, config.memory_notes_max_tokens, config.anthropic_timeout, zone)
    return DigestJob(store(), digester, limits)


def digest_limits(config: Settings) -> DigestLimits:
    return DigestLimits(
        max_messages=config.context_max_messages,
        window_step=config.context_window_step,
        window_hours=config.context_window_hours,
        batch_size=config.digest_batch_size,
        time_budget_s=config.digest_time_budget,
        idle_s=config.digest_pause_seconds,
    )


@built_once
def owed_replies() -> OwedReplies:
    """The scheduled job's answers to owed messages, on the surfaces it can reach."""
    config = settings()
    channels = {surface: adapter.reply_channel for surface, adapter in surfaces().items() if adapter.reply_channel}
    deadlines = {surface: adapter.deadline_s for surface, adapter in surfaces().items()}
    # Nobody waits on the job: a try's deadline is up to half the run's share of DIGEST_TIME_BUDGET
    # (functions/digest.py: 120 s of 240), which the function's timeout (serverless.yml: 300 s) is above.
    return OwedReplies(
        memory(),
        turns(),
        channels,
        deadlines,
        max_age_s=config.owed_reply_max_age * 60,
        max_tries=config.owed_reply_max_tries,
    )


@built_once
def outside_thread(surface: Surface) -> MessagesOutsideThread:
    """A surface's messages that are no turn, as the follow-ups see them (WhatsApp's window)."""
    return MessagesOutsideThread(store(), identity(), surface)


@built_once
def opt_outs() -> OptOuts:
    """The chats and numbers that opted out (SMS's STOP), heard from the webhook or a refused send."""
    return OptOuts(store(), identity(), now=lambda: now())


@built_once
def follow_up_delivery() -> FollowUpDelivery:
    """The scheduled job's delivery of due follow-ups, on the apps it can reach."""
    return FollowUpDelivery(store(), surfaces(), identity(), now=lambda: now(), catalogue=catalogue())


def sms(config: Settings) -> SurfaceAdapter:
    """SMS: replies in the webhook's TwiML; owed replies and follow-ups through Twilio's Messages
    API from TWILIO_SMS_FROM, which with the account sms_webhook needs outside APP_ENV=local."""
    say: SayFollowUp = not_pushed
    channel = None
    later_needs: str | None = "TWILIO_ACCOUNT_SID and TWILIO_SMS_FROM"
    if config.twilio_sms_from and whatsapp_configured(config):
        say = sms_surface.say_follow_up(lambda to, text, part: sms_sender().send_parts(to, text, first_part=part))
        channel, later_needs = sms_channel, None
    return SurfaceAdapter(
        sms_surface.Rules,
        config.sms_model_deadline,
        twilio_media,
        say,
        frozenset(sms_surface.Rules.key(sender) for sender in config.owner_sms_numbers),
        channel,
        later_needs,
    )


def webhook_surface(surface: Surface) -> SurfaceAdapter:
    """A surface's adapter for its webhook, which refuses to serve (ConfigurationError) outside
    APP_ENV=local where this deployment lacks what saying anything later there needs (`later_needs`):
    it would answer now, and never send what it owes or what the agent promised (a reminder)."""
    adapter = surfaces()[surface]
    if adapter.later_needs and not settings().is_local:
        raise ConfigurationError(f"set {adapter.later_needs}: nothing could be sent later")
    return adapter


@built_once
def sms_sender() -> WhatsAppSender:
    """Twilio's Messages API from the SMS number (the same client as WhatsApp's, another sender)."""
    from core.channels.whatsapp import WhatsAppSender  # twilio: only the functions that reach Twilio

    config = settings()
    assert config.twilio_account_sid and config.twilio_auth_token is not None and config.twilio_sms_from
    token = config.twilio_auth_token.get_secret_value()
    return WhatsAppSender(
        config.twilio_account_sid,
        token,
        config.twilio_sms_from,
        sms_surface.SMS_LIMIT,
        config.twilio_api_base,
        sms=sms_surface.Rules.carried_as_sms,
        # a number Twilio refused as opted out (21610): its STOP may have come while we were down
        opted_out=lambda to: opt_outs().heard(Surface.SMS, to, True),
    )


def sms_channel(to: str) -> ReplyChannel:
    from core.channels.whatsapp import WhatsAppChannel

    return WhatsAppChannel(sms_sender(), to)  # a number as Twilio's SMS takes it: +14155550123


def follow_up_template(config: Settings, to: str, text: str, first_part: int) -> Sent | None:
    """A follow-up outside WhatsApp's 24-hour window through TWILIO_FOLLOW_UP_CONTENT_SID (a template
    message a part, from `first_part`), read here (only the scheduled job has it); None without one."""
    if (content_sid := config.twilio_follow_up_content_sid) is None:
        return None
    return twilio_sender().send_parts(to, text, first_part=first_part, content_sid=content_sid)


def whatsapp_configured(config: Settings) -> bool:
    return bool(config.twilio_account_sid) and config.twilio_auth_token is not None


def twilio_sender() -> WhatsAppSender:
    """Twilio's REST API, where the settings have already said it is configured."""
    sender = whatsapp_sender()
    if sender is None:
        raise ConfigurationError("TWILIO_ACCOUNT_SID and TWILIO_AUTH_TOKEN are not set")
    return sender


@built_once
def whatsapp_sender() -> WhatsAppSender | None:
    """Twilio's REST API for this account (owed replies, typing indicators), when configured."""
    config = settings()
    if not config.twilio_account_sid or config.twilio_auth_token is None:
        return None
    from core.channels.whatsapp import WhatsAppSender  # twilio: only the functions that reach WhatsApp

    return WhatsAppSender(
        config.twilio_account_sid,
        config.twilio_auth_token.get_secret_value(),
        config.twilio_whatsapp_from or "",
        whatsapp_surface.WHATSAPP_LIMIT,
        config.twilio_api_base,
    )


@built_once
def refusals_logged() -> set[str]:
    """The reasons this instance has logged for refusing to serve: each once, not once a request
    (anyone who can reach an unconfigured function could otherwise fill the error log)."""
    return set()


@built_once
def twilio_signatures() -> TwilioSignatures:
    """Twilio's webhooks' signature check, which logs this instance's first refusal."""
    from core.channels.whatsapp import TwilioSignatures  # twilio: only the functions Twilio calls

    return TwilioSignatures()


@built_once
def linking() -> Linking:
    config = settings()
    return Linking(
        store(),
        identity(),
        ttl_minutes=config.link_code_ttl_minutes,
        attempts_per_hour=config.link_attempts_per_hour,
        telegram_bot_username=config.telegram_bot_username,
        stranger_reply=config.stranger_reply,
        catalogue=catalogue(),
    )


@built_once
def catalogue() -> Catalogue:
    """The fixed phrases in every language (core/phrases/), each file read when first needed."""
    return Catalogue(settings().default_language)


@built_once
def commands() -> Commands:
    """The chat commands' one router (core/surfaces/commands.py)."""
    return Commands(linking(), forgetting())


@built_once
def remembered_language() -> RememberedLanguage:
    """The person's remembered language, for what is answered without a turn (a command, a notice)."""
    return RememberedLanguage(store(), identity())


@built_once
def corrections() -> Corrections:
    """Edited messages (core/memory/edits.py)."""
    return Corrections(memory(), identity())


@built_once
def forgetting() -> Forgetting:
    config = settings()
    return Forgetting(
        store(),
        identity(),
        stranger_reply=config.stranger_reply,
        catalogue=catalogue(),
        attempts_per_hour=config.link_attempts_per_hour,
    )


@built_once
def export() -> Export:
    return Export(store(), now)


@built_once
def retention() -> Retention:
    config = settings()
    deadlines = (adapter.deadline_s for adapter in surfaces().values())
    return Retention(store(), batch_size=config.purge_batch, in_flight=in_flight_window(*deadlines))


@built_once
def telegram_bot() -> TelegramBot:
    config = settings()
    if config.telegram_bot_token is None:
        raise RuntimeError("TELEGRAM_BOT_TOKEN is not set")
    return TelegramBot(config.telegram_bot_token.get_secret_value(), config.telegram_api_base)


@built_once
def token_verifier() -> TokenVerifier:
    from core.identity.web_auth import TokenVerifier  # PyJWT and cryptography: only the web pays for them

    config = settings()
    secret = config.supabase_jwt_secret.get_secret_value() if config.supabase_jwt_secret else None
    return TokenVerifier(hs256_secret=secret, jwks_url=config.supabase_jwks_url)


_CACHED = (
    settings,
    store,
    memory,
    model,
    identity,
    surfaces,
    turns,
    linking,
    catalogue,
    commands,
    remembered_language,
    corrections,
    forgetting,
    export,
    retention,
    telegram_bot,
    token_verifier,
    digest_job,
    owed_replies,
    follow_up_delivery,
    outside_thread,
    opt_outs,
    whatsapp_sender,
    sms_sender,
    refusals_logged,
    twilio_signatures,
    media_reader,
    telegram_files,
    twilio_media,
    inline_media,
    transcriber,
    describer,
)


def reset() -> None:
    """Forget every client, as a new instance would: the next call builds them again."""
    if store.cache_info().currsize:
        store().close()
    if telegram_bot.cache_info().currsize:
        telegram_bot().close()
    for client in (telegram_files, twilio_media, transcriber):
        if client.cache_info().currsize and (built := client()) is not None:
            close = getattr(built, "close", None)
            if close is not None:
                close()
    for cached in _CACHED:
        cached.cache_clear()
