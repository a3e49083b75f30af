"""Option groups: a command takes related options as one frozen value instead of one parameter each.

A group is a frozen dataclass whose fields are Typer options written as ``Annotated`` hints with
their defaults (``dsn: Annotated[Optional[str], typer.Option("--dsn", ...)] = None``). A command
decorated with ``@grouped`` names the group once (``ledger: LedgerOptions``); the decorator shows
Typer the group's fields in its place (through ``__signature__``, which ``inspect.signature`` reads
before anything else) and, on each call, builds the group from them before calling the command.
The command line is exactly what the fields say: same option names, defaults, help and callbacks.

Why not Typer's own: Typer maps one parameter to one option and has no notion of a group, and
click's ``Context.params`` would hand the command a loose dict again.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable
from typing import Any, TypeVar

R = TypeVar("R")


def is_group(hint: Any) -> bool:
    """A frozen dataclass (the class itself, not an instance) is an option group."""
    return (isinstance(hint, type) and dataclasses.is_dataclass(hint)
            and bool(getattr(hint, "__dataclass_params__").frozen))


def _fields(group: type) -> list[inspect.Parameter]:
    """The group's fields as keyword-only parameters: their ``Annotated`` hints and their defaults."""
    hints = typing.get_type_hints(group, include_extras=True)
    out = []
    for field in dataclasses.fields(group):
        if not field.init:
            continue
        if field.default is not dataclasses.MISSING:
            default: Any = field.default
        elif field.default_factory is not dataclasses.MISSING:
            default = field.default_factory()
        else:
            default = inspect.Parameter.empty  # a required option
        out.append(inspect.Parameter(field.name, inspect.Parameter.KEYWORD_ONLY, default=default,
                                     annotation=hints[field.name]))
    return out


class _Grouped:
    """A command with option groups: callable as Typer calls it, its spread signature made on first look.

    Lazy because every command module is imported on each start while Typer builds only the one
    command asked for (``main._app_for``): evaluating every command's hints at import would cost
    every start tens of milliseconds.
    """

    def __init__(self, command: Callable[..., Any]) -> None:
        functools.update_wrapper(self, command, assigned=("__module__", "__name__", "__qualname__", "__doc__"),
                                 updated=())
        self.__wrapped__ = command
        self._spread: tuple[inspect.Signature, dict[str, tuple[type, tuple[str, ...]]]] | None = None

    def _plan(self) -> tuple[inspect.Signature, dict[str, tuple[type, tuple[str, ...]]]]:
        if self._spread is None:
            self._spread = _spread(self.__wrapped__)
        return self._spread

    @property
    def __signature__(self) -> inspect.Signature:
        return self._plan()[0]

    @property
    def __annotations__(self) -> dict[str, Any]:  # type: ignore[override]
        # Typer also reads the hints (typing.get_type_hints): the shown parameters', already evaluated.
        shown = self._plan()[0]
        return {p.name: p.annotation for p in shown.parameters.values()} | {"return": shown.return_annotation}

    def __call__(self, **given: Any) -> Any:
        for name, (group, fields) in self._plan()[1].items():
            given[name] = group(**{f: given.pop(f) for f in fields})
        return self.__wrapped__(**given)


def _spread(command: Callable[..., Any]) -> tuple[inspect.Signature, dict[str, tuple[type, tuple[str, ...]]]]:
    """The signature Typer is shown (each group's fields in its place) and, per group, its class and fields."""
    hints = typing.get_type_hints(command, include_extras=True)
    shown: list[inspect.Parameter] = []
    groups: dict[str, tuple[type, tuple[str, ...]]] = {}
    for param in inspect.signature(command).parameters.values():
        hint = hints.get(param.name, param.annotation)
        if not is_group(hint):
            # Keyword-only: Typer calls with keywords, and a group's required field may follow a default.
            shown.append(param.replace(kind=inspect.Parameter.KEYWORD_ONLY, annotation=hint))
            continue
        fields = _fields(hint)
        groups[param.name] = (hint, tuple(f.name for f in fields))
        shown.extend(fields)
    names = [p.name for p in shown]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:  # two groups (or a group and a parameter) would fight over one option's value
        raise TypeError(f"{command.__qualname__}: option groups repeat {', '.join(twice)}")
    return inspect.Signature(shown, return_annotation=hints.get("return", inspect.Signature.empty)), groups


def grouped(command: Callable[..., R]) -> Callable[..., R]:
    """``command`` with each option-group parameter spread into its fields for Typer, and gathered back."""
    return _Grouped(command)


def written(command: Callable[..., Any]) -> Callable[..., Any]:
    """The command function as written (its groups as single parameters), under ``@grouped``."""
    return inspect.unwrap(command)


__all__ = ["grouped", "is_group", "written"]
