"""The model's tools as the settings give them. EXTRA_TOOLS: a tool an operator adds without
editing core (docs/extending.md); the docs' own example, loaded by `crossmem dev` in its own
process as `make dev` runs it, is called by the model (the real SDK against the fake Anthropic)
in a turn; an entry that cannot be loaded refuses to serve, naming it, with nothing stored.
TOOL_ROUNDS: the deployed function runs that many rounds."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from core.errors import ConfigurationError
from functions.extra_tools import extra_tools
from tests.fakes.anthropic_api import Answer, FakeAnthropic, tool_results, tool_use
from tests.helpers import TELEGRAM_SECRET, app_client, count, crossmem_dev, free_port, update

ROOT = Path(__file__).resolve().parents[2]
CROSSMEM = [sys.executable, "-m", "functions.tools.cli"]


def docs_example() -> str:
    """The first Python block of docs/extending.md: the example tool, as an operator copies it."""
    text = (ROOT / "docs" / "extending.md").read_text()
    found = re.search(r"```python\n(.*?)```", text, flags=re.DOTALL)
    assert found is not None, "docs/extending.md has no Python example"
    return found[1]


def docs_command() -> dict[str, str]:
    """The settings docs/extending.md's command line gives `make dev`, as an operator types them."""
    found = re.search(r"^((?:[A-Z_]+=\S+ )+)make dev$", (ROOT / "docs" / "extending.md").read_text(), re.MULTILINE)
    assert found is not None, "docs/extending.md has no `... make dev` line for its example"
    return dict(setting.split("=", 1) for setting in found[1].split())


@pytest.fixture
def dev(tmp_path: Path, database_url: str, fake_anthropic: FakeAnthropic) -> Iterator[dict[str, str]]:
    """`crossmem dev` with the docs' example saved where the docs say (the directory it runs in,
    as the project's root) and the docs' command line's settings, on the test's database, the
    model being the fake Anthropic."""
    (tmp_path / "my_tools.py").write_text(docs_example())
    command = docs_command()
    assert command == {"PYTHONPATH": ".", "EXTRA_TOOLS": "my_tools:opening_hours"}
    port = free_port()
    env = {
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": os.pathsep.join([str(ROOT), command["PYTHONPATH"]]),
        "PORT": str(port),
        "HOME": str(tmp_path),
        "DATABASE_URL": database_url,
        "ANTHROPIC_API_KEY": "sk-ant-test",
        "ANTHROPIC_BASE_URL": fake_anthropic.url,
        "EXTRA_TOOLS": command["EXTRA_TOOLS"],
    }
    server = crossmem_dev(env, tmp_path, port)
    yield env
    server.send_signal(signal.SIGTERM)
    printed, _ = server.communicate(timeout=30)
    assert "\n  extra tools  opening_hours\n" in printed  # the banner says the tool was loaded


