"""The fenced examples of README.md and docs/*.md, parsed for tests/integration/test_docs_examples.py.

A block is runnable when its fence says ``bash``, ``sh``, ``shell``, ``console`` or ``python``.
An HTML comment on the line right before a fence (blank lines between are allowed) steers it:

- ``<!-- docs-test: skip (why) -->``: not run; the reason is required;
- ``<!-- docs-test: setup NAME -->``: the ledger/cluster state the block runs against (default
  ``orders``: a recorded pipeline ``orders`` on a 2-partition topic ``orders``);
- ``<!-- docs-test: output -->`` on a fence without a language: the output of the runnable block
  before it; its first line's words must all appear in that block's stdout.

Shell blocks are split into commands (in a ``console`` block, the ``$ `` lines; the lines after
one are its output, and those without digits must appear in what it prints) (``\\`` continuations and multi-line quotes joined). A
trailing comment starting ``# exit N`` is the command's expected exit code (default 0); a comment
that shows JSON (``# {"a": {...}, "b": ...}`` or a next line ``# stdout: {...}``) names keys the
command's JSON stdout must have, and its string values (numbers vary, ``...`` elides).
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNNABLE = {"bash": "shell", "sh": "shell", "shell": "shell", "console": "shell", "python": "python"}
MAX_SKIPPED = 6

_FENCE = re.compile(r"^(\s*)```([\w+-]*)\s*$")
_MARKER = re.compile(r"^\s*<!--\s*docs-test:\s*(.*?)\s*-->\s*$")
_SKIP = re.compile(r"^skip\s*\((.*)\)$")
_SETUP = re.compile(r"^setup\s+([\w-]+)$")


@dataclass
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    lang: str
    text: str
    skip: str | None = None  # the reason, when marked skip
    setup: str = "orders"
    output_header: list[str] | None = None  # from a following <!-- docs-test: output --> fence
    bad_markers: list[str] = field(default_factory=list)

    @property
    def kind(self) -> str | None:
        return RUNNABLE.get(self.lang)

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def parse(path: Path) -> list[Block]:
    """Every fenced block of ``path`` with its marker applied (runnable or not)."""
    lines = path.read_text(encoding="utf-8").split("\n")
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        j = i + 1
        while j < len(lines) and not re.match(r"^\s*```\s*$", lines[j]):
            j += 1
        indent = len(m.group(1))
        block = Block(path, i + 1, m.group(2).lower(), "\n".join(ln[indent:] for ln in lines[i + 1:j]))
        k = i - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        marker = _MARKER.match(lines[k]) if k >= 0 else None
        if marker:
            spec = marker.group(1)
            if (s := _SKIP.match(spec)) is not None:
                block.skip = s.group(1).strip()
            elif (s := _SETUP.match(spec)) is not None:
                block.setup = s.group(1)
            elif spec == "output" and not block.lang:
                runnable = [b for b in blocks if b.kind]
                if runnable:
                    runnable[-1].output_header = block.text.split("\n")[0].split()
            else:
                block.bad_markers.append(spec)
        blocks.append(block)
        i = j + 1
    return blocks


def all_blocks() -> list[Block]:
    return [b for path in doc_files() for b in parse(path)]


# -- shell ------------------------------------------------------------------------------------


@dataclass
class Command:
    text: str  # the command as bash runs it (continuations kept)
    comment: str  # its trailing comment, '' if none
    exit_code: int = 0
    shown_json: str | None = None  # the JSON the doc shows as its output
    shown_lines: list[str] = field(default_factory=list)  # a console block's output lines


def console_commands(script: str) -> list[Command]:
    """A ``console`` block: ``$ `` lines are commands, the lines after one are its output."""
    out: list[Command] = []
    for line in script.split("\n"):
        if line.startswith("$ "):
            out.extend(commands(line[2:]))
        elif out and line.strip():
            out[-1].shown_lines.append(line)
    return out


def label_lines(lines: list[str]) -> list[list[str]]:
    """The output lines a run must reproduce: those without digits (headers, labels); the words of each."""
    return [line.split() for line in lines if not re.search(r"\d", line)]


def _scan(text: str) -> tuple[str | None, int | None]:
    """(the open quote at the end of ``text`` or None, the index where a trailing comment starts)."""
    quote: str | None = None
    comment = None
    i = 0
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\" and quote == '"':
                i += 2
                continue
            if c == quote:
                quote = None
        elif c == "\\":
            i += 2
            continue
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or text[i - 1] in " \t\n") and not text[:i].rstrip().endswith("$("):
            comment = i
            break
        i += 1
    return quote, comment


def commands(script: str) -> list[Command]:
    """The commands of a shell block, one per logical line (comment-only lines attach to the last)."""
    out: list[Command] = []
    pending = ""
    for line in script.split("\n"):
        pending = f"{pending}\n{line}" if pending else line
        quote, comment = _scan(pending)
        if quote is not None or (comment is None and pending.rstrip().endswith("\\")):
            continue
        logical, pending = pending, ""
        if not logical.strip():
            continue
        code = logical if comment is None else logical[:comment]
        note = "" if comment is None else logical[comment:].lstrip("#").strip()
        if not code.strip():
            if out and note.startswith("stdout:"):
                out[-1].shown_json = _json_in(note) or out[-1].shown_json
            continue
        cmd = Command(code.rstrip().rstrip("\\").rstrip(), note)
        if (m := re.match(r"exit (\d+)\b", note)) is not None:
            cmd.exit_code = int(m.group(1))
        cmd.shown_json = _json_in(note)
        out.append(cmd)
    if pending.strip():
        raise ValueError(f"unterminated quote or continuation in:\n{pending}")
    return out


def _json_in(note: str) -> str | None:
    start = note.find("{")
    if start < 0 or '"' not in note[start:]:
        return None
    depth = 0
    for i, c in enumerate(note[start:], start):
        depth += c == "{"
        depth -= c == "}"
        if depth == 0:
            return note[start:i + 1]
    return None


def shown_shape(shown: str) -> object:
    """The JSON a comment shows, with ``...`` elisions dropped (``{...}`` becomes ``{}``)."""
    cleaned = re.sub(r"\{\s*\.\.\.\s*\}", "{}", shown)
    cleaned = re.sub(r",\s*\.\.\.\s*", "", cleaned)
    return json.loads(cleaned)


def shape_mismatches(shown: object, actual: object, path: str = "") -> list[str]:
    """Keys ``shown`` has that ``actual`` lacks, and differing string values (numbers may vary)."""
    if isinstance(shown, dict):
        if not isinstance(actual, dict):
            return [f"{path or '.'}: expected an object, got {type(actual).__name__}"]
        out = []
        for key, value in shown.items():
            if key not in actual:
                out.append(f"{path}.{key}: missing")
            else:
                out.extend(shape_mismatches(value, actual[key], f"{path}.{key}"))
        return out
    if isinstance(shown, str) and shown != actual:
        return [f"{path}: {actual!r} != {shown!r}"]
    return []


# -- python -----------------------------------------------------------------------------------


def top_level_print_labels(source: str) -> list[str]:
    """The literal first argument of every top-level ``print("label", ...)``: each must be printed."""
    labels = []
    for node in ast.parse(source).body:
        if (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
                and isinstance(node.value.func, ast.Name) and node.value.func.id == "print"
                and node.value.args and isinstance(node.value.args[0], ast.Constant)
                and isinstance(node.value.args[0].value, str)):
            labels.append(node.value.args[0].value)
    return labels
