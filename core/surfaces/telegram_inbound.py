"""A Telegram update answered: what it asks for (core/surfaces/telegram.py's `classify`),
done, and what the webhook says back.

A turn's reply goes out through the Bot API (streamed as drafts, then sent), or inside the
webhook's answer (`inline`: TELEGRAM_REPLY_IN_WEBHOOK, a reply of one message; with no bot token,
in local development, a longer one's first message); an
edited message corrects the stored one and is not answered; a tap on a draft's stop button is
recorded for the turn writing it, wherever it runs (core/turn/stopped_generation.py). When the stored
reply could not be sent for a reason that may pass, or the turn's time ran out before its reply
went out, the answer is `Redeliver`: Telegram redelivers an update whose webhook answered anything
but 2xx, and the redelivery (or the scheduled job before it) answers the message once. The
function module (functions/telegram.py) only checks the secret and renders the answer.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from core.channels.splitting import split_message
from core.channels.telegram_bot import TELEGRAM_LIMIT, TelegramAnswerChannel, TelegramBot, TelegramChannel
from core.errors import InputError, OverBudget, StillAnswering
from core.identity.remembered_language import RememberedLanguage
from core.memory.edits import Corrections, MessageEdit
from core.models import Delivery
from core.phrases.catalogue import Catalogue, Phrases
from core.phrases.refusals import input_refused, over_budget
from core.surfaces.adapter import Surface
from core.surfaces.commands import Commands
from core.surfaces.telegram import CONFIRM_LINK, Command, Converse, Notice, StopGeneration, TelegramUpdate
from core.surfaces.telegram import classify as classify_update
from core.turn.request import TurnRequest
from core.turn.stopped_generation import StoppedGenerations
from core.turn.turns import Turns

Answer = dict[str, object]  # the webhook's answer: a Bot API method Telegram runs, or what was done


@dataclass(frozen=True)
class Redeliver:
    """Telegram should deliver the update again later (the webhook answers it non-2xx)."""

    error: str
    message: str


@dataclass(frozen=True)
class TelegramBotOptions:
    """How this deployment's bot answers (the settings' TELEGRAM_*)."""

    bot: Callable[[], TelegramBot] | None  # None: no bot token, every answer inside the webhook's
    inline: bool  # a short answer inside the webhook's answer
    drafts: bool  # a reply streamed as drafts before it is sent
    bot_id: int | None = None
    bot_username: str | None = None


@dataclass(frozen=True)
class TelegramInbound:
    """Telegram's updates, each answered once. `reply_within_s`: the time a reply has to be out."""

    options: TelegramBotOptions
    turns: Turns
    commands: Commands
    catalogue: Catalogue
    remembered: RememberedLanguage
    corrections: Corrections
    stops: StoppedGenerations
    deadline_s: float
    reply_within_s: float

    def answer(self, update: TelegramUpdate) -> Answer | Redeliver:
        options = self.options
        action = classify_update(update, options.bot_id, options.bot_username)
        if isinstance(action, Notice):
            if self.turns.identity.resolve(Surface.TELEGRAM, action.sender_id) is None:
                # Turned away (the owner policy): what a stranger meets first is what their words
                # get, never a welcome, the commands, or an invitation to write.
                return self._reply(action.chat_id, self.turns.stranger_reply(action.language_code))
            # An app that states no language we have: the person's as remembered (a round trip, for this alone).
            remembered = None
            if not self.catalogue.has(action.language_code):
                remembered = self.remembered.of(Surface.TELEGRAM, action.sender_id)
            phrases = self.catalogue.phrases(self.catalogue.choose(action.language_code, remembered=remembered))
            return self._reply(action.chat_id, phrases.say(action.phrase))
        if isinstance(action, StopGeneration):
            # Never a turn, never an answer: the turn writing that draft stops, and sends what was shown.
            return {"ok": True, "stopped": self.stops.record(action.chat_id, action.draft_id)}
        if isinstance(action, MessageEdit):
            # No answer: the person corrected what they said; the next turn reads it (core/memory/edits.py).
            return {"ok": True, "edit": self.corrections.apply(action).value}
        if isinstance(action, Command):
            answered = self.commands.answer(action.request, action.language_code)
            if answered.for_the_thread:  # a code alone that no code has: what they wrote
                action = classify_update(update, options.bot_id, options.bot_username, commands=False)
                assert isinstance(action, Converse)
                return self._converse(action)
            if action.callback_query_id and options.bot is not None:
                options.bot().answer_callback_query(action.callback_query_id)
            phrases = self.catalogue.phrases(answered.language)
            button = confirm_button(answered.confirm_code, phrases) if answered.confirm_code else None
            return self._reply(action.chat_id, answered.text, button, again=False)
        if not isinstance(action, Converse):
            tapped = update.callback_query.get("id") if update.callback_query is not None else None
            if isinstance(tapped, str) and options.bot is not None:
                # A button we do not act on: its progress bar shows until the tap is answered.
                options.bot().answer_callback_query(tapped)
            return {"ok": True, "ignored": action.reason}
        return self._converse(action)

    def _converse(self, action: Converse) -> Answer | Redeliver:
        phrases = self._phrases(action.language_code, action.text)
        turn = TurnRequest(
            Surface.TELEGRAM,
            action.text,
            str(action.update_id),
            sender_id=action.sender_id,
            deadline_s=self.deadline_s,
            media=action.media,
            platform=action.platform,
            language=action.language_code,
        )
        options = self.options
        channel: TelegramChannel | TelegramAnswerChannel | None = None
        if options.bot is not None:
            deadline = time.monotonic() + self.reply_within_s
            drafts, stops = options.drafts, self.stops
            channel = (
                TelegramAnswerChannel(options.bot(), action.chat_id, deadline)
                if options.inline
                else TelegramChannel(
                    options.bot(), action.chat_id, deadline, draft_id=action.update_id, drafts=drafts, stops=stops
                )
            )
        try:
            result = self.turns.run(turn, channel)
        except OverBudget as exc:
            return self._reply(action.chat_id, over_budget(phrases, exc))
        except StillAnswering as exc:
            # A redelivery while the first attempt may still answer: Telegram tries again later, and
            # once that attempt can no longer answer, the redelivery answers (the message is owed).
            return Redeliver("still_answering", str(exc))
        except InputError as exc:
            return self._reply(action.chat_id, input_refused(phrases, exc))
        if isinstance(channel, TelegramAnswerChannel) and channel.carried is not None:
            return in_the_answer(action.chat_id, channel.carried, None)
        if channel is None and result.reply:  # no bot token: the reply's first message
            return in_the_answer(action.chat_id, result.reply, None)
        if result.reply_owed:
            return Redeliver("reply_owed", "the Bot API did not take the reply")
        return {"ok": True, "outcome": result.outcome.value}

    def _phrases(self, language_code: str | None, text: str = "") -> Phrases:
        return self.catalogue.phrases(self.catalogue.choose(language_code, text))

    def _reply(
        self, chat_id: int, text: str, markup: Answer | None = None, *, again: bool = True
    ) -> Answer | Redeliver:
        """An answer inside the webhook's (one outbound call fewer), or through the Bot API when it
        is longer than one message; with no bot token (local development) only its first part.
        `markup`: the buttons under the text. Sent, but not taken for a reason that may pass:
        `Redeliver`, and the redelivery answers again (a turn's reply from the store, a refusal
        anew). Not `again` (a command's: not stored, so a redelivery runs it again, and one that
        changed something, a forget, an unlink, a code redeemed, would answer otherwise: "nothing to
        confirm" after everything was deleted): inside the webhook's answer instead, for Telegram
        to send."""
        bot = self.options.bot
        if self.options.inline and (len(text) <= TELEGRAM_LIMIT or bot is None):
            return in_the_answer(chat_id, text, markup)
        assert bot is not None  # not inline: a bot token is set
        if bot().send_text(chat_id, text, reply_markup=markup) is Delivery.OWED:
            return (
                Redeliver("reply_owed", "the Bot API did not take the reply")
                if again
                else in_the_answer(chat_id, text, markup)
            )
        return {"ok": True}


def in_the_answer(chat_id: int, text: str, markup: Answer | None) -> Answer:
    """The Bot API method the webhook's answer carries for Telegram to run: the text, or the first
    message of one longer than that, marked as cut."""
    shown = text.strip()
    if len(shown) > TELEGRAM_LIMIT:
        shown = split_message(text, TELEGRAM_LIMIT - 2)[0] + " …"
    answer: Answer = {"method": "sendMessage", "chat_id": chat_id, "text": shown}
    if markup:
        answer["reply_markup"] = markup
    return answer


def confirm_button(code: str, phrases: Phrases) -> Answer:
    """The button that confirms linking with `code`."""
    label = phrases.say("telegram.confirm_button")
    return {"inline_keyboard": [[{"text": label, "callback_data": CONFIRM_LINK + code}]]}