def test_the_docs_example_tool_is_called_by_the_model_in_a_turn_through_crossmem_dev(
    dev: dict[str, str], fake_anthropic: FakeAnthropic
) -> None:
    def pharmacy(body: dict[str, Any]) -> Answer:
        results = tool_results(body)
        if results:
            return "Yes: " + str(results[0]["content"])
        return [tool_use("opening_hours", {"shop": "pharmacy"}, id="toolu_hours")]

    fake_anthropic.answer = pharmacy
    said = subprocess.run(
        [*CROSSMEM, "say", "--surface", "telegram", "is the pharmacy open tonight?"],
        env=dev,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert said.returncode == 0, said.stderr
    assert "Yes: The pharmacy is open every day 9:00-21:00." in said.stdout

    first, second = fake_anthropic.requests
    assert first["tools"][-1] == {
        "name": "opening_hours",
        "description": "When a shop near the person is open: the bakery or the pharmacy.",
        "input_schema": {
            "type": "object",
            "properties": {"shop": {"type": "string", "enum": ["bakery", "pharmacy"]}},
            "required": ["shop"],
        },
    }
    assert [tool["name"] for tool in first["tools"][:-1]] == [
        "schedule_follow_up",
        "list_follow_ups",
        "cancel_follow_up",
        "set_timezone",
        "search_memory",
    ]
    system = first["system"][0]["text"]
    assert "Shops nearby\n- opening_hours knows when the bakery and the pharmacy are open" in system
    assert system.index("Your memory") < system.index("Shops nearby") < system.index("What you cannot do")
    assert tool_results(second) == [
        {"type": "tool_result", "tool_use_id": "toolu_hours", "content": "The pharmacy is open every day 9:00-21:00."}
    ]


@pytest.mark.parametrize(
    ("entry", "error"),
    [
        (
            "no_such_module:tool",
            "EXTRA_TOOLS: no_such_module:tool could not be loaded "
            "(ModuleNotFoundError: not installed, or not on PYTHONPATH)",
        ),
        # a typo of the callable's name: not "could not be loaded (AttributeError)", which sent the
        # operator looking for an error in a module that imports fine
        ("json:no_such_thing", "EXTRA_TOOLS: json:no_such_thing: json has no no_such_thing"),
        ("json", "EXTRA_TOOLS: json is not package.module:callable"),
        ("json:__doc__", "EXTRA_TOOLS: json:__doc__ is not callable"),
        ("json:dumps", 'EXTRA_TOOLS: json:dumps needs an input_schema, a JSON schema of "type": "object"'),
    ],
)
def test_an_entry_that_describes_no_tool_is_refused_naming_it(entry: str, error: str) -> None:
    with pytest.raises(ConfigurationError) as refused:
        extra_tools([entry], ())
    assert str(refused.value) == error


@pytest.mark.parametrize("name", ["search_memory", "schedule_follow_up"])
def test_a_tool_named_like_a_built_in_one_is_refused_naming_its_entry(
    environment: pytest.MonkeyPatch, tmp_path: Path, fake_anthropic: FakeAnthropic, name: str
) -> None:
    """An operator's tool that would shadow the memory search's or the follow-ups': refused, saying
    which entry and why. Seen unclear: "two tools share a name: search_memory" named neither the
    setting nor the entry, nor that the other tool was a built-in one."""
    from functions.runtime import capabilities
    from functions.settings import Settings

    (tmp_path / f"clash_{name}.py").write_text(  # a module a name: Python keeps the first imported
        f"def {name}(arguments):\n"
        '    """Search elsewhere."""\n'
        '    return "nothing"\n'
        f'{name}.input_schema = {{"type": "object", "properties": {{}}}}\n'
    )
    environment.syspath_prepend(str(tmp_path))
    environment.setenv("EXTRA_TOOLS", f"clash_{name}:{name}")
    refusal = f"EXTRA_TOOLS: clash_{name}:{name} is named {name}, as a built-in tool is: give it a name of its own"
    with pytest.raises(ConfigurationError) as refused:
        capabilities(Settings(_env_file=None))  # type: ignore[call-arg]
    assert str(refused.value) == refusal
    response = app_client("telegram_webhook").post(
        "/", json=update("hello, clash", user_id=7005), headers={"X-Telegram-Bot-Api-Secret-Token": TELEGRAM_SECRET}
    )
    assert (response.status_code, response.get_json()) == (503, {"error": "not_configured", "message": refusal})
    assert fake_anthropic.requests == []


def test_two_entries_of_one_name_are_refused_naming_both(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "twice.py").write_text(
        "def lookup(arguments):\n"
        '    """Look something up."""\n'
        '    return "nothing"\n'
        'lookup.input_schema = {"type": "object", "properties": {}}\n'
        "again = lookup\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigurationError) as refused:
        extra_tools(["twice:lookup", "twice:again"], ())
    assert (
        str(refused.value) == "EXTRA_TOOLS: twice:again is named lookup, as twice:lookup is: give it a name of its own"
    )


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (
            "no_such_module:tool",
            "EXTRA_TOOLS: no_such_module:tool could not be loaded "
            "(ModuleNotFoundError: not installed, or not on PYTHONPATH)",
        ),
        ("json:no_such_tool", "EXTRA_TOOLS: json:no_such_tool: json has no no_such_tool"),
    ],
)
def test_a_function_whose_extra_tool_cannot_load_answers_503_and_stores_nothing(
    environment: pytest.MonkeyPatch, database_url: str, fake_anthropic: FakeAnthropic, entry: str, message: str
) -> None:
    environment.setenv("EXTRA_TOOLS", entry)
    client = app_client("telegram_webhook")
    response = client.post(
        "/",
        json=update("hello with a tool missing", user_id=7001),
        headers={"X-Telegram-Bot-Api-Secret-Token": TELEGRAM_SECRET},
    )
    assert (response.status_code, response.get_json()) == (503, {"error": "not_configured", "message": message})
    assert (
        count(database_url, "select count(*) from messages where content = %s", "hello with a tool missing") == 0
        and fake_anthropic.requests == []
    )


