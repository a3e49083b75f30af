"""No function of the package takes more than ten parameters, except the public entry points whose keyword
arguments users write (issue 51): a longer list is a value waiting to be named (``RestartRequest``,
``NewGeneration``, ``WriterOptions``, the CLI's option groups). Read with ``ast``: nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2].parent / "offset_ledger"
MOST = 10
#: (module under offset_ledger, function): the public keyword signatures, pinned as users call them.
PUBLIC_KEYWORDS = {
    ("operate/restart.py", "start_from_ledger"),   # offset_ledger.start_from_ledger
    ("operate/failover.py", "failover"),           # offset_ledger.failover
    ("capture/listener.py", "__init__"),           # OffsetLedgerListener(...)
    ("sinks/kafka.py", "__init__"),                # KafkaSink(...)
    ("operate/adopt.py", "import_checkpoint"),     # docs/layers.md: the entry point import-checkpoint calls
}


def parameter_count(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = fn.args
    n = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + bool(a.vararg) + bool(a.kwarg)
    return n - 1 if a.args and a.args[0].arg in ("self", "cls") else n


def wide_functions(source: str) -> list[tuple[str, int]]:
    return [(node.name, parameter_count(node)) for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and parameter_count(node) > MOST]


def test_no_function_takes_more_than_ten_parameters_but_the_public_entry_points() -> None:
    wide, seen = [], set()
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE).as_posix()
        for name, count in wide_functions(path.read_text()):
            if (module, name) in PUBLIC_KEYWORDS:
                seen.add((module, name))
            else:
                wide.append(f"{module}:{name} takes {count} parameters (at most {MOST}: pass a value)")
    assert not wide, "\n".join(wide)
    assert seen == PUBLIC_KEYWORDS, f"no longer wide, drop from PUBLIC_KEYWORDS: {PUBLIC_KEYWORDS - seen}"


def test_the_check_can_fail() -> None:
    names = ", ".join(f"p{i}" for i in range(MOST + 1))
    assert wide_functions(f"def f({names}):\n    pass\n") == [("f", MOST + 1)]
    assert wide_functions(f"class C:\n    def m(self, {', '.join(f'p{i}' for i in range(MOST))}):\n        pass\n") == []
