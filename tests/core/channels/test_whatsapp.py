"""Twilio's Messages API through the real twilio SDK, against the local fake Twilio: what the
agent says outside a webhook's answer (owed replies, follow-ups; WhatsApp's and SMS's)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from core.channels.splitting import packed, split_message
from core.channels.whatsapp import WhatsAppSender, twilio_length, twilio_parts, twiml
from core.models import Delivery, SaidFirst, Sent
from core.surfaces.whatsapp import WHATSAPP_LIMIT
from tests.fakes.twilio_api import FakeTwilio
from tests.helpers import TWILIO_TOKEN, free_port, messages_of

ACCOUNT_SID = "AC" + "4" * 32
LONG = " ".join(f"Sentence {n} of a long answer." for n in range(130))  # three messages of WhatsApp's


@pytest.fixture
def fake_twilio() -> Iterator[FakeTwilio]:
    server = FakeTwilio(ACCOUNT_SID, TWILIO_TOKEN)
    yield server
    server.close()


def sender(fake_twilio: FakeTwilio, waited: list[float]) -> WhatsAppSender:
    return WhatsAppSender(
        ACCOUNT_SID,
        TWILIO_TOKEN,
        "whatsapp:+15550001111",
        WHATSAPP_LIMIT,
        api_base=fake_twilio.url,
        sleep=waited.append,
    )


def test_a_later_part_that_fails_for_a_moment_is_sent_again_and_the_first_not_twice(fake_twilio: FakeTwilio) -> None:
    """An owed reply of three messages whose second meets a 503 once: tried again a second later,
    and the person has each part once. An attacker review's finding: it answered OWED, and the
    scheduled job's next try sent the whole reply, its first part a second time."""
    waited: list[float] = []
    fake_twilio.fail_once_after(1, 503, 20500)
    parts = split_message(LONG, WHATSAPP_LIMIT)
    until = time.monotonic() + 60
    assert sender(fake_twilio, waited).send_parts("whatsapp:+34600000002", LONG, until).delivery is Delivery.DELIVERED
    assert [message["Body"] for message in fake_twilio.messages] == parts and len(parts) == 3
    assert waited == [1.0]


def test_a_later_part_is_not_tried_again_past_the_attempts_time(fake_twilio: FakeTwilio) -> None:
    """A try that could end after the attempt's time (its wait and Twilio's 10 s timeout) is not
    made: past it, the message may be another attempt's to answer (a review's finding: the part
    went out 3 s past the claim). Without a time (a follow-up's send), no part is tried again."""
    waited: list[float] = []
    fake_twilio.fail_once_after(1, 503, 20500)
    # Each part's try fits (Twilio's timeout, 10 s, to connect and again to read), a retry's wait and
    # try would not.
    until = time.monotonic() + 20.5
    assert sender(fake_twilio, waited).send_parts("whatsapp:+34600000002", LONG, until) == Sent(Delivery.OWED, 1)
    fake_twilio.fail_once_after(len(fake_twilio.messages) + 1, 503, 20500)
    assert sender(fake_twilio, waited).send_parts("whatsapp:+34600000003", LONG).delivery is Delivery.OWED
    assert waited == [] and len(fake_twilio.messages) == 2


def test_a_send_from_a_later_part_sends_only_the_rest(fake_twilio: FakeTwilio) -> None:
    """A reply owed from its second part (its unsent_from): the rest, once each."""
    rest = sender(fake_twilio, []).send_parts("whatsapp:+34600000004", LONG, time.monotonic() + 60, 1)
    assert rest == Sent(Delivery.DELIVERED, 3)
    assert [message["Body"] for message in fake_twilio.messages] == split_message(LONG, WHATSAPP_LIMIT)[1:]


