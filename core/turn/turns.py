"""One turn, the same on every surface: who is writing, what they said, what to answer.

    resolve the person -> begin_turn (1 round trip) -> skip the model on a redelivery
    -> the model within the surface's deadline -> send -> finish_turn (1 round trip)

Failure policy (DESIGN.md): the context cannot be loaded -> answer without history; the
model fails or passes its deadline -> a short fallback answer, the person's message
stays stored and the fallback is not; the reply cannot be stored -> it still goes out.
One JSON log line per turn with its figures.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

from core.errors import ModelDeclined, ModelUnavailable, StillAnswering
from core.follow_ups.said_first import HeldFirst, Room, with_room
from core.follow_ups.wall_clock import zone_named
from core.identity.policy import IdentityPolicy
from core.media.kinds import placeholder, unread_notice
from core.media.listening import Listening
from core.media.turn_media import MediaReader, PreparedMedia, remembered_content
from core.memory.service import Memory, OwedMessage, TurnEstimate, storable
from core.model.llm import Model, ModelReply, Usage, approximate_tokens
from core.models import Delivery, Person, Role, SaidFirst, Sent, StoredMessage, Surface, TurnStart
from core.phrases.language import language_tag
from core.turn import tool_loop
from core.turn.capabilities import TurnState, prompt_for, turn_clock
from core.turn.context import (
    ContextItem,
    ModelMessage,
    build_model_messages,
    client_window,
    merged_into_last,
    web_items,
)
from core.turn.estimate import answer_ceiling, owed_estimate, turn_estimate
from core.turn.request import (
    CarriesShortReplies,
    Outcome,
    ReplyChannel,
    StopButton,
    TurnFigures,
    TurnRequest,
    TurnResult,
    TurnSettings,
)
from core.turn.tool_loop import Toolbox

log = logging.getLogger("crossmem.turn")
# How long past its model deadline a turn's attempt may still store a reply (sending it, the
# second round trip): after it, a message without a reply is owed.
ANSWER_MARGIN_S = 10.0
# Of that margin, what storing the reply is left: an attempt's reply goes out by its answer_by
# less this, or not at all (the message is handed over), so that no reply is stored, nor any
# sent, once the message may be someone else's to answer.
STORE_MARGIN_S = 2.0
# A reply that goes in the caller's own response (the web's stream, WhatsApp's TwiML): delivered
# as far as the turn can know (the platform's retry of an answer it did not get is a redelivery).
IN_THE_RESPONSE = Sent(Delivery.DELIVERED, 1)


def told_unread(
    items: Sequence[ContextItem | StoredMessage], message_ids: Collection[int | None]
) -> list[ContextItem | StoredMessage]:
    """`items` with each stored message of `message_ids` (an owed one taken over, and the earlier
    ones the last turn merged with it) followed by what the model is told of its media no attempt
    read: their bytes were never stored, so an answer given without them does not pretend to have
    seen them (docs/media.md)."""
    told: list[ContextItem | StoredMessage] = list(items)
    for at, item in enumerate(told):
        notice = unread_notice(item.content) if item.id is not None and item.id in message_ids else None
        if notice is not None:
            told[at] = ContextItem(item.role, f"{item.content}\n{notice}", item.surface, item.created_at, item.id)
    return told


class Turns:
    def __init__(
        self,
        memory: Memory,
        model: Callable[[], Model],
        identity: IdentityPolicy,
        settings: TurnSettings,
        clock: Callable[[], float] = time.monotonic,
        media: Callable[[], MediaReader] | None = None,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.memory = memory
        self._media = media
        self._now = now
        self._model = model
        self._identity = identity
        self._settings = settings
        self._zone = ZoneInfo(settings.timezone)
        self._clock = clock
        self._executor = ThreadPoolExecutor(max_workers=16, thread_name_prefix="model")
        self._held = HeldFirst(settings.phrases, now, self._zone)

    @property
    def identity(self) -> IdentityPolicy:
        """Who is served: what the scheduled job checks a chat or number against before it speaks."""
        return self._identity

    def run(self, request: TurnRequest, channel: ReplyChannel | None = None) -> TurnResult:
        """A whole turn. With a channel the reply is sent through it; without one the
        caller answers with `result.reply` in its response."""
        began = self._clock()
        until = self._send_by(began, request.deadline_s)  # begin_turn's answer_by is later than this
        if channel is None:
            # The caller answers in its response: bounded by the platform's wait, when it has one.
            until = min(until, began + request.reply_within_s) if request.reply_within_s is not None else math.inf
        request = self._admitted(request)
        start, figures, result = self._begin(request, channel)
        if result is not None:
            if channel is not None and result.reply is not None:
                if result.outcome is Outcome.REFUSED:
                    channel.send(result.reply, until)
                elif result.outcome is Outcome.REDELIVERED:
                    self._send_stored_reply(result, start, channel, until)
            return self._logged(request.surface, result, began)
        with self._ended_if_failed(start, figures):
            return self._run_begun(request, start, figures, channel, began, until)

    def _run_begun(
        self,
        request: TurnRequest,
        start: TurnStart,
        figures: TurnFigures,
        channel: ReplyChannel | None,
        began: float,
        until: float,
    ) -> TurnResult:
        """`run` once its message is stored and this attempt holds it."""
        if start.owed and isinstance(channel, StopButton) and self._stopped_before(channel, figures):
            # The person stopped this reply while an attempt that has since died wrote it: it is
            # not written again (docs/decisions.md, Stop means stop). Nothing is sent or stored.
            figures.owed = True
            self._end_attempt(start, figures)
            return self._logged(request.surface, self._result(Outcome.STOPPED, None, start, figures), began)
        prepared = self._prepared(request, start)
        start = self._spoken(request, start, prepared)
        if prepared is not None and prepared.notice is not None:
            return self._refuse_media(
                request.surface, start, prepared, figures, channel, began, until, room=request.first_room
            )
        deadline_s = request.deadline_s - (self._clock() - began) if prepared is not None else request.deadline_s
        messages, merged = self._messages(request, start, prepared)
        tools = self._tools(start, request.surface, max(deadline_s, 1.0), request)
        return self._answer(
            request.surface,
            start,
            messages,
            figures,
            max(deadline_s, 1.0),
            channel,
            began,
            prepared,
            tools,
            until=until,
            merged=merged,
            room=request.first_room,
        )

    def fallback_reply(self, said: str, remembered: str | None) -> str:
        """The fallback in the person's `remembered` language, else that of what they `said`: for
        the scheduled job, which has no request to say it."""
        return self._settings.fallback(self._settings.catalogue.choose(None, said, remembered=remembered))

    def stranger_reply(self, stated: str | None, said: str = "") -> str:
        """What a sender the identity policy turns away is told, in the language they state, else
        that of what they `said`: for a fixed answer that is no turn (a chat's notice)."""
        return self._settings.stranger(self._settings.catalogue.choose(stated, said))

    def owed_estimate(self) -> TurnEstimate:
        """What `answer_owed` reads besides the window and the notes, and its requests: for the
        tokens the scheduled job's claim reserves."""
        return owed_estimate(self._settings)

    def answer_owed(
        self,
        owed: OwedMessage,
        channel: ReplyChannel,
        deadline_s: float,
        until: float | None = None,
        *,
        last_try: bool = False,
    ) -> TurnResult:
        """The scheduled job's turn for a message no attempt answered: the model, once, from the
        context it was stored in, within `deadline_s`; the reply sent through `channel` by `until`
        (its claim's end, less the time to store it; default: as a turn's) and stored. `last_try`:
        a fallback leaves the claim on the message (its attempt not ended, what it spent in the
        result's figures) for the job's give-up, so no other run or redelivery takes it meanwhile."""
        began = self._clock()
        figures = TurnFigures(round_trips=1, reserved_tokens=owed.start.reserved_tokens)
        zone = self._zone_of(owed.start)
        elsewhere = owed.start.answered_elsewhere
        merged = merged_into_last(owed.start.history, owed.start.message_id, elsewhere)
        items = told_unread(owed.start.history, {owed.start.message_id, *merged})
        messages = build_model_messages(items, annotate=self._settings.annotate, zone=zone, elsewhere=elsewhere)
        with self._ended_if_failed(owed.start, figures):
            tools = self._tools(owed.start, owed.surface, deadline_s)  # as the person's turn would have had them
            return self._answer(
                owed.surface,
                owed.start,
                messages,
                figures,
                deadline_s,
                channel,
                began,
                tools=tools,
                waiting=False,
                until=until,
                merged=merged,
                keep_claim=last_try,
            )

    def _answer(
        self,
        surface: Surface,
        start: TurnStart,
        messages: list[ModelMessage],
        figures: TurnFigures,
        deadline_s: float,
        channel: ReplyChannel | None,
        began: float,
        prepared: PreparedMedia | None = None,
        tools: Toolbox | None = None,
        *,
        waiting: bool = True,
        until: float | None = None,
        merged: tuple[int, ...] = (),
        room: Room | None = None,
        keep_claim: bool = False,
    ) -> TurnResult:
        """`waiting`: the person is waiting on this turn (a webhook's, the web's): they see "typing…",
        and the fallback when the model fails. The scheduled job's owed answer has nobody waiting:
        a failure sends nothing (they had the fallback already) and leaves the message owed, but
        with `keep_claim` (its last try) held by the job, whose give-up ends it.
        `until`: when the attempt must have sent by (default: from `began` and `deadline_s`).
        `merged`: the stored messages the context's last turn merged with this one. `room`: the
        request's `first_room`."""
        until = until if until is not None else self._send_by(began, deadline_s)
        figures.context_messages = len(messages)
        figures.owed = start.owed
        first, unsaid = self._held.pushed(start, channel, until)
        if unsaid:
            return self._held_not_said(surface, start, figures, began, unsaid)
        if channel is not None and waiting:
            channel.show_typing(until)
        outcome, text = Outcome.ANSWERED, ""
        described = self._describe(prepared, deadline_s)
        # Telegram's stop button: what the person was shown when they tapped it is the reply. Asked
        # once: an isinstance of a runtime Protocol walks its members each time (tens of µs).
        button = channel if channel is not None and isinstance(channel, StopButton) else None
        stop = button.stopped if button is not None else None
        try:
            drafts = channel.draft if channel is not None else None
            answer = self._ask(figures, messages, self._notes(start), deadline_s, drafts, tools, stop)
            text = answer.text
            figures.add_usage(answer.usage)
            if stop is not None and (shown := stop()) is not None:
                outcome, text = Outcome.STOPPED, shown
        except ModelDeclined as exc:
            outcome, text, figures.error = Outcome.DECLINED, self._settings.declined(start.language), str(exc)
        except ModelUnavailable as exc:
            outcome, figures.error = Outcome.FALLBACK, str(exc)
            text = self._settings.fallback(start.language, kept=start.message_id is not None)
        self._count_tools(figures, tools)
        sends = channel is not None and (waiting or outcome is not Outcome.FALLBACK)
        sent = IN_THE_RESPONSE
        if channel is not None and sends:
            sent = channel.send(text, until)
        elif channel is None:
            sent = self._in_the_response(until)
        delivery = sent.delivery
        if button is not None:
            figures.round_trips += button.checks  # its drafts thread's questions: was it stopped?
        if delivery is not Delivery.DELIVERED:
            figures.error = "the reply could not be delivered"
        handed_over = self._handed_over(sent, until, figures)
        result = self._result(outcome, None if handed_over else text, start, figures)
        first, later = ([], []) if handed_over else with_room(first, text, room)
        result.follow_ups_first = first
        learned = self._learned(prepared, described, figures, began + deadline_s)
        if outcome is not Outcome.FALLBACK and not handed_over:
            # Tried again until its answer_by, and a reply inside the caller's response until the
            # platform stops waiting for it.
            store_by = min(self._answer_by(began, deadline_s), until if channel is None else math.inf)
            declined = merged if outcome is Outcome.DECLINED else None
            answered = merged if outcome is Outcome.ANSWERED else ()
            self._finish(result, start, text, sent, learned, tools, store_by, declined, later, merged=answered)
            # Only a stored reply can be sent by a redelivery; a fallback or a lost reply cannot.
            result.reply_owed = delivery is Delivery.OWED and result.reply_id is not None
        elif keep_claim and outcome is Outcome.FALLBACK:
            figures.ended = True  # the job's give-up stores its fallback and counts what this try spent
        else:
            # The held follow-ups went first: pushed, or in this fallback's response (not a response
            # that comes after the platform stopped waiting).
            said_first = channel is not None or not handed_over
            self._end_attempt(start, figures, learned, said_first=said_first, said_later=later)
            # Handed over: the redelivery this asks for answers the message, unless the job has.
            result.reply_owed = handed_over and outcome is not Outcome.FALLBACK
        return self._logged(surface, result, began)

    def stream(
        self, request: TurnRequest, begun: Callable[[TurnStart], None] | None = None
    ) -> Iterator[TurnResult | str]:
        """The web's streamed turn: text chunks as the model writes, then the `TurnResult`;
        `begun` is given the turn's start before the first of them (the reply's id, for the UI
        message stream's `start`); raising, it refuses a start this call holds the message by
        before the model is asked: the attempt ends, and the message is owed as it was.

        Closed before its end (the client went away), it stops the model there: after a
        response Cloud Run gives an instance no CPU to finish it with. What the model reported
        spending is counted, one log line says `abandoned`, and the message is owed, so the
        client's retry with the same `client_message_id` gets a whole answer."""
        began = self._clock()
        request = self._admitted(request)
        start, figures, result = self._begin(request, None)
        if result is not None:
            if begun is not None:
                begun(start)
            if result.reply:
                yield result.reply
            yield self._logged(request.surface, result, began)
            return
        with self._ended_if_failed(start, figures):
            if begun is not None:
                begun(start)
            yield from self._stream_begun(request, start, figures, began)

    def _stream_begun(
        self, request: TurnRequest, start: TurnStart, figures: TurnFigures, began: float
    ) -> Iterator[TurnResult | str]:
        """`stream` once its message is stored and this attempt holds it."""
        prepared = self._prepared(request, start)
        start = self._spoken(request, start, prepared)
        if prepared is not None and prepared.notice is not None:
            yield prepared.notice
            yield self._refuse_media(request.surface, start, prepared, figures, None, began)
            return
        messages, merged = self._messages(request, start, prepared)
        described = self._describe(prepared, request.deadline_s)
        figures.context_messages = len(messages)
        figures.owed = start.owed
        parts: list[str] = []
        unreported: list[str] = []  # the model's text since it last said what it has written
        outcome = Outcome.ANSWERED
        tools = self._tools(start, request.surface, request.deadline_s - (self._clock() - began), request)
        chunks = tool_loop.answered(
            self._model(),
            prompt_for(self._settings.system_prompt, self._settings.capabilities, tools),
            messages,
            request.deadline_s,
            self._notes(start),
            tools,
            lambda: self._clock() - began > request.deadline_s,
        )
        try:
            try:
                for chunk in chunks:
                    if isinstance(chunk, Usage):
                        figures.add_usage(chunk)
                        unreported.clear()
                        continue
                    if not chunk:
                        continue
                    parts.append(chunk)
                    unreported.append(chunk)
                    yield chunk
                    if self._clock() - began > request.deadline_s:
                        raise ModelUnavailable(f"no complete answer within {request.deadline_s:g} s")
                if not "".join(parts).strip():
                    raise ModelUnavailable("the model answered with no text")
            except ModelUnavailable as exc:
                declined = isinstance(exc, ModelDeclined)
                outcome, figures.error = Outcome.DECLINED if declined else Outcome.FALLBACK, str(exc)
                answer = (
                    self._settings.declined(start.language)
                    if declined
                    else self._settings.fallback(start.language, kept=start.message_id is not None)
                )
                # What the model wrote before it was stopped was shown: the answer follows it. A
                # declined turn stores only the answer (the rest is no answer: Anthropic's page).
                said = ("\n\n" if "".join(parts).strip() else "") + answer
                parts.append(said)
                yield said
            text = "".join(parts)
            self._count_tools(figures, tools)
            result = self._result(outcome, text, start, figures)
            learned = self._learned(prepared, described, figures, began + request.deadline_s)
            store_by = self._answer_by(began, request.deadline_s)
            if outcome is Outcome.ANSWERED:
                self._finish(result, start, text, IN_THE_RESPONSE, learned, tools, store_by, merged=merged)
            elif outcome is Outcome.DECLINED:
                self._finish(result, start, answer, IN_THE_RESPONSE, learned, tools, store_by, declined=merged)
            else:
                self._end_attempt(start, figures, learned)
            yield self._logged(request.surface, result, began)
        finally:
            if not figures.ended:
                tool_loop.close(chunks)
                self._count_tools(figures, tools)
                # The stream's last event, which says what the model wrote, never came: it wrote at
                # least the text it sent since it last said (not the fallback: that is ours).
                figures.output_tokens += approximate_tokens("".join(unreported))
                figures.error = figures.error or "the client went away before the answer was whole"
                abandoned = self._result(Outcome.ABANDONED, "".join(parts), start, figures)
                # The description was asked beside the answer: what it spent counts too.
                learned = self._learned(prepared, described, figures, began + request.deadline_s)
                self._end_attempt(start, figures, learned)
                self._logged(request.surface, abandoned, began)

    # The steps.

    def _admitted(self, request: TurnRequest) -> TurnRequest:
        """The request with only the client history the context can use, refused (InputError)
        before anything is stored when that part is too long or holds a date it cannot show."""
        if request.client_history is None:
            return request
        limits = self.memory.limits
        window = client_window(
            request.client_history,
            limit=limits.max_messages - 1,
            step=limits.window_step,
            max_chars=limits.max_history_chars,
            fit=request.history_fits,
        )
        return replace(request, client_history=window)

    def _begin(
        self, request: TurnRequest, channel: ReplyChannel | None
    ) -> tuple[TurnStart, TurnFigures, TurnResult | None]:
        """Resolve the person and store the message. The third value is the finished
        result of a turn that needs no model: a stranger, a redelivery, or a message from a
        number that opted out.

        A redelivery answers with the reply stored for it. A surface that answers in its
        HTTP response cannot know whether that response arrived, so it always repeats
        the reply; one that pushes it (through a `channel`) knows, and repeats only an undelivered one."""
        figures = TurnFigures()
        person = self._person(request)
        if person is None:
            nobody = TurnStart(None, None, None, duplicate=False, reply=None)
            return (
                nobody,
                figures,
                TurnResult(Outcome.REFUSED, self._settings.stranger(self._language(request)), figures=figures),
            )
        media = self._media().limits if request.media and self._media is not None else None
        start = self.memory.begin_turn(
            person,
            request.surface,
            placeholder(request.media, request.text) if request.media else request.text,
            request.external_id,
            request.conversation_id,
            sender=request.sender_id,
            answer_within_s=request.deadline_s + ANSWER_MARGIN_S,
            platform=request.platform,
            estimate=turn_estimate(self._settings, request, media),
            language=request.language,
        )
        figures.round_trips, figures.degraded = 1, start.degraded
        figures.reserved_tokens = start.reserved_tokens
        if start.opted_out:  # stored; any answer would be refused (core/identity/opt_outs.py)
            return start, figures, self._result(Outcome.OPTED_OUT, None, start, figures)
        if not start.duplicate:
            return start, figures, None
        stored = start.reply
        if stored is None and start.answer_by is not None:
            wait_s = (start.answer_by - datetime.now(UTC)).total_seconds()
            raise StillAnswering(max(math.ceil(wait_s), 1))
        if stored is None and start.declined and not request.surface.is_secondary:
            # Declined with a later turn (whose answer said so): the web, whose page may keep its own
            # thread, is told again, marked, so that the thread leaves it out; a chat was told.
            result = self._result(
                Outcome.DUPLICATE, self._settings.declined(self._language(request, start)), start, figures
            )
            result.declined = True
            return start, figures, result
        if stored is None or (
            self._pushes(channel, stored.content) and (stored.delivered or stored.unsent_from is None)
        ):
            # Pushed, and delivered or given up (the surface refused it for good): nothing is sent again.
            return start, figures, self._result(Outcome.DUPLICATE, None, start, figures)
        result = self._result(Outcome.REDELIVERED, stored.content, start, figures)
        result.reply_id, result.declined = stored.id, stored.declined
        if channel is None and stored.unsent_from is not None and start.user_id is not None:
            # Its rest was owed a push (the job's reply, Twilio's Messages API down): this caller's
            # response repeats it whole, so it is recorded delivered, or the job would send the rest.
            self.memory.record_delivery(start.user_id, stored.id, start.attempt, IN_THE_RESPONSE)
            figures.round_trips += 1
        # what the first answer said before it
        result.follow_ups_first = self._held.as_said(replace(start, language=self._language(request, start)))
        return start, figures, result

    @staticmethod
    def _pushes(channel: ReplyChannel | None, text: str) -> bool:
        """Whether `text` goes out through `channel`, not inside the caller's response."""
        return channel is not None and not (isinstance(channel, CarriesShortReplies) and channel.carries(text))

    @staticmethod
    def _stopped_before(channel: StopButton, figures: TurnFigures) -> bool:
        figures.round_trips += 1
        return channel.stopped_before()

    def _language(self, request: TurnRequest, start: TurnStart | None = None, heard: str | None = None) -> str:
        """The language of the turn's fixed phrases: stated by the request, else the person's as
        remembered, else heard in its voice note, else its words, else DEFAULT_LANGUAGE
        (core/phrases/language.py)."""
        remembered = start.language if start is not None else None
        return self._settings.catalogue.choose(request.language, request.text, remembered=remembered, heard=heard)

    def _spoken(self, request: TurnRequest, start: TurnStart, prepared: PreparedMedia | None) -> TurnStart:
        """The start in the language its fixed phrases are said in from here on (the fallback),
        with what its voice note was heard in, to keep as the person's when the request stated
        no language (the turn's end keeps it: no round trip of its own)."""
        heard = prepared.heard_language if prepared is not None else None
        kept = heard if language_tag(request.language) is None else None
        return replace(start, language=self._language(request, start, heard), heard_language=kept)

    def _person(self, request: TurnRequest) -> Person | None:
        if request.user_id is not None:
            return Person(user_id=request.user_id)
        if request.sender_id is None:
            raise ValueError("a turn needs a user_id or a sender_id")
        return self._identity.resolve(request.surface, request.sender_id, request.sender_alias)

    def _messages(
        self, request: TurnRequest, start: TurnStart, prepared: PreparedMedia | None
    ) -> tuple[list[ModelMessage], tuple[int, ...]]:
        """What the model reads, and the stored messages its last turn merged with this one
        (`merged_into_last`: declined with it, if it is)."""
        items: Sequence[ContextItem | StoredMessage]
        # A page's turn in another app's thread (its edit of that app's message) reads the page's
        # thread: of the window over every conversation that app's turns read, only that thread's.
        history = start.history if request.client_history is None else start.thread()
        elsewhere = start.answered_elsewhere
        if start.degraded:
            current = ContextItem(Role.USER, storable(request.text), request.surface, datetime.now(UTC))
            items = [*(request.client_history or []), current]
        elif not request.surface.is_secondary or request.client_history is not None:
            # the web client sends its thread's history (another app's thread too, on its page)
            current = ContextItem.from_stored(start.history[-1])
            page = request.client_history
            items = web_items(start.prepend, history, page, current, elsewhere, since_page=request.history_is_page)
        else:
            items = start.history
        if prepared is not None and items:
            # This message as the turn learned it: transcripts in place, its images and PDF attached.
            last = len(items) - 1
            at = next((i for i, item in enumerate(items) if item.id is not None and item.id == start.message_id), last)
            message = items[at]
            content = start.quoting(prepared.content)
            learned = ContextItem(
                message.role, content, message.surface, message.created_at, message.id, prepared.attachments
            )
            items = [*items[:at], learned, *items[at + 1 :]]
        # A client's history may name any id: only messages the store read for this turn are counted.
        stored = {message.id for message in (*start.prepend, *history)}
        merged = tuple(i for i in merged_into_last(items, start.message_id, elsewhere) if i in stored)
        # The earlier messages this turn answers with its own, and its own when taken over owed without
        # its media (the web's resume, a send again without its files): what of theirs no attempt read.
        unread = {*merged, start.message_id} if prepared is None and start.owed else set(merged)
        items = told_unread(items, unread)
        # the browser's, which the turn makes theirs, unless they stated theirs
        zone = turn_clock(self._zone_of(start), request.timezone, start.timezone_stated)
        messages = build_model_messages(items, annotate=self._settings.annotate, zone=zone, elsewhere=elsewhere)
        return messages, merged

    # Media (core/media/turn_media.py): after begin_turn, so a redelivery fetches and transcribes nothing.

    def _prepared(self, request: TurnRequest, start: TurnStart) -> PreparedMedia | None:
        if not request.media:
            return None
        if self._media is None:
            raise RuntimeError("a turn with media needs a MediaReader")
        reader = self._media()
        listening = None
        if start.user_id is not None and start.message_id is not None:
            per_day = reader.limits.voice_seconds_per_day
            listening = Listening(self.memory.store, start.user_id, start.message_id, per_day)
        remembered = remembered_content(start)  # an owed takeover's transcripts, heard once
        return reader.prepare(
            request.surface,
            request.media,
            request.text,
            request.deadline_s,
            listening,
            self._settings.phrases(self._language(request, start)),
            remembered,
        )

    def _describe(self, prepared: PreparedMedia | None, deadline_s: float) -> Future[None] | None:
        """The description of the turn's images and PDFs, written beside the answer."""
        if prepared is None or not prepared.attachments or self._media is None:
            return None
        return self._executor.submit(self._media().describe, prepared, deadline_s)

    def _learned(
        self, prepared: PreparedMedia | None, described: Future[None] | None, figures: TurnFigures, until: float
    ) -> str | None:
        """The message as the memory keeps it, once its description is in (or its time is up)."""
        if prepared is None:
            return None
        if described is not None:
            try:
                described.result(timeout=max(until - self._clock(), 0.0))
            except FuturesTimeout:
                log.warning("the media description came too late; the message is stored without it")
            usage = prepared.usage
            figures.media_tokens = (
                usage.input_tokens
                + usage.output_tokens
                + usage.cache_creation_input_tokens
                + usage.cache_read_input_tokens
            )
        return prepared.stored()

    def _refuse_media(
        self,
        surface: Surface,
        start: TurnStart,
        prepared: PreparedMedia,
        figures: TurnFigures,
        channel: ReplyChannel | None,
        began: float,
        until: float = math.inf,
        room: Room | None = None,
    ) -> TurnResult:
        """Media that could not be used: the notice is the answer (stored, so a redelivery repeats it
        rather than asking anything again), and the message is stored as what is known."""
        assert prepared.notice is not None
        first, unsaid = self._held.pushed(start, channel, until)
        if unsaid:
            return self._held_not_said(surface, start, figures, began, unsaid, prepared.stored())
        sent = channel.send(prepared.notice, until) if channel is not None else self._in_the_response(until)
        if self._handed_over(sent, until, figures):
            result = self._result(Outcome.MEDIA_REFUSED, None, start, figures)
            self._end_attempt(start, figures, prepared.stored(), said_first=channel is not None)
            result.reply_owed = True
            return self._logged(surface, result, began)
        result = self._result(Outcome.MEDIA_REFUSED, prepared.notice, start, figures)
        result.follow_ups_first, later = with_room(first, prepared.notice, room)
        self._finish(result, start, prepared.notice, sent, prepared.stored(), said_later=later)
        result.reply_owed = sent.delivery is Delivery.OWED and result.reply_id is not None
        return self._logged(surface, result, began)

    def _in_the_response(self, until: float) -> Sent:
        """A reply the caller answers with in its response: owed, nothing of it out, when that
        response would come after the platform stopped waiting for it."""
        return IN_THE_RESPONSE if self._clock() < until else Sent(Delivery.OWED, 0)

    def said_held_first(self, start: TurnStart, channel: ReplyChannel, until: float) -> bool:
        """The held follow-ups pushed before an answer that asks no model (the scheduled job's
        give-up); False when one did not go: the attempt is ended with how far each got, and the
        message is owed with them."""
        _, unsaid = self._held.pushed(start, channel, until)
        if unsaid:
            self._end_attempt(start, TurnFigures(), first_parts=unsaid)
        return not unsaid

    def _held_not_said(
        self,
        surface: Surface,
        start: TurnStart,
        figures: TurnFigures,
        began: float,
        pushed: list[SaidFirst],
        learned: str | None = None,
    ) -> TurnResult:
        """A held follow-up could not be pushed (the surface down): no model is asked (nor a media
        notice sent), and the message stays owed with its held follow-ups, for the next answer to
        say first from the part each got to (the parts out never go twice)."""
        figures.error = "the held follow-ups could not be sent first; the message is owed"
        self._end_attempt(start, figures, learned, first_parts=pushed)
        return self._logged(surface, self._result(Outcome.FALLBACK, None, start, figures), began)

    @staticmethod
    def _answer_by(began: float, deadline_s: float) -> float:
        """An attempt's answer_by (begin_turn's), on the turn's clock: after it the message is owed."""
        return began + deadline_s + ANSWER_MARGIN_S

    @classmethod
    def _send_by(cls, began: float, deadline_s: float) -> float:
        """When an attempt that began at `began` must have sent its reply by: its answer_by, less
        the time to store the reply (STORE_MARGIN_S)."""
        return cls._answer_by(began, deadline_s) - STORE_MARGIN_S

    def _handed_over(self, sent: Sent, until: float, figures: TurnFigures) -> bool:
        """Whether the reply is left unsent because the attempt's time is up: nothing of it is
        stored, the attempt ends, and the message is owed (its redelivery or the scheduled job
        answers it once). A reply the channel could not send in time for a reason that may pass
        is stored, undelivered, for the redelivery to send: its storing still fits. So is one of
        which a part went out: a new answer would follow that part; the rest of this one does."""
        if sent.delivery is not Delivery.OWED or sent.parts > 0 or self._clock() < until:
            return False
        figures.error = "the attempt's time ran out before its reply went out; the message is owed"
        return True

    def _tools(
        self, start: TurnStart, surface: Surface, deadline_s: float, request: TurnRequest | None = None
    ) -> Toolbox | None:
        """This turn's tools on `surface`: each capability's that is on, from what begin_turn brought, in the
        person's timezone (theirs, else CONTEXT_TIMEZONE), with the `deadline_s` the answer has
        from now; `request`: the web client's own."""
        if start.message_id is None or start.user_id is None:
            return None
        until, clock = self._clock() + deadline_s, self._clock
        turn = TurnState(
            self.memory,
            start.user_id,
            start,
            self._zone_of(start),
            self._now(),
            client_zone=request.timezone if request is not None else None,
            client_history=request.client_history if request is not None else None,
            history_is_page=request is not None and request.history_is_page,
            time_left=lambda: until - clock(),
            surface=surface,
        )
        toolsets = [toolset for c in self._settings.capabilities if (toolset := c.toolset(turn)) is not None]
        if not toolsets:
            return None
        ceiling = answer_ceiling(self._settings, request, start.reserved_tokens)
        return Toolbox(toolsets, self._settings.tool_rounds, ceiling, self.memory.budget.reply_tokens)

    @staticmethod
    def _count_tools(figures: TurnFigures, tools: Toolbox | None) -> None:
        """The model requests and the round trips of the tools' calls: the turn's log line and its budget."""
        figures.model_requests = tools.requests if tools is not None else 1
        figures.round_trips += tools.round_trips if tools is not None else 0
        figures.tool_calls, figures.tool_errors = (tools.calls, tools.errors) if tools is not None else (0, 0)

    def _zone_of(self, start: TurnStart) -> ZoneInfo:
        """The person's timezone (theirs, else CONTEXT_TIMEZONE): the context's tags and the
        follow-up tools read the same clock, the one the person lives by."""
        return zone_named(start.timezone) or self._zone

    def _notes(self, start: TurnStart) -> str:
        return start.notes if self._settings.memory_notes else ""

    def _ask(
        self,
        figures: TurnFigures,
        messages: list[ModelMessage],
        notes: str,
        deadline_s: float,
        drafts: Callable[[str], None] | None = None,
        tools: Toolbox | None = None,
        stop: Callable[[], str | None] | None = None,
    ) -> ModelReply:
        """The model's answer within the deadline, streamed: what it reports spending reaches
        `figures` as it goes (its input as soon as it starts), so a turn that ends in the
        fallback still counts what the model read; `drafts` sees the text as it grows. Once
        `stop` says the person stopped it, the answer so far, with what it wrote since it last
        said what it spent (as the web's abandoned stream counts it)."""
        stopped = threading.Event()
        until = self._clock() + deadline_s

        def answer() -> ModelReply:
            parts: list[str] = []
            unreported: list[str] = []  # the model's text since it last said what it has written
            usage = Usage()
            chunks = tool_loop.answered(
                self._model(),
                prompt_for(self._settings.system_prompt, self._settings.capabilities, tools),
                messages,
                deadline_s,
                notes,
                tools,
                lambda: stopped.is_set() or self._clock() >= until,
            )
            for chunk in chunks:
                if stopped.is_set():
                    tool_loop.close(chunks)  # the caller gave up: stop reading (and paying for) the answer
                    break
                if stop is not None and stop() is not None:
                    tool_loop.close(chunks)  # the person stopped it: the same, at once
                    spent = usage.output_tokens + approximate_tokens("".join(unreported))
                    return ModelReply("".join(parts), replace(usage, output_tokens=spent))
                if isinstance(chunk, Usage):
                    usage = chunk
                    figures.add_usage(chunk)
                    unreported.clear()
                elif chunk:
                    parts.append(chunk)
                    unreported.append(chunk)
                    if drafts is not None:
                        drafts("".join(parts))
            text = "".join(parts)
            if not text.strip():
                raise ModelUnavailable("the model answered with no text")
            return ModelReply(text, usage)

        future = self._executor.submit(answer)
        try:
            return future.result(timeout=deadline_s)
        except FuturesTimeout as exc:
            stopped.set()
            raise ModelUnavailable(f"no answer within {deadline_s:g} s") from exc

    @contextmanager
    def _ended_if_failed(self, start: TurnStart, figures: TurnFigures) -> Iterator[None]:
        """A failure of ours between begin_turn and the turn's end (a bug: the store's and the
        model's failures are answered where they happen) ends the attempt before it goes on up:
        its tokens count and its message is owed at once, so that the platform's retry, the
        person's or the scheduled job answers it rather than wait for its answer_by. An attempt
        already ended (finish_turn or end_attempt asked) is not ended again: its tokens would
        count twice. A stream closed by its client where no step of its own ends the attempt (at
        a media notice) ends it the same way."""
        try:
            yield
        except (Exception, GeneratorExit):
            if not figures.ended:
                self._end_attempt(start, figures)
            raise

    def _end_attempt(
        self,
        start: TurnStart,
        figures: TurnFigures,
        learned: str | None = None,
        *,
        said_first: bool = False,
        first_parts: list[SaidFirst] | None = None,
        said_later: list[SaidFirst] | None = None,
    ) -> None:
        """A turn that stored no reply: its tokens count, and its message is owed. `said_first`:
        the held follow-ups it took reached the person (pushed, or in the answer it returned), but
        `said_later`, which that answer had no room for; `first_parts`: how far pushing them got
        when one did not go."""
        figures.ended = True
        if start.message_id is None or start.user_id is None:
            return
        self.memory.end_attempt(
            start.user_id,
            start.message_id,
            start.attempt,
            figures.model_tokens,
            user_content=learned,
            reserved=start.reserved_tokens,
            language=start.heard_language,
            said_first=said_first,
            first_parts=first_parts or (),
            said_later=said_later or (),
        )
        figures.round_trips += 1

    def _send_stored_reply(self, result: TurnResult, start: TurnStart, channel: ReplyChannel, until: float) -> None:
        """A reply stored undelivered, sent again by a redelivery from the part it stopped at (the
        ones before it went out when it was written), and what became of it recorded; or one
        delivered inside a caller's response, carried there again (CarriesShortReplies)."""
        assert result.reply is not None and result.user_id is not None and result.reply_id is not None
        assert start.reply is not None
        sent = channel.send(result.reply, until, start.reply.unsent_from or 0)
        if start.reply.delivered:  # carried in the caller's response again (CarriesShortReplies)
            return
        # tried again while this attempt holds the message (its answer_by): one not recorded is sent again
        self.memory.record_delivery(
            result.user_id, result.reply_id, start.attempt, sent, retry_for_s=until + STORE_MARGIN_S - self._clock()
        )
        result.figures.round_trips += 1
        if sent.delivery is not Delivery.DELIVERED:
            result.figures.error = "the stored reply could not be delivered"
        result.reply_owed = sent.delivery is Delivery.OWED

    def _finish(
        self,
        result: TurnResult,
        start: TurnStart,
        text: str,
        sent: Sent,
        learned: str | None = None,
        tools: Toolbox | None = None,
        store_by: float = -math.inf,
        declined: tuple[int, ...] | None = None,
        said_later: list[SaidFirst] | None = None,
        *,
        merged: tuple[int, ...] = (),
    ) -> None:
        """Store the reply, tried again until `store_by` (a time on the turn's clock; by default, not).
        `declined`: the model declined the turn, and the reply says so: the other stored messages
        the turn merged, declined with it; what its tools decided before is dropped. `merged`: the
        model answered, and the other stored messages its last turn merged are answered with it
        (an owed one is no longer owed). `said_later`:
        the held follow-ups the answer had no room for, left to the follow-up job with it."""
        result.figures.ended = True
        if start.message_id is None or start.user_id is None:
            return
        recorded = tools.recorded() if tools is not None and declined is None else {}
        result.reply_id = self.memory.finish_turn(
            start.user_id,
            start.message_id,
            text,
            delivered=sent.delivery is Delivery.DELIVERED,
            unsent_from=sent.unsent_from,
            attempt=start.attempt,
            tokens=result.figures.model_tokens,
            user_content=learned,
            reserved=start.reserved_tokens,
            language=start.heard_language,
            **recorded,
            reply_id=start.reply_id,
            retry_for_s=store_by - self._clock(),
            declined=declined,
            merged=merged,
            said_later=said_later or (),
        )
        result.figures.round_trips += 1
        if result.reply_id is not None and recorded.get("follow_ups"):
            # The web's stream tells the page what the turn scheduled (functions/ui_message_stream.py).
            result.follow_ups_scheduled = list(recorded["follow_ups"].get("schedule", []))
        if result.reply_id is None:
            result.figures.error = result.figures.error or "the reply could not be stored"

    @staticmethod
    def _result(outcome: Outcome, reply: str | None, start: TurnStart, figures: TurnFigures) -> TurnResult:
        return TurnResult(
            outcome=outcome,
            reply=reply,
            user_id=start.user_id,
            conversation_id=start.conversation_id,
            message_id=start.message_id,
            figures=figures,
            declined=outcome is Outcome.DECLINED,
        )

    def _logged(self, surface: Surface, result: TurnResult, began: float) -> TurnResult:
        result.figures.latency_ms = round((self._clock() - began) * 1000, 1)
        level = logging.WARNING if result.figures.error else logging.INFO
        if not log.isEnabledFor(level):
            return result
        # The figures are scalars: their fields as asdict() gives them, without its deep copy of
        # each (which cost a third of the whole line); `ended` is the turn's own bookkeeping.
        figures = vars(result.figures).copy()
        del figures["ended"]
        log.log(
            level,
            "turn",
            extra={
                "surface": surface.value,
                "outcome": result.outcome.value,
                "user_id": str(result.user_id) if result.user_id else None,
                **figures,
            },
        )
        return result
