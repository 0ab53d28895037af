"""One person on every app, through the real functions: link codes from the web, redeemed on
Telegram and WhatsApp, merging, unlinking, and the owner policy closed on the web."""

from __future__ import annotations

import json
import uuid

import pytest

from core.identity.linking import ANSWERS, LinkStatus
from functions.tools.cli import main
from tests.fakes.anthropic_api import FakeAnthropic
from tests.fakes.telegram_api import FakeTelegram
from tests.helpers import (
    CORPUS,
    ENGLISH,
    TELEGRAM_HEADERS,
    Apps,
    app_client,
    as_owner,
    bearer,
    count,
    form,
    messages_of,
    new_code,
    sent_texts,
    signed,
    stored_turn,
    telegram,
    update,
    whatsapp,
)

# The account of `bearer`'s tokens (its email claim), masked as a chat is shown it.
ACCOUNT = "u•••@example.com"
CALLBACK_QUERY = json.loads((CORPUS / "telegram" / "11_callback_query.json").read_text())


def linked() -> str:
    return ENGLISH.say(ANSWERS[LinkStatus.LINKED], account=ACCOUNT)


def tap(apps: Apps, data: str, chat: int | None = None) -> None:
    """The person taps a button under one of the bot's messages (the corpus's callback_query)."""
    tapped = json.loads(json.dumps(CALLBACK_QUERY))
    tapped["update_id"] = uuid.uuid4().int % 10**9
    tapped["callback_query"]["from"]["id"] = chat or apps.chat
    tapped["callback_query"]["message"]["chat"]["id"] = chat or apps.chat
    tapped["callback_query"]["data"] = data
    response = apps.telegram.post("/", json=tapped, headers=TELEGRAM_HEADERS)
    assert response.status_code == 200


def occurrences(texts: list[str], needle: str) -> int:
    return sum(text.count(needle) for text in texts)


def test_one_thread_across_telegram_the_web_and_whatsapp_once_linked(
    apps: Apps, fake_anthropic: FakeAnthropic, fake_telegram: FakeTelegram, database_url: str
) -> None:
    telegram(apps, "My sister's name is Carmen")
    telegram(apps, "The dentist moved to Friday")
    person = uuid.uuid4()
    issued = new_code(apps, person)
    assert issued["telegram_url"] == f"https://t.me/advisor_bot?start={issued['code']}"
    assert issued["whatsapp_text"] == f"link {issued['code']}"
    # The deep link's one tap on a chat with history links nothing yet: it asks, naming the account.
    telegram(apps, f"/start {issued['code']}")
    question = fake_telegram.sent()[-1]
    assert question["text"] == (
        f"This code would join this chat to the web account {ACCOUNT}, and move what we have said here (4 messages)"
        f" to it: whoever signs in there would read it. Only if that account is yours, tap Confirm, or send: "
        f"/link {issued['code']}"
    )
    assert question["reply_markup"] == {
        "inline_keyboard": [[{"text": "Confirm", "callback_data": f"link:{issued['code']}"}]]
    }
    assert count(database_url, "select count(*) from identities where user_id = %s", person) == 0
    tap(apps, question["reply_markup"]["inline_keyboard"][0][0]["callback_data"])
    assert fake_telegram.sent("answerCallbackQuery")[-1] == {"callback_query_id": "4278655576917205700"}
    assert fake_telegram.sent()[-1] == {"chat_id": apps.chat, "text": linked()}

    asked = len(fake_anthropic.requests)
    response = apps.web.post("/", json={"message": "What do you know about me?"}, headers=bearer(person))
    assert response.status_code == 200
    assert len(fake_anthropic.requests) == asked + 1
    texts = sent_texts(fake_anthropic.requests[-1])
    assert occurrences(texts, "My sister's name is Carmen") == 1
    assert occurrences(texts, "The dentist moved to Friday") == 1
    assert texts[-1].endswith("What do you know about me?")

    second = new_code(apps, person)
    assert whatsapp(apps, f"  link {second['code'].lower()} ") == [linked()]
    whatsapp(apps, "What did I tell you on the other apps?")
    texts = sent_texts(fake_anthropic.requests[-1])
    assert occurrences(texts, "My sister's name is Carmen") == 1
    assert occurrences(texts, "What do you know about me?") == 1
    assert texts[-1].endswith("What did I tell you on the other apps?")
    # The commands themselves are never part of the thread.
    assert count(database_url, "select count(*) from messages where user_id = %s", person) == 8
    commands = "select count(*) from messages where user_id = %s and (content ilike %s or content ilike %s)"
    assert count(database_url, commands, person, "%link%", "%start%") == 0

    listed = apps.web.get("/links", headers=bearer(person))
    assert listed.status_code == 200
    assert [(item["surface"], item["external_id"]) for item in listed.get_json()["links"]] == [
        ("telegram", "•" * (len(str(apps.chat)) - 4) + str(apps.chat)[-4:]),
        ("whatsapp", "+34" + "•" * 9 + "7888"),
    ]


