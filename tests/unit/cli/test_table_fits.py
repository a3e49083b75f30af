"""Tables fit the terminal (issue 50, item 4): a pipelines-like row of about 170 columns in a
100-column terminal wraps, every character kept; prose wraps at words; ``--wide`` keeps one line per
row; a pipe's cut lands after a whole word ("query ended", never "query end...")."""

from __future__ import annotations

import re

import pytest

from offset_ledger.cli.table import render, shorten

HEADERS = ["PIPELINE", "CONSUMER_GROUP", "STATE", "STATUS", "GENERATION", "FOREIGN_RUNS", "PARTITIONS",
           "LAST_BATCH_TIME", "LAST_BATCH_ID", "LAG", "HEADROOM", "FINDINGS", "WHY"]
ROW = ["demo_orders", "demo_orders", "stopped", "STOPPED", "2(2.0)", "-", "4", "2026-11-28T14:03:11.123Z", "41",
       "0", "OK:caught-up", "3", "the run's query ended cleanly at 2026-11-28T14:03:12Z (terminated event; "
       "the listener saw it stop)"]
NUMERIC = [False, False, False, False, False, False, True, False, True, True, False, True, False]
PROSE = [h == "WHY" for h in HEADERS]
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _plain(text: str) -> list[str]:
    return [ANSI.sub("", line) for line in text.splitlines()]


@pytest.mark.parametrize("columns", [100, 80, 60])
def test_a_terminal_gets_every_character_within_its_width(monkeypatch: pytest.MonkeyPatch, columns: int) -> None:
    """Too wide even with the reason wrapped: one record per row, a header a line, every cell whole
    (the reason wrapped at words), nothing past the terminal's edge."""
    monkeypatch.setenv("COLUMNS", str(columns))
    lines = _plain(render(HEADERS, [ROW, ROW], NUMERIC, PROSE, tty=True))
    assert max(len(line) for line in lines) <= columns, "\n".join(lines)
    assert "..." not in "\n".join(lines)
    first = lines[:lines.index("")]
    label = first[0].index(ROW[0])
    for header, cell in zip(HEADERS[:-1], ROW[:-1]):
        assert f"{header:<{label}}{cell}" in first, (header, first)
    why = " ".join(line[label:] for line in first[len(HEADERS) - 1:])
    assert first[len(HEADERS) - 1].startswith("WHY") and why == ROW[-1]


def test_a_table_that_fits_once_prose_wraps_stays_a_table(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "190")
    lines = _plain(render(HEADERS, [ROW], NUMERIC, PROSE, tty=True))
    assert lines[0].split() == HEADERS and max(len(line) for line in lines) <= 190 and len(lines) > 2
    start = lines[0].index("WHY")
    assert " ".join(line[start:].strip() for line in lines[1:]) == ROW[-1]  # wrapped, whole words, in order


def test_prose_wraps_at_words(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    lines = _plain(render(["ID", "MESSAGE"], [["7", ROW[-1]]], [True, False], [False, True], tty=True))
    words = set(ROW[-1].split())
    start = lines[0].index("MESSAGE")
    for line in lines[1:]:
        for word in line[start:].split():
            assert word in words, (word, lines)  # every piece is a whole word: wrapped at a boundary


def test_wide_is_one_line_per_row(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    lines = _plain(render(HEADERS, [ROW, ROW], NUMERIC, PROSE, truncate=False, tty=True))
    assert len(lines) == 3 and lines[1].endswith(ROW[-1])


def test_a_pipe_cuts_after_a_whole_word() -> None:
    text = "the run's query ended cleanly"
    for width in range(8, len(text)):
        cut = shorten(text, width)
        assert len(cut) <= width and cut.endswith("...")
        kept = cut[:-3].split()
        assert kept == text.split()[:len(kept)], (width, cut)  # whole words only
    assert shorten("query ended", 10) == "query..."
    assert shorten("x" * 30, 10) == "x" * 7 + "..."  # one word longer than the column: cut inside it
