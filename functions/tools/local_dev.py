"""`make dev`: one local server with every function at its path, an embedded database,
the offline model, and development-only credentials that `crossmem say` also uses.

Each function is mounted as functions_framework builds it from main.py, so what runs
here is what runs on Cloud Functions. Development credentials are defaults only: any
variable already set (or in `.env`) wins. The server answers only requests addressed to
a loopback name: it hands out the owner's token, and a web page that reaches 127.0.0.1
by DNS rebinding still sends its own name as the Host.
"""

from __future__ import annotations

import html
import json
import os
import re
import signal
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.models import Surface
from core.surfaces import rules
from functions.function_settings import SURFACE_SETTINGS
from functions.settings import ReadBy, Settings

if TYPE_CHECKING:
    from core.follow_ups.delivery import FollowUpDelivery
    from core.surfaces.adapter import SayFollowUp, SurfaceAdapter

# Flask, functions_framework, PyJWT and the runtime (the whole server) are imported by the parts
# that serve: `crossmem say` runs apply_dev_defaults and deliver_locally alone, and should start fast.

# The apps a message can be sent from with `crossmem say` (every surface but the web, which the page is).
CHAT_SURFACES = tuple(surface.value for surface in Surface if surface.is_secondary)
# The surfaces whose deliveries `crossmem say` signs as Twilio's form: those TWILIO_AUTH_TOKEN's
# mark names (a Twilio function checks its signature with it). Telegram's are its update.
TWILIO_SURFACES = tuple(
    surface.value for surface in Surface if surface in SURFACE_SETTINGS["twilio_auth_token"].surfaces
)
DEMO_USER_ID = "00000000-0000-4000-8000-00000000d3e0"
DEMO_TELEGRAM_ID = "100200300"  # a Telegram user id; on every other app the demo person is a number
DEMO_NUMBER = "+15550100100"
DEMO_PAGE = Path(__file__).resolve().parent / "demo" / "index.html"
DEV_TOKEN_LIFETIME_S = 3600  # as Supabase's access tokens

DEV_DEFAULTS = {
    "APP_ENV": "local",
    "IDENTITY_POLICY": "owner",
    "OWNER_USER_ID": DEMO_USER_ID,
    # Every surface's owners' list (functions/settings.py marks them): the demo person's id there.
    **{
        name.upper(): DEMO_TELEGRAM_ID if Surface.TELEGRAM in mark.surfaces else DEMO_NUMBER
        for name, mark in SURFACE_SETTINGS.items()
        if mark.read_by is ReadBy.EVERY_FUNCTION
    },
    "TELEGRAM_WEBHOOK_SECRET": "local-telegram-secret",
    "TELEGRAM_REPLY_IN_WEBHOOK": "true",
    "TWILIO_AUTH_TOKEN": "local-twilio-auth-token",
    "SUPABASE_JWT_SECRET": "local-development-jwt-secret-at-least-32-bytes",
    # A small window and a short pause, so the demo shows memory notes after a few messages.
    "CONTEXT_MAX_MESSAGES": "8",
    "CONTEXT_WINDOW_STEP": "4",
    "DIGEST_PAUSE_SECONDS": "60",
}


LOOPBACK_HOST = re.compile(r"(localhost|127\.0\.0\.1|\[::1\])(:[0-9]{1,5})?", re.IGNORECASE)


def apply_dev_defaults(port: int) -> None:
    """Fill in the development values of the variables set neither in the environment nor
    in `.env` (read as Settings reads it: the environment would otherwise beat `.env`)."""
    from pydantic_settings import DotEnvSettingsSource

    in_dotenv = {name.upper() for name in DotEnvSettingsSource(Settings)()}
    for name, value in {**DEV_DEFAULTS, "PUBLIC_BASE_URL": f"http://127.0.0.1:{port}"}.items():
        if name not in in_dotenv:
            os.environ.setdefault(name, value)