def test_an_update_delivered_before_the_link_and_again_after_is_one_message_and_one_model_call(
    apps: Apps, fake_anthropic: FakeAnthropic, fake_telegram: FakeTelegram, database_url: str
) -> None:
    telegram(apps, "Remember the locker code 4417", update_id=880001)
    asked, sent = len(fake_anthropic.requests), len(fake_telegram.sent())
    person = uuid.uuid4()
    telegram(apps, f"/link {new_code(apps, person)['code']}")
    telegram(apps, "Remember the locker code 4417", update_id=880001)
    assert len(fake_anthropic.requests) == asked
    assert len(fake_telegram.sent()) == sent + 1  # the link's answer, not a second reply
    # The chat's own: another test's chat may have sent an update 880001 to this session's database.
    once = "select count(*) from messages where external_id = '880001' and sender = %s"
    assert count(database_url, once, str(apps.chat)) == 1
    assert count(database_url, "select count(*) from messages where user_id = %s and role = 'user'", person) == 1


def test_after_unlinking_the_surface_sees_none_of_the_web_persons_memory(
    apps: Apps, fake_anthropic: FakeAnthropic, fake_telegram: FakeTelegram, database_url: str
) -> None:
    person = uuid.uuid4()
    telegram(apps, f"/start {new_code(apps, person)['code']}")
    telegram(apps, "My passport number ends in 7731")
    apps.web.post("/", json={"message": "And my bank is Northwind"}, headers=bearer(person))
    response = apps.web.delete("/links/telegram", headers=bearer(person))
    assert (response.status_code, response.get_json()) == (200, {"surface": "telegram", "unlinked": 1})
    assert apps.web.get("/links", headers=bearer(person)).get_json() == {"links": []}
    telegram(apps, "What do you know about me?")
    texts = sent_texts(fake_anthropic.requests[-1])
    assert len(texts) == 1 and texts[0].endswith("What do you know about me?")
    # The web person keeps what was said.
    assert count(database_url, "select count(*) from messages where user_id = %s", person) == 4


def test_unlink_from_telegram_and_from_whatsapp(apps: Apps, fake_telegram: FakeTelegram) -> None:
    person = uuid.uuid4()
    telegram(apps, f"/start {new_code(apps, person)['code']}")
    whatsapp(apps, f"link {new_code(apps, person)['code']}")
    telegram(apps, "/unlink")
    assert fake_telegram.sent()[-1] == {"chat_id": apps.chat, "text": ENGLISH.say("link.unlinked")}
    assert whatsapp(apps, "UNLINK") == [ENGLISH.say("link.unlinked")]
    assert apps.web.get("/links", headers=bearer(person)).get_json() == {"links": []}


def test_a_wrong_code_on_telegram_is_answered_and_links_nothing(
    apps: Apps, fake_telegram: FakeTelegram, database_url: str
) -> None:
    telegram(apps, "/link ABCDEFGHJ")
    assert fake_telegram.sent()[-1]["text"] == ENGLISH.say(ANSWERS[LinkStatus.INVALID])
    linked = "select count(*) from identities where external_id = %s and linked_at is not null"
    assert count(database_url, linked, str(apps.chat)) == 0
    # A deep link whose payload is not a code (a campaign tag, say) is only a welcome.
    telegram(apps, "/start from-the-newsletter")
    assert fake_telegram.sent()[-1]["text"] == (
        "Hi! I'm your advisor. Write to me here or on any other app you reach me on:"
        " I remember our one conversation across all of them."
    )


