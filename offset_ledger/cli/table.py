"""Every ``-f table`` answer, drawn by one function through Rich.

In a terminal the table fits the terminal's width and nothing is cut: prose columns (a finding's
message, a state's reason, a reset's changes) wrap at words onto more lines; names, ids, offsets and
times stay whole. When even they do not fit side by side, each row is printed as a record, one
``HEADER  value`` line per column (as ``psql``'s expanded display). ``--wide`` (``--no-truncate``)
keeps one line per row, however wide.

Output that is not a terminal (a pipe, a test) is one line per row at a fixed width (``COLUMNS``,
else 200) with no colour, so that it reads the same wherever it runs and ``grep`` finds a row:
there only prose gives up width, cut after a whole word with an ellipsis (``...``); names, ids,
offsets and times are never shortened.
"""

from __future__ import annotations

import io
import os
import sys
from collections.abc import Sequence

# Columns of free text: the only ones shortened to fit the terminal.
PROSE = frozenset({"message", "why", "reason", "changes", "explanation", "notes", "borders", "policies",
                   "stateReason"})
PIPE_WIDTH = 200  # the width of output that is not a terminal, unless COLUMNS says otherwise
MIN_PROSE = 12  # a prose column is never made narrower than this (or its header)
GAP = 2  # spaces between columns

ELLIPSIS = "..."  # ASCII: a pipe in the C locale must not fail on it