def test_a_module_that_exits_as_it_imports_is_refused_naming_it(
    environment: pytest.MonkeyPatch, tmp_path: Path, database_url: str, fake_anthropic: FakeAnthropic
) -> None:
    """A script's module made a tool: argparse at its top raises SystemExit, no Exception. Seen
    failing: it went past the loader's refusal, `crossmem dev` ended with the script's usage line
    (exit 2), and a function's request raised it out of Flask, which ends the server's worker."""
    (tmp_path / "script_tools.py").write_text(
        "import argparse\n"
        "parser = argparse.ArgumentParser()\n"
        'parser.add_argument("--city", required=True)\n'
        "ARGS = parser.parse_args()\n"
    )
    environment.syspath_prepend(str(tmp_path))
    environment.setenv("EXTRA_TOOLS", "script_tools:weather")
    response = app_client("telegram_webhook").post(
        "/",
        json=update("hello with a script as a tool", user_id=7003),
        headers={"X-Telegram-Bot-Api-Secret-Token": TELEGRAM_SECRET},
    )
    assert (response.status_code, response.get_json()) == (
        503,
        {"error": "not_configured", "message": "EXTRA_TOOLS: script_tools:weather could not be loaded (SystemExit)"},
    )
    assert count(database_url, "select count(*) from messages where content = %s", "hello with a script as a tool") == 0
    assert fake_anthropic.requests == []


def test_a_tool_whose_description_fails_as_it_is_read_is_refused_naming_it(
    environment: pytest.MonkeyPatch, tmp_path: Path, fake_anthropic: FakeAnthropic
) -> None:
    """A class's tool (the docs' way for type-checked code) whose description is a property that
    reads a file. Seen failing: its FileNotFoundError went past the loader, a 500 on every request,
    which Telegram redelivers."""
    (tmp_path / "class_tools.py").write_text(
        "class Weather:\n"
        '    name = "weather"\n'
        '    input_schema = {"type": "object"}\n'
        "\n"
        "    @property\n"
        "    def description(self):\n"
        '        return open("/nonexistent/weather.txt").read()\n'
        "\n"
        "    def __call__(self, arguments):\n"
        '        return "sunny"\n'
        "\n"
        "weather = Weather()\n"
    )
    environment.syspath_prepend(str(tmp_path))
    environment.setenv("EXTRA_TOOLS", "class_tools:weather")
    response = app_client("telegram_webhook").post(
        "/", json=update("hello, class", user_id=7004), headers={"X-Telegram-Bot-Api-Secret-Token": TELEGRAM_SECRET}
    )
    assert (response.status_code, response.get_json()) == (
        503,
        {
            "error": "not_configured",
            "message": "EXTRA_TOOLS: class_tools:weather could not be loaded (FileNotFoundError)",
        },
    )
    assert fake_anthropic.requests == []


NEVER_TEXT = """\
import functools


async def weather(arguments):
    \"\"\"Today's weather in a city.\"\"\"
    return "sunny"


def forecast(arguments):
    \"\"\"The next days' weather, one day at a time.\"\"\"
    yield "sunny"


class Clock:
    \"\"\"The time where the person is.\"\"\"

    name = "clock"

    def __call__(self, arguments):
        return "12:00"


class Tide:
    \"\"\"When the tide is high.\"\"\"

    async def __call__(self, arguments):
        return "at noon"


tide = Tide()
later_weather = functools.partial(weather)
for tool in (weather, forecast, Clock, Tide, later_weather):
    tool.input_schema = {"type": "object", "properties": {}}
later_weather.name = "later_weather"
later_weather.description = "Today's weather, later."
"""