def test_no_part_starts_when_its_try_could_end_past_the_attempts_time(fake_twilio: FakeTwilio) -> None:
    """The first part too (a review's finding: only later ones were kept inside the hold)."""
    until = time.monotonic() + 15  # under twice Twilio's 10 s timeout (connecting, then reading) from now
    channel = sender(fake_twilio, []).channel("+34600000005")
    assert channel.send(LONG, until) == Sent(Delivery.OWED, 0) and fake_twilio.messages == []
    assert channel.send(LONG, until, 2) == Sent(Delivery.OWED, 2) and fake_twilio.messages == []


def test_a_later_part_refused_is_not_tried_again(fake_twilio: FakeTwilio) -> None:
    """Refused (a 4xx: the number unknown, the window closed), trying again cannot help."""
    waited: list[float] = []
    fake_twilio.fail_once_after(1, 400, 63016)
    assert (
        sender(fake_twilio, waited).send_parts("whatsapp:+34600000002", LONG, time.monotonic() + 60).delivery
        is Delivery.GIVEN_UP
    )
    assert len(fake_twilio.messages) == 1 and waited == []


@pytest.mark.parametrize(("code", "opted_out"), [(21610, True), (21211, False)])
def test_a_part_refused_as_sent_to_a_number_that_opted_out_says_so(
    fake_twilio: FakeTwilio, code: int, opted_out: bool
) -> None:
    """Twilio's 21610 (the number texted STOP) is told apart from other refusals, with how far the
    text got: the follow-up job holds such a one for START rather than giving it up."""
    fake_twilio.fail_after(1, 400, code)
    sent = sender(fake_twilio, []).send_parts("+34600000006", LONG, time.monotonic() + 60)
    assert sent == Sent(Delivery.GIVEN_UP, 1, opted_out) and len(fake_twilio.messages) == 1


def test_a_twilio_that_cannot_be_reached_leaves_the_message_owed_from_its_first_part(fake_twilio: FakeTwilio) -> None:
    """No answer at all from Twilio's host (a network failure, not an error of Twilio's): nothing
    escapes to the job, the reply is owed from the part not out, and the next run sends it whole."""
    closed = free_port()
    unreachable = WhatsAppSender(
        ACCOUNT_SID, TWILIO_TOKEN, "whatsapp:+15550001111", WHATSAPP_LIMIT, api_base=f"http://127.0.0.1:{closed}"
    )
    assert unreachable.send_parts("whatsapp:+34600000003", LONG) == Sent(Delivery.OWED, 0)
    assert sender(fake_twilio, []).send_parts("whatsapp:+34600000003", LONG) == Sent(Delivery.DELIVERED, 3)
    assert [message["Body"] for message in fake_twilio.messages] == split_message(LONG, WHATSAPP_LIMIT)


def test_texts_are_packed_in_order_into_as_few_messages_as_fit_whole() -> None:
    """A blank line between two texts in one message; a text that would pass the limit starts the next."""
    assert packed(["a" * 10, "b" * 10, "c" * 7], 24) == ["a" * 10 + "\n\n" + "b" * 10, "c" * 7]
    assert packed(["a" * 10, "b" * 12], 24) == ["a" * 10 + "\n\n" + "b" * 12]
    assert packed(["a" * 10, "b" * 13], 24) == ["a" * 10, "b" * 13]
    assert packed([], 24) == []


def test_twilio_bodies_are_measured_in_utf16_code_units() -> None:
    """Twilio counts a body's length in UTF-16 code units (an emoji is two) and refuses one past its
    limit (error 21617): cut and packed so, never at a code point count."""
    cheer = "Yes \U0001f389."  # 6 characters, 7 units
    assert twilio_length(cheer) == 7
    assert split_message(f"{cheer} {cheer}", 14, length=twilio_length) == [cheer, cheer]
    assert split_message(f"{cheer} {cheer}", 14) == [f"{cheer} {cheer}"]  # 13 characters
    assert split_message("\U0001f389" * 5, 7, length=twilio_length) == ["\U0001f389" * 3, "\U0001f389" * 2]
    assert packed([cheer, cheer], 15, twilio_length) == [cheer, cheer]  # 16 units with the blank line
    assert packed([cheer, cheer], 15) == [f"{cheer}\n\n{cheer}"]