def test_a_number_alone_that_no_code_has_is_a_message_of_the_thread(
    apps: Apps, fake_anthropic: FakeAnthropic, fake_telegram: FakeTelegram, database_url: str
) -> None:
    """An order number typed alone reads as a code ("482 739 256": nine characters of the code
    alphabet). No code has it: the model answers it and it is stored, counted as a wrong code all
    the same (guessing stays bounded); a real code sent alone still links. Seen failing with the
    number swallowed as a wrong code, never answered or remembered."""
    fake_anthropic.answer = lambda body: "Order noted."
    telegram(apps, "482 739 256")
    assert fake_telegram.sent()[-1]["text"] == "Order noted."
    assert sent_texts(fake_anthropic.requests[-1])[-1].endswith("] 482 739 256")
    stored = "select count(*) from messages where content = '482 739 256'"
    attempts = "select count(*) from link_attempts where external_id = %s"
    assert count(database_url, stored) == 1 and count(database_url, attempts, str(apps.chat)) == 1
    assert whatsapp(apps, "ABC-234-XYZ") == ["Order noted."]
    assert count(database_url, "select count(*) from messages where content = 'ABC-234-XYZ'") == 1

    person = uuid.uuid4()
    issued = new_code(apps, person)
    telegram(apps, issued["code"])
    assert fake_telegram.sent()[-1]["text"] == linked()
    assert count(database_url, f"select count(*) from messages where content = '{issued['code']}'") == 0


def test_a_forwarded_link_command_is_not_the_persons_and_links_nothing(
    apps: Apps, fake_anthropic: FakeAnthropic, fake_telegram: FakeTelegram, database_url: str
) -> None:
    """Someone else's message, forwarded to the bot, is not a command the person gave: a stranger who
    gets them to forward "/link CODE" (a long press and a tap, as little as the deep link the
    question guards) would otherwise have their whole thread moved to the stranger's web account,
    unasked. Seen failing with the forward linked at once."""
    telegram(apps, "My sister's name is Carmen")
    stranger = uuid.uuid4()
    issued = new_code(apps, stranger)
    origin = {"type": "user", "sender_user": {"id": 7001, "is_bot": False, "first_name": "Mallory"}, "date": 1732860000}
    for text in (f"/link {issued['code']}", f"link {issued['code']}", issued["code"]):
        body = update(text, user_id=apps.chat)
        body["message"]["forward_origin"] = origin
        assert apps.telegram.post("/", json=body, headers=TELEGRAM_HEADERS).status_code == 200
    assert count(database_url, "select count(*) from identities where user_id = %s", stranger) == 0
    assert count(database_url, "select count(*) from messages where user_id = %s", stranger) == 0
    assert linked() not in [payload["text"] for payload in fake_telegram.sent()]
    # The person's own message, forwarded (the code sent to their Saved Messages on the computer,
    # forwarded on the phone): their own words, a command as typed.
    person = uuid.uuid4()
    mine = update(f"/link {new_code(apps, person)['code']}", user_id=apps.chat)
    mine["message"]["forward_origin"] = {**origin, "sender_user": {"id": apps.chat, "is_bot": False}}
    assert apps.telegram.post("/", json=mine, headers=TELEGRAM_HEADERS).status_code == 200
    assert fake_telegram.sent()[-1]["text"] == linked()
    assert count(database_url, "select count(*) from identities where user_id = %s", person) == 1


def test_a_message_forwarded_on_whatsapp_is_no_command_and_stays_someone_elses(
    apps: Apps, fake_anthropic: FakeAnthropic, database_url: str
) -> None:
    """Twilio marks a WhatsApp forward `Forwarded=true` (`FrequentlyForwarded=true` when WhatsApp
    says "Forwarded many times"): words that came from someone else. Read as typed, a stranger's forwarded
    `link CODE` moved the person's whole thread to the stranger's web account at once (WhatsApp
    asks nothing first), and a forwarded "I am allergic to peanuts" was kept as theirs. Seen failing
    with the forward linked."""
    whatsapp(apps, "My sister's name is Carmen")
    stranger = uuid.uuid4()
    issued = new_code(apps, stranger)
    for text, flag in ((f"link {issued['code']}", "Forwarded"), (issued["code"], "FrequentlyForwarded")):
        fields = form(text, sender=f"whatsapp:{apps.number}", **{flag: "true"})
        response = apps.whatsapp.post("/", data=fields, headers=signed(fields))
        assert response.status_code == 200 and messages_of(response.text) != [linked()]
        assert stored_turn(database_url, fields["MessageSid"])[0] == ("user", f"[forwarded] {text}")
    assert count(database_url, "select count(*) from identities where user_id = %s", stranger) == 0
    assert count(database_url, "select count(*) from messages where user_id = %s", stranger) == 0
    # Their own words, typed (`Forwarded=false`, or no such field): a command.
    mine = form(f"link {issued['code']}", sender=f"whatsapp:{apps.number}", Forwarded="false")
    assert messages_of(apps.whatsapp.post("/", data=mine, headers=signed(mine)).text) == [linked()]