@pytest.mark.parametrize(
    ("attribute", "why"),
    [
        ("weather", "is async: a tool is called, never awaited, and answers its text"),
        ("later_weather", "is async: a tool is called, never awaited, and answers its text"),
        ("tide", "is async: a tool is called, never awaited, and answers its text"),
        ("forecast", "is a generator: a tool answers its text"),
        ("Clock", "is a class: name an instance of it"),
    ],
)
def test_a_callable_that_could_never_answer_text_is_refused_where_it_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, attribute: str, why: str
) -> None:
    """An `async def` tool (an operator's network call written with httpx's async client), a
    generator, or the docs' class named instead of its instance. Seen failing: each loaded, `crossmem
    dev`'s banner named it, and every call was said back to the model as not done ("answered no
    text", or a TypeError: the class called with the arguments), with a coroutine never awaited on
    stderr, where a callable without an `input_schema` is refused before a turn is served."""
    (tmp_path / "never_text.py").write_text(NEVER_TEXT)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigurationError) as refused:
        extra_tools([f"never_text:{attribute}"], ())
    assert str(refused.value) == f"EXTRA_TOOLS: never_text:{attribute} {why}"


def test_a_partial_is_described_by_its_functions_docstring(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One function made several tools with functools.partial, each given its name. Seen failing:
    the model was told functools' own docstring, "partial(func, *args, **keywords) - new function
    with partial application of the given arguments and keywords.", as what each tool does."""
    (tmp_path / "partial_tools.py").write_text(
        "import functools\n"
        "\n"
        "def hours(shop, arguments):\n"
        '    """When the shop is open."""\n'
        '    return f"The {shop} is open."\n'
        "\n"
        'bakery = functools.partial(hours, "bakery")\n'
        'bakery.name = "bakery_hours"\n'
        'bakery.input_schema = {"type": "object", "properties": {}}\n'
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    [tool] = extra_tools(["partial_tools:bakery"], ()).tools
    assert tool.definition == {
        "name": "bakery_hours",
        "description": "When the shop is open.",
        "input_schema": {"type": "object", "properties": {}},
    }


def test_the_function_runs_tool_rounds_rounds_then_asks_for_an_answer(
    environment: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic
) -> None:
    environment.setenv("TOOL_ROUNDS", "1")

    def listing(body: dict[str, Any]) -> Answer:
        if body.get("tool_choice") == {"type": "none"}:
            return "Nothing is planned."
        return [tool_use("list_follow_ups", {}, id=f"l{len(body['messages'])}")]

    fake_anthropic.answer = listing
    client = app_client("telegram_webhook")
    response = client.post(
        "/", json=update("what is planned?", user_id=7002), headers={"X-Telegram-Bot-Api-Secret-Token": TELEGRAM_SECRET}
    )
    assert response.status_code == 200
    assert [body.get("tool_choice") for body in fake_anthropic.requests] == [None, {"type": "none"}]


def test_crossmem_dev_refuses_to_start_with_a_tool_it_cannot_load(tmp_path: Path, database_url: str) -> None:
    """Not a server whose /healthz says ok while every turn answers 503: it stops at once, saying why."""
    env = {
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": str(ROOT),
        "PORT": str(free_port()),
        "HOME": str(tmp_path),
        "DATABASE_URL": database_url,
        "EXTRA_TOOLS": "nope_tools:x",
    }
    done = subprocess.run([*CROSSMEM, "dev"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == (
        "crossmem dev: EXTRA_TOOLS: nope_tools:x could not be loaded "
        "(ModuleNotFoundError: not installed, or not on PYTHONPATH)"
    )


SCHEMA_SLIPS = '''
HOURS = {"bakery": "Mon-Sat 7:00-14:00", "pharmacy": "every day 9:00-21:00"}


def hours(arguments):
    """When a shop near the person is open."""
    return HOURS.get(str(arguments.get("shop")), "unknown")


def keys_hours(arguments):
    """When a shop near the person is open."""
    return hours(arguments)


def short_hours(arguments):
    """When a shop near the person is open."""
    return hours(arguments)


def loose_required(arguments):
    """When a shop near the person is open."""
    return hours(arguments)


def python_typed(arguments):
    """When a shop near the person is open."""
    return hours(arguments)


def loose_enum(arguments):
    """When a shop near the person is open."""
    return hours(arguments)


def quoted_length(arguments):
    """When a shop near the person is open."""
    return hours(arguments)


def required_twice(arguments):
    """When a shop near the person is open."""
    return hours(arguments)


hours.input_schema = {"type": "object", "properties": {"shop": {"type": "string", "enum": sorted(HOURS)}}}
keys_hours.input_schema = {"type": "object", "properties": {"shop": {"type": "string", "enum": HOURS.keys()}}}
short_hours.input_schema = {"type": "object", "properties": {"shop": "string"}}
loose_required.input_schema = {"type": "object", "properties": {"shop": {"type": "string"}}, "required": "shop"}
python_typed.input_schema = {"type": "object", "properties": {"days": {"type": "int"}}}
loose_enum.input_schema = {"type": "object", "properties": {"shop": {"type": "string", "enum": "bakery"}}}
quoted_length.input_schema = {"type": "object", "properties": {"shop": {"type": "string", "minLength": "3"}}}
required_twice.input_schema = {"type": "object", "required": ["shop", "shop"]}
'''


@pytest.mark.parametrize(
    ("tool", "error"),
    [
        ("keys_hours", "input_schema is not JSON (Object of type dict_keys is not JSON serializable)"),
        (
            "short_hours",
            'input_schema.properties.shop is refused by JSON Schema draft 2020-12: "string" is not of types '
            '"boolean", "object"',
        ),
        (
            "loose_required",
            'input_schema.required is refused by JSON Schema draft 2020-12: "shop" is not of type "array"',
        ),
        (
            "python_typed",
            'input_schema.properties.days.type is refused by JSON Schema draft 2020-12: "int" is not valid under '
            "any of the schemas listed in the 'anyOf' keyword: JSON Schema's types are "
            "array, boolean, integer, null, number, object, string",
        ),
        (
            "loose_enum",
            'input_schema.properties.shop.enum is refused by JSON Schema draft 2020-12: "bakery" is not of type '
            '"array"',
        ),
        # Seen passing the hand-written check, and refused by the Messages API in every request:
        (
            "quoted_length",
            'input_schema.properties.shop.minLength is refused by JSON Schema draft 2020-12: "3" is not of type '
            '"integer"',
        ),
        (
            "required_twice",
            'input_schema.required is refused by JSON Schema draft 2020-12: ["shop","shop"] has non-unique elements',
        ),
    ],
)
def test_a_schema_the_messages_api_would_refuse_is_refused_where_it_loads(
    environment: pytest.MonkeyPatch, tmp_path: Path, fake_anthropic: FakeAnthropic, tool: str, error: str
) -> None:
    """Five slips of a hand-written schema. Seen failing (a review of the tools): `HOURS.keys()` in
    an enum made every turn of every function a bare 500 before the message was stored (the turn's
    estimate could not serialise the tools), so Telegram redelivered it for a day and nobody was
    answered; a property written as "string", and `required` as a name, were sent with every request,
    which the Messages API refuses (400: "JSON schema is invalid. It must match JSON Schema draft
    2020-12"), so every turn answered the fallback; so were Python's "int" for "integer" and an
    enum of one value written without its list (draft 2020-12's meta-schema refuses both; the fake
    Anthropic checks no schema, so here those turns answered as if the tool were fine). Now each is
    refused as the docs say a tool that cannot load is: 503 `not_configured`, naming it and what is
    wrong."""
    (tmp_path / "schema_slips.py").write_text(SCHEMA_SLIPS)
    environment.syspath_prepend(str(tmp_path))
    assert extra_tools(["schema_slips:hours"], ()).definitions[0]["input_schema"]["properties"]["shop"]["enum"] == [
        "bakery",
        "pharmacy",
    ]
    with pytest.raises(ConfigurationError) as refused:
        extra_tools([f"schema_slips:{tool}"], ())
    assert str(refused.value) == f"EXTRA_TOOLS: schema_slips:{tool}'s {error}"
    environment.setenv("EXTRA_TOOLS", f"schema_slips:{tool}")
    response = app_client("telegram_webhook").post(
        "/",
        json=update("is the bakery open?", user_id=7201),
        headers={"X-Telegram-Bot-Api-Secret-Token": TELEGRAM_SECRET},
    )
    assert (response.status_code, response.get_json()["error"]) == (503, "not_configured")
    assert fake_anthropic.requests == []


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"shop": {"type": "string", "minLength": "3"}}},
        {"type": "object", "properties": {"shop": {"type": "string"}}, "required": ["shop", "shop"]},
        {"type": "object", "properties": {"days": {"type": "int"}}},
    ],
)
def test_the_fake_anthropic_refuses_a_tool_schema_as_the_messages_api_does(
    fake_anthropic: FakeAnthropic, schema: dict[str, Any]
) -> None:
    """The API checks every tool's input_schema against draft 2020-12's meta-schema and answers 400
    to the whole request. Seen missing: the fake checked none, so a turn with such a tool answered
    here as if it were fine, and only the real API said no."""
    import anthropic

    client = anthropic.Anthropic(api_key="sk-ant-test", base_url=fake_anthropic.url, max_retries=0)
    tools = [
        {"name": "fine", "description": "d", "input_schema": {"type": "object", "properties": {}}},
        {"name": "hours", "description": "d", "input_schema": schema},
    ]
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(
            model="claude-sonnet-5-5",
            max_tokens=50,
            messages=[{"role": "user", "content": "hello"}],
            tools=tools,  # type: ignore[arg-type]
        )
    assert (refused.value.status_code, refused.value.body) == (
        400,
        {
            "type": "error",
            "error": {
                "type": "invalid_request_error",
                "message": "tools.1.custom.input_schema: JSON schema is invalid. It must match JSON Schema draft "
                "2020-12 (https://json-schema.org/draft/2020-12). Learn more about tool use at "
                "https://platform.claude.com/docs/en/agents-and-tools/tool-use/overview.",
            },
        },
    )