def test_a_whatsapp_message_with_emoji_is_sent_in_bodies_twilio_takes(fake_twilio: FakeTwilio) -> None:
    """A reply of 1,559 characters, 1,679 UTF-16 code units, in two messages Twilio takes."""
    reply = " ".join(["Well done \U0001f389."] * 120)
    assert sender(fake_twilio, []).send_parts("whatsapp:+34600000006", reply).delivery is Delivery.DELIVERED
    bodies = [message["Body"] for message in fake_twilio.messages]
    assert [len(body) for body in bodies] == [1481, 77]
    assert [twilio_length(body) for body in bodies] == [1595, 83]
    assert messages_of(twiml(reply, WHATSAPP_LIMIT)) == bodies


def test_a_twiml_answer_packs_the_follow_ups_said_first_and_never_the_reply_with_them() -> None:
    first = [SaidFirst(1, "Stretch now."), SaidFirst(2, "Drink some water.")]
    assert messages_of(twiml("Hi!", WHATSAPP_LIMIT, first)) == ["Stretch now.\n\nDrink some water.", "Hi!"]


def test_a_twiml_answer_has_no_message_left_empty_by_the_characters_xml_forbids() -> None:
    assert messages_of(twiml("\x01\x02", WHATSAPP_LIMIT, [SaidFirst(1, "Stretch\x00 now.")])) == ["Stretch now."]


def test_a_reply_of_many_paragraphs_is_cut_at_sentences_to_fit_one_twiml_answer() -> None:
    """Eleven paragraphs of 900 characters take a message each, eleven, and Twilio sends none of an
    answer past 10 (a review's finding): cut at sentence ends instead, every word kept, in order."""
    reply = "\n\n".join(f"Point {n}. " + "All good here. " * 60 for n in range(1, 12))
    assert len(split_message(reply, WHATSAPP_LIMIT)) == 11
    said = messages_of(twiml(reply, WHATSAPP_LIMIT))
    assert len(said) == 7 and all(len(part) <= WHATSAPP_LIMIT for part in said)
    assert " ".join(said).split() == reply.split()


def test_a_reply_that_fits_ten_messages_at_paragraphs_is_not_cut_into_more_at_sentences() -> None:
    """Ten messages at paragraphs, eleven at sentence ends (the first a sentence of three letters):
    the ten (a review's finding: the eleven went, and Twilio sent none)."""
    opening, listing = ("Ok. " + "word " * 199).strip(), ("item " * 140).strip()
    reply = "\n\n".join([opening, listing] * 5)
    assert len(split_message(reply, WHATSAPP_LIMIT)) == 10
    assert len(split_message(reply, WHATSAPP_LIMIT, at_paragraphs=False)) == 11
    assert messages_of(twiml(reply, WHATSAPP_LIMIT)) == split_message(reply, WHATSAPP_LIMIT)


def test_numbered_parts_keep_room_for_their_place_when_it_takes_a_digit_more() -> None:
    """SMS's parts each start with their place (core/surfaces/sms.py). Forty words in messages of 22:
    eight unnumbered; cut with room for `(8/8) `, ten; a place of ten, `(10/10) `, takes two more
    characters, so they are cut again with room for it: fourteen of three words, none longer than
    22 (cut only once, the tenth was 23, a body past the limit). A text of one message has no place."""
    text = " ".join(f"w{n:02d}" for n in range(40))
    parts = twilio_parts(text, 22, sms=True)
    assert len(split_message(text, 22)) == 8
    words = [" ".join(f"w{w:02d}" for w in range(3 * n, min(3 * n + 3, 40))) for n in range(14)]
    assert parts == [f"({n + 1}/14) {said}" for n, said in enumerate(words)]
    assert max(twilio_length(part) for part in parts) == 19  # "(10/14) w27 w28 w29"
    assert twilio_parts("w00 w01", 22, sms=True) == ["w00 w01"]