def test_a_tap_the_webhook_cannot_use_is_still_answered_so_its_spinner_stops(
    apps: Apps, fake_telegram: FakeTelegram, database_url: str
) -> None:
    """The Bot API's callback_query: "Telegram clients will display a progress bar until you call
    answerCallbackQuery. It is, therefore, necessary to react by calling answerCallbackQuery even if no
    notification to the user is needed." A Confirm that comes without its `message` (Bot API 10.5's
    callback_query_mode: docs/decisions.md) or any other button links nothing, and is answered. Seen
    failing with no answerCallbackQuery at all."""
    person = uuid.uuid4()
    issued = new_code(apps, person)
    tapped = json.loads(json.dumps(CALLBACK_QUERY))
    tapped["update_id"] = uuid.uuid4().int % 10**9
    tapped["callback_query"]["from"]["id"] = apps.chat
    del tapped["callback_query"]["message"]
    tapped["callback_query"] |= {"inline_message_id": "AAAAAFx3", "data": f"link:{issued['code']}"}
    for body in (tapped, CALLBACK_QUERY):
        response = apps.telegram.post("/", json=body, headers=TELEGRAM_HEADERS)
        assert response.status_code == 200 and response.get_json()["ignored"] == "callback_query"
    assert fake_telegram.sent("answerCallbackQuery") == [{"callback_query_id": "4278655576917205700"}] * 2
    assert count(database_url, "select count(*) from identities where user_id = %s", person) == 0
    assert fake_telegram.sent() == []


def test_a_redelivered_code_counts_one_wrong_code(
    apps: Apps, fake_anthropic: FakeAnthropic, fake_telegram: FakeTelegram, database_url: str
) -> None:
    """Telegram delivers one update again (a slow answer, a 503 `still_answering`): one message,
    one wrong code, whether it says `/link` or is a code alone. Seen failing with each delivery
    counted, so one order number sent while the model was slow used up the hour's attempts."""
    fake_anthropic.answer = lambda body: "Order noted."
    for _ in range(3):
        telegram(apps, "ABC 234 789", update_id=777)
        telegram(apps, "/link ABCDEFGHJ", update_id=778)
    attempts = "select count(*) from link_attempts where external_id = %s"
    assert count(database_url, attempts, str(apps.chat)) == 2
    invalid = ENGLISH.say(ANSWERS[LinkStatus.INVALID])
    assert [sent["text"] for sent in fake_telegram.sent()] == ["Order noted.", invalid, invalid, invalid]
    assert count(database_url, "select count(*) from messages where content = 'ABC 234 789'") == 1


WEB_ROUTES = [
    ("post", "/", {"message": "hello"}),
    ("get", "/conversations", None),
    ("post", "/conversations", {"title": "x"}),
    ("get", f"/conversations/{uuid.uuid4()}/messages", None),
    ("post", "/links", None),
    ("get", "/links", None),
    ("delete", "/links/telegram", None),
    ("delete", "/memory", None),
    ("delete", f"/conversations/{uuid.uuid4()}", None),
    ("get", "/no-such-route", None),
]


def test_owner_mode_answers_another_users_token_403_on_every_route_and_stores_nothing(
    apps: Apps, environment: pytest.MonkeyPatch, owner: uuid.UUID, fake_anthropic: FakeAnthropic, database_url: str
) -> None:
    as_owner(environment, owner)
    web = app_client("web_chat")
    stranger = uuid.uuid4()
    everything = "select (select count(*) from messages) + (select count(*) from conversations)"
    before = count(database_url, everything)
    for method, path, body in WEB_ROUTES:
        response = getattr(web, method)(path, json=body, headers=bearer(stranger))
        assert response.status_code == 403, (method, path)
        assert response.get_json()["error"] == "forbidden"
    assert count(database_url, everything) == before and fake_anthropic.requests == []
    # The owner is served as before; linking is not needed, and says why.
    assert web.post("/", json={"message": "hello"}, headers=bearer(owner)).status_code == 200
    for method, path in (("post", "/links"), ("get", "/links"), ("delete", "/links/whatsapp")):
        response = getattr(web, method)(path, headers=bearer(owner))
        assert response.status_code == 409
        assert response.get_json()["error"] == "linking_not_needed"
        assert "IDENTITY_POLICY=owner" in response.get_json()["message"]
    # Nothing to link: the owner's number typed alone is a message of the thread, never an answer
    # that linking is not needed.
    fake_anthropic.answer = lambda body: "Order noted."
    owners_app = app_client("telegram_webhook")
    response = owners_app.post("/", json=update("482 739 256", user_id=4242), headers=TELEGRAM_HEADERS)
    assert response.status_code == 200 and sent_texts(fake_anthropic.requests[-1])[-1].endswith("] 482 739 256")


