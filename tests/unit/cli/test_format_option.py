"""``-f`` means ``--format`` on every command: the error path reads it from the raw words (``cli.support.
json_requested``, since an error can come before the command's own parsing), so a command whose ``-f`` meant
something else would have its errors misread as a JSON request. The words and Click must agree."""

from __future__ import annotations

from typing import Any

import pytest

from offset_ledger.cli.support import json_requested
from tests.unit.cli.cli_run import click_commands


def _format_option(command: Any) -> Any:
    for param in command.params:
        names = {*param.opts, *param.secondary_opts}
        if names & {"-f", "--format"}:
            assert param.param_type_name == "option"
            return param
    return None


COMMANDS = dict(click_commands())
WITH_FORMAT = sorted(name for name, command in COMMANDS.items() if _format_option(command) is not None)


def test_every_short_f_is_the_format_option_and_takes_a_value() -> None:
    assert WITH_FORMAT, "no command has --format: the walk found nothing"
    for name, command in COMMANDS.items():
        option = _format_option(command)
        if option is None:
            continue
        assert "--format" in option.opts, f"{name}: its -f is not --format"
        assert not option.is_flag and option.nargs == 1, f"{name}: --format must take a value"
        # "-fjson" is read as -f json by the words too: no other short option may start with -f.
        others = {o for p in command.params if p is not option for o in p.opts if o.startswith("-f")
                  and not o.startswith("--")}
        assert not others, f"{name}: {others} would be read as -f"


WORDS = [["-f", "json"], ["--format", "json"], ["--format=json"], ["-fjson"], ["-f", "json", "--format", "table"],
         ["-f", "table", "-fjson"], ["-f", "table"], ["--format", "csv"], []]
# Each command with the words it accepts (``alerts`` has --format without -f).
CASES = [(name, words) for name in WITH_FORMAT for words in WORDS
         if "-f" in _format_option(COMMANDS[name]).opts or not any(w.startswith("-f") for w in words)]


@pytest.mark.parametrize(("name", "words"), CASES)
def test_the_words_and_click_agree_on_json(name: str, words: list[str]) -> None:
    command = COMMANDS[name]
    ctx = command.make_context(name, list(words), resilient_parsing=True)
    option = _format_option(command)
    assert json_requested([*name.split(), *words]) == (ctx.params[option.name] == "json")