def dev_token(lifetime_s: int = DEV_TOKEN_LIFETIME_S) -> str:
    """A Supabase-shaped access token for the owner, signed with the local JWT secret."""
    from core.identity.web_auth import hs256_token
    from functions import runtime

    config = runtime.settings()
    secret = config.supabase_jwt_secret
    if secret is None:
        raise RuntimeError("SUPABASE_JWT_SECRET is not set")
    user_id = str(config.owner_user_id or DEMO_USER_ID)
    now = int(time.time())
    claims: dict[str, Any] = {
        "sub": user_id,
        "aud": "authenticated",
        "role": "authenticated",
        "iat": now,
        "exp": now + lifetime_s,
        "iss": "http://127.0.0.1/auth/v1",
        "email": "demo@example.com",
        "phone": "",
        "aal": "aal1",
        "session_id": user_id,
        "is_anonymous": False,
    }
    return hs256_token(claims, secret.get_secret_value())


def cannot_sign(surface: str) -> str | None:
    """Why `crossmem say` cannot post a delivery on `surface` (it signs Telegram's updates and
    Twilio's forms only), or None."""
    if surface == "telegram" or surface in TWILIO_SURFACES:
        return None
    return (
        f"crossmem say cannot sign a delivery on {surface}: functions/tools/local_dev.py's deliver_locally"
        " signs Telegram's updates and Twilio's forms only (docs/extending.md, Adding a surface)"
    )


def deliver_locally(
    base_url: str, surface: str, text: str, config: Settings, sender: str | None = None
) -> tuple[int, str]:
    """Post a Telegram, WhatsApp or SMS delivery, signed as the real service signs it with the
    secrets of `config`, to a running dev server; return the status and the reply it carried.
    Raises OSError when nothing answers at `base_url`."""
    if surface == "telegram":
        if sender is not None and not rules(Surface.TELEGRAM).is_sender(sender):
            raise ValueError(
                f"--from on telegram is a Telegram user id (digits, e.g. {DEMO_TELEGRAM_ID}), not {sender!r}"
            )
        chat = int(sender or DEMO_TELEGRAM_ID)
        update = {
            "update_id": uuid.uuid4().int % 2**31,
            "message": {
                "message_id": 1,
                "date": int(time.time()),
                "chat": {"id": chat, "type": "private"},
                "from": {"id": chat, "is_bot": False, "first_name": "Demo"},
                "text": text,
            },
        }
        secret = config.telegram_webhook_secret.get_secret_value() if config.telegram_webhook_secret else ""
        headers = {"X-Telegram-Bot-Api-Secret-Token": secret}
        status, answer = post_locally(f"{base_url}/telegram", json.dumps(update), "application/json", headers)
        body = json.loads(answer)
        if status == 200 and not body.get("text") and body.get("ignored"):
            return status, f"(answered with no message: {body['ignored']})"
        return status, str(body.get("text") or json.dumps(body))
    if (unsigned := cannot_sign(surface)) is not None:
        raise ValueError(unsigned)
    from core.channels.whatsapp import sign_form

    # WhatsApp's numbers carry Twilio's `whatsapp:` prefix; an SMS's are the numbers alone.
    prefix = "whatsapp:" if surface == "whatsapp" else ""
    form = {
        "From": f"{prefix}{sender or DEMO_NUMBER}",
        "To": f"{prefix}+14155238886",
        "Body": text,
        "MessageSid": "SM" + uuid.uuid4().hex,
        "NumMedia": "0",
    }
    token = config.twilio_auth_token.get_secret_value() if config.twilio_auth_token else ""
    public = (config.public_base_url or base_url).rstrip("/") + f"/{surface}"
    headers = {"X-Twilio-Signature": sign_form(token, public, form)}
    form_type = "application/x-www-form-urlencoded"
    status, answer = post_locally(f"{base_url}/{surface}", urllib.parse.urlencode(form), form_type, headers)
    messages = re.findall(r"<Message>(.*?)</Message>", answer, flags=re.DOTALL)
    if messages:
        return status, html.unescape("\n".join(messages))
    return status, NO_MESSAGE if status == 200 else answer


# What `crossmem say` prints for a TwiML that says nothing (`<Response />`), as Twilio takes it.
NO_MESSAGE = (
    "(answered with no message: a keyword Twilio answers itself, STOP, START or HELP on SMS,"
    " or a message another attempt is still answering)"
)


