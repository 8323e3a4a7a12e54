"""--help in the user's words: each argument shown by its metavar (MODEL, CONFIG, REPORT...), not
by Typer's Python type (``<path>``, ``<list[Path]>``) nor as ``{model}`` in the usage line.

Options name their metavar where they are declared; arguments need this too, because Typer adds
its type label after an argument's name whatever its metavar. The application's group class
gives every command's arguments the class below, so a command added later is covered as well.
"""

from __future__ import annotations

from typing import Any

from typer.core import TyperArgument, TyperGroup


class WordArgument(TyperArgument):
    """An argument shown by its metavar alone: ``MODEL`` when required, ``[MODEL]`` when not."""

    def _usage_display_name(self) -> str:
        name = self.metavar or self.name.upper()
        if self.nargs != 1 and not name.endswith("..."):
            name += "..."
        return name if self.required else f"[{name}]"

    def display_type_rich(self, ctx: Any) -> str | None:  # noqa: ARG002 - Typer's signature
        return None  # the metavar already says what the argument is


class WordsGroup(TyperGroup):
    """The ortprep application's group: every command's arguments become :class:`WordArgument`."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        for command in self.commands.values():
            for param in command.params:
                if type(param) is TyperArgument:
                    param.__class__ = WordArgument