def test_the_docs_give_tool_rounds_default_and_bounds_as_the_settings_do() -> None:
    """TOOL_ROUNDS outside 1 to 20 is refused (503 `not_configured`, naming it). Seen missing: the
    docs gave its default and no bound, so an operator who set 25 learnt the cap from the refusal."""
    from functions.settings import Settings

    field = Settings.model_fields["tool_rounds"]
    [low] = [bound.ge for bound in field.metadata if hasattr(bound, "ge")]
    [high] = [bound.le for bound in field.metadata if hasattr(bound, "le")]
    configuration = (ROOT / "docs" / "configuration.md").read_text()
    assert f"| `TOOL_ROUNDS` | `{field.default}` | rounds of tool calls a turn runs, {low} to {high} (" in configuration
    extending = (ROOT / "docs" / "extending.md").read_text()
    assert f"up to `TOOL_ROUNDS` rounds (default {field.default}, {low} to {high})" in extending


def test_the_docs_class_example_is_the_same_tool_and_passes_mypy_strict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/extending.md sends a deployed tool to functions/, where `make test`'s `mypy --strict`
    reads it, "so write it as the class below". Seen missing: no class was below, and the function
    example fails mypy --strict (an attribute set on a function, a bare `dict`)."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "extending.md").read_text(), flags=re.DOTALL)
    assert len(blocks) == 2, "docs/extending.md shows no class for type-checked code"
    (tmp_path / "plain_tools.py").write_text(blocks[0])
    (tmp_path / "typed_tools.py").write_text(blocks[1])
    monkeypatch.syspath_prepend(str(tmp_path))
    plain = extra_tools(["plain_tools:opening_hours"], ())
    typed = extra_tools(["typed_tools:opening_hours"], ())
    assert (typed.definitions, typed.instructions) == (plain.definitions, plain.instructions)
    assert typed.tools[0].run({"shop": "Bakery"}) == "The bakery is open Mon-Sat 7:00-14:00."
    checked = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "typed_tools.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (checked.returncode, checked.stdout) == (0, "Success: no issues found in 1 source file\n")