# The standard library's client, not httpx: `crossmem say` talks to 127.0.0.1 only, and httpx
# (with the HTTP/2 stack it loads) would add a third of a second to every `say`. No proxy either:
# an http_proxy set for the outside world must not carry a request to the local server.
LOCAL_ONLY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def post_locally(url: str, body: str, content_type: str, headers: dict[str, str]) -> tuple[int, str]:
    """POST `body` to the dev server; its status and text, whatever the status."""
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"{url} is not an http:// or https:// URL")
    headers = {**headers, "Content-Type": content_type}
    request = urllib.request.Request(url, data=body.encode(), headers=headers, method="POST")  # noqa: S310 (checked above)
    try:
        with LOCAL_ONLY.open(request, timeout=60) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as refused:  # a 4xx or 5xx is still the server's answer
        with refused:
            return refused.code, refused.read().decode()


def run_scheduled_job() -> int:
    """One run of what Cloud Scheduler starts every minute: the follow-ups due (the demo page
    shows a web one when it next asks for the open conversation), then the memory digest.
    Answers how many follow-ups were sent."""
    from functions import runtime

    sent = dev_follow_up_delivery().run(time_budget_s=10).sent
    if runtime.settings().memory_notes:
        runtime.digest_job().run()
    return sent


def dev_follow_up_delivery() -> FollowUpDelivery:
    """The scheduled job's delivery, with every app `make dev` cannot push to (no bot token, no
    Twilio sender: every one but the web, by default) said on this server's console instead, and
    kept in its thread as sent, as the web's is: a reminder asked for on Telegram, WhatsApp or SMS
    arrives too (`crossmem history` and the page's conversations show it)."""
    from dataclasses import replace

    from core.follow_ups.delivery import FollowUpDelivery
    from functions import runtime

    adapters = {
        surface: replace(adapter, say_follow_up=said_here(surface)) if unreachable(surface, adapter) else adapter
        for surface, adapter in runtime.surfaces().items()
    }
    return FollowUpDelivery(
        runtime.store(), adapters, runtime.identity(), now=lambda: runtime.now(), catalogue=runtime.catalogue()
    )


def unreachable(surface: Surface, adapter: SurfaceAdapter) -> bool:
    """An app this deployment answers on but cannot push to (the web is never pushed to)."""
    return surface.is_secondary and adapter.reply_channel is None


def said_here(surface: Surface) -> SayFollowUp:
    """A follow-up for `surface`, printed where `make dev` runs."""
    from core.models import Delivery, Sent

    def say(to: str | None, row: Mapping[str, Any], now: datetime) -> tuple[Sent, str]:
        print(f"follow-up on {surface.value} to {to}: {row['content']}", flush=True)
        return Sent(Delivery.DELIVERED, 1), "sent"

    return say


def digest_every_minute() -> None:
    """Cloud Scheduler's part, locally: the scheduled job every minute, in the background."""
    from core.errors import CrossmemError

    while True:
        time.sleep(60)
        try:
            run_scheduled_job()
        except CrossmemError as exc:
            print(f"scheduled job: {exc}", file=sys.stderr)


def build_dev_mounts() -> dict[str, str]:
    """Each function of main.py that serves people, by the path `make dev` serves it on."""
    return {f"/{surface}": f"{surface}_webhook" for surface in CHAT_SURFACES} | {"/chat": "web_chat"}