def output_width(tty: bool) -> int:
    """The width to fit: the terminal's, or (not a terminal) ``COLUMNS`` else ``PIPE_WIDTH``."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    if tty:
        import shutil

        return shutil.get_terminal_size((PIPE_WIDTH, 24)).columns
    return PIPE_WIDTH


def fit(headers: Sequence[str], cells: Sequence[Sequence[str]], prose: Sequence[bool], width: int) -> list[int]:
    """Column widths: each column's natural width, except prose columns capped (widest first) so the
    row fits ``width``; never below ``MIN_PROSE`` or the header."""
    from rich.cells import cell_len  # a wide character takes two columns

    natural = [max([cell_len(h)] + [cell_len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    total = sum(natural) + GAP * (len(natural) - 1)
    if total <= width or not any(prose):
        return natural
    floor = [max(MIN_PROSE, len(h)) if p else n for h, p, n in zip(headers, prose, natural)]
    budget = width - (total - sum(n for n, p in zip(natural, prose) if p))  # what prose may take
    # One cap for every prose column (the widest give way first), as high as the budget allows.
    cap = max(n for n, p in zip(natural, prose) if p)
    while cap > 0 and sum(min(n, max(cap, f)) for n, f, p in zip(natural, floor, prose) if p) > budget:
        cap -= 1
    return [min(n, max(cap, f)) if p else n for n, f, p in zip(natural, floor, prose)]


def shorten(text: str, width: int) -> str:
    """``text`` in ``width`` characters: cut after the last whole word that fits, with an ellipsis.
    Only a single word longer than the whole width is cut inside (there is no boundary to cut at)."""
    from rich.cells import cell_len

    if cell_len(text) <= width:
        return text
    room = max(width - len(ELLIPSIS), 1)
    cut = text[:room]
    while cell_len(cut) > room:
        cut = cut[:-1]
    if text[len(cut):len(cut) + 1] not in (" ", ""):  # the cut fell inside a word: back to its start
        space = cut.rfind(" ")
        if space > 0:
            cut = cut[:space]
    return cut.rstrip() + ELLIPSIS


def render(headers: Sequence[str], cells: Sequence[Sequence[str]], numeric: Sequence[bool],
           prose: Sequence[bool], *, truncate: bool = True, tty: bool | None = None) -> str:
    """The table as text: headers over their columns, numbers right-aligned.

    A terminal: the table fits its width; prose wraps at words onto more lines, or (still too wide)
    each row becomes a record, every character kept. A pipe: one line per row, prose cut at
    a word. ``truncate=False`` (``--wide``): one line per row, nothing wrapped or cut.
    """
    tty = sys.stdout.isatty() if tty is None else tty
    if truncate and tty:
        return _wrapped(headers, cells, numeric, prose, output_width(tty))
    if truncate:
        widths = fit(headers, cells, prose, output_width(tty))
        cells = [[shorten(v, w) if p else v for v, w, p in zip(r, widths, prose)] for r in cells]
    else:
        widths = fit(headers, cells, prose, sys.maxsize)
    from rich.table import Table

    table = Table(box=None, pad_edge=False, padding=(0, GAP // 2), show_edge=False, highlight=False,
                  header_style="bold" if tty else None)
    for h, w, n in zip(headers, widths, numeric):
        # Every column gets its width decided above: Rich neither wraps nor shrinks a cell.
        table.add_column(h, justify="right" if n else "left", no_wrap=True, overflow="crop", min_width=w,
                         max_width=w)
    return _print(table, cells, sum(widths) + GAP * len(widths) + 1, tty)


def _wrapped(headers: Sequence[str], cells: Sequence[Sequence[str]], numeric: Sequence[bool],
             prose: Sequence[bool], width: int) -> str:
    """The terminal's layout in ``width`` columns, nothing cut. Prose wraps at words onto more lines;
    names, ids, numbers and times stay whole on one line. When even those do not fit side by side,
    each row becomes a record: one ``HEADER  value`` line per column (prose wrapped at words)."""
    from rich.cells import cell_len
    from rich.table import Table

    natural = [max([cell_len(h)] + [cell_len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    widths = fit(headers, cells, prose, width)  # prose capped, widest first, never below MIN_PROSE
    # ... nor below its longest word: prose wraps between words, never inside one.
    widths = [max(w, *(cell_len(word) for r in cells for word in r[i].split())) if p and cells else w
              for i, (w, p) in enumerate(zip(widths, prose))]
    if sum(widths) + GAP * (len(widths) - 1) > width:
        return _records(headers, cells, prose, width)
    table = Table(box=None, pad_edge=False, padding=(0, GAP // 2), show_edge=False, highlight=False,
                  header_style="bold")
    for h, n, p, w, nat in zip(headers, numeric, prose, widths, natural):
        if p:  # wraps at words; a single word longer than the column folds
            table.add_column(h, justify="left", no_wrap=False, overflow="fold", min_width=w, max_width=w)
        else:
            table.add_column(h, justify="right" if n else "left", no_wrap=True, min_width=nat, max_width=nat)
    return _print(table, cells, sum(widths) + GAP * len(widths) + 1, True)


def _records(headers: Sequence[str], cells: Sequence[Sequence[str]], prose: Sequence[bool], width: int) -> str:
    """Rows too wide for the terminal as records (as ``psql``'s expanded display): a header a line,
    a blank line between rows; prose wrapped at words under its value's start, nothing cut."""
    import textwrap

    label = max(len(h) for h in headers) + GAP
    out: list[str] = []
    for i, row in enumerate(cells):
        if i:
            out.append("")
        for h, value, p in zip(headers, row, prose):
            lines = textwrap.wrap(value, max(width - label, MIN_PROSE), break_long_words=False,
                                  break_on_hyphens=False) if p else [value]
            out.append(f"{h:<{label}}{lines[0] if lines else ''}".rstrip())
            out.extend(" " * label + more for more in lines[1:])
    return "\n".join(out)


def _print(table: object, cells: Sequence[Sequence[str]], width: int, tty: bool) -> str:
    from rich.console import Console
    from rich.text import Text

    for r in cells:
        table.add_row(*(Text(v) for v in r))  # type: ignore[attr-defined]  # Text: "[...]" is data, not markup
    buffer = io.StringIO()
    Console(file=buffer, width=width, force_terminal=tty,
            color_system="standard" if tty else None, no_color=None if tty else True, highlight=False,
            emoji=False, markup=False, soft_wrap=False, legacy_windows=False).print(table)
    return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines())