def test_operator_commands_link_list_and_unlink(
    apps: Apps, capsys: pytest.CaptureFixture[str], database_url: str
) -> None:
    person = uuid.uuid4()
    telegram(apps, "before the operator links me", chat=6262)
    assert main(["link", "--user", str(person), "--surface", "telegram", "--external-id", "6262", "--yes"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"linked: telegram 6262 -> {person} (2 message(s) moved)"
    assert main(["identities", "--user", str(person), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(row["surface"], row["external_id"]) for row in listed] == [("telegram", "6262")]
    assert main(["unlink", "--surface", "telegram", "--external-id", "6262"]) == 0
    assert capsys.readouterr().out == "unlinked 1 identity\n"
    assert main(["unlink", "--surface", "telegram", "--external-id", "6262"]) == 1
    assert count(database_url, "select count(*) from messages where user_id = %s", person) == 2


def test_a_whatsapp_history_joins_the_web_person_when_linked(
    apps: Apps, fake_anthropic: FakeAnthropic, database_url: str
) -> None:
    whatsapp(apps, "My landlord is called Mr Okafor")
    person = uuid.uuid4()
    assert whatsapp(apps, f"link {new_code(apps, person)['code']}") == [linked()]
    apps.web.post("/", json={"message": "Who is my landlord?"}, headers=bearer(person))
    assert occurrences(sent_texts(fake_anthropic.requests[-1]), "My landlord is called Mr Okafor") == 1
    assert count(database_url, "select count(*) from messages where user_id = %s", person) == 4


def test_a_message_typed_on_the_web_in_the_telegram_thread_reads_what_whatsapp_was_just_told(
    apps: Apps, fake_anthropic: FakeAnthropic
) -> None:
    """The web lists the person's [Telegram] thread, and they type in it at their desk: the model
    read that thread alone, and did not know what they told it on WhatsApp a minute before (Telegram
    itself, and a new web conversation, read it). It reads the other apps' latest before the
    thread, as a web conversation does, and the thread's own messages once."""
    person = uuid.uuid4()
    telegram(apps, f"/start {new_code(apps, person)['code']}")
    assert whatsapp(apps, f"link {new_code(apps, person)['code']}") == [linked()]
    telegram(apps, "My sister's name is Carmen")
    whatsapp(apps, "My dog is called Bruno")
    conversations = apps.web.get("/conversations", headers=bearer(person)).get_json()["conversations"]
    [thread] = [conversation["id"] for conversation in conversations if conversation["surface"] == "telegram"]
    asked = {"message": "What is my dog called?", "conversation_id": thread}
    assert apps.web.post("/", json=asked, headers=bearer(person)).status_code == 200
    texts = sent_texts(fake_anthropic.requests[-1])
    assert occurrences(texts, "My dog is called Bruno") == 1
    assert occurrences(texts, "My sister's name is Carmen") == 1
    assert texts[-1].endswith("What is my dog called?")


def test_with_the_database_down_linking_answers_and_never_fails(
    apps: Apps, environment: pytest.MonkeyPatch, fake_telegram: FakeTelegram
) -> None:
    environment.setenv("DATABASE_URL", "postgresql://postgres@127.0.0.1:1/postgres")
    down = Apps(
        app_client("telegram_webhook"), app_client("whatsapp_webhook"), app_client("web_chat"), apps.chat, apps.number
    )
    response = down.web.post("/links", headers=bearer(uuid.uuid4()))
    assert (response.status_code, response.get_json()["error"]) == (503, "store_unavailable")
    assert down.web.get("/links", headers=bearer(uuid.uuid4())).status_code == 503
    telegram(down, "/start ABCDEFGHJ")
    assert fake_telegram.sent()[-1] == {"chat_id": apps.chat, "text": ENGLISH.say("link.unavailable")}
    assert whatsapp(down, "unlink") == [ENGLISH.say("link.unavailable")]


def test_the_link_command_alone_says_how_to_send_the_code_and_is_no_turn(
    apps: Apps, fake_anthropic: FakeAnthropic, fake_telegram: FakeTelegram
) -> None:
    """The bot's menu sends `/link` with no code; WhatsApp's person types `link`: each is told the
    command with a code after it, in its own app's way of writing it; no model is asked."""
    for text in ("/link", "/link@advisor_bot"):
        telegram(apps, text)
        assert fake_telegram.sent()[-1] == {
            "chat_id": apps.chat,
            "text": ENGLISH.say("link.no_code", example="/link ABC234XYZ"),
        }
    assert whatsapp(apps, "Link") == [ENGLISH.say("link.no_code", example="link ABC234XYZ")]
    assert fake_anthropic.requests == []  # no turn: nothing of it is the thread's


@pytest.mark.parametrize("whose", ["another person's tap", "a group's chat", "a bot's tap", "not a code"])
def test_a_confirm_tap_that_is_not_the_chats_own_person_links_nothing(
    apps: Apps, fake_telegram: FakeTelegram, database_url: str, whose: str
) -> None:
    """The Confirm button links only the private chat of the person who tapped it: a tap whose sender
    is not the chat (a group, someone else's), a bot's, or data that is no code, is ignored (its spinner
    stopped) and links nothing."""
    person = uuid.uuid4()
    issued = new_code(apps, person)
    tapped = json.loads(json.dumps(CALLBACK_QUERY))
    tapped["update_id"] = uuid.uuid4().int % 10**9
    query = tapped["callback_query"]
    query["from"]["id"] = query["message"]["chat"]["id"] = apps.chat
    query["data"] = f"link:{issued['code']}"
    if whose == "another person's tap":
        query["from"]["id"] = apps.chat + 1
    elif whose == "a group's chat":
        query["message"]["chat"] = {"id": apps.chat, "type": "group", "title": "Family"}
    elif whose == "a bot's tap":
        query["from"]["is_bot"] = True
    else:
        query["data"] = "link:not-a-code!"
    response = apps.telegram.post("/", json=tapped, headers=TELEGRAM_HEADERS)
    assert response.status_code == 200 and response.get_json() == {"ok": True, "ignored": "callback_query"}
    assert fake_telegram.sent("answerCallbackQuery") == [{"callback_query_id": query["id"]}]
    assert fake_telegram.sent() == []
    assert count(database_url, "select count(*) from identities where user_id = %s", person) == 0


def test_a_link_question_answered_in_the_webhooks_response_carries_its_confirm_button(
    apps: Apps, environment: pytest.MonkeyPatch, fake_telegram: FakeTelegram, database_url: str
) -> None:
    """TELEGRAM_REPLY_IN_WEBHOOK: the deep link's question on a chat with history goes back in the
    webhook's response; without its button the person could only type the command out."""
    telegram(apps, "My sister's name is Carmen")
    environment.setenv("TELEGRAM_REPLY_IN_WEBHOOK", "true")
    client = app_client("telegram_webhook")
    person = uuid.uuid4()
    code = new_code(apps, person)["code"]
    response = client.post("/", json=update(f"/start {code}", user_id=apps.chat), headers=TELEGRAM_HEADERS)
    answer = response.get_json()
    assert (answer["method"], answer["chat_id"]) == ("sendMessage", apps.chat)
    assert answer["text"].startswith(f"This code would join this chat to the web account {ACCOUNT}")
    assert answer["reply_markup"] == {"inline_keyboard": [[{"text": "Confirm", "callback_data": f"link:{code}"}]]}
    assert count(database_url, "select count(*) from identities where user_id = %s", person) == 0


def test_an_account_signed_in_by_phone_is_named_by_its_last_four_digits(apps: Apps, database_url: str) -> None:
    """Supabase's phone sign-in: the token's email is empty and its phone the number. The chat that
    links is told the account as `•••` and its last four digits, never the whole number."""
    person = uuid.uuid4()
    made = apps.web.post("/links", headers=bearer(person, email="", phone="34600111222"))
    assert made.status_code == 201
    said = whatsapp(apps, f"link {made.get_json()['code']}")
    assert said == [ENGLISH.say(ANSWERS[LinkStatus.LINKED], account="•••1222")]
    assert "34600111222" not in said[0]
    assert count(database_url, "select count(*) from identities where user_id = %s", person) == 1
