"""Every ``-f table`` answer, drawn by one function through Rich.

The layout is decided here, not left to Rich's shrinking, so that nothing an operator copies is
ever cut: only prose columns (a finding's message, a state's reason, a reset's changes) give up
width when the table is wider than the terminal, and they are cut at a word with an ellipsis (``...``).
Names, ids (``checkpoint:1a2b3c4d``), offsets and times keep their full width always; when even
the prose at its minimum does not fit, the lines grow past the terminal rather than cut an id.
``--no-truncate`` never shortens anything.

Output that is not a terminal (a pipe, a test) is laid out at a fixed width (``COLUMNS``, else
200) with no colour, so that it reads the same wherever it runs.
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
    """``text`` in ``width`` characters: cut at the last word that fits, with an ellipsis."""
    from rich.cells import cell_len

    if cell_len(text) <= width:
        return text
    room = max(width - len(ELLIPSIS), 1)
    cut = text[:room]
    while cell_len(cut) > room:
        cut = cut[:-1]
    space = cut.rfind(" ")
    if space >= width // 2:  # a word boundary not too far back; else cut inside the long word
        cut = cut[:space]
    return cut.rstrip() + ELLIPSIS


def render(headers: Sequence[str], cells: Sequence[Sequence[str]], numeric: Sequence[bool],
           prose: Sequence[bool], *, truncate: bool = True, tty: bool | None = None) -> str:
    """The table as text: one line per row, headers over their columns, numbers right-aligned."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    tty = sys.stdout.isatty() if tty is None else tty
    if truncate:
        widths = fit(headers, cells, prose, output_width(tty))
        cells = [[shorten(v, w) if p else v for v, w, p in zip(r, widths, prose)] for r in cells]
    else:
        widths = fit(headers, cells, prose, sys.maxsize)
    table = Table(box=None, pad_edge=False, padding=(0, GAP // 2), show_edge=False, highlight=False,
                  header_style="bold" if tty else None)
    for h, w, n in zip(headers, widths, numeric):
        # Every column gets its width decided above: Rich neither wraps nor shrinks a cell.
        table.add_column(h, justify="right" if n else "left", no_wrap=True, overflow="crop", min_width=w,
                         max_width=w)
    for r in cells:
        table.add_row(*(Text(v) for v in r))  # Text: a "[...]" in a cell is data, not Rich markup
    buffer = io.StringIO()
    Console(file=buffer, width=sum(widths) + GAP * len(widths) + 1, force_terminal=tty,
            color_system="standard" if tty else None, no_color=None if tty else True, highlight=False,
            emoji=False, markup=False, soft_wrap=False, legacy_windows=False).print(table)
    return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines())
