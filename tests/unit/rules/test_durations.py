"""The one duration grammar (``offset_ledger.rules.durations``) and every place that reads a duration."""

from __future__ import annotations

from datetime import timedelta

import pytest

from offset_ledger.errors import InvalidDuration, InvalidInput
from offset_ledger.rules.durations import parse_duration, parse_duration_ms


@pytest.mark.parametrize("text, expected", [
    # ISO 8601, as kafka-consumer-groups' --by-duration takes it
    ("PT30M", timedelta(minutes=30)), ("P30D", timedelta(days=30)), ("P1DT2H", timedelta(days=1, hours=2)),
    ("PT0.5S", timedelta(seconds=0.5)), ("pt10m", timedelta(minutes=10)), ("P2W", timedelta(weeks=2)),
    ("PT1H30M", timedelta(minutes=90)),
    # a number and a unit
    ("30m", timedelta(minutes=30)), ("10min", timedelta(minutes=10)), ("10 minutes", timedelta(minutes=10)),
    ("12h", timedelta(hours=12)), ("30d", timedelta(days=30)), ("45s", timedelta(seconds=45)),
    ("500ms", timedelta(milliseconds=500)), ("1.5h", timedelta(minutes=90)), ("2 weeks", timedelta(weeks=2)),
    ("1h30m", timedelta(minutes=90)), ("1 minute 30 seconds", timedelta(seconds=90)),
    ("interval 5 minutes", timedelta(minutes=5)), (" 2 Days ", timedelta(days=2)), ("10 hrs", timedelta(hours=10)),
    # from Python: a timedelta, or seconds
    (timedelta(seconds=3), timedelta(seconds=3)), (90, timedelta(seconds=90)),
])
def test_every_spelling_means_the_same(text: object, expected: timedelta) -> None:
    assert parse_duration(text) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize("text", ["", "P", "PT", "PT0S", "0m", "10", "-5m", "soon", "P1Y", "10 parsecs", "10 s x",
                                  "5mm", "1T", "P1DT", True, None, 0, timedelta(0)])
def test_what_is_not_a_duration_is_refused_naming_the_option(text: object) -> None:
    with pytest.raises(InvalidDuration) as info:
        parse_duration(text, "--older-than")  # type: ignore[arg-type]
    assert isinstance(info.value, InvalidInput)  # exit 2, HTTP 400
    assert info.value.message.startswith("invalid --older-than ")


def test_the_message_says_the_grammar() -> None:
    with pytest.raises(InvalidDuration, match=r"invalid OFFSET_LEDGER_RUN_TIMEOUT 'ten minutes': use ISO 8601 "
                                              r"\(PT30M, P30D\) or a number and unit \(30m, 10min"):
        parse_duration("ten minutes", "OFFSET_LEDGER_RUN_TIMEOUT")


def test_milliseconds_for_windows() -> None:
    assert parse_duration_ms("PT10M") == parse_duration_ms("10 minutes") == parse_duration_ms("10min") == 600_000
    assert parse_duration_ms(1500) == 1500  # an int is milliseconds, as Spark's APIs take them
    with pytest.raises(InvalidDuration):
        parse_duration_ms(0)


def test_the_variable_is_named_when_it_is_malformed(monkeypatch: pytest.MonkeyPatch) -> None:
    from offset_ledger.ledger.activity import run_timeout

    monkeypatch.setenv("OFFSET_LEDGER_RUN_TIMEOUT", "10min")
    assert run_timeout() == timedelta(minutes=10)
    monkeypatch.setenv("OFFSET_LEDGER_RUN_TIMEOUT", "ten")
    with pytest.raises(InvalidDuration, match="OFFSET_LEDGER_RUN_TIMEOUT 'ten'"):
        run_timeout()
    monkeypatch.delenv("OFFSET_LEDGER_RUN_TIMEOUT")


@pytest.mark.parametrize("argv, option", [
    (["prune", "--older-than", "P30D"], "--older-than"),
    (["reset", "orders", "--by-duration", "30 minutes"], "--by-duration"),
    (["policy", "set", "orders", "--window", "PT10M", "--reason", "r"], "window"),
])
def test_every_option_takes_every_spelling(argv: list[str], option: str, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    """The options parse ISO and short forms alike: a wrong one is refused naming the option, before any
    connection (the ledger here does not even exist)."""
    from offset_ledger.cli.main import main

    dsn = ["--dsn", f"sqlite:///{tmp_path / 'none.db'}"]
    bad = [a if a not in ("P30D", "30 minutes", "PT10M") else "30 parsecs" for a in argv]
    with pytest.raises(SystemExit) as info:
        main([*bad, *dsn])
    err = capsys.readouterr().err
    assert info.value.code == 2 and f"invalid {option} '30 parsecs'" in err, err
    with pytest.raises(SystemExit) as info:
        main([*argv, *dsn])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "invalid" not in err and "no ledger database" in err, err  # got past the grammar
