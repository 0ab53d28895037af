"""EXTRA_TOOLS: the model's tools an operator adds without editing core (docs/extending.md),
each named `package.module:callable` and imported once per instance, when its turns are built."""

from __future__ import annotations

import importlib
from collections.abc import Collection, Sequence

from core.errors import ConfigurationError
from core.turn.operator_tools import OperatorTool, OperatorTools, described


def extra_tools(entries: Sequence[str], built_in: Collection[str]) -> OperatorTools:
    """The tools the entries name; a ConfigurationError (503 `not_configured`) when one cannot be
    loaded or does not describe itself, so a typo never serves a model without its tool, or when
    one takes a name already taken (`built_in`: the built-in tools' that are on), which the model
    could not tell apart: the entry is named, and the one it would shadow."""
    tools: list[OperatorTool] = []
    named: dict[str, str] = {}
    for entry in entries:
        module, _, attribute = entry.partition(":")
        if not module or not attribute:
            raise ConfigurationError(f"EXTRA_TOOLS: {entry} is not package.module:callable")
        try:
            imported = importlib.import_module(module)
            if not hasattr(imported, attribute):  # a typo of its name, not an error in the module
                raise ConfigurationError(f"EXTRA_TOOLS: {entry}: {module} has no {attribute}")
            tool = described(getattr(imported, attribute), entry)
        except ConfigurationError:
            raise
        # An operator's module: missing, or failing as it imports or as its tool is read (a
        # property that reads a file: a 500 on every request); SystemExit too (a script's argparse
        # at its top), which would go past Flask and end the server's worker.
        except (Exception, SystemExit) as exc:
            # ImportError: the module, or one it imports, is not installed, or not where Python looks
            where = ": not installed, or not on PYTHONPATH" * isinstance(exc, ImportError)
            raise ConfigurationError(
                f"EXTRA_TOOLS: {entry} could not be loaded ({type(exc).__name__}{where})"
            ) from None
        if tool.name in built_in or tool.name in named:
            other = "a built-in tool" if tool.name in built_in else named[tool.name]
            raise ConfigurationError(
                f"EXTRA_TOOLS: {entry} is named {tool.name}, as {other} is: give it a name of its own"
            )
        named[tool.name] = entry
        tools.append(tool)
    return OperatorTools(tuple(tools))