def build_dev_app() -> Any:
    import flask
    from functions_framework import create_app
    from werkzeug.middleware.dispatcher import DispatcherMiddleware

    from core.stores.embedded import REPOSITORY
    from core.surfaces import rules
    from functions import runtime
    from functions.http import MAX_BODY_BYTES

    main = str(REPOSITORY / "main.py")
    site = flask.Flask("crossmem-dev")
    site.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES  # the functions' own limit, for the page's routes

    @site.get("/")
    def demo_page() -> flask.Response:
        return flask.send_file(DEMO_PAGE, mimetype="text/html")

    @site.get("/healthz")
    def healthz() -> flask.Response:
        config = runtime.settings()
        return flask.jsonify(
            ok=True,
            store=runtime.store_kind(config),
            model=runtime.model().name,
            max_message_chars=config.max_message_chars,
        )

    @site.get("/dev/surfaces")
    def surfaces() -> flask.Response:
        # The page's "other app" list and its surfaces' names, from `Surface`: a new surface
        # appears there without a line of the page changed.
        return flask.jsonify(
            surfaces=[{"surface": surface.value, "label": rules(surface).label} for surface in Surface],
            other_apps=list(CHAT_SURFACES),
        )

    @site.post("/dev/token")
    def token() -> flask.Response:
        # Shaped like a Supabase session, so the page renews it as a real frontend would.
        return flask.jsonify(access_token=dev_token(), expires_in=DEV_TOKEN_LIFETIME_S)

    @site.post("/dev/say")
    def say() -> flask.Response:
        body = flask.request.get_json(silent=True) or {}
        surface, text = body.get("surface"), str(body.get("text", "")).strip()
        if surface not in CHAT_SURFACES or not text:
            asked = f"give a surface ({'|'.join(CHAT_SURFACES)}) and a text"
            response = flask.jsonify(error="bad_request", message=asked)
            response.status_code = 400
            return response
        if (unsigned := cannot_sign(surface)) is not None:
            response = flask.jsonify(error="bad_request", message=unsigned)
            response.status_code = 400
            return response
        status, reply = deliver_locally(flask.request.host_url.rstrip("/"), surface, text, runtime.settings())
        return flask.jsonify(status=status, reply=reply)

    mounts = {
        route: create_app(function, main)  # type: ignore[no-untyped-call]
        for route, function in build_dev_mounts().items()
    }
    dispatcher = DispatcherMiddleware(site.wsgi_app, mounts)

    def app(environ: dict[str, Any], start_response: Any) -> Any:
        if not LOOPBACK_HOST.fullmatch(environ.get("HTTP_HOST", "")):
            refusal = {"error": "forbidden_host", "message": "this server answers only localhost, 127.0.0.1 and [::1]"}
            response = flask.Response(json.dumps(refusal), 403, mimetype="application/json")
            return response(environ, start_response)
        # A function's own root is "/": POST /telegram means /telegram/, as on Cloud Functions.
        if environ.get("PATH_INFO") in mounts:
            environ["PATH_INFO"] += "/"
        return dispatcher(environ, start_response)

    return app


def serve(port: int) -> None:
    from werkzeug.serving import make_server

    from core.errors import ConfigurationError
    from core.turn.operator_tools import OperatorTools
    from functions import runtime

    apply_dev_defaults(port)
    config = runtime.settings()
    config.require_valid()  # every function is served here: each setting that does not parse, named
    # What every function would answer to every request (503 `not_configured`), said once before
    # serving: APP_ENV=production from the environment or .env beats the development value.
    try:
        runtime.check_can_serve(config)
    except ConfigurationError as refused:
        raise ConfigurationError(f"APP_ENV={config.app_env} (the environment or .env): {refused}") from None
    # The port first: one in use stops here, saying so, before a database starts or a banner says
    # the server is on (werkzeug prints why and exits 1).
    server = make_server("127.0.0.1", port, build_dev_app(), threaded=True)
    runtime.build_store(config).close()  # start (and migrate) the embedded database now, failing loudly
    capabilities = runtime.capabilities(config)  # and EXTRA_TOOLS, which would otherwise refuse every turn
    print(f"crossmem on http://127.0.0.1:{port}  store={runtime.store_kind(config)}  model={runtime.model().name}")
    print("  demo page  /   " + "   ".join(f"{surface}  POST /{surface}" for surface in CHAT_SURFACES))
    print("  web  /chat   health  /healthz")
    extra = [
        tool.name for capability in capabilities if isinstance(capability, OperatorTools) for tool in capability.tools
    ]
    if extra:
        print("  extra tools  " + "  ".join(extra))
    # Another shell may not have PORT: the port it serves on, unless it is the one `say` assumes.
    port_option = "" if port == Settings.defaults().port else f" --port {port}"
    print(f'  try: .venv/bin/crossmem say{port_option} --surface telegram "I moved my dentist appointment to Friday"')
    # SIGTERM (a process manager) and SIGHUP (its terminal closed) end the server like Ctrl-C does,
    # so the embedded Postgres stops with it: killed by either, it ran on for good.
    for ending in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(ending, lambda signum, frame: sys.exit(0))
    threading.Thread(target=digest_every_minute, name="memory-digest", daemon=True).start()
    server.serve_forever()
